"""The cases of the parallel truth: id -> (world size, runner, parameters, model).

Each case runs on `world` gloo ranks (run.py starts one set of processes per world size and
runs its cases in order). `params` is what the runner gets and what the expected file records
as the configuration; `model` names the memest model file (expected/models/<model>.json) of the
whole, unsharded model at the batch one rank (DDP, ZeRO), one tensor-parallel group (TP) or one
micro-batch (PP) sees.
"""
import dataclasses
import functools

import dp
import ep
import models
import pp
import tp


@dataclasses.dataclass
class Case:
    id: str
    world: int
    run: object
    params: dict
    model: str
    note: str = ""


CASES = {}


def add(cid, world, run, params, model, note=""):
    assert cid not in CASES, cid
    CASES[cid] = Case(cid, world, run, dict(params), model, note)


# ------------------------------------------------------------------------------ DDP
_MLP = {"model": "mlp", "batch": 8}
_GPT = {"model": "gpt", "batch": 4}
for w in (2, 4):
    for gabv in (False, True):
        v = "view" if gabv else "copy"
        add(f"ddp/mlp/w{w}/{v}", w, dp.run,
            {**_MLP, "optimizer": "sgd", "bucket_cap_mb": 0.25, "gradient_as_bucket_view": gabv}, "mlp")
        add(f"ddp/gpt/w{w}/{v}", w, dp.run,
            {**_GPT, "optimizer": "sgd", "bucket_cap_mb": 0.25, "gradient_as_bucket_view": gabv}, "gpt")
for gabv in (False, True):
    v = "view" if gabv else "copy"
    add(f"ddp/mlp/w2/{v}/keep-grads", 2, dp.run,
        {**_MLP, "optimizer": "sgd", "bucket_cap_mb": 0.25, "gradient_as_bucket_view": gabv,
         "keep_grads": True}, "mlp", "zero_grad(set_to_none=False), 1.13's default")
add("ddp/mlp/w2/copy/find-unused", 2, dp.run,
    {**_MLP, "optimizer": "sgd", "bucket_cap_mb": 0.25, "gradient_as_bucket_view": False,
     "find_unused_parameters": True}, "mlp")

# ------------------------------------------------------------------------------ ZeRO-1
for w in (2, 4):
    for opt in ("adam", "adamw", "momentum"):
        for pabv in ((False, True) if opt == "adam" else (False,)):
            add(f"zero/mlp/w{w}/{opt}" + ("/bucket-view" if pabv else ""), w, dp.run,
                {**_MLP, "optimizer": opt, "zero": True, "parameters_as_bucket_view": pabv,
                 "bucket_cap_mb": 25, "gradient_as_bucket_view": False}, "mlp")

# ------------------------------------------------------------------------------ tensor parallel
for m in ("mlp", "attention", "lm", "lm-tied", "lm-rope"):
    for sp in (False, True):
        for w in (2, 4):
            add(f"tp/{m}/t{w}" + ("/sp" if sp else ""), w, tp.run,
                {"model": m, "batch": 2, "sp": sp, "optimizer": "adam"}, f"tp-{m}")

# ------------------------------------------------------------------------------ pipeline
for sched in ("gpipe", "1f1b"):
    for w in (2, 4):
        for m in (4, 8):
            add(f"pp/{sched}/p{w}/m{m}", w, pp.run,
                {"schedule": sched, "microbatches": m, "layers": 8, "batch": 2, "optimizer": "adam"},
                "pp-gpt")
add("pp/1f1b/p4/m8/keep-outputs", 4, pp.run,
    {"schedule": "1f1b", "microbatches": 8, "layers": 8, "batch": 2, "optimizer": "adam",
     "deallocate_outputs": False}, "pp-gpt",
    "stage outputs kept whole until their backward (torch.distributed.pipelining), not deallocated")

# Interleaved 1F1B (Megatron's virtual pipeline stages): V chunks of 8 / (P V) blocks per stage.
for w, v, m in ((2, 2, 4), (2, 2, 8), (4, 2, 8)):
    add(f"pp/interleaved/p{w}/v{v}/m{m}", w, pp.run,
        {"schedule": "interleaved", "virtual_stages": v, "microbatches": m, "layers": 8, "batch": 2,
         "optimizer": "adam"}, "pp-gpt")

# ------------------------------------------------------------------------------ expert parallel
# Megatron's MoELayer over the whole world as its expert-parallel group (ep.py); with tensor
# parallelism (and sequence parallelism), over TP x E ranks.
for w in (2, 4):
    for routing in ("worst", "balanced"):
        add(f"ep/moe/e{w}/{routing}", w, ep.run,
            {"routing": routing, "batch": 2, "optimizer": "sgd"}, f"ep-moe-{routing}")
for e in (1, 2):
    for routing in ("worst", "balanced"):
        add(f"ep/moe/t2/e{e}/{routing}", 2 * e, ep.run,
            {"routing": routing, "batch": 2, "optimizer": "sgd", "tp": 2}, f"ep-moe-{routing}")

MODEL_FNS = {"mlp": (dp.MODELS["mlp"], 8), "gpt": (dp.MODELS["gpt"], 4),
             "tp-mlp": (functools.partial(tp.tp_mlp, tp=tp.TP(1)), 2),
             "tp-attention": (functools.partial(tp.tp_attention, tp=tp.TP(1)), 2),
             "tp-lm": (functools.partial(tp.tp_lm, tp=tp.TP(1)), 2),
             "tp-lm-tied": (functools.partial(tp.MODELS["lm-tied"], tp=tp.TP(1)), 2),
             "tp-lm-rope": (functools.partial(tp.MODELS["lm-rope"], tp=tp.TP(1)), 2),
             "pp-gpt": (functools.partial(models.gpt, layers=8, **pp.GPT), 2),
             "ep-moe-worst": (functools.partial(ep.moe_layer, ep=ep.EP(1), routing="worst"), 2),
             "ep-moe-balanced": (functools.partial(ep.moe_layer, ep=ep.EP(1), routing="balanced"), 2)}
