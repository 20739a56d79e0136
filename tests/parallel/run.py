#!/usr/bin/python3
"""The per-rank truth for memest's parallelism pass: real PyTorch 1.13 on the CPU, gloo, N
processes; each rank measured as the conformance suite measures one process.

Usage (Debian's PyTorch: /usr/bin/python3):
  /usr/bin/python3 tests/parallel/run.py [--case SUBSTRING ...] [--list] [--write-expected]
      [--report FILE] [--memest [PATH]] [--no-measure]

For every case (cases.py) it starts the case's world size of gloo ranks (one set of processes
per world size, its cases run in order), measures every rank and compares each number with
tests/parallel/expected/<case>.json: a measurement that changes fails (exit 1), as does a case
that errors or has no expected file. --write-expected writes the expected files instead (and
the models' memest model files, expected/models/<model>.json). docs/parallelism-truth.md gives
the closed-form account of every number.

Equal means equal to the byte, except live-byte figures (peaks, live at a mark, `other_*`),
which may move by PEAK_SLACK bytes: the few small tensors whose free the trace sometimes misses
(common.py, "Unseen frees"; at most Trace.UNSEEN_LIMIT bytes each) are left out of the figures
when it does. `unseen_frees` itself is reported, not compared.

--memest [PATH] (default build/bin/memest) also compares memest's estimate of every DDP and
ZeroRedundancyOptimizer case with this run's measurement of the rank memest estimates
(memest_check.py: which quantities, to what bounds, which cases are SKIP and why), prints each
quantity measured vs estimated and `memest: N passed, M failed, K skipped`; a failure there
fails the run too. --no-measure takes the measurement from expected/<case>.json instead of
running PyTorch (quick, for memest's side only).
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import common  # noqa: E402,F401  (paths, environment)

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import memest_check  # noqa: E402
import registry  # noqa: E402

EXPECTED = os.path.join(HERE, "expected")
PEAK_SLACK = 1024  # bytes


def case_file(cid):
    return os.path.join(EXPECTED, re.sub(r"[^A-Za-z0-9_.-]+", "_", cid) + ".json")


def model_json(model):
    """memest's model file of the whole model, recorded as the conformance suite records."""
    from recorder import ParamStore, Recorder
    fn, batch = registry.MODEL_FNS[model]
    rec = Recorder(ParamStore(seed=0), training=True)
    rec.finish(fn(rec, batch))
    return rec.to_model_json(batch)


def run_world(world, cids):
    """Runs the cases on `world` ranks; returns {case id: [rank results]}."""
    tmp = tempfile.mkdtemp(prefix="memest-parallel-")
    try:
        try:
            mp.spawn(common.worker, args=(world, cids, tmp, os.path.join(tmp, "rendezvous")),
                     nprocs=world, join=True)
            spawn_error = None
        except Exception as e:  # a rank died: report what the others wrote
            spawn_error = f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"
        out = {}
        stderr = ""
        for r in range(world):
            path = os.path.join(tmp, f"stderr.{r}")
            if os.path.exists(path):
                with open(path, errors="replace") as f:
                    lines = [x for x in f.read().splitlines() if "CPUAllocator.cpp" not in x
                             and "InitGoogleLogging" not in x]
                stderr += "".join(f"[rank {r}] {x}\n" for x in lines[-20:])
        for n, cid in enumerate(cids):
            ranks = []
            for r in range(world):
                path = os.path.join(tmp, f"{n}.{r}.json")
                if os.path.exists(path):
                    with open(path) as f:
                        ranks.append(json.load(f))
                else:
                    ranks.append({"ok": False, "error": spawn_error or "no result"})
            if any(not x.get("ok") for x in ranks):
                ranks[0]["stderr"] = stderr
            out[cid] = ranks
        return out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def flatten(x, prefix=""):
    """{"a": {"b": [1, 2]}} -> {"a.b[0]": 1, "a.b[1]": 2}"""
    out = {}
    if isinstance(x, dict):
        for k, v in x.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            out.update(flatten(v, f"{prefix}[{i}]"))
    else:
        out[prefix] = x
    return out


