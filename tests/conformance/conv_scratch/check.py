"""Predict the allocator event sequence of F.conv1d/conv2d forward and of the
conv's backward (y.backward(g)) on PyTorch 1.13 CPU (Debian build, oneDNN 2.6.3,
torch.set_num_threads(1)), AVX-512 machine.  Compare with measured all.jsonl.
usage: python3 check.py MEASURED.jsonl"""
import json, sys

F4 = 4  # float32 bytes
def rup(c, b): return (c + b - 1) // b * b

def geometry(p):
    dim = p['dim']; S = p['S']; K = p['K']; st = p['stride']; pad = p['pad']; dil = p['dil']
    H = 1 if dim == 1 else S; W = S
    kh = 1 if dim == 1 else K; kw = K
    oW = (W + 2 * pad - dil * (kw - 1) - 1) // st + 1
    oH = 1 if dim == 1 else (H + 2 * pad - dil * (kh - 1) - 1) // st + 1
    return H, W, kh, kw, oH, oW

def use_mkldnn(p):
    # aten/src/ATen/native/Convolution.cpp ConvParams::use_mkldnn (float32, 1 thread)
    H, W, kh, kw, oH, oW = geometry(p)
    N = p['N']
    c1 = p['stride'] != 1 or p['dil'] != 1 or N >= 16 or kh != 1 or kw != 1
    c2 = p['groups'] > 1 or (kh > 3 and kw > 3) or N > 1 or N * p['Ci'] * H * W > 20480
    return c1 and c2

def SCR(*entries):
    """oneDNN user scratchpad: each booked entry costs size+128 bytes."""
    return sum(e + 128 for e in entries if e > 0)

