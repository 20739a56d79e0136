"""Measures the allocations inside conv forward and backward for each grid point:
probe.py GRID.json OUT.jsonl (one JSON line per point: its parameters and both sequences).
A point with "cl": true has a channels-last input (and so a channels-last output and gradient)."""
import torch, torch.nn.functional as F, json, sys, itertools, random
from torch.profiler import profile, ProfilerActivity
torch.set_num_threads(1)
def trace(fn):
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as p:
        r = fn()
    ev = []
    def walk(n):
        ef = n.extra_fields
        if type(ef).__name__.endswith("Allocation"): ev.append((n.start_time_ns, ef.alloc_size, ef.ptr))
        for c in n.children: walk(c)
    for root in p.profiler.kineto_results.experimental_event_tree(): walk(root)
    ev.sort(key=lambda e: e[0])   # stable: ties keep tree order
    return r, [s for _, s, _ in ev]
def measure(N, Ci, Co, S, K, stride, pad, dil, groups, bias, xg, dim, cl=False):
    xs = (N, Ci) + (S,)*dim
    ws = (Co, Ci//groups) + (K,)*dim
    if cl:  # a channels-last input: an NHWC leaf seen as NCHW (ConvNeXt's LayerNorm2d hands this)
        x0 = torch.randn(N, S, S, Ci, requires_grad=xg); x = x0.permute(0, 3, 1, 2)
    else:
        x = torch.randn(*xs, requires_grad=xg)
    w = torch.randn(*ws, requires_grad=True)
    b = torch.randn(Co, requires_grad=True) if bias else None
    conv = F.conv2d if dim == 2 else F.conv1d
    f = lambda: conv(x, w, b, stride=stride, padding=pad, dilation=dil, groups=groups)
    y, fs = trace(f)
    g = torch.randn_like(y)  # in y's layout: channels-last for a channels-last convolution
    _, bs = trace(lambda: y.backward(g))
    return dict(N=N, Ci=Ci, Co=Co, S=S, K=K, stride=stride, pad=pad, dil=dil, groups=groups,
                bias=bias, xg=xg, dim=dim, cl=cl, out=list(y.shape), fwd=fs, bwd=bs)
if __name__ == "__main__":
    pts = json.load(open(sys.argv[1]))
    with open(sys.argv[2], "w") as fo:
        for p in pts:
            try:
                r = measure(**p)
            except Exception as e:
                r = dict(p, err=str(e))
            fo.write(json.dumps(r) + "\n")