def slack_ok(key, m, e):
    if m == e:
        return True
    last = key.rsplit(".", 1)[-1]
    loose = ("peak" in key or "live" in key or "phases" in key or last.startswith("other")) \
        and isinstance(m, int) and isinstance(e, int)
    return loose and abs(m - e) <= PEAK_SLACK


def compare(measured, expected):
    """Differences between a case's measured and expected rank results."""
    fm, fe = flatten(measured), flatten(expected)
    for f in (fm, fe):  # what the trace missed varies from run to run: reported, not compared
        for k in [k for k in f if ".unseen_frees" in k]:
            del f[k]
    diffs = []
    for k in sorted(set(fm) | set(fe)):
        if k not in fe:
            diffs.append(f"{k}: measured {fm[k]}, not expected")
        elif k not in fm:
            diffs.append(f"{k}: expected {fe[k]}, not measured")
        elif not slack_ok(k, fm[k], fe[k]):
            diffs.append(f"{k}: measured {fm[k]}, expected {fe[k]}")
    return diffs


def print_explain(cid, ranks):
    print(f"== {cid}")
    for i, r in enumerate(ranks):
        for ph, items in (r.get("explain") or {}).items():
            total = sum(nb * n for nb, n, _, _ in items)
            print(f"   rank {i} {ph}: {total} B live at its peak")
            for nb, n, made, op in items:
                print(f"      {nb * n:>10} = {n:>3} x {nb:<9} made in {made:<18} {op}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", default=[], metavar="SUBSTRING",
                    help="run only cases whose id contains this (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the case ids and exit")
    ap.add_argument("--write-expected", action="store_true",
                    help="write expected/<case>.json (and expected/models/) from this run")
    ap.add_argument("--report", help="write every measurement here (JSON)")
    ap.add_argument("--memest", nargs="?", const="", metavar="PATH",
                    help="also compare memest's estimate of the DDP and ZeRO cases with the "
                         "measurement (default PATH: build/bin/memest)")
    ap.add_argument("--no-measure", action="store_true",
                    help="with --memest: take the measurement from expected/<case>.json")
    ap.add_argument("--explain", action="store_true",
                    help="print, per rank and phase, what was live at the phase's peak (the op "
                         "that allocated each block); not compared")
    args = ap.parse_args()

    sel = [c for c in registry.CASES.values() if not args.case or any(s in c.id for s in args.case)]
    if args.list:
        for c in sel:
            print(f"{c.id}  (world {c.world})")
        return 0
    if not sel:
        print("no case matches", file=sys.stderr)
        return 2
    if args.no_measure and args.memest is None:
        print("--no-measure goes with --memest", file=sys.stderr)
        return 2
    if args.explain:
        os.environ["PARALLEL_EXPLAIN"] = "1"  # read by the ranks (common.explained)
    memest = memest_check.find_memest(args.memest) if args.memest is not None else None
    failed, report = 0, {}
    if not args.no_measure:
        failed, report = measure(args, sel)
    if memest is not None:
        failed += check_memest(memest, sel, report, args.no_measure)
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if failed else 0


