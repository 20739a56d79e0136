
OM
  F
conv2d
out_channels
padding
ø¢ıÖì´î~
kernel_size