def predict(p):
    N, Ci, Co, G = p['N'], p['Ci'], p['Co'], p['groups']
    bias, xg = p['bias'], p['xg']
    H, W, kh, kw, oH, oW = geometry(p)
    k = kh * kw; HW = H * W; oHW = oH * oW
    Xp = N * Ci * HW * F4; Yp = N * Co * oHW * F4
    Wp = Co * (Ci // G) * k * F4; Bp = Co * F4
    Xb = lambda b: N * rup(Ci, b) * HW * F4
    Yb = lambda b: N * rup(Co, b) * oHW * F4
    fwd, bwd = [], []
    def alloc_free(seq, allocs, frees): seq.extend(allocs); seq.extend(-f for f in frees)

    if not use_mkldnn(p):
        # ---------------- native THNN path (slow_conv2d / slow_conv_dilated2d) -------------
        dilated = p['dil'] != 1
        cols_needed = not (k == 1 and p['stride'] == 1 and p['pad'] == 0 and not dilated)
        cig = Ci // G; cog = Co // G
        if dilated:
            cols = cig * k * oHW * F4            # one sample at a time
        else:
            cols = N * cig * k * oHW * F4        # whole batch im2col
        if G == 1 and dilated:                   # slow_conv_dilated2d (only N==1 reaches here)
            fwd += [Yp, cols, -cols]
            if xg: bwd.append(Xp)
            bwd.append(Wp)
            if bias: bwd.append(Bp)
            bwd.append(cols)
            if bias: bwd += [Bp, -Bp]
            bwd.append(-cols)
        elif G == 1:
            if cols_needed: fwd += [cols, Yp, -cols]
            else: fwd += [Yp]
            if xg: bwd.append(Xp)
            if bias: bwd.append(Bp)
            bwd.append(Wp)
            if cols_needed: bwd += [cols, -cols]
        else:   # per-group loop in at::_convolution, then at::cat
            slice_copy = N > 1                   # narrow(1,..) of NCHW is contiguous iff N==1
            xg_sz = N * cig * HW * F4; yg_sz = N * cog * oHW * F4
            for g in range(G):
                if slice_copy: fwd.append(xg_sz)
                if cols_needed: fwd += [cols, yg_sz, -cols]
                else: fwd.append(yg_sz)
                if slice_copy: fwd.append(-xg_sz)
            fwd.append(Yp); fwd += [-yg_sz] * G
            gw_g = cog * cig * k * F4; gb_g = cog * F4
            for g in range(G):
                if slice_copy: bwd += [yg_sz, xg_sz]
                if xg: bwd.append(xg_sz)
                if bias: bwd.append(gb_g)
                bwd.append(gw_g)
                if cols_needed: bwd += [cols, -cols]
                if slice_copy: bwd += [-xg_sz, -yg_sz]
            if xg: bwd.append(Xp)
            bwd.append(Wp)
            if bias: bwd.append(Bp)
            if bias: bwd += [-gb_g] * G
            bwd += [-gw_g] * G
            if xg: bwd += [-xg_sz] * G
        return fwd, bwd

    # ---------------- oneDNN (mkldnn) path -------------------------------------------------
    dw = G > 1                                   # only depthwise G==Ci==Co measured
    k1 = (k == 1)
    pad_ge_kernel = p['pad'] > 0 and k1          # only case measured: 1x1 with padding
    div = (HW and W % oW == 0 and H % oH == 0)
    W16 = rup(Co, 16) * rup(Ci, 16) * k * F4     # ABcd16b16a / ABcd16a16b
    W1st = rup(Co, 16) * Ci * k * F4             # Acdb16a / Abcd16a (first-conv kernel)
    W8 = rup(Co, 8) * rup(Ci, 8) * k * F4        # ABcd8b8a (avx2 kernel)
    Wdw = rup(Co, 16) * k * F4                   # Abcde16a (depthwise)
    pbias16 = rup(Co, 16) * F4 if (bias and Co % 16) else 0
    pbias8 = rup(Co, 8) * F4 if (bias and Co % 8) else 0
    col = (Ci // G) * k * oHW * F4               # gemm im2col buffer (one image)
    rtus = rup(Ci, 16) * oHW * F4 if p['stride'] > 1 else 0

    # forward implementation
    if dw:
        if pad_ge_kernel: f = dict(src=0, w=0, dst=Yp, scr=SCR(col))                       # gemm
        else: f = dict(src=Xb(16), w=Wdw, dst=Yb(16), scr=SCR(pbias16))                     # jit_dw
    elif pad_ge_kernel:
        f = dict(src=0, w=0, dst=Yp, scr=SCR(col))                                        # gemm
    elif k1 and div:
        f = dict(src=Xb(16), w=W16, dst=Yb(16), scr=SCR(rtus, pbias16))                   # jit_1x1
    elif Ci < 16:
        f = dict(src=0, w=W1st, dst=Yb(16), scr=SCR(pbias16))                             # jit 1st-conv
    else:
        f = dict(src=Xb(16), w=W16, dst=Yb(16), scr=SCR(pbias16))                         # jit blocked
    alloc_free(fwd, [x for x in (f['scr'], f['src'], f['w'], f['dst']) if x],
               [x for x in (f['w'], f['src'], f['scr']) if x])
    fwd += [Yp, -f['dst']]

    # backward data
    if xg:
        if dw: d = dict(gy=Yb(16), w=Wdw, gx=Xb(16), scr=0)
        elif pad_ge_kernel: d = dict(gy=0, w=0, gx=Xp, scr=SCR(col))
        elif k1 and div: d = dict(gy=Yb(16), w=W16, gx=Xb(16), scr=SCR(rtus))
        else: d = dict(gy=Yb(16), w=W16, gx=Xb(16), scr=0)
        alloc_free(bwd, [x for x in (d['gy'], d['w'], d['gx'], d['scr']) if x],
                   [x for x in (d['scr'], d['w'], d['gy']) if x])
        bwd += [Xp, -d['gx']]
    # backward weights (+bias)
    gemm_w = dict(gy=0, x=0, gw=Wp, scr=SCR(col, 4 * Wp))
    if dw:
        wb = gemm_w if k1 else dict(gy=Yb(16), x=Xb(16), gw=Wdw, scr=0)
    elif pad_ge_kernel: wb = gemm_w
    elif k1 and div: wb = dict(gy=Yb(16), x=Xb(16), gw=W16, scr=SCR(rtus, pbias16))
    elif Ci >= 16: wb = dict(gy=Yb(16), x=Xb(16), gw=W16, scr=SCR(pbias16))
    elif Ci <= 3: wb = dict(gy=Yb(16), x=0, gw=W1st, scr=SCR(pbias16))
    elif p['dil'] != 1: wb = gemm_w
    else: wb = dict(gy=Yb(8), x=Xb(8), gw=W8, scr=SCR(pbias8))                             # jit:avx2
    bwd += [x for x in (wb['gy'], wb['x'], wb['gw'], wb['scr']) if x]
    if bias: bwd.append(Bp)
    bwd += [-x for x in (wb['scr'], wb['x'], wb['gy']) if x]
    if bias: bwd.append(Bp)
    bwd += [Wp, -wb['gw']]
    if bias: bwd.append(-Bp)
    return fwd, bwd

def peak(seq):
    run = pk = 0
    for s in seq: run += s; pk = max(pk, run)
    return pk, run

if __name__ == '__main__':
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    R = [json.loads(l) for l in open(path)]
    nseq = npk = 0; bad = []
    for r in R:
        f, b = predict(r)
        ok = (f == r['fwd'] and b == r['bwd'])
        okp = (peak(f) == peak(r['fwd']) and peak(b) == peak(r['bwd']))
        nseq += ok; npk += okp
        if not ok: bad.append((r, f, b))
    for r, f, b in bad[:40]:
        print({k: r[k] for k in 'N Ci Co S K stride pad dil groups bias xg dim'.split()}, 'mkldnn' if use_mkldnn(r) else 'native')
        if f != r['fwd']: print('   fwd meas', r['fwd'], '\n       pred', f)
        if b != r['bwd']: print('   bwd meas', r['bwd'], '\n       pred', b)
    print(f"exact sequence match: {nseq}/{len(R)} = {nseq/len(R):.4%};  peak+net match: {npk}/{len(R)} = {npk/len(R):.4%};  mismatches: {len(bad)}")
