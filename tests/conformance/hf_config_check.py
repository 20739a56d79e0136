#!/usr/bin/env python3
"""memest's --hf-config builders against real Hugging Face models (the zoo's), op by op.

Usage (an interpreter with PyTorch 1.13, transformers and memest: build/pyenv/bin/python):
  build/pyenv/bin/python tests/conformance/hf_config_check.py [-k NAME] [--memest PATH]
      [--dump DIR] [--layers] [--report FILE]

For each small config of zoo_models.HF whose model_type `memest estimate --hf-config` builds
(llama, mistral, qwen2, gemma, gemma2, phi3, gpt_neox, gpt2, mixtral, qwen2_moe, falcon,
opt, bert, roberta, vit, t5; qwen3, qwen3_moe and gemma3_text are not in transformers 4.47.1; the zoo's falcon_40b and
opt_350m are those types too) and each of its zoo modes
(training: SGD, first step and steady state; inference), in a child process of its own:
  1. the config as the zoo makes it (transformers' Config class with the zoo's kwargs and vocab
     512, use_cache False) written as config.json (`config.to_dict()`);
  2. `memest estimate --local --hf-config config.json --seq 16 --batch <zoo batch> --runtime
     cpu-1.13` with the flags run.py gives the zoo's traced estimate (run.estimate: precision,
     ISA and caches, optimizer and its impl, --first-step or not, --no-hold-outputs);
  3. the zoo's traced estimate of the same module (memest.trace + run.estimate, as zoo.py);
  4. the module measured by real PyTorch as the zoo measures it (zoo_measure.ModuleRun);
and prints, per model, mode and step, every quantity the zoo compares (run.compare): measured,
the hf-config estimate, the traced estimate, and the hf-config estimate's difference in bytes
and percent, marked `!!` outside the suite's bounds (saved and end-of-step bytes equal, peaks
within 1%), `UNDER` where it is below the measurement and out of bounds, `under (within bounds)`
where it is below but within them.

--lora JSON wraps each model in PEFT's get_peft_model(model, LoraConfig(**JSON)) (peft 0.13.2
with torch 1.13; e.g. '{"r": 8, "target_modules": ["q_proj", "v_proj"], "lora_dropout": 0.1}')
before it is traced and measured, and gives memest the LoraConfig's to_dict() as its
adapter_config.json (--lora-config).

--use-cache writes the configs with use_cache true and measures training with a loop that
holds the model's whole output (its past_key_values, T5's encoder output) through backward and
the optimizer step into the next forward, estimated with --hold-outputs.

--dump DIR keeps the config.json and both estimates' JSON replies per model, mode and step;
--layers prints, per mode, the per-layer rows (memest's `layers`) where the hf-config estimate
and the traced one differ, and each estimate's peak op and scope.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
warnings.filterwarnings("ignore")
os.environ.setdefault("GLOG_minloglevel", "2")

# model_types memest's --hf-config builds that transformers 4.47.1 has (qwen3 came in 4.51,
# gemma3_text in 4.50).
SUPPORTED = ("bert", "roberta", "vit", "t5", "llama", "mistral", "qwen2", "gemma", "gemma2", "phi3", "gpt_neox", "gpt2",
             "mixtral", "qwen2_moe", "falcon", "falcon_40b", "opt", "opt_350m")
STEPS = {"training": [("first", True), ("steady", False)], "inference": [("inference", False)]}


# The zoo's hf_vit (zoo_models._hugging_face): an image classifier, whose sequence is its patches
# and the class token, (32 / 8)^2 + 1 = 17.
VIT = ("vit", "ViTConfig", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                intermediate_size=128, image_size=32, patch_size=8, num_labels=10))
SEQ = {"vit": 17}


def hf_configs():
    """(zoo name, Config class name, kwargs) of zoo_models.HF that --hf-config builds, and
    the zoo's ViT."""
    import zoo_models
    return [(name, cfg_cls, dict(zoo_models.HF_SMALL, **kw))
            for name, _cls, cfg_cls, kw, _ci in zoo_models.HF + zoo_models.HF_SEQ2SEQ
            if name in SUPPORTED] + [VIT]


