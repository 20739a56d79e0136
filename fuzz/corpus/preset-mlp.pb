


mlp

layers