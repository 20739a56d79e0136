#!/work/venv-torch2/bin/python
"""FSDP2 (`fully_shard`) per rank, measured: PyTorch 2.x on the CPU, gloo, 2 and 4 processes.
By hand, never in CI (Debian's PyTorch 1.13 has no FSDP2). The expected files are PyTorch
2.15.0's, from PyPI in a venv of its own:

  /usr/bin/python3 -m venv /work/venv-torch2 && /work/venv-torch2/bin/pip install torch==2.15.0
  /work/venv-torch2/bin/python tests/parallel/fsdp2.py [--case SUBSTRING ...] [--write-expected]
      [--explain] [--lifetimes] [--events SUBSTRING] [--list]

Every case starts its world size of gloo ranks (torch.multiprocessing spawn, init_method
file://; one set of processes per world size, its cases in order). Each rank builds the model,
shards it (`fully_shard(block)` for every block, then `fully_shard(model)`), builds AdamW over
the sharded parameters and runs STEPS steps (zero_grad(set_to_none) -> DATA -> FORWARD -> LOSS
-> BACKWARD [-> again per micro-batch] -> OPTIMIZER_STEP; the loop holds the loss, the batch and
nothing else across backward, as the conformance suite's), all under one allocator trace
(fsdp2_trace.LabelledTrace: ranktrace.Trace with a name for every buffer FSDP2 makes). The
numbers are compared with tests/parallel/expected/fsdp2_<case>.json, to the byte: a change
fails (exit 1). --write-expected writes those files instead. --explain prints the labelled
live set at each phase's peak; --lifetimes when each FSDP2 buffer was made and freed.
docs/parallelism-truth.md, "FSDP2 (fully_shard), measured on PyTorch 2.x", accounts for them.

The model (`GPT`): the `gpt` of models.py as nn.Modules (token and position embeddings,
pre-LayerNorm blocks of attention without mask and a GELU MLP of 4d, final LayerNorm, untied
head, cross entropy), V 256, t 16, d 128, 4 heads, 3 blocks, batch 4 per rank.
"""
import argparse
import gc
import importlib
import json
import math
import os
import re
import sys
import tempfile
import time
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
for p in (os.path.join(os.path.dirname(os.path.dirname(HERE)), "tests", "conformance"), HERE):
    if p not in sys.path:
        sys.path.insert(0, p)
os.environ.setdefault("GLOG_minloglevel", "2")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fsdp2_trace  # noqa: E402

EXPECTED = os.path.join(HERE, "expected")
STEPS = 3
DIMS = {"vocab": 256, "t": 16, "d": 128, "heads": 4, "layers": 3, "batch": 4}

# id -> (world size, parameters). Case 1 fp32; 2 blocks not resharded after forward; 3 bf16
# parameters with fp32 reduction (torchtitan's default); 4 two micro-batches; 5 a vocabulary of
# 255 rows (embedding and head dim 0 not divisible by the world size: padding); fused AdamW;
# HSDP: 4 ranks as 2 replicas of 2 shards (a 2-D mesh, replicate x shard).
BASE = {"reshard_after_forward": True, "param_dtype": None, "reduce_dtype": None, "microbatches": 1,
        "vocab": 256, "optimizer": "adamw-foreach", "shard": None}
VARIANTS = {
    "fp32": {},
    "no-reshard": {"reshard_after_forward": False},
    "bf16": {"param_dtype": "bfloat16", "reduce_dtype": "float32"},
    "accum2": {"microbatches": 2},
    "pad": {"vocab": 255},
    "fused": {"optimizer": "adamw-fused"},
    "hsdp": {"shard": 2},
}
ONLY = {"fused": 2, "hsdp": 4}  # variants run at one world size
CASES = {f"fsdp2/{v}/w{w}": (w, {**BASE, **p}) for v, p in VARIANTS.items() for w in (2, 4)
         if ONLY.get(v, w) == w}


