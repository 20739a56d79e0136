
«¨
@M
conv1d
dilation
groups
kernel_size
out_channels
gelu
approximate"tanh	
flatten
linear
out_features
tanh"mse