"""Megatron-LM's MoELayer with the all-to-all token dispatcher over E expert-parallel ranks,
written here with plain collectives as megatron/core/transformer/moe/{moe_layer,
token_dispatcher,moe_utils,experts}.py and tensor_parallel/mappings.py `_AllToAll` write it
(NVIDIA/Megatron-LM d98e8a64; the one-rank layer is tests/conformance/cases_megatron_moe.py,
engine/models/megatron_moe.cc builds it, engine/passes/expert_parallel.h splits it):

* every rank routes its own tokens over all EXPERTS experts (the router and the permute are
  the one-rank layer's), then `_AllToAll` sends each expert's tokens to the rank that holds it
  (`output = torch.empty(sum(output_split_sizes), ...)`, all_to_all_single; backward the same
  with the splits swapped), the tokens and their routing weights each;
* `sort_chunks_by_idxs` reorders what arrived from [rank][local expert] to [local expert][rank]
  (a split and a cat: a copy), only with more than one local expert;
* SequentialMLP runs the rank's EXPERTS / E local experts (fc1, the weighted SwiGLU, fc2) on
  their tokens; the chunks are sorted back, sent back, and unpermuted (scatter_add).

Routing is the data's: the router's logits get a fixed per-position preference (as the
conformance case), `worst` sending every token to the last TOP_K experts (what memest's
--expert-load worst assumes), `balanced` spreading every rank's picks evenly over the experts.
With the expert-parallel group the whole world, the expert-data-parallel group is one rank:
no gradient of an expert is reduced; the router's (replicated) is all-reduced after backward
(phase GRAD_SYNC), as Megatron's DDP all-reduces the dense buffer. The plain model (E = 1) is the
memest model file (expected/models/ep-moe-<routing>.json).
"""
import functools

import torch
import torch.distributed as dist

import common
from common import ParamStore
from megatron_fns import route_and_permute

EXPERTS, TOP_K, SEQ, DIM, FFN = 4, 2, 8, 16, 24
# Each position's two experts. worst: every token to the last two; balanced: every expert 4 of
# the 16 picks a sample.
ROUTING = {"worst": [(2, 3)] * SEQ,
           "balanced": [(0, 1), (2, 3), (0, 2), (1, 3), (0, 3), (1, 2), (0, 1), (2, 3)]}


class AllToAll(torch.autograd.Function):
    """mappings.py _AllToAll: a new output of the received rows; backward with the splits
    swapped."""

    @staticmethod
    def forward(ctx, x, output_splits, input_splits):
        ctx.splits = (output_splits, input_splits)
        out = torch.empty((sum(output_splits),) + tuple(x.shape[1:]), dtype=x.dtype)
        dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=common.GROUP)
        common.flush()
        return out

    @staticmethod
    def backward(ctx, g):
        output_splits, input_splits = ctx.splits
        return AllToAll.apply(g.contiguous(), input_splits, output_splits), None, None


class EP:
    """An expert-parallel group of `size` ranks (1: the plain layer); this process's rank."""

    def __init__(self, size=1, rank=0):
        self.size, self.rank = size, rank
        self.local = EXPERTS // size
        self.mine = list(range(rank * self.local, (rank + 1) * self.local))

    def owner(self, e):
        return e // self.local


def _split(r, x, sizes, moe):
    """split along dim 0, marked as megatron_moe.cc marks its splits (`moe`: the expert-parallel
    pass gives them the rank's sizes); always a list."""
    out = r._op("split", [x], {"dim": 0, "sizes": list(sizes), "moe": moe},
                lambda t: t.split(list(sizes), 0), n_out=len(sizes))
    return out if len(sizes) > 1 else [out]


def _cat(r, xs, moe):
    return r._op("cat", list(xs), {"dim": 0, "moe": moe}, lambda *t: torch.cat(t, 0))