# ---------------------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.attn, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ln2, self.fc, self.mproj = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = (z.view(b, t, self.heads, hd).transpose(1, 2) for z in self.attn(self.ln1(x)).split(d, 2))
        y = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(hd), -1) @ v
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mproj(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab, t, d, heads, layers):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(t, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.lnf, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.h:
            x = blk(x)
        return self.head(self.lnf(x))


# ---------------------------------------------------------------------------------------------
PROBES = fsdp2_trace.Probes()


def storages(tensors):
    seen = {}
    for t in tensors:
        if t is None:
            continue
        t = getattr(t, "_local_tensor", t)
        ptr, nb, _ = fsdp2_trace.storage_key(t)
        seen[ptr] = nb
    return sum(seen.values())


def model_state(model, opt):
    params = list(model.parameters())
    state = [v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
    return {"parameters": storages(params), "gradients": storages(p.grad for p in params),
            "optimizer_state": storages(state)}


class Saved:
    """Bytes autograd saves in forward + loss, by distinct storage still alive at the end of the
    loss (the conformance rule): parameters left out, sharded or unsharded (the unsharded ones
    are what the module holds while it runs), inputs included, wrapped scalars not counted."""

    def __init__(self, model):
        self.model, self.saved = model, {}
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)

    def pack(self, t):
        from torch.multiprocessing.reductions import StorageWeakRef
        if t.dim() == 0 and t.dtype in (torch.float64, torch.int64) and t.grad_fn is None and not t.requires_grad:
            return t
        params = {fsdp2_trace.storage_key(getattr(p, "_local_tensor", p))[0] for p in self.model.parameters()}
        ptr, nb, st = fsdp2_trace.storage_key(t)
        if ptr in params or nb == 0:
            return t
        e = self.saved.get(ptr)
        if e is None or e[0].expired():
            self.saved[ptr] = [StorageWeakRef(st), nb]
        return t.detach()

    def total(self):
        return sum(e[1] for e in self.saved.values() if not e[0].expired())


def build(p, mesh):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    torch.manual_seed(0)
    model = GPT(p["vocab"], DIMS["t"], DIMS["d"], DIMS["heads"], DIMS["layers"])
    mp_kw = {}
    if p["param_dtype"]:
        mp_kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=getattr(torch, p["param_dtype"]),
                                                  reduce_dtype=getattr(torch, p["reduce_dtype"]))
    for blk in model.h:
        fully_shard(blk, mesh=mesh, reshard_after_forward=p["reshard_after_forward"], **mp_kw)
    fully_shard(model, mesh=mesh, **mp_kw)
    return model


