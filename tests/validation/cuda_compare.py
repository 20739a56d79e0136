#!/usr/bin/env python3
"""Compares memest's estimates with the steps tests/validation/cuda_record.py recorded on a GPU.

For each recorded case with a trace (DIR/NAME.MODE.trace.json, or .trace.json.gz: cuda_record.py's,
or one made elsewhere with its --trace-only and the same torch and transformers), `memest
estimate --local --json` of the traced model with the case's run (optimizer, precision, --no-hold-outputs, training or inference, the recording GPU as
the device) against the measured steady-state step: per phase, the peak allocated and reserved
bytes; and the step's peak. Prints a table, and with --markdown writes it as a section of docs.

    python3 tests/validation/cuda_compare.py DIR [--build build] [--markdown FILE]

Exit status: 0 when every estimate ran; 1 otherwise (an under-prediction is reported, not failed:
the table is the record of where memest stands on the GPU).
"""
import argparse
import glob
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEVICES = {"NVIDIA H200": "h200-141gb", "NVIDIA H100 80GB HBM3": "h100-80gb"}
PHASES = {"DATA": "PHASE_DATA", "FORWARD": "PHASE_FORWARD", "LOSS": "PHASE_LOSS",
          "BACKWARD": "PHASE_BACKWARD", "OPTIMIZER_STEP": "PHASE_OPTIMIZER_STEP"}


def estimate_flags(rec, trace):
    flags = ["estimate", "--local", "--json", "--no-advice", "--model", trace,
             "--batch", str(rec["batch"]), "--precision", rec["precision"],
             "--device", DEVICES.get(rec.get("device_name"), "h100-80gb")]
    if rec["mode"] == "training":
        return flags + ["--optimizer", rec["optimizer"], "--optimizer-impl", "foreach",
                        "--weight-decay", "0", "--no-hold-outputs"]
    return flags + ["--mode", "inference"]


def compare(rec, trace, memest):
    cmd = [memest] + estimate_flags(rec, trace)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    if proc.returncode not in (0, 3):  # 3: does not fit (still an estimate)
        return None, proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
    est = json.loads(proc.stdout)
    by_phase = {p.get("phase"): p for p in est.get("phases", [])}
    measured = next(s for s in rec["steps"] if s["step"] == "measured")["phases"]
    rows = []
    for m in measured:
        e = by_phase.get(PHASES[m["phase"]], {})
        rows.append((m["phase"], m["peak_allocated"], int(e.get("allocatedBytes", 0)),
                     m["peak_reserved"], int(e.get("reservedBytes", 0))))
    rows.append(("peak", max(r[1] for r in rows), int(est["peak"]["allocatedBytes"]),
                 max(r[3] for r in rows), int(est["peakReservedBytes"])))
    return rows, " ".join(cmd[1:]).replace(trace, os.path.basename(trace))


def pct(e, m):
    return f"{100.0 * (e - m) / m:+.2f}%" if m else "-"


def mib(n):
    return f"{n / 2**20:.1f}"


def find_trace(path):
    """NAME.MODE.trace.json beside NAME.MODE.json, or its gzipped copy (the stored records')."""
    trace = path[:-len(".json")] + ".trace.json"
    if os.path.exists(trace) or not os.path.exists(trace + ".gz"):
        return trace
    return trace + ".gz"


def compare_dir(directory, memest):
    """Per recorded case, in name order: (name, record, rows or None, detail).

    rows as compare() gives them; None with `detail` saying why when the case was not measured
    on a GPU, not traced, or its estimate failed ("estimate failed: ...")."""
    out = []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        if path.endswith(".trace.json"):
            continue
        with open(path) as f:
            rec = json.load(f)
        name = f"{rec['case']} [{rec['mode']}]"
        trace = find_trace(path)
        if "steps" not in rec or "peak_allocated" not in rec["steps"][-1]["phases"][0]:
            out.append((name, rec, None, "not measured on a GPU"))
            continue
        if "trace_error" in rec or not os.path.exists(trace):
            out.append((name, rec, None, f"not traced: {rec.get('trace_error', 'no trace')}"))
            continue
        with tempfile.TemporaryDirectory() as tmp:
            if trace.endswith(".gz"):
                plain = os.path.join(tmp, os.path.basename(trace)[:-len(".gz")])
                with gzip.open(trace, "rb") as src, open(plain, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                trace = plain
            rows, detail = compare(rec, trace, memest)
        out.append((name, rec, rows, detail if rows is not None else f"estimate failed: {detail}"))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir")
    parser.add_argument("--build", default=os.path.join(REPO, "build"))
    parser.add_argument("--markdown")
    args = parser.parse_args(argv)
    memest = os.path.join(args.build, "bin", "memest")
    lines, failed = [], 0
    for name, rec, rows, detail in compare_dir(args.dir, memest):
        if rows is None:
            failed += detail.startswith("estimate failed")
            if not detail.startswith("not measured"):
                lines.append(f"### {name}\n\n{detail.split(':')[0]}: `{detail.split(': ', 1)[-1]}`\n")
            print(f"{name}: {detail[:300]}")
            continue
        lines.append(f"### {name}\n\n`memest {detail}`; batch {rec['batch']}, "
                     f"{rec['parameters']:,} parameters\n")
        lines.append("| phase | PyTorch allocated (MiB) | memest | error | PyTorch reserved (MiB) | memest | error |")
        lines.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        print(name)
        for phase, ma, ea, mr, er in rows:
            lines.append(f"| {phase} | {mib(ma)} | {mib(ea)} | {pct(ea, ma)} | {mib(mr)} | {mib(er)} | {pct(er, mr)} |")
            print(f"  {phase:15} allocated {ma:>14,} est {ea:>14,} {pct(ea, ma):>9}   "
                  f"reserved {mr:>14,} est {er:>14,} {pct(er, mr):>9}")
        lines.append("")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