def write_config(cfg_cls, kw, path, use_cache=False):
    """The zoo's config (zoo_models._hf: the Config class with its kwargs, use_cache False unless
    asked) as a config.json."""
    import transformers
    transformers.logging.set_verbosity_error()
    config = getattr(transformers, cfg_cls)(**kw)
    config.use_cache = use_cache
    with open(path, "w") as f:
        json.dump(config.to_dict(), f, indent=1)
    return config


def write_adapter_config(lora, path):
    """PEFT's adapter_config.json of LoraConfig(**lora), as save_pretrained writes it (sets as
    lists)."""
    import peft
    d = peft.LoraConfig(**lora).to_dict()
    d = {k: sorted(v) if isinstance(v, set) else v for k, v in d.items()}
    with open(path, "w") as f:
        json.dump(d, f, indent=1, default=str)


def hf_estimate(memest, config_path, seq, batch, cfg, first_step, extra=()):
    """`memest estimate --hf-config` with the flags run.estimate gives a model file."""
    import run as suite
    cmd = [memest, "estimate", "--local", "--hf-config", config_path, "--seq", str(seq)]
    cmd += suite.step_flags(batch, cfg, first_step) + list(extra)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"memest exited {p.returncode}: {p.stderr.strip() or p.stdout.strip()}"
                           f"\n  command: {' '.join(cmd)}")
    return json.loads(p.stdout), cmd


# ------------------------------------------------------------------ one model (child process)

def with_cache(run):
    """Makes a zoo model (zoo_models._hf sets use_cache False) return its cache, the whole output
    of an encoder-decoder too."""
    module = run.module
    if hasattr(module, "full_output"):
        module.full_output = True
        module = module.model
    module.config.use_cache = True


def run_one(name, memest_bin, isa, dump, lora=None, use_cache=False):
    import torch
    import memest
    import run as suite
    import zoo_models
    from measure import Config
    from zoo_measure import ModuleRun

    torch.set_num_threads(1)
    suite.CPU_ISA = isa
    suite.CPU_CACHE_FLAGS = suite.onednn_cache_flags()
    _, cfg_cls, kw = next(c for c in hf_configs() if c[0] == name)
    entry = zoo_models.find(f"hf_{name}")
    workdir = dump or tempfile.mkdtemp(prefix="hf_config_check.")
    os.makedirs(workdir, exist_ok=True)
    config_path = os.path.join(workdir, f"{name}.config.json")
    write_config(cfg_cls, kw, config_path, use_cache)
    extra = []
    if name in zoo_models.HF_ROUTES:  # the zoo's routers route as this load assumes
        extra = ["--expert-load", zoo_models.HF_ROUTES[name]]
    if lora:
        adapter_path = os.path.join(workdir, f"{name}.adapter_config.json")
        write_adapter_config(lora, adapter_path)
        extra += ["--lora-config", adapter_path]
    out = {"name": name, "config": config_path, "batch": entry.batch, "seq": zoo_models.HF_SEQ,
           "modes": []}
    for mode in entry.modes:
        if use_cache and name == "gemma2" and mode != zoo_models.TRAIN:
            continue  # 4.47's Gemma 2 makes its inference cache with torch._dynamo (not in 1.13)
        cfg = Config(hold_outputs=use_cache) if mode == zoo_models.TRAIN else Config(mode="inference")
        res = {"mode": mode, "config": cfg.label(), "steps": []}
        out["modes"].append(res)
        run = ModuleRun(entry, cfg)
        if use_cache:
            with_cache(run)
        if lora:
            import peft
            from zoo_measure import _Store
            run.module = peft.get_peft_model(run.module, peft.LoraConfig(**lora))
            run.module.train(cfg.training)
            run.store = _Store(run.module)
        inputs, tgt = run.example()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = memest.trace(run.module, inputs, target=tgt,
                                  loss=entry.loss if cfg.training else None, training=cfg.training)
        hf, tr = [], []
        for step, first in STEPS[mode]:
            h, cmd = hf_estimate(memest_bin, config_path, SEQ.get(name, zoo_models.HF_SEQ),
                                 entry.batch, cfg, first, extra)
            t = suite.estimate(memest_bin, dict(traced), entry.batch, cfg, first)
            hf.append(h)
            tr.append(t)
            res.setdefault("commands", []).append(" ".join(cmd))
            if dump:
                for tag, r in (("hf", h), ("traced", t)):
                    with open(os.path.join(dump, f"{name}.{mode}.{step}.{tag}.json"), "w") as f:
                        json.dump(r, f, indent=1)
        saved = run.measure_saved()
        measured = run.run_steps(steps=len(STEPS[mode]) if cfg.training else 1)
        for (step, _), m, h, t in zip(STEPS[mode], measured, hf, tr):
            mq = suite.measured_quantities(m, saved, cfg.training)
            hq = suite.estimated_quantities(h, cfg.training)
            tq = suite.estimated_quantities(t, cfg.training)
            hrows = suite.compare(name, step, mq, hq)
            trows = {r["quantity"]: r for r in suite.compare(name, step, mq, tq)}
            rows = []
            for r in hrows:
                q = r["quantity"]
                tr_row = trows.get(q)
                rows.append({"quantity": q, "measured": r["measured_bytes"], "hf": r["estimated_bytes"],
                             "traced": tq.get(q, 0), "hf_ok": r["ok"],
                             "traced_ok": tr_row["ok"] if tr_row else tq.get(q, 0) == 0})
            for q, tr_row in trows.items():  # a phase only the traced estimate reports
                if q not in {r["quantity"] for r in rows}:
                    rows.append({"quantity": q, "measured": tr_row["measured_bytes"], "hf": hq.get(q, 0),
                                 "traced": tr_row["estimated_bytes"], "hf_ok": hq.get(q, 0) == 0,
                                 "traced_ok": tr_row["ok"]})
            res["steps"].append({"step": step, "rows": rows,
                                 "hf_peak_at": _peak_at(h), "traced_peak_at": _peak_at(t),
                                 "layers": _layer_diff(h, t)})
        del run
    return out