def measure(args, sel):
    """Measures the cases `sel` and compares them with their expected files (or writes those);
    prints per case and `N passed, M failed`. Returns (failures, {case id: its measurement})."""
    t0 = time.time()
    results = {}
    for world in sorted({c.world for c in sel}):
        results.update(run_world(world, [c.id for c in sel if c.world == world]))
    # A trace that lost allocation events under load shows less live at the end than the model
    # states it holds (other_at_end < 0), which no step can: such a case is measured once more.
    lost = [cid for cid, ranks in results.items()
            if any(st.get("other_at_end", 0) < 0 for r in ranks for st in r.get("steps", []))]
    for world in sorted({registry.CASES[cid].world for cid in lost}):
        again = [cid for cid in lost if registry.CASES[cid].world == world]
        print(f"re-measuring {', '.join(again)}: a trace lost allocation events (live below the "
              "model states at a step's end)")
        results.update(run_world(world, again))

    failed, report = 0, {}
    if args.write_expected:
        os.makedirs(os.path.join(EXPECTED, "models"), exist_ok=True)
        for m in sorted({c.model for c in sel}):
            with open(os.path.join(EXPECTED, "models", f"{m}.json"), "w") as f:
                json.dump(model_json(m), f, indent=1)
                f.write("\n")
    for c in sel:
        ranks = results[c.id]
        errors = [f"rank {i}: {r.get('error')}" for i, r in enumerate(ranks) if not r.get("ok")]
        doc = {"case": c.id, "world_size": c.world, "config": c.params, "model": c.model,
               "note": c.note, "torch": torch.__version__,
               "ranks": [{k: v for k, v in r.items() if k not in ("ok", "explain")} for r in ranks]}
        if args.explain:
            print_explain(c.id, ranks)
        report[c.id] = doc
        if errors:
            failed += 1
            print(f"ERROR {c.id}")
            for e in errors:
                print(f"      {e}")
            tb = next((r.get("traceback") for r in ranks if r.get("traceback")), None)
            if tb:
                print("      " + tb.strip().replace("\n", "\n      "))
            if ranks[0].get("stderr"):
                print("      stderr:\n      " + ranks[0]["stderr"].strip().replace("\n", "\n      "))
            continue
        path = case_file(c.id)
        if args.write_expected:
            with open(path, "w") as f:
                json.dump(doc, f, indent=1)
                f.write("\n")
            print(f"wrote {c.id}")
            continue
        if not os.path.exists(path):
            failed += 1
            print(f"FAIL  {c.id}\n      no expected file {os.path.relpath(path)} (run with --write-expected)")
            continue
        with open(path) as f:
            exp = json.load(f)
        diffs = compare({"config": doc["config"], "ranks": doc["ranks"]},
                        {"config": exp.get("config"), "ranks": exp.get("ranks")})
        if diffs:
            failed += 1
            print(f"FAIL  {c.id}")
            for d in diffs[:20]:
                print(f"      {d}")
            if len(diffs) > 20:
                print(f"      ... {len(diffs) - 20} more")
        else:
            print(f"ok    {c.id}")
    print(f"({time.time() - t0:.1f} s)")
    print(f"{len(sel) - failed} passed, {failed} failed")
    return failed, report


def check_memest(memest, sel, report, from_expected):
    """memest against each DDP and ZeRO case's measurement (report[case id]["ranks"]; with
    `from_expected`, its expected file). Prints per case and quantity; adds the rows to the
    report. Returns the number of failed cases."""
    t0 = time.time()
    print(f"\n== memest ({os.path.relpath(memest)}) against the measured rank it estimates")
    passed = failed = skipped = 0
    for c in sel:
        skip = memest_check.not_expressible(c)
        if skip:
            skipped += 1
            print(f"SKIP  {c.id}: {skip}")
            continue
        if from_expected:
            with open(case_file(c.id)) as f:
                ranks = json.load(f)["ranks"]
        elif c.id in report and all("steps" in r for r in report[c.id]["ranks"]):
            ranks = report[c.id]["ranks"]
        else:
            failed += 1
            print(f"ERROR {c.id}: no measurement to compare with")
            continue
        try:
            rows, info = memest_check.check(memest, c, ranks)
        except Exception as e:  # memest refused or failed: a failure, with its message
            failed += 1
            print(f"ERROR {c.id}: {type(e).__name__}: {e}")
            continue
        ok = all(r["ok"] for r in rows)
        passed, failed = passed + ok, failed + (not ok)
        print(f"{'ok' if ok else 'FAIL':<5} {c.id} [rank {info['rank']} of {c.world}]")
        memest_check.print_rows(rows)
        report.setdefault(c.id, {"case": c.id})["memest"] = {"rank": info["rank"], "rows": rows}
    print(f"({time.time() - t0:.1f} s)")
    print(f"memest: {passed} passed, {failed} failed, {skipped} skipped")
    return failed


if __name__ == "__main__":
    sys.exit(main())
