
ü:ú:

x@@float32 
,
init_conv.conv1.0.weightÄfloat32 
'
init_conv.conv1.0.biasÄfloat32 
)
init_conv.conv1.1.weightÄfloat32 
'
init_conv.conv1.1.biasÄfloat32 
/
init_conv.conv1.1.running_meanÄfloat32 
.
init_conv.conv1.1.running_varÄfloat32 
0
%init_conv.conv1.1.num_batches_trackedint64 
-
init_conv.conv2.0.weightÄÄfloat32 
'
init_conv.conv2.0.biasÄfloat32 
)
init_conv.conv2.1.weightÄfloat32 
'
init_conv.conv2.1.biasÄfloat32 
/
init_conv.conv2.1.running_meanÄfloat32 
.
init_conv.conv2.1.running_varÄfloat32 
0
%init_conv.conv2.1.num_batches_trackedint64 
1
down1.model.0.conv1.0.weightÄÄfloat32 
+
down1.model.0.conv1.0.biasÄfloat32 
-
down1.model.0.conv1.1.weightÄfloat32 
+
down1.model.0.conv1.1.biasÄfloat32 
3
"down1.model.0.conv1.1.running_meanÄfloat32 
2
!down1.model.0.conv1.1.running_varÄfloat32 
4
)down1.model.0.conv1.1.num_batches_trackedint64 
1
down1.model.0.conv2.0.weightÄÄfloat32 
+
down1.model.0.conv2.0.biasÄfloat32 
-
down1.model.0.conv2.1.weightÄfloat32 
+
down1.model.0.conv2.1.biasÄfloat32 
3
"down1.model.0.conv2.1.running_meanÄfloat32 
2
!down1.model.0.conv2.1.running_varÄfloat32 
4
)down1.model.0.conv2.1.num_batches_trackedint64 
1
down1.model.1.conv1.0.weightÄÄfloat32 
+
down1.model.1.conv1.0.biasÄfloat32 
-
down1.model.1.conv1.1.weightÄfloat32 
+
down1.model.1.conv1.1.biasÄfloat32 
3
"down1.model.1.conv1.1.running_meanÄfloat32 
2
!down1.model.1.conv1.1.running_varÄfloat32 
4
)down1.model.1.conv1.1.num_batches_trackedint64 
1
down1.model.1.conv2.0.weightÄÄfloat32 
+
down1.model.1.conv2.0.biasÄfloat32 
-
down1.model.1.conv2.1.weightÄfloat32 
+
down1.model.1.conv2.1.biasÄfloat32 
3
"down1.model.1.conv2.1.running_meanÄfloat32 
2
!down1.model.1.conv2.1.running_varÄfloat32 
4
)down1.model.1.conv2.1.num_batches_trackedint64 
1
down2.model.0.conv1.0.weightÄÄfloat32 
+
down2.model.0.conv1.0.biasÄfloat32 
-
down2.model.0.conv1.1.weightÄfloat32 
+
down2.model.0.conv1.1.biasÄfloat32 
3
"down2.model.0.conv1.1.running_meanÄfloat32 
2
!down2.model.0.conv1.1.running_varÄfloat32 
4
)down2.model.0.conv1.1.num_batches_trackedint64 
1
down2.model.0.conv2.0.weightÄÄfloat32 
+
down2.model.0.conv2.0.biasÄfloat32 
-
down2.model.0.conv2.1.weightÄfloat32 
+
down2.model.0.conv2.1.biasÄfloat32 
3
"down2.model.0.conv2.1.running_meanÄfloat32 
2
!down2.model.0.conv2.1.running_varÄfloat32 
4
)down2.model.0.conv2.1.num_batches_trackedint64 
1
down2.model.1.conv1.0.weightÄÄfloat32 
+
down2.model.1.conv1.0.biasÄfloat32 
-
down2.model.1.conv1.1.weightÄfloat32 
+
down2.model.1.conv1.1.biasÄfloat32 
3
"down2.model.1.conv1.1.running_meanÄfloat32 
2
!down2.model.1.conv1.1.running_varÄfloat32 
4
)down2.model.1.conv1.1.num_batches_trackedint64 
1
down2.model.1.conv2.0.weightÄÄfloat32 
+
down2.model.1.conv2.0.biasÄfloat32 
-
down2.model.1.conv2.1.weightÄfloat32 
+
down2.model.1.conv2.1.biasÄfloat32 
3
"down2.model.1.conv2.1.running_meanÄfloat32 
2
!down2.model.1.conv2.1.running_varÄfloat32 
4
)down2.model.1.conv2.1.num_batches_trackedint64 

targetÄfloat32 è
conv2dxinit_conv.conv1.0.weightinit_conv.conv1.0.biast3"
dilation"
groups"
padding"
stride*init_conv.conv1.0ò

