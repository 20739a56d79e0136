
®«

xfloat32 
%
layers.0.fc.weight€float32 
!
layers.0.fc.bias€float32 
%
layers.1.fc.weight€€float32 
!
layers.1.fc.bias€float32 

head.weight
€float32 

	head.bias
float32 

labelsint64 B
linearxlayers.0.fc.weightlayers.0.fc.biast3*layers.0.fc
relut3t4*layers.0.actC
lineart4layers.1.fc.weightlayers.1.fc.biast7*layers.1.fc
relut7t8*layers.1.act/
lineart8head.weight	head.biast11*head!
cross_entropyt11labelst13t13"layers.0"layers.1