"""Writes the grid of convolutions measured for RULE.md, in two halves: mkgrid.py OUT0 OUT1."""
import json, itertools, random, sys
random.seed(0)
C = [1,3,4,8,15,16,17,32,64]
pts = []
# main 2D grid: full over channels, kernel, stride, pad, batch, bias; spatial 8 and 12
for Ci, Co, K, st, pad, N, bias in itertools.product(C, C, [1,3], [1,2], [0,1], [1,2,4], [False, True]):
    S = 12 if (Ci+Co+K+N) % 2 else 9
    for xg in [True, False]:
        pts.append(dict(N=N, Ci=Ci, Co=Co, S=S, K=K, stride=st, pad=pad, dil=1, groups=1, bias=bias, xg=xg, dim=2))
# 5x5 and 1D, fewer
for Ci, Co, st, pad, N, bias in itertools.product(C, C, [1,2], [0,2], [1,2,4], [False, True]):
    if random.random() < 0.35:
        pts.append(dict(N=N, Ci=Ci, Co=Co, S=11, K=5, stride=st, pad=pad, dil=1, groups=1, bias=bias, xg=random.random()<0.7, dim=2))
for Ci, Co, K, st, pad, N, bias in itertools.product(C, C, [1,3], [1,2], [0,1], [1,2,4], [False, True]):
    if random.random() < 0.2:
        pts.append(dict(N=N, Ci=Ci, Co=Co, S=random.choice([10,32,64]), K=K, stride=st, pad=pad, dil=1, groups=1, bias=bias, xg=random.random()<0.7, dim=1))
# depthwise and dilation
for Cc, K, st, pad, N, bias in itertools.product(C, [1,3], [1,2], [0,1], [1,2,4], [False, True]):
    pts.append(dict(N=N, Ci=Cc, Co=Cc, S=10, K=K, stride=st, pad=pad, dil=1, groups=Cc, bias=bias, xg=True, dim=2))
for Ci, Co, N in itertools.product(C, C, [1,2]):
    if random.random() < 0.3:
        pts.append(dict(N=N, Ci=Ci, Co=Co, S=12, K=3, stride=1, pad=2, dil=2, groups=1, bias=True, xg=True, dim=2))
# batch-1 large input (crosses N*C*H*W > 20480)
for Ci, Co, K in itertools.product([3,16,32,64], [8,16], [1,3]):
    pts.append(dict(N=1, Ci=Ci, Co=Co, S=32, K=K, stride=1, pad=K//2, dil=1, groups=1, bias=True, xg=True, dim=2))
random.shuffle(pts)
print(len(pts))
h = len(pts)//2
json.dump(pts[:h], open(sys.argv[1], "w")); json.dump(pts[h:], open(sys.argv[2], "w"))
