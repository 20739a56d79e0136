



resnet18