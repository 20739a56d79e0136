
½º

x@€float32 

target@int64 


fc1.weight€@€ 

fc1.bias€@ 


fc2.weight
€@ 

fc2.bias
 )
linearx
fc1.weightfc1.biash*fc1
sigmoidhgate*act
mulhgatea*act.
lineara
fc2.weightfc2.biaslogits*fc2+
cross_entropylogitstargetloss*lossloss(@