#!/usr/bin/python3
"""memest against real PyTorch, case by case: the conformance suite's entry point.

Usage (from anywhere; use the interpreter that has PyTorch, Debian's /usr/bin/python3):
  /usr/bin/python3 tests/conformance/run.py [--report FILE] [-k SUBSTRING] [--list]
      [--explain] [--no-docs] [--memest PATH] [--via-tracer] [--onednn-max-isa ISA]

For every case (cases.py) and configuration it runs real PyTorch (measure.py) and
`memest estimate --local --runtime cpu-1.13 --cpu-isa ISA` on the same model (recorder.py writes
the model file; ISA is what oneDNN reports it runs on here), and compares:
  * saved-for-backward bytes and end-of-step parameter, gradient and optimizer-state bytes:
    equal, to the byte;
  * peak live bytes per phase and overall: within 1%.
Training cases are checked at the first step and in steady state (step 2).

--via-tracer (run it with an interpreter that has both PyTorch and memest: build/pyenv/bin/python):
each case is also made a torch.nn.Module (via_tracer.py), traced by memest.trace at the case's
batch with the case's inputs, target and loss, and the traced model is estimated with the same
flags and compared with the same measurements to the same bounds. The status printed is the
traced model's; a traced case that fails where the hand-recorded one passes is marked
[tracer-only]. Cases a module cannot express (checkpointed runs) are SKIP, with the reason.
docs/fidelity.md is not regenerated in this mode.

Writes the report (--report, JSON rows) and regenerates docs/fidelity.md when every case ran
(no -k). Prints `N passed, M failed` and exits 1 on any failure.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
warnings.filterwarnings("ignore")
# The profiler's memory reporter warns (c10 LOG(WARNING)) on every free of a block allocated
# before profiling started (parameters, grads): expected here, and noise.
os.environ.setdefault("GLOG_minloglevel", "2")

import torch  # noqa: E402

from cases import CASES, HAS_TRANSFORMERS  # noqa: E402
from measure import CaseRun  # noqa: E402

torch.set_num_threads(1)

PEAK_TOLERANCE = 0.01  # peaks: within 1%; everything else: equal


def find_memest(explicit=None):
    for p in (explicit, os.environ.get("MEMEST_BIN"), os.path.join(ROOT, "build", "bin", "memest")):
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    sys.exit("run.py: build/bin/memest not found (build first: bash scripts/build.sh)")


def onednn_isa():
    """The ISA oneDNN runs this process's convolutions with, as memest's --cpu-isa word: asked of
    oneDNN itself (its verbose info line, in a child with the same environment, so that
    ONEDNN_MAX_CPU_ISA counts)."""
    probe = ("import torch, torch.nn.functional as F; torch.set_num_threads(1); "
             "F.conv2d(torch.ones(2, 8, 6, 6), torch.ones(8, 8, 3, 3))")
    out = subprocess.run([sys.executable, "-c", probe], env=dict(os.environ, ONEDNN_VERBOSE="1"),
                         capture_output=True, text=True, check=True).stdout
    isa = next((line.split("isa:", 1)[1] for line in out.splitlines() if ",isa:" in line), None)
    if isa is None:
        sys.exit("run.py: oneDNN printed no ISA (is PyTorch built with mkldnn?)")
    if "AVX-512" in isa:
        return "avx512"
    if "AVX2" in isa:
        return "avx2"
    sys.exit(f"run.py: oneDNN runs on '{isa}'; memest models its AVX-512 and AVX2 convolutions only")


def _cpu_count(cpu_list):
    """How many CPUs a sysfs list ("0-3,8") names."""
    n = 0
    for part in cpu_list.strip().split(","):
        lo, _, hi = part.partition("-")
        n += int(hi or lo) - int(lo) + 1
    return n


def onednn_cache_flags():
    """memest's --cpu-l1-cache / --cpu-l2-cache for the caches oneDNN blocks its convolutions by
    here (src/cpu/platform.cpp, get_per_core_cache_size): on an Intel CPU, Xbyak's reading of
    CPUID leaf 4, each data cache's size over the cores sharing it (the CPUs sharing it over
    those sharing the L1); elsewhere Xbyak (oneDNN 2.6's) reads none and oneDNN takes its
    defaults, as memest does without the flags. The kernel's sysfs holds the same CPUID
    figures."""
    try:
        with open("/proc/cpuinfo") as f:
            intel = "GenuineIntel" in f.read(4096)
        base = "/sys/devices/system/cpu/cpu0/cache"
        caches = {}
        for entry in sorted(os.listdir(base)):
            if not entry.startswith("index"):
                continue
            read = lambda name: open(os.path.join(base, entry, name)).read().strip()
            if read("type") in ("Data", "Unified"):
                size = read("size")
                unit = {"K": 1024, "M": 1 << 20}.get(size[-1], 1)
                caches[int(read("level"))] = (int(size.rstrip("KM")) * unit,
                                              _cpu_count(read("shared_cpu_list")))
    except (OSError, ValueError):
        return []
    if not intel or 1 not in caches or 2 not in caches:
        return []
    smt = caches[1][1]
    per_core = {lvl: size // max(shared // smt, 1) for lvl, (size, shared) in caches.items()}
    return ["--cpu-l1-cache", str(per_core[1]), "--cpu-l2-cache", str(per_core[2])]


CPU_ISA = None  # set by main(): what oneDNN runs on here
CPU_CACHE_FLAGS = []  # set by main(): the caches oneDNN blocks by here, when not its defaults


def estimate(memest, model, batch, cfg, first_step):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(model, f)
        path = f.name
    # A traced graph without tracedBatch (the module does not run at batch B + 1) is valid at
    # the batch it was traced at only: memest takes that batch itself (and refuses another).
    own_batch = "ops" in model and not model["ops"].get("tracedBatch")
    # A traced model carries its own checkpoint regions (memest refuses a policy on top).
    own_checkpoints = bool(model.get("ops", {}).get("checkpoints"))
    cmd = [memest, "estimate", "--local", "--model", path] + step_flags(
        None if own_batch else batch, cfg, first_step, own_checkpoints)
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    finally:
        os.unlink(path)
    if p.returncode != 0:
        raise RuntimeError(f"memest exited {p.returncode}: {p.stderr.strip() or p.stdout.strip()}"
                           f"\n  command: {' '.join(cmd)}")
    return json.loads(p.stdout)


def step_flags(batch, cfg, first_step, own_checkpoints=False):
    """`memest estimate`'s flags for one step of `cfg` at `batch` (None: the model's own) on the
    runtime and CPU the suite measures."""
    cmd = [] if batch is None else ["--batch", str(batch * cfg.accum)]
    cmd += ["--mode", cfg.mode, "--precision", "fp32", "--runtime", "cpu-1.13",
            "--cpu-isa", CPU_ISA, "--json", "--no-advice"] + CPU_CACHE_FLAGS
    if cfg.training:
        cmd += ["--optimizer", cfg.optimizer, "--optimizer-impl", cfg.impl]
        if cfg.accum > 1:
            cmd += ["--grad-accum", str(cfg.accum)]
        if cfg.weight_decay:
            cmd += ["--weight-decay", repr(cfg.weight_decay)]
        if cfg.keep_grads:
            cmd += ["--keep-grads"]
        if first_step:
            cmd += ["--first-step"]
        cmd += ["--hold-outputs" if cfg.hold_outputs else "--no-hold-outputs"]
        if cfg.checkpoint != "none" and not own_checkpoints:
            cmd += ["--checkpoint", cfg.checkpoint]
            if cfg.checkpoint == "every-k":
                cmd += ["--checkpoint-k", str(cfg.checkpoint_k)]
            if cfg.non_reentrant:
                cmd += ["--non-reentrant"]
    return cmd


def _int(v):
    return int(v) if v not in (None, "") else 0


def estimated_quantities(resp, training):
    q = {}
    if training:
        q["saved_for_backward"] = _int(resp.get("savedForBackwardBytes"))
    eos = resp.get("endOfStep") or {}
    q["end_of_step.parameters"] = _int(eos.get("parameters"))
    q["end_of_step.gradients"] = _int(eos.get("gradients"))
    q["end_of_step.optimizer_state"] = _int(eos.get("optimizerState"))
    for ph in resp.get("phases", []):
        name = ph.get("phase", "").replace("PHASE_", "")
        q[f"peak.{name}"] = _int(ph.get("allocatedBytes"))
    q["peak"] = _int((resp.get("peak") or {}).get("allocatedBytes"))
    return q


def measured_quantities(step_result, saved, training):
    q = {}
    if training:
        q["saved_for_backward"] = saved
    for k, v in step_result["end_of_step"].items():
        q[f"end_of_step.{k}"] = v
    for ph, v in step_result["phases"].items():
        q[f"peak.{ph}"] = v
    q["peak"] = step_result["peak"]
    return q


def compare(case_id, step, measured, estimated):
    rows = []
    keys = list(measured)
    # A phase memest reports with bytes but PyTorch never entered is a disagreement too.
    for k, v in estimated.items():
        if k not in measured and k.startswith("peak.") and v:
            keys.append(k)
    for k in keys:
        m = measured.get(k, 0)
        e = estimated.get(k)
        if e is None:
            e = 0
        rel = (e - m) / m if m else (0.0 if e == 0 else float("inf"))
        ok = abs(rel) <= PEAK_TOLERANCE if k.startswith("peak") else e == m
        row = {"case": case_id, "step": step, "quantity": k, "measured_bytes": m, "estimated_bytes": e,
               "rel_error": rel if rel != float("inf") else None, "ok": ok}
        rows.append(row)
    return rows


def explain(run, steps, saved_list):
    print("    saved storages (bytes, as packed):")
    for nb, descs in saved_list:
        print(f"      {nb:>9}  {', '.join(descs[:4])}{' ...' if len(descs) > 4 else ''}")
    res = run.run_steps(steps=2, method="dispatch", keep_log=True)
    print("    (the allocations below are from the dispatch-mode tracker, which names the op behind each storage;\n     it does not see scratch a kernel allocates inside itself, which the allocator trace does)")
    for i, r in enumerate(res):
        print(f"    step {i + 1}: phase peaks {r['phases']}  (peak op {r['peak_where']})")
        for ph, label, nb, live in r["log"]:
            print(f"      {str(ph):<15} {nb:<+9} live {live:<9} {label}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--report", help="write the JSON report here")
    ap.add_argument("-k", dest="select", help="run only cases whose id contains this substring")
    ap.add_argument("--list", action="store_true", help="list the case ids and exit")
    ap.add_argument("--explain", action="store_true", help="print storages and allocations of failing cases")
    ap.add_argument("--no-docs", action="store_true", help="do not regenerate docs/fidelity.md")
    ap.add_argument("--memest", help="the memest binary (default: build/bin/memest)")
    ap.add_argument("--via-tracer", action="store_true",
                    help="estimate the case as traced by memest.trace from an nn.Module (see above)")
    ap.add_argument("--onednn-max-isa", metavar="ISA",
                    help="cap oneDNN's ISA (ONEDNN_MAX_CPU_ISA, e.g. AVX2) to check memest's "
                         "convolution rule for a CPU without AVX-512")
    args = ap.parse_args()

    variants = [(cid, cfg, c) for c in CASES for cid, cfg in c.variants()]
    if args.select:
        variants = [v for v in variants if args.select in v[0]]
    if args.list:
        for cid, cfg, c in variants:
            print(f"{cid}  ({cfg.label()}, batch {c.batch})")
        return 0
    memest = find_memest(args.memest)
    if args.onednn_max_isa:  # read by oneDNN at its first primitive, which has not run yet
        os.environ["ONEDNN_MAX_CPU_ISA"] = args.onednn_max_isa
    global CPU_ISA
    CPU_ISA = onednn_isa()  # a child process with PyTorch: not for --list
    global CPU_CACHE_FLAGS
    CPU_CACHE_FLAGS = onednn_cache_flags()
    if args.via_tracer:
        import via_tracer

    rows, results = [], []
    t0 = time.time()
    for cid, cfg, c in variants:
        steps = [("first", True), ("steady", False)] if cfg.training else [("inference", False)]
        skip, hand_ok = None, {}
        try:
            run = CaseRun(c.fn, c.batch, cfg)
            model = run.model
            if args.via_tracer:
                skip = via_tracer.not_applicable(c, cfg, run)
                if skip is None:
                    model = via_tracer.trace_case(run, cfg)
        except Exception as e:
            skip, run, model = None, None, None
            case_rows, error = [], f"{type(e).__name__}: {e}"
        if skip is not None:
            for step, _ in steps:
                results.append({"case": cid, "group": c.group, "step": step, "config": cfg.label(),
                                "status": "SKIP", "error": None, "skip": skip, "rows": [], "note": c.note})
                print(f"SKIP  {cid} [{step}]\n      not applicable through the tracer: {skip}", flush=True)
            continue
        try:
            if model is None:
                raise RuntimeError(error)
            saved, saved_list = run.measure_saved()
            measured = run.run_steps(steps=2 if cfg.training else 1)
            case_rows = []
            for (step, first), m in zip(steps, measured):
                mq = measured_quantities(m, saved, cfg.training)
                est = estimated_quantities(estimate(memest, model, c.batch, cfg, first), cfg.training)
                case_rows += compare(cid, step, mq, est)
                if args.via_tracer:  # the hand-recorded model on the same measurements
                    hest = estimated_quantities(estimate(memest, run.model, c.batch, cfg, first), cfg.training)
                    hand_ok[step] = all(r["ok"] for r in compare(cid, step, mq, hest))
            error = None
        except Exception as e:  # a case that cannot run is a failure, reported with its error
            case_rows, error = [], f"{type(e).__name__}: {e}"
        rows += case_rows
        for step, _ in steps:
            srows = [r for r in case_rows if r["step"] == step]
            bad = [r for r in srows if not r["ok"]]
            status = "ERROR" if error else ("FAIL" if bad else "ok")
            results.append({"case": cid, "group": c.group, "step": step, "config": cfg.label(),
                            "status": status, "error": error, "rows": srows, "note": c.note})
            line = f"{status:<5} {cid} [{step}]"
            if args.via_tracer and status in ("FAIL", "ERROR") and hand_ok.get(step):
                line += " [tracer-only]"
                results[-1]["tracer_only"] = True
            if error:
                line += f"\n      {error}"
            for r in bad:
                err = "" if r["rel_error"] is None else f" ({r['rel_error']:+.2%})"
                line += (f"\n      {r['quantity']}: measured {r['measured_bytes']}, estimated "
                         f"{r['estimated_bytes']}{err}")
            print(line, flush=True)
        if args.explain and any(x["status"] == "FAIL" for x in results[-len(steps):]):
            explain(run, steps, saved_list)

    passed = sum(1 for r in results if r["status"] in ("ok",))
    skipped = sum(1 for r in results if r["status"] == "SKIP")
    failed = sum(1 for r in results if r["status"] in ("FAIL", "ERROR"))
    if args.report:
        os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
        with open(args.report, "w") as f:
            json.dump({"torch": torch.__version__, "date": datetime.date.today().isoformat(),
                       "command": " ".join(["tests/conformance/run.py"] + sys.argv[1:]),
                       "rows": rows,
                       "cases": [{k: v for k, v in r.items() if k != "rows"} for r in results]}, f, indent=1)
    if not args.select and not args.no_docs and not args.via_tracer:
        write_fidelity(results, passed, failed)
    print(f"({time.time() - t0:.1f} s)")
    if not HAS_TRANSFORMERS:
        print("note: transformers is not importable here: the optim/mlp cases of its AdamW and "
              "Adafactor were left out (build/pyenv/bin/python runs them)")
    print(f"{passed} passed, {failed} failed"
          + (f", {skipped} skipped" if skipped else "")
          + (" (via the tracer; [tracer-only]: " + str(sum(1 for r in results if r.get("tracer_only")))
             + ")" if args.via_tracer else ""))
    return 1 if failed else 0


def _fmt_err(r):
    if r is None:
        return "-"
    if r["rel_error"] is None:
        return "inf"
    return f"{r['rel_error']:+.2%}"


def write_fidelity(results, passed, failed):
    path = os.path.join(ROOT, "docs", "fidelity.md")
    out = []
    w = out.append
    w("# Fidelity: memest against real PyTorch")
    w("")
    w("Generated by `tests/conformance/run.py` (do not edit by hand); regenerate with")
    w("")
    w("```sh")
    w("/usr/bin/python3 tests/conformance/run.py --report build/conformance.json")
    w("```")
    w("")
    w(f"PyTorch {torch.__version__} on the CPU (Debian python3-torch), float32, one thread, oneDNN "
      f"on {CPU_ISA}; memest `estimate --local --runtime cpu-1.13 --cpu-isa {CPU_ISA}"
      f"{''.join(' ' + f for f in CPU_CACHE_FLAGS)}`; "
      f"{datetime.date.today().isoformat()}.")
    w("")
    w(f"**{passed} passed, {failed} failed** "
      "(one line per case, configuration and step).")
    w("")
    w("## What is compared")
    w("")
    w("| quantity | PyTorch side | bound |")
    w("|---|---|---|")
    w("| saved for backward | distinct storages packed by `saved_tensors_hooks` and still alive at the end of the loss; parameters and buffers excluded, inputs and targets included (its own pass) | equal |")
    w("| peak per phase, overall | the CPU allocator's own trace (`torch.profiler`, `profile_memory=True`: every allocation and free with its address and a ns time stamp, phases marked on the same clock), over a baseline of the parameters, existing grads and optimizer state counted from the tensors; this sees scratch a kernel allocates inside itself. A `TorchDispatchMode` tracker (a storage counts from the op that returns it until its `StorageWeakRef` expires) names the op behind each storage for `--explain` | within 1% |")
    w("| end of step: parameters, gradients, optimizer state | distinct storages of the parameters (and buffers), their `.grad`, and the optimizer's state tensors after `step()` | equal |")
    w("")
    w("Step: `zero_grad` (start of step), data (inputs and targets made), forward, loss (from the first "
      "op that reads a target or makes the loss), backward, optimizer step; the loop holds only the loss "
      "(memest `--no-hold-outputs`), or, in the configurations marked hold-outputs, the model's outputs too, "
      "as `outputs = model(**batch)` does (through backward and the optimizer step, until the next forward "
      "and loss have returned; memest `--hold-outputs`); a tensor dies at its last use in the graph, or where "
      "the case's code lets go of it (a local that lives until its function returns: the model file's "
      "`held`); inputs die at the end of the micro-batch. First step = step 1, steady state = step 2. "
      "Inference: `torch.no_grad()`, dropout off.")
    w("")
    w("Through the tracer: `build/pyenv/bin/python tests/conformance/run.py --via-tracer` runs every "
      "case again as a `torch.nn.Module` (tests/conformance/via_tracer.py: the case's torch code, its "
      "parameters and buffers registered on the module) traced by `memest.trace`, estimated with the "
      "same flags and compared with the same measurements to the same bounds; in checkpointed runs "
      "the module calls torch.utils.checkpoint as the measured run does, and memest gets the "
      "regions from the trace instead of a policy. It does not write this file.")
    w("")
    w("Not counted: the optimizer's `record_function` handles (profiler bookkeeping), and in saved "
      "bytes the wrapped Python scalars autograd keeps for `x * 2.0` (host memory on a CUDA run). "
      "Counted: Adam/AdamW's 0-dim f32 `step` counters (4 B per parameter, real CPU memory, which "
      "the cpu-1.13 runtime models). Live bytes include a few transient host scalars (8 B wrapped "
      "numbers, `mean` backward's 4 B cast), hence the -0.0x% errors. Torch runs with one thread "
      "(`torch.set_num_threads(1)`): some CPU kernels size their scratch by the thread count.")
    w("")
    groups = []
    for r in results:
        if r["group"] not in groups:
            groups.append(r["group"])
    for g in groups:
        w(f"## {g}")
        w("")
        w("| case | step | saved (measured / memest) | peak (measured / memest, error) | worst phase | end of step P / G / S | result |")
        w("|---|---|---|---|---|---|---|")
        for r in results:
            if r["group"] != g:
                continue
            q = {x["quantity"]: x for x in r["rows"]}
            saved = q.get("saved_for_backward")
            peak = q.get("peak")
            phases = [x for x in r["rows"] if x["quantity"].startswith("peak.")]
            worst = max(phases, key=lambda x: abs(x["rel_error"]) if x["rel_error"] is not None else 1e9, default=None)
            eos = ["parameters", "gradients", "optimizer_state"]
            e = [q.get(f"end_of_step.{k}") for k in eos]
            eos_s = " / ".join("-" if x is None else (f"{x['measured_bytes']}" if x["ok"] else
                               f"**{x['measured_bytes']} vs {x['estimated_bytes']}**") for x in e)
            name = r["case"].split("/", 1)[1]
            res = {"ok": "pass", "FAIL": "**FAIL**", "ERROR": "**ERROR**"}[r["status"]]
            if r["error"]:
                w(f"| {name} | {r['step']} | - | - | - | - | {res}: {r['error'][:120]} |")
                continue
            sv = "-" if saved is None else (f"{saved['measured_bytes']}" if saved["ok"] else
                                            f"**{saved['measured_bytes']} / {saved['estimated_bytes']}**")
            pk = "-" if peak is None else f"{peak['measured_bytes']} / {peak['estimated_bytes']} ({_fmt_err(peak)})"
            wp = "-" if worst is None else f"{worst['quantity'][5:]} {_fmt_err(worst)}"
            w(f"| {name} | {r['step']} | {sv} | {pk} | {wp} | {eos_s} | {res} |")
        w("")
    notes = [(r["case"], r["note"]) for r in results if r["note"]]
    seen = set()
    if notes:
        w("## Notes")
        w("")
        for cid, n in notes:
            base = cid.split("[", 1)[0]  # one note per case, not per configuration
            if base not in seen:
                seen.add(base)
                w(f"- `{base}`: {n}")
        w("")
    w("Not covered yet: autocast and half precision, SDPA (absent from PyTorch 1.13), non-reentrant "
      "checkpoint (`use_reentrant=False`), a GPU run against PyTorch 2.x.")
    w("")
    text = keep_zoo_section(path_text(path), "\n".join(out))
    with open(path, "w") as f:
        f.write(text)


def path_text(path):
    return open(path).read() if os.path.exists(path) else ""


def keep_zoo_section(old, new):
    """`new` with the model zoo's section of `old` (zoo.py writes it, between its markers)
    appended as it was."""
    begin = "<!-- zoo: begin"
    end = "<!-- zoo: end -->"
    if begin not in old or end not in old:
        return new
    section = begin + old.split(begin, 1)[1].split(end, 1)[0] + end
    return new.rstrip("\n") + "\n\n" + section + "\n"


if __name__ == "__main__":
    sys.exit(main())
