"""memest's data-parallel estimate against the per-rank truth (run.py --memest).

For every DDP and ZeroRedundancyOptimizer case memest can express, `memest estimate --local
--runtime cpu-1.13` runs on the case's whole model (expected/models/<model>.json) with the
case's settings (dp.py: batch, optimizer, bucket_cap_mb, gradient_as_bucket_view, keep-grads,
ZeRO), once with --first-step (compared with the measured step 1, which runs with DDP's
construction-time bucket layout) and once for the steady state (compared with the last
measured step; step 2 is the one whose forward rebuilds the buckets). memest estimates the rank
that holds the most and says which (`dataParallel.rank`); that rank's measurement is compared,
to the conformance suite's bounds (tests/conformance/run.py): saved-for-backward and end-of-step
parameter, gradient and optimizer-state bytes to the byte, every phase's peak and the step's
peak within 1%. Also checked: that the measured ranks holding the most include memest's rank,
and that memest's DDP bucket sizes are the ones DDP logged (bucket_sizes at step 1,
rebuilt_bucket_sizes after).

Pipeline cases (pp.py) run `memest estimate ... --pipeline P --pipeline-schedule S --grad-accum M`
(interleaved cases: `--pipeline-schedule 1f1b --virtual-stages V`) on the whole model: memest estimates every stage and reports the one that needs the most. Each
stage's step peak is compared with its rank's (first step with step 1, steady state with step
2); the worst stage memest names must be among the measured worst; the worst stage's saved bytes
per micro-batch, end-of-step model states and phases are compared: memest's data, forward and
loss peaks against the measured F<j> phases (a micro-batch's forward, its receive included), its
backward against the B<j> phases (interleaved: F<j>c<c> and B<j>c<c>, micro-batch j on the
stage's chunk c).

Expert-parallel cases (ep.py) run memest's Megatron expert parallelism on the one-rank layer
(check_expert_parallel): the rank receiving the most, its received rows and saved bytes.

Cases memest cannot express are SKIP, with the reason (`not_expressible`).
"""
import json
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODELS = os.path.join(HERE, "expected", "models")
PEAK_TOLERANCE = 0.01  # peaks within 1%; everything else equal (tests/conformance/run.py)
RANK_SLACK = 1024      # ranks whose peaks are this close hold "the same" (run.py's PEAK_SLACK)


def find_memest(explicit):
    """`explicit` when given (it must be an executable), else $MEMEST_BIN or build/bin/memest."""
    for p in ([explicit] if explicit else
              [os.environ.get("MEMEST_BIN"), os.path.join(ROOT, "build", "bin", "memest")]):
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    raise SystemExit(f"run.py: memest not found at {explicit or 'build/bin/memest'} "
                     "(build first: bash scripts/build.sh, or --memest PATH)")


def not_expressible(case):
    """Why memest cannot estimate `case` yet, or None when it can."""
    p = case.params
    if case.id.startswith("tp/"):
        return None if case.model in TP_PLANS else f"no tensor-parallel plan for model {case.model}"
    if case.id.startswith(("pp/", "ep/")):
        return None
    if not case.id.startswith(("ddp/", "zero/")):
        return "not a data-parallel case"
    if p.get("find_unused_parameters"):
        return ("find_unused_parameters=True (definition-order buckets never rebuilt, "
                "local_used_map_) is not a memest setting")
    if p.get("parameters_as_bucket_view"):
        return ("ZeroRedundancyOptimizer(parameters_as_bucket_view=True) is not a memest setting "
                "(it moves the parameters into per-rank flat buckets at construction)")
    return None


# tp.py's Megatron layers, as memest's --tensor-plan names them (module = parameter name up to
# its last '.').
TP_PLANS = {"tp-mlp": ["fc1=colwise", "fc2=rowwise"],
            "tp-attention": ["qkv=colwise", "proj=rowwise"],
            "tp-lm": ["wte=rowwise", "head=colwise"],
            "tp-lm-tied": ["wte=rowwise"],  # the head is the table
            "tp-lm-rope": ["wte=rowwise", "head=colwise"]}


def base_command(memest, case, batch, hold_outputs=False):
    """`memest estimate` of the case's whole model on the CPU runtime, float32, the case's
    optimizer (for-loop) at `batch`; the modules return the loss alone unless `hold_outputs`."""
    return ([memest, "estimate", "--local", "--runtime", "cpu-1.13", "--json", "--no-advice"] +
            ([] if hold_outputs else ["--no-hold-outputs"]) +
            ["--model", os.path.join(MODELS, f"{case.model}.json"), "--batch", str(batch),
             "--precision", "fp32", "--optimizer", case.params["optimizer"],
             "--optimizer-impl", "for-loop"])


