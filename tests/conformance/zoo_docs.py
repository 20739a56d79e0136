"""The zoo's section of docs/fidelity.md, written by zoo.py from its results.

The section lies between zoo.BEGIN and zoo.END; the rest of the file is run.py's, which keeps
this section as it is when it rewrites the file (run.keep_zoo_section).
"""
import datetime
import os

import torch

from zoo import BEGIN, COMMAND, END


def _fmt(r):
    if r is None:
        return "-"
    if r["rel_error"] is None:
        return "inf"
    return f"{r['rel_error']:+.2%}"


def _cell(r):
    if r is None:
        return "-"
    if r["ok"]:
        return f"{r['measured_bytes']}"
    return f"**{r['measured_bytes']} / {r['estimated_bytes']}**"


def section(results, isa, seconds, zoo_models):
    out = [BEGIN, "", "## The model zoo", ""]
    w = out.append
    w("Real models (torchvision, Hugging Face `transformers` built from their configs, nn.Transformer, "
      "RNN language models, UNets; tests/conformance/zoo_models.py), each traced by `memest.trace` "
      "and the traced graph estimated by `memest estimate --local --runtime cpu-1.13`, against the "
      "same module measured by real PyTorch with the method above (tests/conformance/zoo_measure.py; "
      "the loop holds only the loss across backward, the output is dropped once the loss is made). "
      "Training: SGD, for-loop, set-to-none, first step and steady state; inference: `eval()` under "
      "`no_grad`. Same bounds: saved and end-of-step bytes equal, peaks within 1%. Regenerate with")
    w("")
    w("```sh")
    w(COMMAND)
    w("```")
    w("")
    lines = [(r, m) for r in results for m in r["modes"]]
    passed = sum(1 for _, m in lines if m["status"] == "ok")
    traced = sum(1 for _, m in lines if m["status"] in ("ok", "FAIL", "ESTIMATE ERROR"))
    import transformers  # noqa: the version the zoo ran with
    w(f"PyTorch {torch.__version__}, torchvision {_torchvision_version()}, transformers "
      f"{transformers.__version__}; oneDNN on "
      f"{isa}; {datetime.date.today().isoformat()}; {seconds / 60:.0f} min for the whole zoo.")
    w("")
    w(f"**{len(results)} models, {len(lines)} model-modes: {traced} traced, {passed} within every bound.**")
    w("")
    w("Status: `pass` (every quantity within its bound), `FAIL` (traced, some quantity out of bounds: "
      "in bold, measured / memest), `NOT TRACED` (memest.trace raised UnsupportedOp: the aten op and "
      "the module scope), `ESTIMATE ERROR` (memest refused the traced graph), `TRACER ERROR` (any other "
      "exception in the tracer: a bug), `ERROR` (the model does not run here).")
    w("")
    groups = []
    for r in results:
        if r["group"] not in groups:
            groups.append(r["group"])
    for g in groups:
        w(f"### {g}")
        w("")
        w("| model | mode | step | saved (measured / memest) | peak (measured / memest, error) | worst phase | "
          "end of step P / G / S | result |")
        w("|---|---|---|---|---|---|---|---|")
        for r in results:
            if r["group"] != g:
                continue
            for m in r["modes"]:
                if not m["steps"]:
                    if m["status"] == "NOT TRACED":
                        why = f"{m['op']}" + (f" ({m['detail']})" if m.get("detail") else "") + \
                              f" in `{m['scope'] or '(top)'}`"
                    else:
                        why = (m.get("error") or "")[:160].replace("|", "/")
                    w(f"| {r['name']} | {m['mode']} | - | - | - | - | - | **{m['status']}**: {why} |")
                    continue
                for st in m["steps"]:
                    q = {x["quantity"]: x for x in st["rows"]}
                    phases = [x for x in st["rows"] if x["quantity"].startswith("peak.")]
                    worst = max(phases, key=lambda x: abs(x["rel_error"]) if x["rel_error"] is not None else 1e9,
                                default=None)
                    peak = q.get("peak")
                    pk = "-" if peak is None else f"{peak['measured_bytes']} / {peak['estimated_bytes']} ({_fmt(peak)})"
                    wp = "-" if worst is None else f"{worst['quantity'][5:]} {_fmt(worst)}"
                    eos = " / ".join(_cell(q.get(f"end_of_step.{k}")) for k in ("parameters", "gradients", "optimizer_state"))
                    res = "pass" if all(x["ok"] for x in st["rows"]) else "**FAIL**"
                    w(f"| {r['name']} | {m['mode']} | {st['step']} | {_cell(q.get('saved_for_backward'))} | {pk} | "
                      f"{wp} | {eos} | {res} |")
        w("")
    not_traced = {}
    for r, m in lines:
        if m["status"] == "NOT TRACED":
            not_traced.setdefault(m["op"] + (f" ({m['detail']})" if m.get("detail") else ""), []).append(
                f"{r['name']} [{m['mode']}]")
    if not_traced:
        w("### Not traced yet, by the op that stops them")
        w("")
        for op, names in sorted(not_traced.items()):
            w(f"- `{op}`: {', '.join(names)}")
        w("")
    w("### The models")
    w("")
    for r in results:
        if r.get("note"):
            w(f"- `{r['name']}`: {r['note']}")
    w("")
    w("Left out of the torchvision classification models (every other one of torchvision "
      f"{_torchvision_version()} is in the zoo):")
    w("")
    for name, why in sorted(zoo_models.EXCLUDED.items()):
        w(f"- `{name}`: {why}")
    w("")
    w("CI runs the subset marked `ci` in zoo_models.py (`zoo.py --ci`, in scripts/test.sh): "
      + ", ".join(f"`{r['name']}`" for r in results if r.get("ci")) + ". It fails on any of "
      "them that does not pass, except these, known not to pass yet (zoo_models.KNOWN):")
    w("")
    for (name, mode), why in zoo_models.KNOWN.items():
        w(f"- `{name}` [{mode}]: {why}")
    w("")
    w(END)
    return out


def _torchvision_version():
    import torchvision
    return torchvision.__version__.split("a")[0].split("+")[0]


def write(path, results, isa, seconds, zoo_models):
    text = open(path).read() if os.path.exists(path) else ""
    new = "\n".join(section(results, isa, seconds, zoo_models))
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        text = head + new + tail
    else:
        text = text.rstrip("\n") + "\n\n" + new + "\n"
    with open(path, "w") as f:
        f.write(text)
