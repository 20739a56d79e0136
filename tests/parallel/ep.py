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
With tensor parallelism (TP ranks, Megatron's rank order: tensor fastest, the expert-tensor
group the tensor group), sequence parallelism splits the sequence: each rank routes its own
SEQ / TP positions, the all-to-all runs within its expert-parallel group (the ranks of its
tensor rank), and token_dispatcher.py's dispatch_postprocess gathers what the tensor group
received (`gather_from_sequence_parallel_region` with split sizes: torch.distributed's list
all_gather, which gathers through one new flat tensor of the whole; backward the list
reduce_scatter, written here as ProcessGroupNCCL runs it, through a flat copy of its input),
the experts hold 1/TP of linear_fc1's rows and linear_fc2's columns and communicate nothing
(explicit_expert_comm: fc2's output a partial sum), and combine_preprocess reduce-scatters the
sum back (`reduce_scatter_to_sequence_parallel_region`, the list collective again; backward
all-gathers) before the all-to-all returns it. As MoELayer's functions hold them:
custom_forward the permuted tokens and the all-to-all's outputs until the layer returns,
routed_experts_compute the sorted tokens and weights and the experts' output until
combine_preprocess has run. Routing is per position, so each tensor rank
routes its half alike (the balanced preferences are balanced in each half).

With the expert-parallel and tensor groups covering the world, the expert-data-parallel group
is one rank: no gradient of an expert is reduced; the router's (replicated) is all-reduced after
backward (phase GRAD_SYNC), as Megatron's DDP all-reduces the dense buffer. The plain model
(E = 1, TP = 1) is the memest model file (expected/models/ep-moe-<routing>.json).
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
    def forward(ctx, x, output_splits, input_splits, group):
        ctx.splits, ctx.group = (output_splits, input_splits), group
        out = torch.empty((sum(output_splits),) + tuple(x.shape[1:]), dtype=x.dtype)
        dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)
        common.flush(group)
        return out

    @staticmethod
    def backward(ctx, g):
        output_splits, input_splits = ctx.splits
        return AllToAll.apply(g.contiguous(), input_splits, output_splits, ctx.group), None, None, None