def run_case(rank, world, cid, p, meshes):
    mesh = meshes[p["shard"] or world]
    trace = fsdp2_trace.LabelledTrace()
    PROBES.trace = trace
    gen = torch.Generator().manual_seed(1000 + rank)
    b, t = DIMS["batch"], DIMS["t"]
    steps, saved = [], []
    gc.collect()
    gc.disable()  # FSDP2 holds reference cycles (post_forward_order): no collection mid-step
    with trace:
        trace.mark("CONSTRUCT")
        model = build(p, mesh)
        for name, m in [("root", model), *((f"h.{i}", blk) for i, blk in enumerate(model.h))]:
            for pg in m._get_fsdp_state()._fsdp_param_groups:
                for fp in pg.fsdp_params:
                    trace.label(fp._sharded_param_data, f"sharded param {name}")
        kw = {"foreach": True} if p["optimizer"] == "adamw-foreach" else {"fused": True}
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, **kw)
        trace.mark("0.END")
        for s in range(1, STEPS + 1):
            opt.zero_grad(set_to_none=True)
            for _ in range(p["microbatches"]):
                trace.mark(f"{s}.DATA")
                idx = torch.randint(0, p["vocab"], (b, t), generator=gen)
                y = torch.randint(0, p["vocab"], (b, t), generator=gen)
                trace.label(idx, "input")
                trace.label(y, "input")
                sv = Saved(model)
                with sv.hooks:
                    trace.mark(f"{s}.FORWARD")
                    logits = model(idx)
                    trace.mark(f"{s}.LOSS")
                    loss = F.cross_entropy(logits.view(b * t, -1), y.view(-1))
                    del logits  # the loop holds only the loss across backward (measure.py's protocol)
                saved.append(sv.total())
                trace.mark(f"{s}.BACKWARD")
                loss.backward()
                del loss, idx, y, sv
            trace.mark(f"{s}.OPTIMIZER_STEP")
            opt.step()
            for st in opt.state.values():
                for k, v in st.items():
                    if isinstance(v, torch.Tensor):
                        trace.label(getattr(v, "_local_tensor", v), f"optimizer state {k}")
            for prm in model.parameters():
                if prm.grad is not None:
                    trace.label(prm.grad._local_tensor, "sharded grad (end of step)")
            steps.append(model_state(model, opt))
            trace.mark(f"{s}.END")
        trace.mark("TEARDOWN")
        alive = [getattr(x, "_local_tensor", x) for x in model.parameters()]
    PROBES.trace = None
    gc.enable()
    trace.analyse(alive=alive + [prm.grad._local_tensor for prm in model.parameters() if prm.grad is not None]
                  + [getattr(v, "_local_tensor", v) for st in opt.state.values() for v in st.values()
                     if isinstance(v, torch.Tensor)])
    if os.environ.get("FSDP2_EVENTS") and rank == 0:
        dump_events(trace, os.environ["FSDP2_EVENTS"])
    return result(trace, steps, saved, p)


def dump_events(trace, substring):
    """--events: every allocation and free of rank 0's last step whose op path contains
    `substring`, in order (bytes, address, name, where)."""
    for i, (t, nb, ptr, path) in enumerate(trace._ev):
        ph = [m for tm, m in trace._marks if tm <= t]
        if ph and ph[-1].startswith(f"{STEPS}.") and substring in path:
            print(f"{ph[-1]:<18} {nb:>+10,} {ptr:>14x}  {trace.name(i) if nb > 0 else '':<44.44} "
                  f"{path}", file=sys.stdout, flush=True)


PHASES = ("DATA", "FORWARD", "LOSS", "BACKWARD", "OPTIMIZER_STEP")


def result(trace, ends, saved, p, steps=STEPS):
    out = {"saved_for_backward": sorted(set(saved)),
           "construct": {"peak": trace.peaks["CONSTRUCT"], "live_after": trace.at_mark["0.END"]},
           "steps": [], "unseen_frees": trace.unseen[:8]}
    if len(out["saved_for_backward"]) == 1:
        out["saved_for_backward"] = out["saved_for_backward"][0]
    for s in range(1, steps + 1):
        ph = {k: trace.peaks[f"{s}.{k}"] for k in PHASES}
        top = max(ph, key=ph.get)
        nc = {k: trace.peaks_nccl[f"{s}.{k}"] for k in PHASES}
        out["steps"].append({
            "step": s, "phases": ph, "peak": ph[top], "peak_phase": top,
            "live_at_end": trace.at_mark[f"{s}.END"], "end_of_step": ends[s - 1],
            "phases_without_gloo": nc})
        if s in (1, steps):
            out["steps"][-1].update({
                "peak_where": {k: trace.peak_where(f"{s}.{k}") for k in PHASES},
                "at_peak": {k: trace.live_set(f"{s}.{k}") for k in PHASES},
                "peak_where_without_gloo": {k: trace.peak_where(f"{s}.{k}", True) for k in PHASES},
                "at_peak_without_gloo": {k: trace.live_set(f"{s}.{k}", True) for k in PHASES}})
    out["lifetimes"] = trace.lifetimes({f"{s}.{k}" for s in (1, steps) for k in PHASES})
    return out