def offsets(result):
    """{(mode, step, quantity): (hf-config estimate - measurement, measurement)} of a run_one
    result (its modes must have run without error)."""
    out = {}
    for m in result["modes"]:
        assert not m.get("error"), m["error"]
        for st in m["steps"]:
            for row in st["rows"]:
                out[(m["mode"], st["step"], row["quantity"])] = (row["hf"] - row["measured"],
                                                                 row["measured"])
    return out


def _peak_at(resp):
    p = resp.get("peak") or {}
    return f"{p.get('phase', '').replace('PHASE_', '')} {p.get('op', '')} in '{p.get('scope', '')}'"


def _layer_diff(h, t):
    """Per-layer rows (scope) where the two estimates differ: {scope: {field: [hf, traced]}}."""
    fields = ("parameterBytes", "savedBytes", "outputBytes", "temporaryBytes")
    hl = {r["scope"]: r for r in h.get("layers", [])}
    tl = {r["scope"]: r for r in t.get("layers", [])}
    diff = {}
    for scope in list(hl) + [s for s in tl if s not in hl]:
        a, b = hl.get(scope, {}), tl.get(scope, {})
        d = {f: [int(a.get(f, 0) or 0), int(b.get(f, 0) or 0)] for f in fields}
        d = {f: v for f, v in d.items() if v[0] != v[1]}
        if d or scope not in hl or scope not in tl:
            diff[scope] = d if (scope in hl and scope in tl) else \
                {"only in": "hf-config" if scope in hl else "traced", **d}
    return diff


# ------------------------------------------------------------------ the runner

def _pct(e, m):
    if m == 0:
        return "   -   " if e == 0 else "  inf  "
    return f"{(e - m) / m:+.2%}"


