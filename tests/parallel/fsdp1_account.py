#!/usr/bin/python3
"""The FSDP1 rules of docs/parallelism-truth.md ("FSDP1, measured on PyTorch 2.15"), each checked
against every figure of tests/parallel/expected/fsdp1_*.json that it names. Needs no PyTorch:

  python3 tests/parallel/fsdp1_account.py [--tables]

Prints `ok N figures RULE` per rule (MISS and the first failures when a figure disagrees) and
exits 1 on a miss; --tables prints the document's table.

Notation (per case, rank r): W the world size; for every unit u (root = embeddings, final
LayerNorm and head; h.0..h.2 the blocks) m_u = the numel of its FlatParameter, n_u =
ceil(m_u / W) its padded shard (m_u under NO_SHARD), l_u(r) the elements AdamW keeps state for
on rank r (n_u: the FlatParameter's padded shard; with use_orig_params the unpadded elements r holds);
b_p the bytes of the parameter dtype (2 under bf16, else 4), b_r of the reduce dtype (4).
U_u = b_p * W * n_u (`_full_param_padded`). P = 4 sum n_u, G = 4 sum n_u (sharded gradients,
parameter dtype), S = 8 sum l_u(r) + 4 k(r), k(r) the tensors AdamW steps on rank r (one per
unit; with use_orig_params one per original parameter whose local slice is not empty).
"""
import argparse
import glob
import json
import os
import re
import sys

from account import Rules, report
from fsdp2_account import param_shapes

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED = os.path.join(HERE, "expected")
UNITS = ("root", "h.0", "h.1", "h.2")   # forward order
PHASES = ("DATA", "FORWARD", "LOSS", "BACKWARD", "OPTIMIZER_STEP")


def numels(doc):
    """{unit: [numel of each original parameter, in FlatParameter order]}."""
    shapes = param_shapes(doc["dims"], doc["config"]["vocab"])
    out = {}
    for u, ss in shapes.items():
        out[u] = [eval("*".join(map(str, s))) for s in ss]  # noqa: S307 (products of ints)
        if u == "root" and doc["config"]["head_bias"]:
            out[u].append(doc["config"]["vocab"])
    return out