def _gather(x, group):
    """mappings.py _gather_along_first_dim with output_split_sizes (equal): a new output split
    into views, torch.distributed.all_gather into the list (gloo, as NCCL, gathers into one new
    flat tensor and copies it out)."""
    out = torch.empty((group.size() * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype)
    if x.numel():  # the group's ranks receive alike: none of them any (gloo fails on nothing)
        dist.all_gather(list(out.split([x.shape[0]] * group.size())), x.contiguous(), group=group)
        common.flush(group)
    return out


def _reduce_scatter(x, group):
    """mappings.py _reduce_scatter_along_first_dim with input_split_sizes (equal):
    torch.distributed.reduce_scatter(output, list of x's chunks), as ProcessGroupNCCL runs it
    (gloo has none): the output (empty_like a chunk), then one new flat tensor of x's size with
    the chunks copied in, reduced, the rank's chunk copied out."""
    n = x.shape[0] // group.size()
    out = torch.empty((n,) + tuple(x.shape[1:]), dtype=x.dtype)
    flat = torch.empty(x.shape, dtype=x.dtype)
    flat.copy_(x)
    if x.numel():
        common.all_reduce(flat, group)
    out.copy_(flat[group.rank() * n:(group.rank() + 1) * n])
    del flat
    return out


class GatherTokens(torch.autograd.Function):
    """mappings.py _GatherFromSequenceParallelRegion with split sizes: the group's rows;
    backward reduce-scatters the gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather(x, group)

    @staticmethod
    def backward(ctx, g):
        return _reduce_scatter(g, ctx.group), None


class ScatterTokens(torch.autograd.Function):
    """mappings.py _ReduceScatterToSequenceParallelRegion with split sizes: the group's sum of
    the rank's rows; backward all-gathers the gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter(x, group)

    @staticmethod
    def backward(ctx, g):
        return _gather(g, ctx.group), None


class EP:
    """An expert-parallel group of `size` ranks (1: the plain layer); this process's rank in it.
    With `tp` > 1 tensor ranks, the rank's tensor rank, its tensor group and its expert
    group."""

    def __init__(self, size=1, rank=0, tp=1, tp_rank=0, ep_group=None, tp_group=None):
        self.size, self.rank = size, rank
        self.tp, self.tp_rank, self.ep_group, self.tp_group = tp, tp_rank, ep_group, tp_group
        self.local = EXPERTS // size
        self.mine = list(range(rank * self.local, (rank + 1) * self.local))

    def owner(self, e):
        return e // self.local

    def positions(self, prefs):
        """The rank's share of the sequence's preferences (sequence parallelism)."""
        n = len(prefs) // self.tp
        return prefs[self.tp_rank * n:(self.tp_rank + 1) * n]


def _split(r, x, sizes, moe):
    """split along dim 0, marked as megatron_moe.cc marks its splits (`moe`: the expert-parallel
    pass gives them the rank's sizes); always a list."""
    out = r._op("split", [x], {"dim": 0, "sizes": list(sizes), "moe": moe},
                lambda t: t.split(list(sizes), 0), n_out=len(sizes))
    return out if len(sizes) > 1 else [out]


def _cat(r, xs, moe):
    return r._op("cat", list(xs), {"dim": 0, "moe": moe}, lambda *t: torch.cat(t, 0))


def moe_layer(r, b, ep, routing):
    """x [b, SEQ, DIM] (an input lifted by a parameter; the rank's SEQ / TP positions) ->
    MoELayer -> mean."""
    mine = ep.positions(ROUTING[routing])
    seq = len(mine)
    n, routed = b * seq, b * seq * TOP_K
    counts = [b * sum(e in p for p in mine) for e in range(EXPERTS)]  # every rank's, alike
    x = r.add(r.input("x", [b, seq, DIM]), r.param("lift.b", [DIM]))
    with r.scope("mlp"), r.frame() as local:
        sorted_indices, permuted, permuted_probs = route_and_permute(
            r, x, local, ROUTING[routing], EXPERTS, TOP_K, start=ep.tp_rank * seq)
        # token_dispatch: each rank's experts' tokens to it, and back in combine
        send = [sum(counts[e] for e in range(EXPERTS) if ep.owner(e) == j) for j in range(ep.size)]
        recv = [sum(counts[e] for e in ep.mine)] * ep.size

        def a2a(t, role, out_splits, in_splits):
            if ep.size == 1:
                return r.ep_all_to_all(t, routed, EXPERTS, TOP_K, role)
            attrs = {"ep": ep.size, "rows": routed, "experts": EXPERTS, "top_k": TOP_K, "role": role}
            return r._op("ep_all_to_all", [t], attrs,
                         lambda t_: AllToAll.apply(t_, out_splits, in_splits, ep.ep_group))

        def tp_collective(t, kind, fn):
            if ep.tp == 1:
                return t
            return r._op(kind, [t], {}, lambda t_: fn.apply(t_, ep.tp_group))

        # MoELayer's custom_forward holds the permuted tokens and what the all-to-all returned
        # until it returns
        local(permuted)
        received = local(a2a(permuted, "dispatch", recv, send))
        received_probs = local(a2a(permuted_probs, "dispatch", recv, send))
        # routed_experts_compute, its locals (dispatched_input, permuted_probs, expert_output)
        # held until it returns, after combine_preprocess
        with r.frame() as experts_local:
            # dispatch_postprocess: the tensor group's rows gathered, then sort_chunks_by_idxs:
            # [tensor rank][expert rank][local expert] -> [local expert][tensor rank, expert rank]
            gather = "megatron.gather_from_sequence_parallel_region"
            received = tp_collective(received, gather, GatherTokens)
            received_probs = tp_collective(received_probs, gather, GatherTokens)
            sources = ep.tp * ep.size
            by_rank = [counts[e] for _ in range(sources) for e in ep.mine]
            per_expert = [sources * counts[e] for e in ep.mine]

            def sort(t, sizes, order_):
                if ep.local == 1 and sources > 1:
                    return t
                pieces = _split(r, t, sizes, "chunks")
                return _cat(r, [pieces[i] for i in order_], "chunks")
            to_expert = [j * ep.local + l for l in range(ep.local) for j in range(sources)]
            received = experts_local(sort(received, by_rank, to_expert))
            received_probs = experts_local(sort(received_probs, by_rank, to_expert))
            # SequentialMLP: one local expert runs on what arrived, as it is; each holds 1/TP of
            # linear_fc1's rows (both gated halves) and of linear_fc2's columns
            one = ep.local == 1 and sources > 1
            pieces = [received] if one else _split(r, received, per_expert, "experts")
            weights = [received_probs] if one else _split(r, received_probs, per_expert, "experts")
            ffn = FFN // ep.tp
            outs = []
            for l, e in enumerate(ep.mine):
                with r.scope(f"experts.local_experts.{l}"):
                    w1 = r.param(f"mlp.experts.local_experts.{l}.linear_fc1.weight", [2 * ffn, DIM])
                    h = r.megatron_swiglu(r.linear(pieces[l], w1), r.unsqueeze(weights[l], -1))
                    w2 = r.param(f"mlp.experts.local_experts.{l}.linear_fc2.weight", [DIM, ffn])
                    outs.append(r.linear(h, w2))
            out = experts_local(outs[0] if one else _cat(r, outs, "experts"))
            by_expert_sizes = [counts[e] for e in ep.mine for _ in range(sources)]
            to_rank = [l * sources + j for j in range(sources) for l in range(ep.local)]
            out = sort(out, by_expert_sizes, to_rank)
            # combine_preprocess: the partial sums reduce-scattered back to the rank's rows
            out = tp_collective(out, "megatron.reduce_scatter_to_sequence_parallel_region",
                                ScatterTokens)
        out = a2a(out, "combine", send, recv)
        where = r.expand(r.unsqueeze(sorted_indices, 1), [routed, DIM])
        restored = r.scatter_add_(r.full([n, DIM]), where, out, 0)
        y = r.view(restored, [b, seq, DIM])
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


_GROUPS = [0]  # groups made so far (every rank runs the same cases: the same names)


def run(rank, world, p):
    tp = p.get("tp", 1)
    size, ep_rank, tp_rank = world // tp, rank // tp, rank % tp
    ep_group = tp_group = common.GROUP
    if tp > 1:  # Megatron's rank order: the tensor group's ranks next to each other
        _GROUPS[0] += 1
        ep_group = common.make_group(rank, world, [j * tp + tp_rank for j in range(size)],
                                     f"ep-{_GROUPS[0]}-expert-{tp_rank}")
        tp_group = common.make_group(rank, world, [ep_rank * tp + j for j in range(tp)],
                                     f"ep-{_GROUPS[0]}-tensor-{ep_rank}")
    ep = EP(size, ep_rank, tp, tp_rank, ep_group, tp_group)
    batch = p["batch"]
    fn = functools.partial(moe_layer, ep=ep, routing=p["routing"])
    store = ParamStore(seed=0)
    plan = common.record(store, fn, batch)
    saved = common.saved_by_forward(store, plan, fn, batch)
    results, explained = common.measure_steps(store, plan, fn, batch, p["optimizer"],
                                              sync=lambda: grad_sync(store))
    counts = [batch * sum(e in q for q in ep.positions(ROUTING[p["routing"]]))
              for e in range(EXPERTS)]
    dist.barrier(group=common.GROUP)
    return {"saved_for_backward": saved, "steps": results,
            "received_rows": ep.size * sum(counts[e] for e in ep.mine), **explained}