# ---------------------------------------------------------------------------------------------
def setup(world):
    """What every case of a world size shares (fsdp2.py: the DeviceMeshes, by the ranks a shard
    group holds: the 1-D mesh over every rank, and at 4 ranks the HSDP mesh of 2 replicas of 2
    shards, made before any case's trace)."""
    from torch.distributed.device_mesh import init_device_mesh
    meshes = {world: init_device_mesh("cpu", (world,))}
    if world == 4:
        meshes[2] = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    return meshes


def worker(rank, world, cids, outdir, initfile, driver="fsdp2"):
    """One rank: the cases `cids` of the driver module (fsdp2 or fsdp1: CASES, PROBES,
    setup(world), run_case(rank, world, cid, p, ctx)), each result to <outdir>/<n>.<rank>.json."""
    drv = importlib.import_module(driver)
    fd = os.open(os.path.join(outdir, f"stderr.{rank}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 2)
    os.close(fd)
    torch.set_num_threads(1)
    fsdp2_trace.install_gloo_one_thread()
    dist.init_process_group("gloo", init_method="file://" + initfile, rank=rank, world_size=world)
    ctx = drv.setup(world)
    drv.PROBES.install()
    for n, cid in enumerate(cids):
        try:
            res = {"ok": True, **drv.run_case(rank, world, cid, drv.CASES[cid][1], ctx)}
        except Exception as e:  # reported by the runner; the other ranks time out
            import traceback
            res = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
        with open(os.path.join(outdir, f"{n}.{rank}.json"), "w") as f:
            json.dump(res, f)
        gc.collect()
        if not res["ok"]:
            break
        dist.barrier()
    dist.destroy_process_group()


def run_world(world, cids, driver="fsdp2"):
    outdir = tempfile.mkdtemp(prefix=f"memest-{driver}-")
    initfile = os.path.join(outdir, "init")
    mp.spawn(worker, args=(world, cids, outdir, initfile, driver), nprocs=world, join=True)
    out = {}
    for n, cid in enumerate(cids):
        ranks = []
        for r in range(world):
            path = os.path.join(outdir, f"{n}.{r}.json")
            if os.path.exists(path):
                with open(path) as f:
                    ranks.append(json.load(f))
            else:
                with open(os.path.join(outdir, f"stderr.{r}")) as f:
                    ranks.append({"ok": False, "error": "no result", "stderr": f.read()[-3000:]})
        out[cid] = ranks
    return out


def case_file(cid):
    return os.path.join(EXPECTED, re.sub(r"[^A-Za-z0-9_.-]+", "_", cid) + ".json")


def dumps(x, ind=""):
    """JSON with one line per scalar field and per list of scalars (a live set's entry, a
    lifetime): the expected files stay short and diff line by line."""
    if isinstance(x, dict) and x:
        body = ",\n".join(f"{ind} {json.dumps(k)}: {dumps(v, ind + ' ')}" for k, v in x.items())
        return "{\n" + body + "\n" + ind + "}"
    if isinstance(x, list) and x and any(isinstance(v, (dict, list)) for v in x):
        return "[\n" + ",\n".join(f"{ind} {dumps(v, ind + ' ')}" for v in x) + "\n" + ind + "]"
    return json.dumps(x)


def flatten(x, pre=""):
    if isinstance(x, dict):
        return {k2: v for k, v in x.items() for k2, v in flatten(v, f"{pre}.{k}" if pre else str(k)).items()}
    if isinstance(x, list) and x and isinstance(x[0], (dict, list)):
        return {k2: v for i, v in enumerate(x) for k2, v in flatten(v, f"{pre}[{i}]").items()}
    return {pre: x}


def compare(measured, expected):
    fm, fe = flatten(measured), flatten(expected)
    return [f"{k}: measured {fm.get(k)}, expected {fe.get(k)}" for k in sorted(set(fm) | set(fe))
            if fm.get(k) != fe.get(k)]


def main(driver="fsdp2"):
    """The command line of fsdp2.py and fsdp1.py: `driver` names the module whose CASES run."""
    drv = sys.modules[__name__] if driver == "fsdp2" else importlib.import_module(driver)
    CASES, doc_ = drv.CASES, drv.__doc__
    ap = argparse.ArgumentParser(description=doc_, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", default=[], help="run the cases whose id contains this")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--write-expected", action="store_true")
    ap.add_argument("--explain", action="store_true", help="the labelled live set at each phase's peak")
    ap.add_argument("--lifetimes", action="store_true", help="when each FSDP buffer was made and freed")
    ap.add_argument("--events", metavar="SUBSTRING",
                    help="rank 0's allocations and frees in the last step whose op path contains this")
    args = ap.parse_args()
    sel = [c for c in CASES if not args.case or any(s in c for s in args.case)]
    if args.list:
        print("\n".join(sel))
        return 0
    if args.events:
        os.environ["FSDP2_EVENTS"] = args.events  # read by the ranks (run_case)
    t0 = time.time()
    results = {}
    for world in sorted({CASES[c][0] for c in sel}):
        results.update(run_world(world, [c for c in sel if CASES[c][0] == world], driver))
    failed = 0
    for cid in sel:
        world, p = CASES[cid]
        ranks = results[cid]
        errors = [f"rank {i}: {r.get('error')}" for i, r in enumerate(ranks) if not r.get("ok")]
        if errors:
            failed += 1
            print(f"ERROR {cid}\n      " + "\n      ".join(errors))
            tb = next((r.get("traceback") or r.get("stderr") for r in ranks if not r.get("ok")), "")
            print("      " + (tb or "").strip().replace("\n", "\n      "))
            continue
        ranks = [{k: v for k, v in r.items() if k != "ok"} for r in ranks]
        # a rank that measured exactly what an earlier one did is written as {"same_as_rank": k}
        distinct = [next(({"same_as_rank": k} for k in range(i) if ranks[k] == r), r) for i, r in enumerate(ranks)]
        doc = {"case": cid, "world_size": world, "config": p, "dims": drv.DIMS, "steps": getattr(drv, "STEPS", STEPS),
               "torch": torch.__version__, "ranks": distinct}
        if args.explain:
            explain(cid, ranks, distinct)
        if args.lifetimes:
            for r, rk in enumerate(ranks):
                if "same_as_rank" in distinct[r]:
                    continue
                print(f"== {cid} rank {r} lifetimes")
                for x in rk["lifetimes"]:
                    print(f"   {x[1]:>9,} {x[2]:>3}x {x[0]:<36} made {x[3]:<16} {x[4]:<50} freed {x[5]}: {x[6]}")
        path = case_file(cid)
        if args.write_expected:
            with open(path, "w") as f:
                f.write(dumps(doc) + "\n")
            print(f"wrote {cid}")
            continue
        if not os.path.exists(path):
            failed += 1
            print(f"FAIL  {cid}: no expected file {os.path.relpath(path)} (run with --write-expected)")
            continue
        with open(path) as f:
            exp = json.load(f)
        diffs = compare({"config": p, "ranks": doc["ranks"]}, {"config": exp["config"], "ranks": exp["ranks"]})
        if diffs:
            failed += 1
            print(f"FAIL  {cid}\n      " + "\n      ".join(diffs[:20]))
        else:
            print(f"ok    {cid}")
    print(f"({time.time() - t0:.1f} s) {len(sel) - failed} passed, {failed} failed")
    return 1 if failed else 0


def explain(cid, ranks, distinct):
    for r, rk in enumerate(ranks):
        if "same_as_rank" in distinct[r]:
            continue
        for st in (rk["steps"][0], rk["steps"][-1]):
            for ph in PHASES:
                for view, sfx in (("", ""), (" without gloo's copies", "_without_gloo")):
                    print(f"== {cid} rank {r} step {st['step']} {ph}{view}: peak {st['phases' + sfx][ph]:,} "
                          f"at {st['peak_where' + sfx][ph]}")
                    for name, nb in st["at_peak" + sfx][ph].items():
                        print(f"   {nb:>10,}  {name}")


if __name__ == "__main__":
    sys.exit(main())