def sizes(doc, r):
    """{unit: (m_u, n_u, l_u(r), params with a non-empty slice on r)}."""
    W, ns = doc["world_size"], doc["config"]["sharding"] == "NO_SHARD"
    out = {}
    for u, ps in numels(doc).items():
        m = sum(ps)
        n = m if ns else -(-m // W)
        lo, hi = (0, m) if ns else (r * n, min(m, r * n + n))
        k, off = 0, 0
        for x in ps:
            k += max(off, lo) < min(off + x, hi)
            off += x
        # AdamW's state follows the FlatParameter's padded shard, or the original parameters' unpadded views
        out[u] = (m, n, max(0, hi - lo) if doc["config"]["use_orig_params"] else n, k)
    return out


def load():
    docs = {}
    for path in sorted(glob.glob(os.path.join(EXPECTED, "fsdp1_*.json"))):
        with open(path) as f:
            d = json.load(f)
        d["ranks"] = [d["ranks"][x["same_as_rank"]] if "same_as_rank" in x else x for x in d["ranks"]]
        docs[d["case"]] = d
    return docs


def kind(name):
    name = name.split(" = ")[0]
    m = re.match(r"(.*) (root|h\.\d)$", name)
    return (m.group(1), m.group(2)) if m else (name, None)


def account(docs, rules):
    for cid, d in docs.items():
        c, W = d["config"], d["world_size"]
        for r, rk in enumerate(d["ranks"]):
            w = f"{cid} rank {r}"
            sz = sizes(d, r)
            P = 4 * sum(v[1] for v in sz.values())
            k = sum(v[3] for v in sz.values()) if c["use_orig_params"] else len(sz)
            S = 8 * sum(v[2] for v in sz.values()) + 4 * k
            M = sum(v[0] for v in sz.values())
            big = max(UNITS, key=lambda u: sz[u][0])
            extra = 4 * sz[big][0] + (0 if c["sharding"] == "NO_SHARD" else 4 * sz[big][1])
            rules.check("construct: after = P; peak = the whole model + the largest unit's flat concatenation "
                        "(+ its shard's copy, sharded strategies)", [P, 4 * M + extra],
                        [rk["construct"]["live_after"], rk["construct"]["peak"]], w)
            for st in rk["steps"]:
                e = st["end_of_step"]
                rules.check("end: parameters = P, gradients = G (the sharded flat gradients, parameter dtype), "
                            "optimizer state = S, nothing else live", [P, P, S, 2 * P + S],
                            [e["parameters"], e["gradients"], e["optimizer_state"], st["live_at_end"]], w)
            check_sizes(rk, d, sz, rules, w)
            check_lifetimes(rk, c, rules, w)
            check_peaks(rk, d, sz, P, S, rules, w)


def bytes_p(c):
    return 2 if c["param_dtype"] == "bfloat16" else 4


def check_sizes(rk, d, sz, rules, w):
    c, W = d["config"], d["world_size"]
    bp, br = bytes_p(c), 4
    forms = {
        "full_param_padded": ("U_u = b_p * W * n_u", lambda m, n: bp * W * n),
        "mp shard": ("b_p * n_u", lambda m, n: bp * n),
        "flat grad": ("b_p * m_u (unpadded)", lambda m, n: bp * m),
        "reduce-dtype grad": ("b_r * m_u", lambda m, n: br * m),
        "padded grad": ("b_r * W * n_u", lambda m, n: br * W * n),
        "new sharded grad": ("b_r * n_u", lambda m, n: br * n),
        "gloo all-gather: flat output copy for the flight recorder": ("U_u", lambda m, n: bp * W * n),
        "gloo all-gather: worker's flat output": ("U_u", lambda m, n: bp * W * n),
        "gloo reduce-scatter: clone of the input": ("b_r * W * n_u", lambda m, n: br * W * n),
    }
    pgrad, lazy = {}, 0
    for name, nb, count, made, where, _, _ in rk["lifetimes"]:
        k, u = kind(name)
        if k in forms and u:
            form, f = forms[k]
            rules.check(f"size: {k} = {form}", f(sz[u][0], sz[u][1]) * count, nb, f"{w} {name} {made}")
        elif k == "param grad":
            pgrad[(u, made)] = pgrad.get((u, made), 0) + nb
        elif "FSDP::root_pre_forward (root) > aten::empty" in name:
            lazy += nb
    for (u, made), nb in pgrad.items():
        rules.check("size: the parameters' gradients of a unit (autograd's, before SplitWithSizesBackward "
                    "concatenates them) = b_p * m_u per backward", bp * sz[u][0] * c["microbatches"], nb,
                    f"{w} {u} {made}")
    if c["sharding"] != "NO_SHARD" and not c["no_sync"]:  # no_sync() runs the lazy init itself, before DATA
        mp = sum(bp * sz[u][1] + 4 * W * sz[u][1] for u in UNITS) if c["param_dtype"] else 0
        rules.check("lazy init (step 1, root pre-forward): every unit's _full_param_padded allocated and freed "
                    "at once, sum U_u (+ under mixed precision _mp_shard b_p n_u and _full_prec_full_param_padded "
                    "4 W n_u, each freed at once)", sum(bp * W * sz[u][1] for u in UNITS) + mp, lazy, w)


def check_lifetimes(rk, c, rules, w):
    sgo = c["sharding"] == "SHARD_GRAD_OP"
    for name, nb, count, made, where, freed, fwhere in rk["lifetimes"]:
        k, u = kind(name)
        ph = made.split(".")[1]
        at = f"{w} {name} made {made}"
        fw = fwhere or ""
        if k == "full_param_padded" and ph == "FORWARD":
            if u == "root" or sgo:
                rules.check("the root (every unit under SHARD_GRAD_OP) is gathered in its pre-forward and freed only "
                            "at its post-backward", ("BACKWARD", f"FSDP::post_backward ({u}) > FSDP::reshard ({u})"),
                            (freed.split(".")[1], fw.split("AccumulateGrad > ")[-1]), at)
            else:
                rules.check("FULL_SHARD: a block is gathered in its pre-forward and freed at its post-forward",
                            f"FSDP::post_forward ({u}) > FSDP::reshard ({u})", fw, at)
        elif k == "full_param_padded" and ph == "BACKWARD":
            prev = UNITS[UNITS.index(u) + 1] if u != "h.2" else "root"
            rules.check("FULL_SHARD backward (BACKWARD_PRE): block u is gathered by the pre-backward of the unit "
                        "after it in forward order (the root's for the last block) and freed at u's post-backward",
                        (f"FSDP::pre_backward ({prev}) > FSDP::prefetch ({prev}) > FSDP::unshard ({u})",
                         f"FSDP::post_backward ({u}) > FSDP::reshard ({u})"),
                        (where.split(" > ", 1)[-1], fw.split("AccumulateGrad > ")[-1]), at)
        elif k == "param grad":
            rules.check("the parameters' gradients die when SplitWithSizesBackward0 has concatenated them",
                        "SplitWithSizesBackward0", fw, at)
        elif k == "flat grad" and not c["no_sync"] and c["sharding"] != "NO_SHARD":
            rules.check("the flat gradient is made by SplitWithSizesBackward0 (aten::cat) and freed when "
                        "AccumulateGrad's post-backward hook returns",
                        ("SplitWithSizesBackward0 > aten::cat", "torch::autograd::AccumulateGrad"), (where, fw), at)
        elif k == "reduce-dtype grad":
            rules.check("the reduce-dtype copy is made in the post-backward hook and freed when it returns",
                        ("FSDP::post_backward", "torch::autograd::AccumulateGrad"),
                        (where.split(" > ")[1].split(" (")[0], fw), at)
        elif k == "new sharded grad" and " = saved grad shard" in name:
            rules.check("the first reduce-scatter output IS _saved_grad_shard and then .grad, until zero_grad",
                        True, freed is None or "zero_grad" in fw or "root_pre_forward" in fw, at)
        elif k == "new sharded grad":
            rules.check("a later micro-batch's reduce-scatter output is added into _saved_grad_shard and freed "
                        "in _reduce_grad", f"FSDP::reduce_grad ({u})", fw.split(" > ")[-1], at)
        elif k.startswith("gloo"):
            rules.check("gloo: every copy it makes is freed inside the collective or _reduce_grad", True,
                        any(x in fw for x in ("c10d::allgather_", "gloo:all_gather", "FSDP::reduce_grad")), at)


def terms(live):
    """The labelled FSDP1 buffers and states of a live set (activations, temporaries and the
    batch left out; the root's parameter gradients are checked on their own)."""
    return {n.split(" = ")[0]: v for n, v in live.items()
            if not n.startswith(("activation", "temporary [Native", "temporary [aten::ones_like", "input"))
            and not (n.startswith("temporary") and v < 64)}


def check_peaks(rk, d, sz, P, S, rules, w):
    c, W = d["config"], d["world_size"]
    bp, br = bytes_p(c), 4
    ns, sgo, mb = c["sharding"] == "NO_SHARD", c["sharding"] == "SHARD_GRAD_OP", c["microbatches"]
    U = {u: bp * W * sz[u][1] for u in UNITS}
    m = {u: sz[u][0] for u in UNITS}
    head = bp * (m["root"] - sum(numels(d)["root"][:2]))  # head (and bias) + final LayerNorm
    for st in rk["steps"]:
        s = st["step"]
        base = {f"local shard {u}": 4 * sz[u][1] for u in UNITS}
        if s > 1:
            base.update({"optimizer state exp_avg": (S - 4 * kk(sz, c)) // 2,
                         "optimizer state exp_avg_sq": (S - 4 * kk(sz, c)) // 2, "optimizer state step": 4 * kk(sz, c)})
        carried = {}  # what the second micro-batch starts with
        if mb > 1 and c["no_sync"]:
            carried = {f"flat grad {u}": bp * m[u] for u in UNITS}
        elif mb > 1:
            carried = {f"new sharded grad {u}": br * sz[u][1] for u in UNITS}
        G = 4 * sum(sz[u][1] for u in UNITS)
        data = P + (S if s > 1 else 0) + 1024 + sum(carried.values()) + (G if c["use_orig_params"] and s > 1 else 0)
        rules.check("peak DATA = P + [S] + the batch + [micro-batch 2: G, or under no_sync the unsharded flat "
                    "gradients b_p sum m_u] + [use_orig_params: G, the FlatParameters' gradients survive "
                    "zero_grad(set_to_none) until the root's pre-forward]", data, st["phases"]["DATA"], f"{w} step {s}")
        rules.check("peak OPTIMIZER_STEP = P + G + S + 4 sum l_u (foreach sqrt temporaries) + 12, both views",
                    [2 * P + S + (S - 4 * kk(sz, c)) // 2 + 12] * 2,
                    [st["phases"]["OPTIMIZER_STEP"], st["phases_without_gloo"]["OPTIMIZER_STEP"]], f"{w} step {s}")
        if "at_peak_without_gloo" not in st:
            continue
        at = st["at_peak_without_gloo"]
        gathered = {} if ns else ({f"full_param_padded {u}": U[u] for u in UNITS} if sgo else
                                  {"full_param_padded root": U["root"], "full_param_padded h.2": U["h.2"]})
        rules.check("peak FORWARD (no gloo), in the last block: P + [S] + [carried] + root and last block gathered "
                    "(every unit under SHARD_GRAD_OP, none under NO_SHARD) + activations",
                    dict(base, **carried, **gathered), terms(at["FORWARD"]), f"{w} step {s}")
        loss = {} if ns else ({f"full_param_padded {u}": U[u] for u in UNITS} if sgo else
                              {"full_param_padded root": U["root"]})
        rules.check("peak LOSS: P + [S] + [carried] + the root gathered (every unit under SHARD_GRAD_OP) "
                    "+ activations", dict(base, **carried, **loss), terms(at["LOSS"]), f"{w} step {s}")
        bk = terms(at["BACKWARD"])
        u = next((kind(n)[1] for n in bk if n.startswith(("param grad h", "reduce-dtype grad"))), None)
        exp = dict(base, **carried)
        exp["param grad root"] = head
        i = UNITS.index(u)
        done = UNITS[i + 1:] if not ns else UNITS[1:]
        if ns:  # NO_SHARD: the reduced flat gradients are the .grad, kept; the peak is h.0's concatenation
            exp.update({f"flat grad {x}": bp * m[x] for x in done if x != u})
            exp.update({f"param grad {u}": bp * m[u], f"flat grad {u}": bp * m[u]})
            rule = ("peak BACKWARD (no gloo), NO_SHARD: at the first block's SplitWithSizesBackward: P + [S] + every "
                    "later block's flat gradient + h.0's parameters' gradients and their concatenation + the head's "
                    "and final norm's gradients (kept for the root's concatenation) + activations")
        elif "reduce-dtype grad " + u in bk:
            exp.update({"full_param_padded root": U["root"], f"flat grad {u}": bp * m[u],
                        f"reduce-dtype grad {u}": br * m[u]})
            if UNITS[i - 1] != "root":
                exp[f"full_param_padded {UNITS[i - 1]}"] = U[UNITS[i - 1]]
            exp.update({f"new sharded grad {x}": br * sz[x][1] for x in (u,) + done})
            rule = ("peak BACKWARD (no gloo), mixed precision: in block u's _reduce_grad: P + [S] + root gathered + "
                    "the block before u (prefetched) + u's flat gradient (b_p m_u) and its reduce-dtype copy (b_r m_u) "
                    "+ the new sharded gradients of u and the blocks after it + the head's and final norm's "
                    "gradients + activations")
        else:
            exp.update({f"full_param_padded {x}": U[x] for x in ("root", u, UNITS[i - 1])})
            if sgo:
                exp.update({f"full_param_padded {x}": U[x] for x in UNITS})
            exp.update({f"param grad {u}": bp * m[u],
                        ("temporary [SplitWithSizesBackward0 > aten::cat] (backward)" if c["no_sync"]
                         else f"flat grad {u}"): bp * m[u]})
            exp.update({f"new sharded grad {x}": br * sz[x][1] for x in done})
            rule = ("peak BACKWARD (no gloo), fp32: at the last block's SplitWithSizesBackward (aten::cat): P + [S] + "
                    "[carried] + root, last block and the prefetched block before it gathered (every unit under "
                    "SHARD_GRAD_OP) + the last block's parameters' gradients AND their concatenation, the flat "
                    "gradient (2 b_p m_u) + the head's and final norm's gradients + activations")
        rules.check(rule, exp, bk, f"{w} step {s}")


def kk(sz, c):
    return sum(v[3] for v in sz.values()) if c["use_orig_params"] else len(sz)


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
    print("\n| case | rank | step 1 peak (phase) | steady: DATA | FORWARD | LOSS | BACKWARD | OPTIMIZER_STEP "
          "| FORWARD / BACKWARD without gloo | P / G / S at end |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for cid, d in docs.items():
        seen = []
        for r, rk in enumerate(d["ranks"]):
            key = json.dumps({k: v for k, v in rk.items() if k != "lifetimes"}, sort_keys=True)
            if key in seen:
                continue
            seen.append(key)
            first, last = rk["steps"][0], rk["steps"][-1]
            ph, nc, e = last["phases"], last["phases_without_gloo"], last["end_of_step"]
            print(f"| {cid} | {r} | {first['peak']:,} ({first['peak_phase'].lower()}) | "
                  + " | ".join(f"{ph[p]:,}" for p in PHASES) +
                  f" | {nc['FORWARD']:,} / {nc['BACKWARD']:,} | "
                  f"{e['parameters']:,} / {e['gradients']:,} / {e['optimizer_state']:,} |")


if __name__ == "__main__":
    sys.exit(main())