def tp_command(memest, case, first_step):
    """tp.py's cases (their plans), and ep.py's with tensor ranks only (the default plan's
    linear_fc1 and linear_fc2, sequence parallelism, the routing's load)."""
    p = case.params
    cmd = base_command(memest, case, p["batch"]) + ["--tensor-parallel", str(p.get("tp", case.world))]
    for entry in TP_PLANS.get(case.model, []):
        cmd += ["--tensor-plan", entry]
    if p.get("sp") or "routing" in p:
        cmd.append("--sequence-parallel")
    if "routing" in p:
        cmd += ["--expert-load", p["routing"]]
    if first_step:
        cmd.append("--first-step")
    return cmd


def check_tensor_parallel(memest, case, ranks):
    """Every rank of a tensor-parallel group holds the same; rank 0's measurement is compared
    with memest's rank. The measured GRAD_SYNC phase (finalize_model_grads' all-reduce of the
    replicated gradients under SP) is memest's backward end: compared as the larger of the
    two measured phases."""
    rows = []
    for label, first, k in (("first", True, 0), ("steady", False, -1)):
        resp = estimate(tp_command(memest, case, first))
        step = ranks[0]["steps"][k]
        measured = measured_quantities(ranks[0], step)
        sync = measured.pop("peak.GRAD_SYNC", 0)
        measured["peak.BACKWARD"] = max(measured["peak.BACKWARD"], sync)
        rows += [{"step": f"{label} (step {step['step']})", **r}
                 for r in compare(measured, estimated_quantities(resp, False))]
    return rows, {"rank": 0}


def pipeline_command(memest, case, first_step):
    p = case.params
    m = p["microbatches"]
    interleaved = p["schedule"] == "interleaved"  # Megatron's interleaved 1F1B
    cmd = base_command(memest, case, p["batch"] * m, hold_outputs=True) + [
        "--grad-accum", str(m), "--pipeline", str(case.world),
        "--pipeline-schedule", "1f1b" if interleaved else p["schedule"]]
    if interleaved:
        cmd += ["--virtual-stages", str(p["virtual_stages"])]
    if not p.get("deallocate_outputs", True):
        cmd.append("--pipeline-keep-outputs")
    if first_step:
        cmd.append("--first-step")
    return cmd


def check_pipeline(memest, case, ranks):
    """Every stage's peak, the worst stage, and the worst stage's quantities (see the header)."""
    est = {first: estimate(pipeline_command(memest, case, first)) for first in (True, False)}
    pipe = est[False].get("pipeline") or {}
    worst = _int(pipe.get("worstStage"))
    peaks = [r["steps"][-1]["peak"] for r in ranks]
    most = [i for i, p in enumerate(peaks) if p >= max(peaks) - RANK_SLACK]
    rows = [{"step": "-", "quantity": "stage needing the most", "measured": most,
             "estimated": worst, "rel": None, "ok": worst in most}]
    for label, first, k in (("first", True, 0), ("steady", False, -1)):
        stages = (est[first].get("pipeline") or {}).get("perStage", [])
        for s, r in enumerate(ranks):
            step = r["steps"][k]
            e = _int(stages[s].get("peakAllocatedBytes")) if s < len(stages) else 0
            rows += [{"step": f"{label} (step {step['step']})", **row}
                     for row in compare({f"peak, stage {s}": step["peak"]},
                                        {f"peak, stage {s}": e})]
        resp = est[first]  # its own worst stage (the first step's can differ)
        w = _int((resp.get("pipeline") or {}).get("worstStage"))
        step = ranks[w]["steps"][k]
        ph = {p.get("phase", "").replace("PHASE_", ""): _int(p.get("allocatedBytes"))
              for p in resp.get("phases", [])}
        eos = resp.get("endOfStep") or {}
        measured = {"saved_for_backward": ranks[w]["saved_per_microbatch"],
                    **{f"end_of_step.{n}": v for n, v in step["end_of_step"].items()},
                    "peak.forwards": max(v for n, v in step["phases"].items() if n[0] == "F"),
                    "peak.backwards": max(v for n, v in step["phases"].items() if n[0] == "B"),
                    "peak.OPTIMIZER_STEP": step["phases"]["OPTIMIZER_STEP"]}
        estimated = {"saved_for_backward": _int(resp.get("savedForBackwardBytes")),
                     "end_of_step.parameters": _int(eos.get("parameters")),
                     "end_of_step.gradients": _int(eos.get("gradients")),
                     "end_of_step.optimizer_state": _int(eos.get("optimizerState")),
                     "peak.forwards": max(ph.get("DATA", 0), ph.get("FORWARD", 0), ph.get("LOSS", 0)),
                     "peak.backwards": ph.get("BACKWARD", 0),
                     "peak.OPTIMIZER_STEP": ph.get("OPTIMIZER_STEP", 0)}
        rows += [{"step": f"{label} (step {step['step']})", **row}
                 for row in compare(measured, estimated)]
    return rows, {"rank": worst}