batch_normt3init_conv.conv1.1.weightinit_conv.conv1.1.biasinit_conv.conv1.1.running_meaninit_conv.conv1.1.running_vart9*init_conv.conv1.1"
gelut9t10*init_conv.conv1.2í
conv2dt10init_conv.conv2.0.weightinit_conv.conv2.0.biast13"
dilation"
groups"
padding"
stride*init_conv.conv2.0ö

batch_normt13init_conv.conv2.1.weightinit_conv.conv2.1.biasinit_conv.conv2.1.running_meaninit_conv.conv2.1.running_vart19*init_conv.conv2.1#
gelut19t20*init_conv.conv2.2
addt10t20t21*	init_conv/
divt21t22"
scalar	9¥»væüˆ?*	init_convû
conv2dt22down1.model.0.conv1.0.weightdown1.model.0.conv1.0.biast25"
dilation"
groups"
padding"
stride*down1.model.0.conv1.0Æ

batch_normt25down1.model.0.conv1.1.weightdown1.model.0.conv1.1.bias"down1.model.0.conv1.1.running_mean!down1.model.0.conv1.1.running_vart31*down1.model.0.conv1.1'
gelut31t32*down1.model.0.conv1.2û
conv2dt32down1.model.0.conv2.0.weightdown1.model.0.conv2.0.biast35"
dilation"
groups"
padding"
stride*down1.model.0.conv2.0Æ

batch_normt35down1.model.0.conv2.1.weightdown1.model.0.conv2.1.bias"down1.model.0.conv2.1.running_mean!down1.model.0.conv2.1.running_vart41*down1.model.0.conv2.1'
gelut41t42*down1.model.0.conv2.2û
conv2dt42down1.model.1.conv1.0.weightdown1.model.1.conv1.0.biast45"
dilation"
groups"
padding"
stride*down1.model.1.conv1.0Æ

batch_normt45down1.model.1.conv1.1.weightdown1.model.1.conv1.1.bias"down1.model.1.conv1.1.running_mean!down1.model.1.conv1.1.running_vart51*down1.model.1.conv1.1'
gelut51t52*down1.model.1.conv1.2û
conv2dt52down1.model.1.conv2.0.weightdown1.model.1.conv2.0.biast55"
dilation"
groups"
padding"
stride*down1.model.1.conv2.0Æ

batch_normt55down1.model.1.conv2.1.weightdown1.model.1.conv2.1.bias"down1.model.1.conv2.1.running_mean!down1.model.1.conv2.1.running_vart61*down1.model.1.conv2.1'
gelut61t62*down1.model.1.conv2.2=

max_pool2dt62t63t64"
kernel_size*down1.model.2û
conv2dt63down2.model.0.conv1.0.weightdown2.model.0.conv1.0.biast67"
dilation"
groups"
padding"
stride*down2.model.0.conv1.0Æ

batch_normt67down2.model.0.conv1.1.weightdown2.model.0.conv1.1.bias"down2.model.0.conv1.1.running_mean!down2.model.0.conv1.1.running_vart73*down2.model.0.conv1.1'
gelut73t74*down2.model.0.conv1.2û
conv2dt74down2.model.0.conv2.0.weightdown2.model.0.conv2.0.biast77"
dilation"
groups"
padding"
stride*down2.model.0.conv2.0Æ

batch_normt77down2.model.0.conv2.1.weightdown2.model.0.conv2.1.bias"down2.model.0.conv2.1.running_mean!down2.model.0.conv2.1.running_vart83*down2.model.0.conv2.1'
gelut83t84*down2.model.0.conv2.2û
conv2dt84down2.model.1.conv1.0.weightdown2.model.1.conv1.0.biast87"
dilation"
groups"
padding"
stride*down2.model.1.conv1.0Æ

batch_normt87down2.model.1.conv1.1.weightdown2.model.1.conv1.1.bias"down2.model.1.conv1.1.running_mean!down2.model.1.conv1.1.running_vart93*down2.model.1.conv1.1'
gelut93t94*down2.model.1.conv1.2û
conv2dt94down2.model.1.conv2.0.weightdown2.model.1.conv2.0.biast97"
dilation"
groups"
padding"
stride*down2.model.1.conv2.0Ø

batch_normt97down2.model.1.conv2.1.weightdown2.model.1.conv2.1.bias"down2.model.1.conv2.1.running_mean!down2.model.1.conv2.1.running_vart103*down2.model.1.conv2.1)
gelut103t104*down2.model.1.conv2.2@

max_pool2dt104t105t106"
kernel_size*down2.model.2
mse_losst105targett108t108"	init_conv"down1"down2