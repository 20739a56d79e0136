


vit-b16

layers