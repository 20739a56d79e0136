
ÈÅ
float32"
linearfc1
out_features€ 
reluact1"
linearfc2
out_features€ 
reluact2
dropoutdrop
p	š™™™™™¹?"
linearhead
out_features
"cross_entropy