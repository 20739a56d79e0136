#!/usr/bin/python3
"""The FSDP2 rules of docs/parallelism-truth.md ("FSDP2 (fully_shard), measured on PyTorch 2.x"),
each checked against every figure of tests/parallel/expected/fsdp2_*.json that it names. Needs
no PyTorch (it reads the expected files):

  python3 tests/parallel/fsdp2_account.py [--tables]

Prints `ok N figures RULE` per rule (MISS and the first failures when a figure disagrees) and
exits 1 on a miss; --tables prints the document's tables.

Notation (per case, rank r): W the world size (HSDP: the shard group's size); for every FSDP2 group g (root = embeddings,
final LayerNorm and head; h.0..h.2 the blocks) n_g = sum over its parameters of
ceil(dim0 / W) * (numel / dim0), the padded shard, m_g = its parameters' numel, l_g(r) the
rows rank r really holds times the rest; b_p the bytes of the parameter dtype (2 for bf16,
else 4), b_r of the reduce dtype (4 in every case). P = 4 sum n_g, G = b_r sum n_g,
S = 8 sum l_g(r) + 4 * 41 (AdamW's exp_avg, exp_avg_sq and a 4-byte step per parameter).
"""
import argparse
import glob
import json
import os
import re
import sys

from account import Rules, report  # the same rule bookkeeping as the 1.13 truth

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED = os.path.join(HERE, "expected")
GROUPS = ("root", "h.0", "h.1", "h.2")   # forward order
POST_FORWARD = ("h.0", "h.1", "h.2", "root")  # the order of post_forward (FSDPCommContext.post_forward_order)
PHASES = ("DATA", "FORWARD", "LOSS", "BACKWARD", "OPTIMIZER_STEP")


def param_shapes(dims, vocab):
    d, t = dims["d"], dims["t"]
    block = [(d,), (d,), (3 * d, d), (3 * d,), (d, d), (d,), (d,), (d,), (4 * d, d), (4 * d,), (d, 4 * d), (d,)]
    out = {"root": [(vocab, d), (t, d), (d,), (d,), (vocab, d)]}
    for i in range(dims["layers"]):
        out[f"h.{i}"] = block
    return out


def shard_ranks(doc):
    """W of the formulas: the ranks a parameter is sharded over (HSDP: the shard group's)."""
    return doc["config"].get("shard") or doc["world_size"]