def moe_layer(r, b, ep, routing):
    """x [b, SEQ, DIM] (an input lifted by a parameter) -> MoELayer -> mean."""
    prefs = ROUTING[routing]
    n, routed = b * SEQ, b * SEQ * TOP_K
    counts = [b * sum(e in p for p in prefs) for e in range(EXPERTS)]  # every rank's, alike
    x = r.add(r.input("x", [b, SEQ, DIM]), r.param("lift.b", [DIM]))
    with r.scope("mlp"), r.frame() as local:
        sorted_indices, permuted, permuted_probs = route_and_permute(r, x, local, prefs, EXPERTS,
                                                                     TOP_K)
        # token_dispatch: each rank's experts' tokens to it, and back in combine
        send = [sum(counts[e] for e in range(EXPERTS) if ep.owner(e) == j) for j in range(ep.size)]
        recv = [sum(counts[e] for e in ep.mine)] * ep.size

        def a2a(t, role, out_splits, in_splits):
            if ep.size == 1:
                return r.ep_all_to_all(t, routed, EXPERTS, TOP_K, role)
            attrs = {"ep": ep.size, "rows": routed, "experts": EXPERTS, "top_k": TOP_K, "role": role}
            return r._op("ep_all_to_all", [t], attrs,
                         lambda t_: AllToAll.apply(t_, out_splits, in_splits))

        received = a2a(permuted, "dispatch", recv, send)
        received_probs = a2a(permuted_probs, "dispatch", recv, send)
        # sort_chunks_by_idxs: [rank][local expert] -> [local expert][rank]
        by_rank = [counts[e] for _ in range(ep.size) for e in ep.mine]
        per_expert = [ep.size * counts[e] for e in ep.mine]

        def sort(t, sizes, order_):
            if ep.local == 1 and ep.size > 1:
                return t
            pieces = _split(r, t, sizes, "chunks")
            return _cat(r, [pieces[i] for i in order_], "chunks")
        to_expert = [j * ep.local + l for l in range(ep.local) for j in range(ep.size)]
        received = sort(received, by_rank, to_expert)
        received_probs = sort(received_probs, by_rank, to_expert)
        # SequentialMLP: one local expert runs on what arrived, as it is
        one = ep.local == 1 and ep.size > 1
        pieces = [received] if one else _split(r, received, per_expert, "experts")
        weights = [received_probs] if one else _split(r, received_probs, per_expert, "experts")
        outs = []
        for l, e in enumerate(ep.mine):
            with r.scope(f"experts.local_experts.{l}"):
                w1 = r.param(f"mlp.experts.local_experts.{l}.linear_fc1.weight", [2 * FFN, DIM])
                h = r.megatron_swiglu(r.linear(pieces[l], w1), r.unsqueeze(weights[l], -1))
                w2 = r.param(f"mlp.experts.local_experts.{l}.linear_fc2.weight", [DIM, FFN])
                outs.append(r.linear(h, w2))
        out = outs[0] if one else _cat(r, outs, "experts")
        by_expert_sizes = [counts[e] for e in ep.mine for _ in range(ep.size)]
        to_rank = [l * ep.size + j for j in range(ep.size) for l in range(ep.local)]
        out = sort(out, by_expert_sizes, to_rank)
        out = a2a(out, "combine", send, recv)
        where = r.expand(r.unsqueeze(sorted_indices, 1), [routed, DIM])
        restored = r.scatter_add_(r.full([n, DIM]), where, out, 0)
        y = r.view(restored, [b, SEQ, DIM])
    return r.mean(r.mul(y, y))


def grad_sync(store):
    """Megatron's DDP over the data ranks: the dense (replicated) parameters' gradients
    all-reduced, as one flat copy; the experts' group of one rank reduces nothing."""
    params = [p for n, p in store.params.items() if ".experts." not in n and p.grad is not None]
    grads = [p.grad.data for p in params]
    coalesced = torch._utils._flatten_dense_tensors(grads)
    common.all_reduce(coalesced)
    for buf, synced in zip(grads, torch._utils._unflatten_dense_tensors(coalesced, grads)):
        buf.copy_(synced)


def run(rank, world, p):
    ep = EP(world, rank)
    batch = p["batch"]
    fn = functools.partial(moe_layer, ep=ep, routing=p["routing"])
    store = ParamStore(seed=0)
    plan = common.record(store, fn, batch)
    saved = common.saved_by_forward(store, plan, fn, batch)
    results, explained = common.measure_steps(store, plan, fn, batch, p["optimizer"],
                                              sync=lambda: grad_sync(store))
    counts = [batch * sum(e in q for q in ROUTING[p["routing"]]) for e in range(EXPERTS)]
    dist.barrier(group=common.GROUP)
    return {"saved_for_backward": saved, "steps": results,
            "received_rows": ep.size * sum(counts[e] for e in ep.mine), **explained}
