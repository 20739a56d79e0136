#!/usr/bin/python3
"""The closed-form account of docs/parallelism-truth.md, checked against the measurements
(tests/parallel/expected/*.json): every rule the document states is a function here that
predicts a measured number from the configuration, the model file and, where the rule is a
difference, the single-process reference measured beside the case. Prints each rule with the
number of figures it explains; exits 1 if a prediction misses (0 bytes of slack, except where
the rule names its own).

Usage: /usr/bin/python3 tests/parallel/account.py [--tables]   (--tables: the document's tables)
"""
import argparse
import glob
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED = os.path.join(HERE, "expected")
F32 = 4


def load():
    cases = {}
    for path in sorted(glob.glob(os.path.join(EXPECTED, "*.json"))):
        with open(path) as f:
            d = json.load(f)
        cases[d["case"]] = d
    return cases


def params_of(model):
    """{name: numel} of the model file's parameters, in declaration order."""
    with open(os.path.join(EXPECTED, "models", f"{model}.json")) as f:
        m = json.load(f)
    return {t["name"]: math.prod(t["shape"]) for t in m["ops"]["tensors"] if t["role"] == "TENSOR_ROLE_PARAMETER"}


class Rules:
    def __init__(self):
        self.results = {}  # rule -> [checked, failures]

    def check(self, rule, predicted, measured, where):
        r = self.results.setdefault(rule, [0, []])
        r[0] += 1
        if predicted != measured:
            d = f" ({measured - predicted:+d})" if isinstance(predicted, int) and isinstance(measured, int) else ""
            r[1].append(f"{where}: predicted {predicted}, measured {measured}{d}")


def report(rules):
    """Prints each rule with the figures it was checked on and the first misses; returns the
    number of rules that missed."""
    failed = 0
    for rule, (n, fails) in rules.results.items():
        print(f"{'ok  ' if not fails else 'MISS'} {n:>4} figures  {rule}")
        for f in fails[:int(os.environ.get("ACCOUNT_MISSES", 6))]:
            print(f"           {f}")
        failed += bool(fails)
    return failed


# ------------------------------------------------------------------------------ DDP and ZeRO
def zero_partition(sizes, world):
    """ZeroRedundancyOptimizer._partition_parameters: largest first, each to the rank with the
    smallest total so far (the first such rank)."""
    parts, totals = [[] for _ in range(world)], [0] * world
    for name, n in sorted(sizes.items(), key=lambda kv: -kv[1]):  # stable: declaration order on ties
        r = totals.index(min(totals))
        parts[r].append(name)
        totals[r] += n
    return parts


def optimizer_state(opt, numels):
    """torch.optim (1.13, for-loop) state bytes over parameters of these sizes."""
    if opt in ("adam", "adamw"):
        return sum(2 * F32 * n + F32 for n in numels)  # exp_avg, exp_avg_sq, 0-dim f32 step
    if opt == "momentum":
        return sum(F32 * n for n in numels)  # momentum_buffer
    return 0


def optimizer_transient(opt, numels, first):
    """What the for-loop step allocates beyond the state, at its peak, over the parameters in the
    optimizer's order: Adam/AdamW `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)`
    holds two parameter-sized temporaries while the previous parameter's `denom` is still
    referenced by the loop variable, plus 12 bytes of 0-dim scalars; SGD with momentum 12 bytes
    of scalars in steady state, nothing beyond the state at its first step."""
    if opt in ("adam", "adamw"):
        prev = [0] + list(numels[:-1])
        return F32 * max(2 * n + q for n, q in zip(numels, prev)) + 12 if numels else 0
    if opt == "momentum":
        return 0 if first else 12
    return 0


