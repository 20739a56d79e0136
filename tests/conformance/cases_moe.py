"""Conformance cases for what a mixture-of-experts layer runs (Hugging Face's
MixtralSparseMoeBlock, engine/models/moe_layers.cc): the top-k renormalised in place (div_),
one_hot of the choices, torch.where of each expert's mask (nonzero and its two columns), the
expert's tokens gathered (index), its weights read with two index tensors, and index_add_ into
the output. Registered into cases.CASES (cases.py imports this module).

Which expert a token goes to is the data's: the router's logits here are a parameter (made once,
the same in every pass), never the inputs', so the recorded counts are the measured ones.
"""
import torch

from cases import SGD, case, lift, loss_of, op_case
from measure import Config

INFER = Config(mode="inference")
SHAPE = [8, 16]
EXPERTS, TOP_K, TOKENS, DIM = 4, 2, 8, 16


def _moe(r, b, logits):
    x = lift(r, r.input("x", [b, TOKENS, DIM]))
    flat = r.view(x, [b * TOKENS, DIM])
    weights, chosen = r.topk(r.softmax(logits, -1), TOP_K)
    weights = r.div_(weights, r.sum(weights, dim=[-1], keepdim=True))
    out = r.full([b * TOKENS, DIM])
    mask = r.permute(r.one_hot(chosen, EXPERTS), [2, 1, 0])
    for e in range(EXPERTS):
        found = r.nonzero(r.squeeze(r.slice(mask, 0, e, e + 1), 0))
        which, tokens = [r.squeeze(c, 1) for c in r.split(found, 1, [1, 1])]
        y = r.linear(r.index(flat, tokens), r.param(f"w{e}", [24, DIM]))
        y = r.linear(r.silu(y), r.param(f"v{e}", [DIM, 24]))
        y = r.mul(y, r.index_many(r.unsqueeze(weights, 2), [tokens, which]))
        out = r.index_add_(out, tokens, y)
    return loss_of(r, r.view(out, [b, TOKENS, DIM]))


@case("moe", "expert_loop", configs=[SGD, INFER])
def _(r, b):
    # a router whose logits train (the gradient reaches them through div_, topk and softmax)
    return _moe(r, b, r.param("router", [b * TOKENS, EXPERTS]))


@case("moe", "expert_loop_collapsed", configs=[SGD, INFER])
def _(r, b):
    # every token to the last two experts, the first two running on nothing
    logits = r.buffer("router", [b * TOKENS, EXPERTS], "float32",
                      value=torch.tensor([[0.0, 0.0, 1.0, 2.0]]).repeat(b * TOKENS, 1))
    return _moe(r, b, logits)


op_case("div_inplace", SHAPE,
        lambda r, x: r.div_(r.mul(x, 2.0), r.sum(r.exp(x), dim=[-1], keepdim=True)))


@case("moe", "index_add_")
def _(r, b):
    v = lift(r, r.input("v", [b, 6, 16]))
    idx = r.buffer("idx", [6], "int64", value=torch.tensor([0, 2, 2, 7, 9, 12]))
    out = r.index_add_(r.full([b, 16, 16]), idx, r.exp(v), dim=1)
    return loss_of(r, r.mul(out, out))


@case("moe", "one_hot")
def _(r, b):
    # the choices of scores that take no gradient (a topk whose values nothing reads would be a
    # dead autograd branch: PyTorch frees its saved indices with it, memest keeps them)
    x = lift(r, r.input("x", [b, 8, 16]))
    _, top = r.topk(r.input("s", [b, 8, 16]), 2)
    hot = r.to(r.one_hot(top, 16), "float32")
    return loss_of(r, r.mul(x, r.sum(hot, dim=[2])))
