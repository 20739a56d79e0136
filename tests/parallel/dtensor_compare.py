#!/usr/bin/python3
"""memest's DTensor tensor parallelism (--tensor-layers dtensor) against
tests/parallel/expected/dtensor_<case>.json (PyTorch 2.15 measured on the CPU with gloo by
dtensor_tp.py, docs/parallelism-truth.md section 10), rank 0, every phase of the first step
(memest --first-step) and of the steady state (the last measured step), without gloo's own
copies (what NCCL would not allocate). memest runs on the case's unsharded model file
(expected/models/dtensor-<model>.json, traced by memest's tracer) with the case's plan, the
CPU runtime, float32 and the for-loop Adam, as the measurement.

  /usr/bin/python3 tests/parallel/dtensor_compare.py [--memest PATH] [--markdown] [--check]

--check (CI, scripts/test.sh; reads the expected files, needs no PyTorch) exits 1 unless, for
every case memest can express, the saved-for-backward bytes are the measured ones and every
phase's peak is within -SCALAR_SLACK bytes (the few 4-byte scalars of the loss and Adam's step
counters that the measurement and memest place differently, docs/parallelism-truth.md 10.9)
and +1% of the measurement. The traced attention-sbh files are refused by the tensor-parallel
pass (a 4-D matmul recorded as expand, view and bmm, whose merged dim the pass cannot split):
SKIP, with the refusal.
"""
import argparse
import glob
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXPECTED = os.path.join(HERE, "expected")
PHASES = ("DATA", "FORWARD", "LOSS", "BACKWARD", "OPTIMIZER_STEP")
SCALAR_SLACK = 16      # bytes
PEAK_TOLERANCE = 0.01  # over, at most
# memest's tensor plan for each model file (dtensor_tp.py's plan() on the same modules).
PLANS = {"mlp": ("feed_forward.w1=colwise", "feed_forward.w2=rowwise"),
         "attention": ("attention.wq=colwise", "attention.wk=colwise", "attention.wv=colwise",
                       "attention.wo=rowwise"),
         "lm": ("tok_embeddings=rowwise", "output=colwise"),
         "mlp-sbh": ("feed_forward.w1=colwise", "feed_forward.w2=rowwise"),
         "attention-sbh": ("attention.wqkv=colwise", "attention.wo=rowwise")}


def command(memest, case, first):
    cfg = case["config"]
    cmd = [memest, "estimate", "--local", "--runtime", "cpu-1.13", "--json", "--no-advice",
           "--no-hold-outputs", "--model",
           os.path.join(EXPECTED, "models", f"dtensor-{cfg['model']}.json"),
           "--batch", str(case["dims"]["batch"]), "--precision", "fp32", "--optimizer", "adam",
           "--optimizer-impl", "for-loop", "--tensor-parallel", str(case["world_size"]),
           "--tensor-layers", "dtensor"]
    for entry in PLANS[cfg["model"]]:
        cmd += ["--tensor-plan", entry]
    if cfg["sp"]:
        cmd.append("--sequence-parallel")
    if first:
        cmd.append("--first-step")
    return cmd


def compare(memest, case):
    """Rows (step, quantity, measured, estimated, ok), or a refusal."""
    rank = case["ranks"][0]
    rows = []
    for label, first, step in (("first", True, rank["steps"][0]), ("steady", False, rank["steps"][-1])):
        out = subprocess.run(command(memest, case, first), capture_output=True, text=True)
        if out.returncode:
            return None, out.stderr.strip()
        est = json.loads(out.stdout)
        got = {p["phase"].replace("PHASE_", ""): int(p.get("allocatedBytes", 0)) for p in est["phases"]}
        if first:
            saved = int(est.get("savedForBackwardBytes", 0))
            rows.append(("-", "saved_for_backward", rank["saved_for_backward"], saved,
                         saved == rank["saved_for_backward"]))
        for ph in PHASES:
            m, e = step["phases_without_gloo"][ph], got.get(ph, 0)
            rows.append((f"{label} (step {step['step']})", f"peak.{ph}", m, e,
                         -SCALAR_SLACK <= e - m <= PEAK_TOLERANCE * m))
    return rows, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--memest", default=os.path.join(ROOT, "build", "bin", "memest"))
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    failed = passed = skipped = 0
    if args.markdown:
        print("| case | saved | " + " | ".join(PHASES) + " |")
        print("|---|---|" + "---|" * len(PHASES))
    for path in sorted(glob.glob(os.path.join(EXPECTED, "dtensor_*.json"))):
        with open(path) as f:
            case = json.load(f)
        rows, refused = compare(args.memest, case)
        if refused is not None:
            skipped += 1
            print(f"SKIP {case['case']}: {refused}" if not args.markdown
                  else f"| {case['case']} | refused: {refused} |" + "|" * len(PHASES))
            continue
        bad = [r for r in rows if not r[4]]
        failed += bool(bad)
        passed += not bad
        if args.markdown:
            steady = {q: (m, e) for s, q, m, e, _ in rows if s.startswith("steady")}
            saved = rows[0]
            print(f"| {case['case']} | {saved[2]:,} / {saved[3]:,} ({saved[3] - saved[2]:+,}) | " +
                  " | ".join(f"{steady['peak.' + ph][0]:,} / {steady['peak.' + ph][1]:,} "
                             f"({steady['peak.' + ph][1] - steady['peak.' + ph][0]:+,})" for ph in PHASES) + " |")
            continue
        print(f"{'FAIL' if bad else 'ok  '} {case['case']}")
        for s, q, m, e, ok in rows:
            if not ok or not args.check:
                print(f"     {'' if ok else '!! '}{s:>18} {q:<22} measured {m:>10,}  memest {e:>10,}  ({e - m:+,})")
    print(f"dtensor: {passed} passed, {failed} failed, {skipped} skipped", file=sys.stderr)
    return 1 if args.check and failed else 0


if __name__ == "__main__":
    sys.exit(main())
