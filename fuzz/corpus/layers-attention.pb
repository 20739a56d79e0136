
ãà
 bf16L
	attention
causal
dropout	š™™™™™¹?
heads
scale_qk

layer_norm*
mlp

activation"swish
hidden@
swish	
sigmoid
softmax
dimÿÿÿÿÿÿÿÿÿ
dropout
p	š™™™™™É?