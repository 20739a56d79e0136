



resnet50