"""Writes the grids of convolutions measured for RULE.md (probe.py measures them):
  mkgrid.py main OUT0 OUT1   the main grid, in two halves (9,722 points)
  mkgrid.py groups OUT       grouped, not depthwise, convolutions (467 points)
  mkgrid.py small OUT        inputs of 1 to 6 pixels, kernels up to 5, paddings up to 2 (1,733)
  mkgrid.py boundary OUT     kernels that reach far past the input: dilations to 12 with paddings to
                             match (DeepLab's ASPP), paddings larger than the kernel's half, 5x5 and
                             7x7 depthwise kernels, wide channel counts (gemm's im2col blocking)
  mkgrid.py channels_last OUT  channels-last inputs (ConvNeXt's LayerNorm2d): ungrouped 1x1 to
                             7x7, strided and patchify kernels, depthwise 3x3 to 7x7"""
import itertools
import json
import random
import sys

C = [1, 3, 4, 8, 15, 16, 17, 32, 64]


def main_grid():
    random.seed(0)
    pts = []
    # full over channels, kernel, stride, pad, batch, bias; spatial 9 or 12
    for Ci, Co, K, st, pad, N, bias in itertools.product(C, C, [1, 3], [1, 2], [0, 1], [1, 2, 4], [False, True]):
        S = 12 if (Ci + Co + K + N) % 2 else 9
        for xg in [True, False]:
            pts.append(dict(N=N, Ci=Ci, Co=Co, S=S, K=K, stride=st, pad=pad, dil=1, groups=1, bias=bias, xg=xg, dim=2))
    # 5x5 and 1D, fewer
    for Ci, Co, st, pad, N, bias in itertools.product(C, C, [1, 2], [0, 2], [1, 2, 4], [False, True]):
        if random.random() < 0.35:
            pts.append(dict(N=N, Ci=Ci, Co=Co, S=11, K=5, stride=st, pad=pad, dil=1, groups=1, bias=bias,
                            xg=random.random() < 0.7, dim=2))
    for Ci, Co, K, st, pad, N, bias in itertools.product(C, C, [1, 3], [1, 2], [0, 1], [1, 2, 4], [False, True]):
        if random.random() < 0.2:
            pts.append(dict(N=N, Ci=Ci, Co=Co, S=random.choice([10, 32, 64]), K=K, stride=st, pad=pad, dil=1,
                            groups=1, bias=bias, xg=random.random() < 0.7, dim=1))
    # depthwise and dilation
    for Cc, K, st, pad, N, bias in itertools.product(C, [1, 3], [1, 2], [0, 1], [1, 2, 4], [False, True]):
        pts.append(dict(N=N, Ci=Cc, Co=Cc, S=10, K=K, stride=st, pad=pad, dil=1, groups=Cc, bias=bias, xg=True, dim=2))
    for Ci, Co, N in itertools.product(C, C, [1, 2]):
        if random.random() < 0.3:
            pts.append(dict(N=N, Ci=Ci, Co=Co, S=12, K=3, stride=1, pad=2, dil=2, groups=1, bias=True, xg=True, dim=2))
    # batch-1 large input (crosses N*C*H*W > 20480)
    for Ci, Co, K in itertools.product([3, 16, 32, 64], [8, 16], [1, 3]):
        pts.append(dict(N=1, Ci=Ci, Co=Co, S=32, K=K, stride=1, pad=K // 2, dil=1, groups=1, bias=True, xg=True, dim=2))
    random.shuffle(pts)
    return pts


def groups_grid():
    random.seed(1)
    pts = []
    for Ci, Co, G, K, st, pad, N, bias in itertools.product([8, 16, 32, 48, 64], [8, 16, 32, 64], [2, 4], [1, 3],
                                                            [1, 2], [0, 1], [1, 2, 4], [False, True]):
        if Ci % G or Co % G or Ci == G:
            continue
        if random.random() < 0.25:
            pts.append(dict(N=N, Ci=Ci, Co=Co, S=10, K=K, stride=st, pad=pad, dil=1, groups=G, bias=bias,
                            xg=random.random() < 0.7, dim=2))
    # depthwise with a channel multiplier (Co = 2 Ci, groups = Ci)
    for Cc, K, st, N in itertools.product([4, 8, 16, 32], [3], [1, 2], [1, 2]):
        pts.append(dict(N=N, Ci=Cc, Co=2 * Cc, S=10, K=K, stride=st, pad=1, dil=1, groups=Cc, bias=True, xg=True, dim=2))
    return pts


def small_grid():
    random.seed(2)
    pts = []
    for Ci, Co, S, K, st, pad, N, bias, xg in itertools.product([1, 3, 4, 8, 16, 32], [4, 16, 17, 64], [1, 2, 3, 4, 6],
                                                                [1, 3, 5], [1, 2], [0, 1, 2], [1, 2], [False, True],
                                                                [False, True]):
        if S + 2 * pad < K or random.random() > 0.12:
            continue
        pts.append(dict(N=N, Ci=Ci, Co=Co, S=S, K=K, stride=st, pad=pad, dil=1, groups=1, bias=bias, xg=xg, dim=2))
    return pts


def boundary_grid():
    random.seed(3)
    pts = []
    # ungrouped: dilation d with padding d (a "same" 3x3, as ASPP), or off by one or two
    for Ci, Co, S, K, dil, dpad, st, N in itertools.product([4, 16, 48, 160], [16, 40], [2, 4, 6, 8, 13, 16],
                                                           [3, 5, 7], [1, 2, 3, 6, 12], [-2, -1, 0, 1, 3],
                                                           [1, 2], [1, 2]):
        pad = dil * (K // 2) + dpad
        if pad < 0 or S + 2 * pad < dil * (K - 1) + 1 or random.random() > 0.1:
            continue
        pts.append(dict(N=N, Ci=Ci, Co=Co, S=S, K=K, stride=st, pad=pad, dil=dil, groups=1,
                        bias=random.random() < 0.5, xg=random.random() < 0.8, dim=2))
    # depthwise, kernels 3 to 7, dilated or not, paddings around "same"
    for Cc, S, K, dil, dpad, st, N in itertools.product([16, 24, 72], [2, 4, 7, 8, 16], [3, 5, 7], [1, 2, 4],
                                                       [-1, 0, 1, 2], [1, 2], [1, 2]):
        pad = dil * (K // 2) + dpad
        if pad < 0 or S + 2 * pad < dil * (K - 1) + 1 or random.random() > 0.25:
            continue
        pts.append(dict(N=N, Ci=Cc, Co=Cc, S=S, K=K, stride=st, pad=pad, dil=dil, groups=Cc,
                        bias=random.random() < 0.5, xg=True, dim=2))
    # wide channels: gemm's blocking of im2col over input channels and output pixels
    for Ci, Co, S, dil in itertools.product([256, 640, 960, 1280], [64, 256], [4, 8, 12], [6, 12, 24]):
        pts.append(dict(N=2, Ci=Ci, Co=Co, S=S, K=3, stride=1, pad=dil, dil=dil, groups=1, bias=False,
                        xg=True, dim=2))
    random.shuffle(pts)
    return pts


def channels_last_grid():
    random.seed(5)
    pts = []
    for Ci, Co, (K, st, pad), S, N, bias, xg in itertools.product(
            [16, 32, 48, 96, 128, 3, 8], [16, 32, 48, 64, 96, 192, 40],
            [(1, 1, 0), (3, 1, 1), (3, 2, 1), (2, 2, 0), (4, 4, 0), (7, 1, 3), (1, 2, 0)], [4, 8, 16], [1, 2],
            [False, True], [True, False]):
        if S < K or random.random() > 0.08:
            continue
        pts.append(dict(N=N, Ci=Ci, Co=Co, S=S, K=K, stride=st, pad=pad, dil=1, groups=1, bias=bias, xg=xg,
                        dim=2, cl=True))
    for C, K, st, S, N, bias in itertools.product([16, 48, 96, 100, 8], [3, 5, 7], [1, 2], [2, 4, 8, 16], [1, 2],
                                                  [False, True]):
        if random.random() > 0.35:
            continue
        pts.append(dict(N=N, Ci=C, Co=C, S=S, K=K, stride=st, pad=K // 2, dil=1, groups=C, bias=bias, xg=True,
                        dim=2, cl=True))
    random.shuffle(pts)
    return pts


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("main", "groups", "small", "boundary", "channels_last"):
        sys.exit(__doc__)
    if sys.argv[1] == "main":
        pts = main_grid()
        h = len(pts) // 2
        json.dump(pts[:h], open(sys.argv[2], "w"))
        json.dump(pts[h:], open(sys.argv[3], "w"))
    else:
        pts = {"groups": groups_grid, "small": small_grid, "boundary": boundary_grid,
               "channels_last": channels_last_grid}[sys.argv[1]]()
        json.dump(pts, open(sys.argv[2], "w"))
    print(len(pts))