def print_result(res, layers=False):
    lines = []
    for m in res["modes"]:
        lines.append(f"== {res['name']} [{m['mode']}] batch {res['batch']}, seq {res['seq']} ({m['config']})")
        if m.get("error"):
            lines.append(f"   ERROR: {m['error']}")
        for st in m["steps"]:
            lines.append(f"  {st['step']}:  peak at (hf-config) {st['hf_peak_at']};  (traced) {st['traced_peak_at']}")
            lines.append(f"     {'quantity':<28} {'measured':>10} {'hf-config':>10} {'traced':>10} "
                         f"{'hf - meas':>10} {'hf %':>8}  {'tr - meas':>10}")
            for r in st["rows"]:
                d = r["hf"] - r["measured"]
                mark = "  " if r["hf_ok"] else "!!"
                under = "" if d >= 0 else (" UNDER" if not r["hf_ok"] else " under (within bounds)")
                lines.append(f"  {mark} {r['quantity']:<28} {r['measured']:>10} {r['hf']:>10} {r['traced']:>10} "
                             f"{d:>+10} {_pct(r['hf'], r['measured']):>8}  {r['traced'] - r['measured']:>+10}"
                             f"{'' if r['traced_ok'] else ' (traced !!)'}{under}")
            if layers and st["layers"]:
                lines.append("     layers where the estimates differ (hf-config / traced):")
                for scope, d in st["layers"].items():
                    desc = ", ".join(f"{k} {v}" if k == "only in" else f"{k} {v[0]} / {v[1]}" for k, v in d.items())
                    lines.append(f"       {scope or '(top level)'}: {desc}")
    print("\n".join(lines), flush=True)


def run_child(name, args, isa):
    from child import run_json_child
    cmd = [sys.executable, os.path.abspath(__file__), "--one", name, "--isa", isa,
           "--memest", args.memest]
    if args.dump:
        cmd += ["--dump", args.dump]
    if args.lora:
        cmd += ["--lora", args.lora]
    if args.use_cache:
        cmd += ["--use-cache"]
    try:
        return run_json_child(cmd, args.timeout, tail=5)
    except Exception as e:
        return {"name": name, "batch": "?", "seq": "?",
                "modes": [{"mode": "-", "config": "-", "steps": [], "error": str(e)[:600]}]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", dest="select", help="only models whose name contains this substring")
    ap.add_argument("--memest", help="the memest binary (default: build/bin/memest)")
    ap.add_argument("--dump", help="keep each config.json and both estimates' JSON replies here")
    ap.add_argument("--layers", action="store_true", help="print the per-layer rows where the estimates differ")
    ap.add_argument("--report", help="write the results as JSON here")
    ap.add_argument("--lora", help="LoraConfig kwargs as JSON: each model is wrapped by PEFT's get_peft_model")
    ap.add_argument("--use-cache", action="store_true",
                    help="configs with use_cache true, training loops that hold the outputs "
                         "(memest --hold-outputs): the keys and values the model returns")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per model (default 1200)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--isa", help=argparse.SUPPRESS)
    args = ap.parse_args()

    import run as suite
    args.memest = suite.find_memest(args.memest)
    if args.dump:
        args.dump = os.path.abspath(args.dump)
    if args.one:
        res = run_one(args.one, args.memest, args.isa, args.dump,
                      json.loads(args.lora) if args.lora else None, args.use_cache)
        with open(args.out, "w") as f:
            json.dump(res, f)
        return 0
    isa = suite.onednn_isa()
    names = [n for n, _, _ in hf_configs() if not args.select or args.select in n]
    results = []
    for name in names:
        res = run_child(name, args, isa)
        results.append(res)
        print_result(res, layers=args.layers)
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"isa": isa, "memest": args.memest, "models": results}, f, indent=1)
    bad = [(r["name"], m["mode"], st["step"], row["quantity"]) for r in results for m in r["modes"]
           for st in m["steps"] for row in st["rows"] if not row["hf_ok"]]
    under = [(r["name"], m["mode"], st["step"], row["quantity"], row["hf"] - row["measured"], row["hf_ok"])
             for r in results for m in r["modes"] for st in m["steps"] for row in st["rows"]
             if row["hf"] < row["measured"]]
    errors = [(r["name"], m["mode"]) for r in results for m in r["modes"] if m.get("error")]
    print(f"hf-config: {len(bad)} quantities outside the zoo's bounds; {len(under)} under the measurement "
          f"({sum(1 for u in under if not u[5])} of them out of bounds)" + (f"; {len(errors)} errors" if errors else ""))
    for name, mode, step, q, d, ok in under:
        print(f"  {'under (within bounds)' if ok else 'UNDER'}: {name} {mode} {step} {q} {d:+d} B")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