def sizes(doc, rank):
    """{group: (n_g, m_g, l_g(rank), #params)} for the case's model and world size; under HSDP
    rank r holds shard r mod W (the mesh is replicate x shard)."""
    W = shard_ranks(doc)
    rank %= W
    out = {}
    for g, shapes in param_shapes(doc["dims"], doc["config"]["vocab"]).items():
        n = m = loc = 0
        for s in shapes:
            rest = 1
            for x in s[1:]:
                rest *= x
            rows = -(-s[0] // W)
            n += rows * rest
            m += s[0] * rest
            loc += max(0, min(rows, s[0] - rank * rows)) * rest
        out[g] = (n, m, loc, len(shapes))
    return out


def load():
    docs = {}
    for path in sorted(glob.glob(os.path.join(EXPECTED, "fsdp2_*.json"))):
        with open(path) as f:
            d = json.load(f)
        ranks = d["ranks"]
        d["ranks"] = [ranks[r["same_as_rank"]] if "same_as_rank" in r else r for r in ranks]
        docs[d["case"]] = d
    return docs


def kind(name):
    """'all-gather buffer h.1' -> ('all-gather buffer', 'h.1'); FSDP2's and gloo's names."""
    name = name.split(" = ")[0]
    m = re.match(r"(.*) (root|h\.\d)$", name)
    return (m.group(1), m.group(2)) if m else (name, None)


def account(docs, rules):
    for cid, d in docs.items():
        cfg, W = d["config"], shard_ranks(d)
        bp = 2 if cfg["param_dtype"] == "bfloat16" else 4
        br = 4
        for r, rk in enumerate(d["ranks"]):
            w = f"{cid} rank {r}"
            sz = sizes(d, r)
            nparams = sum(v[3] for v in sz.values())
            P = 4 * sum(v[0] for v in sz.values())
            S = 8 * sum(v[2] for v in sz.values()) + 4 * nparams
            full = 4 * sum(v[1] for v in sz.values())
            rules.check("construct: after = P; peak = the whole model + the largest group's shards (the group being "
                        "sharded still holds its originals)", [P, full + 4 * max(v[0] for v in sz.values())],
                        [rk["construct"]["live_after"], rk["construct"]["peak"]], w)
            for st in rk["steps"]:
                e = st["end_of_step"]
                rules.check("end: parameters = P (padded shards, orig dtype)", P, e["parameters"], w)
                rules.check("end: gradients = G (one flat reduce-scatter output per group)", br * P // 4,
                            e["gradients"], w)
                rules.check("end: optimizer state = S (unpadded local shards)", S, e["optimizer_state"], w)
                rules.check("end: nothing else is live", P + br * P // 4 + S, st["live_at_end"], w)
            check_sizes(rk, sz, W, bp, br, cfg, rules, w)
            check_lifetimes(rk, cfg, rules, w)
            check_peaks(rk, sz, W, bp, br, P, S, cfg, rules, w)


SIZE_RULES = {  # kind: (closed form, bytes(n_g, m_g, W, b_p, b_r))
    "all-gather buffer": ("b_p * W * n_g", lambda n, m, W, bp, br: bp * W * n),
    "unsharded param": ("b_p * W * n_g (padded)", lambda n, m, W, bp, br: bp * W * n),
    "copy-in temporary": ("b_p * n_g", lambda n, m, W, bp, br: bp * n),
    "unsharded grad": ("b_p * m_g (unpadded, the parameter dtype)", lambda n, m, W, bp, br: bp * m),
    "reduce-scatter input": ("b_r * W * n_g", lambda n, m, W, bp, br: br * W * n),
    "reduce-scatter output": ("b_r * n_g", lambda n, m, W, bp, br: br * n),
    "gloo all-gather: flat output copy for the flight recorder": ("b_p * W * n_g", lambda n, m, W, bp, br: bp * W * n),
    "gloo all-gather: worker's flat output": ("b_p * W * n_g", lambda n, m, W, bp, br: bp * W * n),
    "gloo reduce-scatter: clone of the input": ("b_r * W * n_g", lambda n, m, W, bp, br: br * W * n),
}


def check_sizes(rk, sz, W, bp, br, cfg, rules, w):
    """Every FSDP2 buffer and gloo copy the trace names, against its closed form: per group and
    phase, the bytes of all such allocations = the closed form times the micro-batches."""
    totals = {}
    for name, nb, count, made, _, _, _ in rk["lifetimes"]:
        k, g = kind(name)
        if k in SIZE_RULES and g:
            totals[(k, g, made)] = totals.get((k, g, made), 0) + nb
    for (k, g, made), nb in totals.items():
        form, f = SIZE_RULES[k]
        rules.check(f"size: {k} = {form}", f(sz[g][0], sz[g][1], W, bp, br) * cfg["microbatches"], nb,
                    f"{w} {g} {made}")


def nxt(g, order):
    i = order.index(g)
    return order[i + 1] if i + 1 < len(order) else None


def check_lifetimes(rk, cfg, rules, w):
    """When FSDP2's buffers are freed: the op path the profiler saw around each free."""
    raf = cfg["reshard_after_forward"]
    fwd = list(GROUPS)
    bwd = ["h.2", "h.1", "h.0", "root"]
    for name, nb, count, made, where, freed, fwhere in rk["lifetimes"]:
        k, g = kind(name)
        ph = made.split(".")[1]
        at = f"{w} {name} made {made}"
        if k == "all-gather buffer" and ph == "FORWARD":
            n = nxt(g, fwd)
            rules.check("forward: a group's all-gather buffer is freed in the NEXT group's pre_forward, after that "
                        "group's all-gather and before its copy-out; the last block's at the root's post-forward",
                        f"FSDP::pre_forward ({n})" if n else "-", fwhere, at)
        elif k == "all-gather buffer" and ph == "BACKWARD":
            rules.check("backward: a prefetched all-gather buffer is freed in its own group's pre_backward, right "
                        "after its copy-out", f"FSDP::pre_backward ({g})", fwhere.split(" > ", 1)[-1], at)
            by = nxt(g, POST_FORWARD)
            rules.check("backward: group g is prefetched (all-gathered, not copied out) by the pre_backward of the "
                        "group after it in post-forward order h.0, h.1, h.2, root (the root prefetches the last "
                        "block)",
                        f"FSDP::pre_backward{'' if by == 'root' else f' ({by})'} > FSDP::backward_prefetch for {g}",
                        " > ".join(where.split(" > ")[1:3]), at)
        elif k == "unsharded param" and g != "root" and ph == "FORWARD":
            rules.check("forward: a block's unsharded parameters are freed at its post_forward "
                        "(reshard_after_forward=True), else at its post_backward",
                        f"FSDP::post_forward ({g})" if raf else f"FSDP::post_backward_reshard ({g})",
                        fwhere.split(" > ")[-1], at)
        elif k == "unsharded param" and g != "root" and ph == "BACKWARD":
            rules.check("backward: a block's unsharded parameters are freed at its post_backward",
                        f"FSDP::post_backward_reshard ({g})", fwhere.split(" > ")[-1], at)
        elif k == "unsharded param" and g == "root":
            rules.check("root: gathered once at the root's pre_forward, freed only in the final backward callback",
                        ("FORWARD", "FSDP::root_post_backward_callback > FSDP::post_backward_reshard"), (ph, fwhere), at)
        elif k == "reduce-scatter input":
            n = nxt(g, bwd)
            exp = "FSDP::root_post_backward_callback" if g == "root" else \
                f"FSDP::post_backward_rs_wait ({'' if n == 'root' else n})"
            rules.check("backward: a group's reduce-scatter input lives until the next group's post_backward "
                        "(rs_wait, before that group's own reduce-scatter); the root's until the end of backward",
                        exp, fwhere.split(" > ")[-1] if g != "root" else fwhere, at)
        elif k == "reduce-scatter output" and " = sharded grad" in name:
            rules.check("backward: the reduce-scatter output IS the sharded gradient (views), kept past the step "
                        "until the next zero_grad(set_to_none=True)", True,
                        freed is None or (freed.endswith(".END") and "zero_grad" in fwhere), at)
        elif k == "reduce-scatter output":
            rules.check("accumulation: a later micro-batch's reduce-scatter output is added (+=) into the sharded "
                        "gradient and freed in the same post_backward", f"FSDP::post_backward_reduce{'' if g == 'root' else f' ({g})'}",
                        fwhere.split(" > ")[-1], at)
        elif k == "copy-in temporary":
            rules.check("mixed precision: the copy-in temporary is freed when the all-gather returns",
                        f"FSDP::all_gather{'' if g == 'root' else f' ({g})'}", fwhere.split(" > ")[-1], at)
        elif k.startswith("gloo"):
            op = {"gloo all-gather: flat output copy for the flight recorder": "c10d::_allgather_base_",
                  "gloo all-gather: worker's flat output": "gloo:all_gather",
                  "gloo reduce-scatter: clone of the input": f"FSDP::post_backward_reduce{'' if g == 'root' else f' ({g})'}",
                  "gloo all-reduce (AVG): divisor scalars": "gloo:all_reduce"}[k]
            rules.check("gloo: every copy it makes is freed inside the collective", True, op in (fwhere or ""), at)


def fsdp_terms(live):
    """The FSDP2 buffers of a live set, by kind and group (gloo's and the optimizer's left in)."""
    out = {}
    for name, nb in live.items():
        if name.startswith(("activation", "temporary", "input")):
            continue
        out[name.split(" = ")[0]] = nb
    return out


def check_peaks(rk, sz, W, bp, br, P, S, cfg, rules, w):
    """Which FSDP2 buffers are live at each phase's peak, without gloo's copies (as on NCCL)."""
    raf, mb = cfg["reshard_after_forward"], cfg["microbatches"]
    U = {g: bp * W * sz[g][0] for g in GROUPS}
    for st in rk["steps"]:
        if "at_peak_without_gloo" not in st:
            continue
        s = st["step"]
        at = st["at_peak_without_gloo"]
        state = s > 1
        grads = mb > 1  # the second micro-batch holds the first one's sharded gradients
        base = {f"sharded param {g}": 4 * sz[g][0] for g in GROUPS}
        if state:
            base.update({"optimizer state exp_avg": (S - 164) // 2, "optimizer state exp_avg_sq": (S - 164) // 2,
                         "optimizer state step": 164})
        sg = {f"reduce-scatter output {g}": br * sz[g][0] for g in GROUPS} if grads else {}
        fwd = dict(base, **sg, **{"unsharded param root": U["root"], "all-gather buffer h.2": U["h.2"],
                                  "unsharded param h.2": U["h.2"]})
        if not raf:
            fwd.update({"unsharded param h.0": U["h.0"], "unsharded param h.1": U["h.1"]})
        rules.check("peak FORWARD (no gloo): P + [S] + root unsharded + the last block's all-gather buffer and "
                    "unsharded parameters (+ every block's unsharded parameters without reshard_after_forward) "
                    "+ activations", fwd, fsdp_terms(at["FORWARD"]), f"{w} step {s}")
        loss = dict(base, **sg, **{"unsharded param root": U["root"]})
        if not raf:
            loss.update({f"unsharded param {g}": U[g] for g in GROUPS[1:]})
        rules.check("peak LOSS: P + [S] + root unsharded (+ every block's without reshard_after_forward) "
                    "+ activations", loss, fsdp_terms(at["LOSS"]), f"{w} step {s}")
        opt = dict(base, **{f"reduce-scatter output {g}": br * sz[g][0] for g in GROUPS})
        opt.update({"optimizer state exp_avg": (S - 164) // 2, "optimizer state exp_avg_sq": (S - 164) // 2,
                    "optimizer state step": 164})
        rules.check("peak OPTIMIZER_STEP: P + G + S (+ foreach AdamW's temporaries, see the document)", opt,
                    fsdp_terms(at["OPTIMIZER_STEP"]), f"{w} step {s}")
        bk = {k: v for k, v in fsdp_terms(at["BACKWARD"]).items() if not k.startswith("unsharded grad")}
        if raf:
            exp = dict(base, **sg)
            exp.update({"unsharded param root": U["root"], "all-gather buffer h.0": U["h.0"],
                        "unsharded param h.1": U["h.1"], "reduce-scatter input h.2": br * W * sz["h.2"][0],
                        "reduce-scatter output h.2": br * sz["h.2"][0]})
            rule = ("peak BACKWARD (no gloo), blocks resharded: during the middle block's backward: P + [S] + root "
                    "unsharded + h.1 unsharded + h.0's prefetched all-gather buffer + h.2's reduce-scatter input "
                    "and output + unsharded gradients (root's head and final norm, most of h.1's) + activations")
        else:
            exp = dict(base, **sg, **{f"unsharded param {g}": U[g] for g in GROUPS})
            rule = ("peak BACKWARD (no gloo), blocks kept unsharded: during the last block's backward: P + [S] + "
                    "every group unsharded + unsharded gradients (root's head and final norm, most of h.2's) "
                    "+ activations")
        rules.check(rule, exp, bk, f"{w} step {s}")

        # The same peaks with gloo's copies: both are reached inside an all-gather, at the
        # flight recorder's flat copy (c10d::_allgather_base_), except without
        # reshard_after_forward, where backward gathers nothing and the peak is the last block's
        # reduce-scatter (its input and gloo's clone of it).
        ga = st["at_peak"]
        mp = cfg["param_dtype"] is not None
        fr = "gloo all-gather: flat output copy for the flight recorder"
        fwd_g = dict(base, **sg, **{"unsharded param root": U["root"], "all-gather buffer h.1": U["h.1"],
                                    "all-gather buffer h.2": U["h.2"], f"{fr} h.2": U["h.2"]})
        if mp:
            fwd_g["copy-in temporary h.2"] = bp * sz["h.2"][0]
        if not raf:
            fwd_g.update({"unsharded param h.0": U["h.0"], "unsharded param h.1": U["h.1"]})
        rules.check("peak FORWARD (gloo): at the last block's all-gather: P + [S] + root unsharded + h.1's "
                    "all-gather buffer (not yet freed) + h.2's + gloo's flat copy of it (+ the copy-in "
                    "temporary under mixed precision)", fwd_g, fsdp_terms(ga["FORWARD"]), f"{w} step {s}")
        if raf:
            bk_g = dict(base, **sg)
            bk_g.update({"unsharded param root": U["root"], "all-gather buffer h.0": U["h.0"],
                         f"{fr} h.0": U["h.0"], "unsharded param h.1": U["h.1"],
                         "reduce-scatter input h.2": br * W * sz["h.2"][0],
                         "reduce-scatter output h.2": br * sz["h.2"][0]})
            if mp:
                bk_g["copy-in temporary h.0"] = bp * sz["h.0"][0]
            rule = ("peak BACKWARD (gloo), blocks resharded: at h.1's prefetch of h.0: P + [S] + root unsharded + "
                    "h.1 unsharded + h.0's all-gather buffer + gloo's flat copy of it + h.2's reduce-scatter "
                    "input and output + the root's unsharded head and norm gradients + activations")
        else:
            bk_g = dict(base, **sg)
            bk_g.update({f"unsharded param {g}": U[g] for g in GROUPS[:3]})
            bk_g.update({"reduce-scatter input h.2": br * W * sz["h.2"][0],
                         "gloo reduce-scatter: clone of the input h.2": br * W * sz["h.2"][0],
                         "reduce-scatter output h.2": br * sz["h.2"][0],
                         "gloo all-reduce (AVG): divisor scalars h.2": 12})
            rule = ("peak BACKWARD (gloo), blocks kept unsharded: in h.2's reduce-scatter: P + [S] + root, h.0, "
                    "h.1 unsharded + h.2's reduce-scatter input, gloo's clone of it and the output + the root's "
                    "unsharded head and norm gradients + activations")
        rules.check(rule, bk_g, {k: v for k, v in fsdp_terms(ga["BACKWARD"]).items()
                                 if not k.startswith("unsharded grad")}, f"{w} step {s}")

        # Whole figures where no activation is live.
        n_in = 2 * 8 * 4 * 16  # the batch's token ids and targets, int64 [4, 16] each
        G = br * sum(sz[g][0] for g in GROUPS)
        rules.check("peak DATA = P + [S] + [G, second micro-batch] + the batch", P + (S if state else 0)
                    + (G if grads else 0) + n_in, st["phases"]["DATA"], f"{w} step {s}")
        tr = 0 if cfg["optimizer"] == "adamw-fused" else (S - 164) // 2
        rules.check("peak OPTIMIZER_STEP = P + G + S + 12 B + (foreach: one local-shard-sized temporary per "
                    "parameter, sum = S_local = 4 sum l_g: exp_avg_sq.sqrt(); fused: none), both views, every step",
                    [P + G + S + tr + 12] * 2,
                    [st["phases"]["OPTIMIZER_STEP"], st["phases_without_gloo"]["OPTIMIZER_STEP"]], f"{w} step {s}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", action="store_true")
    args = ap.parse_args()
    docs = load()
    rules = Rules()
    account(docs, rules)
    failed = report(rules)
    if args.tables:
        tables(docs)
    return 1 if failed else 0


def tables(docs):
    print("\n| case | rank | saved | step 1 peak (phase) | steady: FORWARD | LOSS | BACKWARD | OPTIMIZER_STEP "
          "| steady peak without gloo (phase) | P / G / S at end |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for cid, d in docs.items():
        seen = []
        for r, rk in enumerate(d["ranks"]):
            key = json.dumps({k: v for k, v in rk.items() if k != "lifetimes"}, sort_keys=True)
            if key in seen:
                continue
            seen.append(key)
            same = [i for i, x in enumerate(d["ranks"])
                    if json.dumps({k: v for k, v in x.items() if k != "lifetimes"}, sort_keys=True) == key]
            ranks = ",".join(map(str, same)) if len(same) < len(d["ranks"]) else "all"
            first, last = rk["steps"][0], rk["steps"][-1]
            ph, nc = last["phases"], last["phases_without_gloo"]
            top = max(nc, key=nc.get)
            e = last["end_of_step"]
            print(f"| {cid} | {ranks} | {rk['saved_for_backward']:,} | {first['peak']:,} "
                  f"({first['peak_phase'].lower().replace('optimizer_step', 'step')}) | "
                  + " | ".join(f"{ph[p]:,}" for p in PHASES[1:]) +
                  f" | {nc[top]:,} ({top.lower().replace('optimizer_step', 'step')}) | "
                  f"{e['parameters']:,} / {e['gradients']:,} / {e['optimizer_state']:,} |")


if __name__ == "__main__":
    sys.exit(main())