def account_dp(cases, rules):
    for cid, d in cases.items():
        if not (cid.startswith("ddp/") or cid.startswith("zero/")):
            continue
        cfg, world = d["config"], d["world_size"]
        sizes = params_of(d["model"])
        P = F32 * sum(sizes.values())
        B = P  # one float32 bucket set covers every parameter
        fu = 2 * 4 * len(sizes) if cfg.get("find_unused_parameters") else 0  # int32 local_used_map(_dev)
        view, keep = cfg["gradient_as_bucket_view"], cfg.get("keep_grads", False)
        ref = d["ranks"][0]["reference"]
        for r, rk in enumerate(d["ranks"]):
            w = f"{cid} rank {r}"
            ddp = rk["ddp"]
            rules.check("ddp.buckets: sum of bucket sizes = parameter bytes", B, sum(ddp["bucket_sizes"]), w)
            if ddp["rebuilt_bucket_sizes"]:
                rules.check("ddp.buckets: sum of rebuilt bucket sizes = parameter bytes", B,
                            sum(ddp["rebuilt_bucket_sizes"]), w)
            rules.check("ddp.construct: live after = P + buckets (+ used maps)", P + B + fu,
                        rk["construct"]["live_after"], w)
            zero_buckets = 0
            if cfg.get("zero") and cfg["parameters_as_bucket_view"]:
                part = zero_partition(sizes, world)
                zero_buckets = max(F32 * sum(sizes[n] for n in p) for p in part)
            rules.check("ddp.construct: peak = P + max(flat broadcast copy = P, buckets = P) (+ the largest ZeRO "
                        "parameter bucket)", P + B + fu + zero_buckets, rk["construct"]["peak"], w)
            local = None
            if cfg.get("zero"):
                part = zero_partition(sizes, world)
                rules.check("zero.partition: greedy, largest first, to the least-loaded rank",
                            part, rk["zero_partition"], w)
                local = [sizes[n] for n in part[r]]
            for st in rk["steps"]:
                s = st["step"]
                rf = ref[s - 1]
                e = st["end_of_step"]
                rules.check("ddp.end: parameters = P", P, e["parameters"], w)
                rules.check("ddp.end: gradients = P (view: the buckets themselves)", P, e["gradients"], w)
                other = 0 if view else B + fu
                rules.check("ddp.end: other live = buckets (copy) or 0 (view)", other, st["other_at_end"], w)
                if local is not None:
                    S = optimizer_state(cfg["optimizer"], local)
                    rules.check("zero.state: optimizer state of the rank's partition only", S, e["optimizer_state"], w)
                    before = st["live_at_end"] - (S if s == 1 else 0)
                    before -= 0
                    T = optimizer_transient(cfg["optimizer"], local, s == 1)
                    # Step 1 creates the state inside the step; later steps start with it.
                    live_before_step = P + P + B + (S if s > 1 else 0)
                    rules.check("zero.step: peak = P + G + buckets + local state + local optimizer transient",
                                live_before_step + (S if s == 1 else 0) + T, st["phases"]["OPTIMIZER_STEP"], w)
                    for ph in ("DATA", "FORWARD", "LOSS", "BACKWARD"):
                        # the reference holds the full optimizer state: remove it, add the local one
                        full = rf["end_of_step"]["optimizer_state"] if s > 1 else 0
                        rules.check(f"zero.{ph}: = DDP(copy) figure with the local state for the full one",
                                    rf["phases"][ph] + B + fu - full + (S if s > 1 else 0), st["phases"][ph], w)
                    continue
                for ph, v in st["phases"].items():
                    if not view:
                        extra = 4 if (fu and ph == "BACKWARD") else 0  # _DDPSink's clone of the loss
                        rules.check("ddp.copy: every phase = single-process + buckets", rf["phases"][ph] + B + fu + extra,
                                    v, w)
                    elif keep and s > 1 and ph in ("DATA", "LOSS"):
                        rules.check("ddp.view+keep-grads: data, loss (grads kept, they are the buckets) = single-process",
                                    rf["phases"][ph], v, w)
                    elif keep and s > 2 and ph == "FORWARD":
                        rules.check("ddp.view+keep-grads: data, loss (grads kept, they are the buckets) = single-process",
                                    rf["phases"][ph], v, w)
                    elif ph in ("DATA", "LOSS", "FORWARD") and not (keep and s == 2):
                        rules.check("ddp.view: data, forward, loss (no grads at the start) = single-process + buckets",
                                    rf["phases"][ph] + B, v, w)
                    elif ph == "FORWARD":
                        rules.check("ddp.view+keep-grads: step 2 forward = its start + a second bucket set (rebuild)",
                                    st["phases"]["DATA"] + B, v, w)
                    elif ph == "OPTIMIZER_STEP":
                        rules.check("ddp.view: optimizer step = single-process (grads are the buckets)", rf["phases"][ph],
                                    v, w)
                    elif ph == "BACKWARD" and keep and s > 1:
                        rules.check("ddp.view+keep-grads: backward (steady) = single-process (accumulates in the "
                                    "buckets)", rf["phases"][ph], v, w)
                if view:
                    rules.check("ddp.view: end of step = single-process", rf["live_at_end"], st["live_at_end"], w)