def command(memest, case, first_step):
    p = case.params
    # dp.py's module returns the loss alone (Recorder.take): the loop holds no outputs.
    cmd = base_command(memest, case, p["batch"]) + [
           "--data-parallel", str(case.world), "--dp-strategy", "zero1" if p.get("zero") else "ddp",
           "--bucket-cap-mb", repr(p["bucket_cap_mb"])]
    if p["optimizer"] == "adamw" and p.get("zero"):
        cmd += ["--weight-decay", "0.01"]  # dp.py builds torch.optim.AdamW with its default decay
    if p["gradient_as_bucket_view"]:
        cmd.append("--gradient-as-bucket-view")
    if p.get("keep_grads"):
        cmd.append("--keep-grads")
    if first_step:
        cmd.append("--first-step")
    return cmd


def estimate(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"memest exited {proc.returncode}: "
                           f"{proc.stderr.strip() or proc.stdout.strip()}\n  command: {' '.join(cmd)}")
    return json.loads(proc.stdout)


def _int(v):
    return int(v) if v not in (None, "") else 0


def estimated_quantities(resp, grads_in_buckets):
    """The figures of memest's response `resp`. With gradient_as_bucket_view, .grad is a view
    of DDP's buckets: the trace counts that storage as the gradients' (dp.py, model_state: the
    .grad tensors' storages), memest files it under communication (the buckets) and counts no
    gradient beside it; the end-of-step gradients are then compared as memest's gradients plus
    its buckets, the same storage under one name."""
    eos = resp.get("endOfStep") or {}
    grads = _int(eos.get("gradients"))
    if grads_in_buckets:
        grads += _int(eos.get("communication"))
    q = {"saved_for_backward": _int(resp.get("savedForBackwardBytes")),
         "end_of_step.parameters": _int(eos.get("parameters")),
         "end_of_step.gradients": grads,
         "end_of_step.optimizer_state": _int(eos.get("optimizerState"))}
    for ph in resp.get("phases", []):
        q["peak." + ph.get("phase", "").replace("PHASE_", "")] = _int(ph.get("allocatedBytes"))
    q["peak"] = _int((resp.get("peak") or {}).get("allocatedBytes"))
    return q


def measured_quantities(rank, step):
    q = {"saved_for_backward": rank["saved_for_backward"]}
    for k, v in step["end_of_step"].items():
        q[f"end_of_step.{k}"] = v
    for ph, v in step["phases"].items():
        q[f"peak.{ph}"] = v
    q["peak"] = step["peak"]
    return q


def compare(measured, estimated):
    """Rows (quantity, measured, estimated, relative error, ok), the conformance suite's rule."""
    keys = list(measured) + [k for k, v in estimated.items()
                             if k not in measured and k.startswith("peak.") and v]
    rows = []
    for k in keys:
        m, e = measured.get(k, 0), estimated.get(k, 0)
        rel = (e - m) / m if m else (0.0 if e == 0 else float("inf"))
        ok = abs(rel) <= PEAK_TOLERANCE if k.startswith("peak") else e == m
        rows.append({"quantity": k, "measured": m, "estimated": e,
                     "rel": None if rel == float("inf") else rel, "ok": ok})
    return rows