# ------------------------------------------------------------------------------ tensor parallel
TP_DIMS = {"s": 32, "b": 2, "h": 128, "ffn": 512, "heads": 8}


def tp_figures(model, t, sp):
    s, b, h, ffn, a = (TP_DIMS[k] for k in ("s", "b", "h", "ffn", "heads"))
    s_ = s // t if sp else s  # rows a rank holds outside the parallel linears
    if model == "mlp":
        numels = [h, h, ffn // t * h, ffn // t, h * ffn // t, h]
        saved = s_ * b * h + 2 * s_ * b + s_ * b * h + 2 * s * b * ffn // t
        sp_params = [h, h, h]  # ln.w, ln.b, fc2.b
    else:
        numels = [h, h, 3 * h // t * h, 3 * h // t, h * h // t, h]
        saved = 2 * s_ * b * h + 2 * s_ * b + 3 * s * b * h // t + b * (a // t) * s * s + s * b * h // t
        sp_params = [h, h, h]  # ln.w, ln.b, proj.b
    return numels, F32 * saved, F32 * sum(sp_params), F32 * s * b * h


def account_tp(cases, rules):
    for cid, d in cases.items():
        if not cid.startswith("tp/") or d["config"]["model"] in LM:
            continue  # the vocabulary end: account_tp_lm
        cfg, t = d["config"], d["world_size"]
        numels, saved, sp_grads, gathered = tp_figures(cfg["model"], t, cfg["sp"])
        P = F32 * sum(numels)
        S = optimizer_state(cfg["optimizer"], numels)
        for r, rk in enumerate(d["ranks"]):
            w = f"{cid} rank {r}"
            rules.check("tp.saved: closed form per model (sequence-sharded outside the parallel linears under SP)",
                        saved, rk["saved_for_backward"], w)
            rules.check("tp.sp: the global 'mpu' buffer = s*b*h (all-gathered input)",
                        {"mpu": gathered} if cfg["sp"] else {}, rk["global_buffers"], w)
            for st in rk["steps"]:
                e = st["end_of_step"]
                rules.check("tp.end: parameters = sharded weights + replicated norms and row bias", P, e["parameters"], w)
                rules.check("tp.end: gradients = parameters", P, e["gradients"], w)
                rules.check("tp.end: optimizer state over the rank's parameters", S, e["optimizer_state"], w)
                rules.check("tp.end: other live = the global buffer (SP)", gathered if cfg["sp"] else 0,
                            st["other_at_end"], w)
                if cfg["sp"]:
                    before = P + P + (S if st["step"] > 1 else 0) + gathered
                    rules.check("tp.sp: grad sync peak = its start + one flat copy of the replicated grads",
                                before + sp_grads, st["phases"]["GRAD_SYNC"], w)


# ------------------------------------------------------------------------------ the vocabulary end
# tp.py's lm models (tp.MODELS): position embedding ("arange": one [s] arange broadcast over the
# batch; "input": a [b, s] int64 input; None: no table), tied (the head is the table), labels_bs
# (labels given [b, s], transposed to [s, b]; the loss transposed back).
LM = {"lm": {"positions": "arange", "tied": False, "labels_bs": False},
      "lm-tied": {"positions": "input", "tied": True, "labels_bs": True},
      "lm-rope": {"positions": None, "tied": False, "labels_bs": True}}
LM_VOCAB = 256


def lm_terms(model, t, sp):
    """The sizes the vocabulary-end rules are written in (bytes unless named numels): N tokens,
    A = one [s, b, h] float32 activation, As = its sequence shard under SP (else A)."""
    c, (s, b, h) = LM[model], (TP_DIMS[k] for k in ("s", "b", "h"))
    N, Vt = s * b, LM_VOCAB // t
    Ns = N // t if sp else N
    numels = [Vt * h] + ([s * h] if c["positions"] else []) + [h, h] + ([] if c["tied"] else [Vt * h])
    return {"N": N, "Vt": Vt, "Ns": Ns, "A": F32 * N * h, "As": F32 * Ns * h, "numels": numels,
            "inputs": 8 * N * (3 if c["positions"] == "input" else 2),  # ids, labels (and positions)
            "arange": 8 * s if c["positions"] == "arange" else 0,       # the [s] position ids
            "pos_out": {"arange": F32 * s * h, "input": F32 * N * h, None: 0}[c["positions"]],
            # the grads the embedding's backward runs beside: the head's (its own, or the pending
            # contribution to the tied table), the position table's and the norm's
            "grads_before_emb": F32 * (Vt * h + (s * h if c["positions"] else 0) + 2 * h)}


def lm_figures(model, t, sp):
    """Saved bytes and the forward's live set past its inputs, from the source (tp_vocab.py,
    docs/parallelism-truth.md 3.1): VocabParallelEmbedding keeps its masked ids (int64) and mask
    (bool), 9N; the LayerNorm its input, mean and rstd; the head its input (the LayerNorm's
    output); the cross entropy the softmax (the float32 logits themselves), the target mask and
    the masked target, 4 N V/t + 9N."""
    k = lm_terms(model, t, sp)
    N, Ns, As = k["N"], k["Ns"], k["As"]
    pos_saved = k["arange"] + (8 * N if LM[model]["positions"] == "input" else 0)
    saved = 9 * N + pos_saved + 2 * As + 8 * Ns + F32 * N * k["Vt"] + 9 * N
    # live when the forward ends, beyond the step's start: the saved tensors but the inputs
    fwd_end = 9 * N + k["arange"] + 2 * As + 8 * Ns + F32 * N * k["Vt"]
    # the embedding stage's peak: the table's output A (all-reduced in place) and the position
    # embedding's output, both still referenced while the sum (A) is made; without a position
    # table the transpose's contiguous copy beside the (un-reduced under SP) output
    emb = 9 * N + k["arange"] + 2 * k["A"] + k["pos_out"]
    return k, saved, fwd_end, emb


# _VocabParallelCrossEntropy.forward at its peak, past the logits (float32, worked on in place):
# logits_max 4N, target_mask N, masked_target 8N, then either arange_1d 8N with the gathered
# logits 4N and their clone 4N (cross_entropy.py 55-57), or predicted_logits 4N, sum_exp_logits 4N,
# log's temporary 4N and the loss 4N (74): 29N either way.
CE_PEAK = 29


def account_tp_lm(cases, rules):
    for cid, d in cases.items():
        if not cid.startswith("tp/") or d["config"]["model"] not in LM:
            continue
        cfg, t, model = d["config"], d["world_size"], d["config"]["model"]
        sp = cfg["sp"]
        k, saved, fwd_end, emb = lm_figures(model, t, sp)
        N, A = k["N"], k["A"]
        P = F32 * sum(k["numels"])
        S = optimizer_state(cfg["optimizer"], k["numels"])
        mpu = A if sp else 0
        for r, rk in enumerate(d["ranks"]):
            w = f"{cid} rank {r}"
            rules.check("lm.saved: embedding 9N (+ position ids) + LayerNorm and head inputs + softmax 4N V/t "
                        "+ 9N", saved, rk["saved_for_backward"], w)
            rules.check("lm.sp: the global 'mpu' buffer = s*b*h (the head's gathered input)",
                        {"mpu": mpu} if sp else {}, rk["global_buffers"], w)
            for st in rk["steps"]:
                e, ph, first = st["end_of_step"], st["phases"], st["step"] == 1
                rules.check("lm.end: parameters = wte [V/t, h] (+ wpe) + norm (+ untied head [V/t, h])",
                            P, e["parameters"], w)
                rules.check("lm.end: gradients = parameters (a tied table's two contributions summed in "
                            "one)", P, e["gradients"], w)
                rules.check("lm.end: optimizer state over the rank's parameters", S, e["optimizer_state"], w)
                rules.check("lm.end: other live = the global buffer (SP)", mpu, st["other_at_end"], w)
                start = P + (0 if first else S + mpu) + k["inputs"]
                rules.check("lm.data: P (+ S, + mpu) + ids and labels (+ position ids)", start, ph["DATA"], w)
                end = start + fwd_end + (mpu if first else 0)
                rules.check("lm.forward: max(embedding stage, forward's end)", max(start + emb, end),
                            ph["FORWARD"], w)
                extra = 8 * N if LM[model]["labels_bs"] else 0  # labels.transpose(0, 1).contiguous()
                rules.check("lm.loss: forward's end (+ the [s, b] labels copy) + 29N", end + extra + CE_PEAK * N,
                            ph["LOSS"], w)
                # + 8: the loss and its seed (ones_like); + 4: IndexPutBackward's 0-dim zeros_like
                bwd = (P + (0 if first else S) + mpu + k["inputs"] + 8 + 9 * N + k["grads_before_emb"] +
                       4 * A + 4)
                rules.check("lm.backward: at the embedding's CopySlices: its incoming gradient and three "
                            "copies (4A), the other grads, the loss and its seed", bwd, ph["BACKWARD"], w)
                if sp:
                    rules.check("lm.sp: grad sync peak = its start + one flat copy of the norm's grads",
                                P + P + (0 if first else S) + mpu + F32 * 2 * TP_DIMS["h"], ph["GRAD_SYNC"], w)
                rules.check("lm.step: P + G + S (+ mpu) + Adam's for-loop transient",
                            P + P + S + mpu + optimizer_transient(cfg["optimizer"], k["numels"], first),
                            ph["OPTIMIZER_STEP"], w)


# ------------------------------------------------------------------------------ pipeline
def pp_in_flight(schedule, p, rank, m):
    """Micro-batches whose activations a stage holds at its second backward (B1): GPipe m - 1;
    1F1B min(p - rank, m), less one if B1 falls in the cool-down (m - warmup < 2)."""
    if schedule == "gpipe":
        return m - 1
    warmup = min(p - rank - 1, m)
    return p - rank if m - warmup >= 2 else p - rank - 1


def account_pp(cases, rules, r0):
    blocks_per = {}
    for cid, d in cases.items():
        if not cid.startswith("pp/") or cid.startswith("pp/interleaved/"):
            continue
        cfg, p = d["config"], d["world_size"]
        keep = not cfg.get("deallocate_outputs", True)
        for r, rk in enumerate(d["ranks"]):
            w = f"{cid} stage {r}"
            st0 = rk["stage"]
            nblocks = st0["blocks"][1] - st0["blocks"][0]
            blocks_per[(p, r)] = nblocks
            kind = "first" if st0["first"] else ("last" if st0["last"] else "middle")
            A = rk["saved_per_microbatch"]
            out = F32 * cfg["batch"] * 16 * 64  # [b, t, d] float32
            # per micro-batch beyond A: 8 B per block (the 0-dim f64 of `scores / sqrt(hd)` autograd
            # keeps) and 4 B (the 1-element stub deallocate_output_tensor leaves), or the whole
            # output when outputs are kept
            # the last stage's output is the loss: nothing beyond A when kept, the 4-byte stub otherwise
            delta = 8 * nblocks + ((0 if st0["last"] else out) if keep else 4)
            s2 = rk["steps"][1]
            k = pp_in_flight(cfg["schedule"], p, r, cfg["microbatches"])
            rules.check("pp.in_flight: at B1, GPipe m - 1, 1F1B min(p - rank, m)", k, s2["in_flight_at_peak"], w)
            rules.check("pp.peak: steady-state peak is at B1", "B1", s2["peak_phase"], w)
            pgs = sum(s2["end_of_step"].values())
            rules.check("pp.peak: = P + G + S + k * (A + per-micro-batch extra) + R0(stage kind)",
                        pgs + k * (A + delta) + r0[kind], s2["peak"], w)


PP_R0 = {"first": 106752, "middle": 114944, "last": 147204}

# R0 of a chunk's backward, beyond its own A, the previous input gradient and a held output:
# any chunk but the head 106,752 (the first stage's R0: the received output gradient 8,192 and the
# last block's MLP projection gradients 98,560); the head chunk 139,008 (the last stage's R0
# 147,204 less the previous input gradient 8,192 and 4 B: the interleaved loop never
# deallocates the loss, output_tensor = None on the last virtual stage).
PPI_R0 = {"chunk": 106752, "head": 139008}


def interleaved_order(p, rank, v, m):
    """Megatron's interleaved order with microbatch_group_size_per_vp_stage = p, in closed form:
    virtual micro-batch k is micro-batch (k // pv) p + k % p on chunk (k % pv) // p (backward:
    chunk v - 1 - that); (p - rank - 1) 2 + (v - 1) p forwards first. [(forward, j, chunk)]."""
    def at(k, fwd):
        c = (k % (p * v)) // p
        return fwd, k // (p * v) * p + k % p, c if fwd else v - 1 - c
    total = m * v
    warmup = min((p - rank - 1) * 2 + (v - 1) * p, total)
    out, f, b = [at(k, True) for k in range(warmup)], warmup, 0
    while f < total:
        out += [at(f, True), at(b, False)]
        f, b = f + 1, b + 1
    return out + [at(k, False) for k in range(b, total)]


def account_pp_interleaved(cases, rules):
    """Interleaved 1F1B (pp.py Stage.interleaved). A_c = chunk c's saved bytes per micro-batch;
    the backward phases B<j>c<c> of step 2 once every chunk has run a backward (so that every
    gradient exists) are predicted from the order alone: those of the 1F1B part on every rank,
    those of the cool-down on every rank but the last (docs/parallelism-truth.md 4.1)."""
    ref = cases.get("pp/1f1b/p4/m8")
    per_block = ref["ranks"][1]["saved_per_microbatch"] // 2  # a middle stage of 2 blocks
    emb = ref["ranks"][0]["saved_per_microbatch"] - 2 * per_block
    head = ref["ranks"][3]["saved_per_microbatch"] - 2 * per_block
    for cid, d in cases.items():
        if not cid.startswith("pp/interleaved/"):
            continue
        cfg, p = d["config"], d["world_size"]
        v, m = cfg["virtual_stages"], cfg["microbatches"]
        out = F32 * cfg["batch"] * 16 * 64  # a sent activation [b, t, d]
        for r, rk in enumerate(d["ranks"]):
            w = f"{cid} stage {r}"
            blocks = [hi - lo for lo, hi in rk["stage"]["chunks"]]
            is_head = [r == p - 1 and c == v - 1 for c in range(v)]
            a = [per_block * blocks[c] + (emb if r == 0 and c == 0 else 0) + (head if is_head[c] else 0)
                 for c in range(v)]
            rules.check("ppi.saved: a chunk saves what its blocks save in the non-interleaved stages "
                        "(+ the embeddings, + the head and loss)", a, rk["saved_per_chunk"], w)
            order = interleaved_order(p, r, v, m)
            warmup = min((p - r - 1) * 2 + (v - 1) * p, m * v)
            s2 = rk["steps"][1]
            rules.check("ppi.in_flight: warm-up + 1 chunk-micro-batches at the steady peak, "
                        "(p - rank - 1) 2 + (v - 1) p + 1", warmup + 1, s2["in_flight_at_peak"], w)
            pgs = sum(s2["end_of_step"].values())
            # The loop variable output_tensor keeps the step's last forward's stub, whose graph's
            # AccumulateGrad keeps that forward's received input (and, once its backward has run,
            # the input's retained .grad) to the end of the schedule: + 4 B + 2 activations (one
            # when that .grad is the previous input gradient, counted already).
            last_f = [(j, c) for fwd, j, c in order if fwd][-1]
            inflight, seen_b, predicted = [], set(), {}
            prev_grad = after_last = prev_is_last = False
            for i, (fwd, j, c) in enumerate(order):
                if fwd:
                    inflight.append(c)
                    continue
                label = f"B{j}c{c}"
                steady = order[i - 1][0]  # a forward just before: the 1F1B part
                held = steady and not is_head[order[i - 1][2]]  # its output not yet deallocated
                if len(seen_b) == v and (steady or r < p - 1):
                    tail = 2 * out + 4 - (out if prev_is_last else 0) if after_last else 0
                    predicted[label] = (pgs + sum(a[x] + 8 * blocks[x] + 4 for x in inflight) +
                                        (PPI_R0["head"] if is_head[c] else PPI_R0["chunk"]) +
                                        (out if prev_grad else 0) + (out - 4 if held else 0) + tail)
                    rules.check("ppi.backward: P + G + S + sum over chunk-micro-batches in flight of "
                                "(A_c + 8 B per block + 4) + R0 (head chunk or other) + the previous "
                                "input gradient + the forward output not yet deallocated (1F1B part) "
                                "+ the last forward's stub, input and its gradient (cool-down)",
                                predicted[label], s2["phases"][label], f"{w} {label}")
                seen_b.add(c)
                inflight.remove(c)
                prev_grad = not (r == 0 and c == 0)  # rank 0's chunk 0 sends no gradient
                prev_is_last = (j, c) == last_f
                after_last = after_last or prev_is_last
            top = max(predicted, key=lambda k: predicted[k])
            rules.check("ppi.peak: the steady peak is the largest predicted backward", predicted[top],
                        s2["peak"], w)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", action="store_true", help="print the document's tables")
    args = ap.parse_args()
    cases = load()
    rules = Rules()
    account_dp(cases, rules)
    account_tp(cases, rules)
    account_tp_lm(cases, rules)
    account_pp(cases, rules, PP_R0)
    account_pp_interleaved(cases, rules)
    failed = report(rules)
    if args.tables:
        tables(cases)
    return 1 if failed else 0


def _peak(st):
    ph = max(st["phases"], key=lambda k: st["phases"][k])
    return f"{st['phases'][ph]:,} ({ph.lower().replace('optimizer_step', 'step')})"


def tables(cases):
    """Markdown tables of the measured figures (one row per case and distinct rank)."""
    groups = [("ddp/", "DDP"), ("zero/", "ZeroRedundancyOptimizer"), ("tp/", "Tensor parallel"),
              ("pp/", "Pipeline")]
    for prefix, title in groups:
        print(f"\n{title}\n")
        if prefix == "pp/":
            print("| case | stage | blocks | A (saved/micro-batch) | step 1 peak | steady peak (phase, in flight) "
                  "| P / G / S at end |")
            print("|---|---|---|---|---|---|---|")
        else:
            print("| case | rank | saved | step 1 peak (phase) | steady peak (phase) | P / G / S at end | other at end |")
            print("|---|---|---|---|---|---|---|")
        for cid, d in cases.items():
            if not cid.startswith(prefix):
                continue
            seen = []
            for r, rk in enumerate(d["ranks"]):
                key = json.dumps({k: v for k, v in rk.items() if k not in ("unseen_frees", "reference")},
                                 sort_keys=True)
                if key in seen:
                    continue
                seen.append(key)
                first, last = rk["steps"][0], rk["steps"][-1]
                e = last["end_of_step"]
                pgs = f"{e['parameters']:,} / {e['gradients']:,} / {e['optimizer_state']:,}"
                same = [i for i, x in enumerate(d["ranks"]) if json.dumps(
                    {k: v for k, v in x.items() if k not in ("unseen_frees", "reference")}, sort_keys=True) == key]
                ranks = ",".join(map(str, same)) if len(same) < len(d["ranks"]) else "all"
                if prefix == "pp/":
                    st = rk["stage"]
                    spans = st["chunks"] if "chunks" in st else [st["blocks"]]
                    print(f"| {cid} | {ranks} | {', '.join(f'{lo}-{hi - 1}' for lo, hi in spans)}"
                          f"{' +emb' if st['first'] else ''}{' +head' if st['last'] else ''} | "
                          f"{rk['saved_per_microbatch']:,} | {first['peak']:,} ({first['peak_phase']}) | "
                          f"{last['peak']:,} ({last['peak_phase']}, {last['in_flight_at_peak']}) | {pgs} |")
                else:
                    print(f"| {cid} | {ranks} | {rk['saved_for_backward']:,} | {_peak(first)} | {_peak(last)} | "
                          f"{pgs} | {last['other_at_end']:,} |")


if __name__ == "__main__":
    sys.exit(main())