def check_expert_parallel(memest, case, ranks):
    """ep.py's MoELayer over the whole world (TP x E ranks): memest's Megatron expert
    parallelism (--dp-strategy megatron-ddp --data-parallel E --expert-parallel E --expert-load
    ROUTING, with --tensor-parallel TP --sequence-parallel; the CUDA runtime Megatron runs on)
    names the expert rank that receives the most tokens, whose ranks (E x TP + its tensor ranks)
    must be among the measured ones; that rank's received rows, and its saved-for-backward
    bytes, are compared to the byte. The peaks are not: the measurement steps plain .grad with
    the for-loop SGD on the CPU, memest Megatron's float32 gradient buffer on CUDA."""
    p = case.params
    tp = p.get("tp", 1)
    size = case.world // tp
    if size == 1:  # tensor ranks alone: run on the CPU runtime without Megatron's DDP
        return check_tensor_parallel(memest, case, ranks)
    cmd = [memest, "estimate", "--local", "--json", "--no-advice", "--no-hold-outputs", "--model",
           os.path.join(MODELS, f"{case.model}.json"), "--batch", str(p["batch"]),
           "--precision", "fp32", "--optimizer", p["optimizer"], "--dp-strategy", "megatron-ddp",
           "--data-parallel", str(size), "--expert-load", p["routing"]]
    if size > 1:
        cmd += ["--expert-parallel", str(size)]
    if tp > 1:
        cmd += ["--tensor-parallel", str(tp), "--sequence-parallel"]
    resp = estimate(cmd)
    ep = resp.get("expertParallel") or {}
    rank = _int(ep.get("rank")) * tp
    rows_in = [r["received_rows"] for r in ranks]
    most = [i for i, n in enumerate(rows_in) if n == max(rows_in)]
    rows = [{"step": "-", "quantity": "rank receiving the most", "measured": most,
             "estimated": rank, "rel": None, "ok": rank in most}]
    measured = {"saved_for_backward": ranks[rank]["saved_for_backward"]}
    estimated = {"saved_for_backward": _int(resp.get("savedForBackwardBytes"))}
    if size > 1:  # memest reports the rows of an expert-parallel rank
        measured.update({"received rows": rows_in[rank], "least received rows": min(rows_in)})
        estimated.update({"received rows": _int(ep.get("receivedRows")),
                          "least received rows": _int(ep.get("leastReceivedRows"))})
    rows += [{"step": "-", **r} for r in compare(measured, estimated)]
    return rows, {"rank": rank}


def check(memest, case, ranks):
    """Compares memest with the measured `ranks` of `case`. Returns (rows, info): rows carry
    the step they belong to; info says which rank was compared."""
    if case.id.startswith("ep/"):
        return check_expert_parallel(memest, case, ranks)
    if case.id.startswith("pp/"):
        return check_pipeline(memest, case, ranks)
    if case.id.startswith("tp/"):
        return check_tensor_parallel(memest, case, ranks)
    est = {first: estimate(command(memest, case, first)) for first in (True, False)}
    rank = _int((est[False].get("dataParallel") or {}).get("rank"))
    rows = []
    peaks = [max(s["peak"] for s in r["steps"]) for r in ranks]
    most = [i for i, p in enumerate(peaks) if p >= max(peaks) - RANK_SLACK]
    rows.append({"step": "-", "quantity": "rank holding the most", "measured": most,
                 "estimated": rank, "rel": None, "ok": rank in most})
    measured = ranks[rank]
    steps = measured["steps"]
    ddp = measured.get("ddp") or {}
    for label, first, step, sizes in (("first", True, steps[0], ddp.get("bucket_sizes")),
                                      ("steady", False, steps[-1], ddp.get("rebuilt_bucket_sizes"))):
        resp = est[first]
        estimated = estimated_quantities(resp, case.params["gradient_as_bucket_view"])
        for r in compare(measured_quantities(measured, step), estimated):
            if r["quantity"] == "end_of_step.gradients" and case.params["gradient_as_bucket_view"]:
                r["quantity"] += " (= buckets)"  # memest: gradients + communication
            rows.append({"step": f"{label} (step {step['step']})", **r})
        buckets = [_int(b) for b in (resp.get("dataParallel") or {}).get("bucketBytes", [])]
        rows.append({"step": f"{label} (step {step['step']})", "quantity": "ddp bucket bytes",
                     "measured": sizes, "estimated": buckets, "rel": None, "ok": buckets == sizes})
    return rows, {"rank": rank}



def print_rows(rows):
    """The rows as a table: one line per quantity, the first step and the steady state side by
    side (measured, estimated, relative error); `!!` marks a quantity out of bounds."""
    steps = list(dict.fromkeys(r["step"] for r in rows if r["step"] != "-"))
    table = {}
    for r in rows:
        table.setdefault(r["quantity"], {})[r["step"]] = r
    print(f"      {'':<31}" + "".join(f"{s:>37}" for s in steps))
    for q, by_step in table.items():
        bad = not all(r["ok"] for r in by_step.values())
        line = f"      {'!! ' if bad else '   '}{q:<28}"
        for s in (["-"] if "-" in by_step else steps):
            r = by_step.get(s)
            if r is None:
                line += f"{'-':>37}"
            elif isinstance(r["measured"], int) and not isinstance(r["measured"], bool):
                err = "inf" if r["rel"] is None else f"{r['rel']:+.2%}"
                line += f"{r['measured']:>14,} {r['estimated']:>13,} {err:>8}"
            else:
                line += f"  measured {r['measured']}, estimated {r['estimated']}"
        print(line)
