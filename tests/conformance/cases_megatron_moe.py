"""Conformance cases for Megatron-LM's MoELayer (engine/models/megatron_moe.cc builds it; its
rules are engine/rules/moe_dispatch.cc): each op it adds, alone (index_select, scatter out of
place with a source and with a value, scatter_add_ with an expanded index, remainder, sort of a
bool map, the all-to-all over one expert-parallel rank, the fused SwiGLU with and without
per-token weights), then the whole layer at one rank with four experts and top-2 routing, as
megatron_moe.cc writes it. Registered into cases.CASES (cases.py imports this module).

Which expert a token goes to is the data's. In the layer case the router's logits get a fixed
per-position preference (a buffer added to the router's output), far larger than the linear's
part, so every pass routes alike and the recorded split sizes are the measured ones; the
gradient still reaches the router's weight through the top-k values.

The custom autograd Functions (megatron_fns.py) are what memest.trace cannot see into: it
records the aten ops of a Function's forward, which runs under no_grad, and neither what the
Function saves nor its backward. Cases that run the SwiGLU Functions are not traced
(`tracer=`); the all-to-all at one rank returns its input, which autograd turns into a view
that the tracer records as one.
"""
import torch

from cases import SGD, case, lift, loss_of
from megatron_fns import route_and_permute
from measure import Config

INFER = Config(mode="inference")
BOTH = [SGD, INFER]
EXPERTS, TOP_K, SEQ, DIM, FFN = 4, 2, 8, 16, 24
# Each position's two experts (first, second): the experts get 7, 4, 3 and 2 of the 16 picks
# per sample.
PREFS = [(0, 1), (0, 2), (1, 2), (0, 3), (0, 1), (2, 0), (1, 0), (3, 0)]
NOT_TRACED = ("Megatron's SwiGLUFunction / WeightedSwiGLUFunction is a custom "
              "autograd.Function: memest.trace records the aten ops of its forward (under "
              "no_grad), not what it saves nor its backward")


def _tokens(r, name, b, width, lift_name="lift"):
    """A trainable [b * SEQ, width] (an input [b, SEQ, width] lifted, viewed flat: every input
    of a case has the batch in its first dim, as memest.trace takes them)."""
    return r.view(lift(r, r.input(name, [b, SEQ, width]), lift_name), [b * SEQ, width])


def _choices(r, b):
    """Top-2 choices among EXPERTS per token, of scores no gradient reaches (an input's)."""
    _, top = r.topk(r.view(r.input("s", [b, SEQ, EXPERTS]), [b * SEQ, EXPERTS]), TOP_K)
    return top


def _routing_map(r, top, n):
    """zeros_like(logits).int().scatter(1, top_indices, 1).bool()"""
    m = r.to(r.full([n, EXPERTS]), "int32")
    return r.to(r.scatter(m, top, dim=1, value=1), "bool")


@case("moe", "megatron_index_select", configs=BOTH)
def _(r, b):
    # permute's tokens.index_select(0, sorted_indices): every token twice, on a trainable input
    flat = _tokens(r, "x", b, DIM)
    idx = r.view(r.input("idx", [b, SEQ * TOP_K], "int64", high=b * SEQ), [-1])
    return loss_of(r, r.index_select(flat, idx, 0))


@case("moe", "megatron_index_select_dim1", configs=BOTH)
def _(r, b):
    x = lift(r, r.input("x", [b, SEQ, DIM]))
    idx = r.buffer("idx", [12], "int64", value=torch.tensor([0, 2, 2, 7, 1, 1, 5, 3, 0, 6, 4, 7]))
    return loss_of(r, r.mul(r.index_select(x, idx, 1), 2.0))


@case("moe", "megatron_scatter_src", configs=BOTH)
def _(r, b):
    # out of place, both self and src take a gradient
    x = _tokens(r, "x", b, EXPERTS, "lx")
    src = r.exp(_tokens(r, "v", b, TOP_K, "lv"))
    return loss_of(r, r.scatter(x, _choices(r, b), src, dim=1))


@case("moe", "megatron_scatter_probs", configs=BOTH)
def _(r, b):
    # the router's zeros_like(logits).scatter(1, top_indices, probs): src alone takes a gradient
    n = b * SEQ
    x = r.view(r.input("x", [b, SEQ, DIM]), [n, DIM])
    logits = r.linear(x, r.param("router", [EXPERTS, DIM]))
    scores, top = r.topk(logits, TOP_K)
    probs = r.scatter(r.full([n, EXPERTS]), top, r.softmax(scores, -1), dim=1)
    return loss_of(r, r.mul(probs, probs))


@case("moe", "megatron_scatter_value", configs=BOTH)
def _(r, b):
    # the routing map: int32 zeros, scatter of the value 1, bool
    x = _tokens(r, "x", b, EXPERTS)
    return loss_of(r, r.masked_fill(x, _routing_map(r, _choices(r, b), b * SEQ), 0.0))


@case("moe", "megatron_scatter_add_expanded", configs=BOTH)
def _(r, b):
    # unpermute: zeros.scatter_add_(0, sorted_indices.unsqueeze(1).expand(-1, hidden), tokens)
    n = b * SEQ
    idx = r.view(r.input("idx", [b, SEQ * TOP_K], "int64", high=n), [-1])
    v = r.exp(lift(r, r.input("v", [b, SEQ * TOP_K, DIM])))
    where = r.expand(r.unsqueeze(idx, 1), [n * TOP_K, DIM])
    out = r.scatter_add_(r.full([n, DIM]), where, r.view(v, [n * TOP_K, DIM]), 0)
    return loss_of(r, r.mul(out, out))


@case("moe", "megatron_scatter_add_into_grad", configs=BOTH)
def _(r, b):
    # scatter_add_ into a tensor that takes a gradient itself (grad passes through); not into
    # a view of one, which autograd would run through CopySlices
    idx = r.input("idx", [b, SEQ, DIM], "int64", high=SEQ)
    x = lift(r, r.input("x", [b, SEQ, DIM]), "lx")
    v = lift(r, r.input("v", [b, SEQ, DIM]), "lv")
    return loss_of(r, r.scatter_add_(x, idx, v, 1))


@case("moe", "megatron_remainder", configs=BOTH)
def _(r, b):
    # int64 positions % a number (permute's flat_sorted % num_tokens), then a lookup
    pos = r.remainder(r.input("i", [b, SEQ * TOP_K], "int64", high=4 * SEQ), SEQ)
    return loss_of(r, r.embedding(r.param("table", [SEQ, DIM]), pos))


@case("moe", "megatron_sort_bool", configs=BOTH)
def _(r, b):
    # routing_map.T.contiguous().reshape(-1).argsort(descending=True, stable=True)
    flat = r.view(lift(r, r.input("x", [b, 4 * SEQ, DIM])), [b * 4 * SEQ, DIM])
    m = r.view(r.input("m", [b, 4 * SEQ], "bool"), [-1])
    _, order = r.sort(m, 0, descending=True, stable=True)
    return loss_of(r, r.index_select(flat, order, 0))


@case("moe", "megatron_permute", configs=BOTH)
def _(r, b):
    # MoEAlltoAllTokenDispatcher.dispatch_preprocess at one rank: the map's nonzeros in
    # expert-major order, the tokens and their weights gathered
    n = b * SEQ
    flat = _tokens(r, "x", b, DIM)
    top = _choices(r, b)
    probs = r.scatter(r.full([n, EXPERTS]), top, r.exp(_tokens(r, "p", b, TOP_K, "lp")), dim=1)
    routing_map = _routing_map(r, top, n)
    by_expert = r.view(r.contiguous(r.transpose(routing_map, 0, 1)), [-1])
    _, order = r.sort(by_expert, 0, descending=True, stable=True)
    flat_sorted = r.slice(order, 0, 0, n * TOP_K)
    sorted_indices = r.remainder(flat_sorted, n)
    probs_t = r.view(r.contiguous(r.transpose(probs, 0, 1)), [-1])
    permuted_probs = r.index(probs_t, flat_sorted)
    permuted = r.index_select(flat, sorted_indices, 0)
    return loss_of(r, r.mul(permuted, r.unsqueeze(permuted_probs, 1)))


@case("moe", "megatron_all_to_all", configs=BOTH)
def _(r, b):
    x = r.view(lift(r, r.input("x", [b, SEQ * TOP_K, DIM])), [b * SEQ * TOP_K, DIM])
    y = r.ep_all_to_all(x, b * SEQ * TOP_K, EXPERTS, TOP_K, "dispatch")
    return loss_of(r, r.exp(y))


@case("moe", "megatron_swiglu", configs=BOTH, tracer=NOT_TRACED)
def _(r, b):
    return loss_of(r, r.megatron_swiglu(_tokens(r, "x", b, 2 * FFN)))


@case("moe", "megatron_swiglu_weighted", configs=BOTH, tracer=NOT_TRACED)
def _(r, b):
    # MLP.forward's weighted_bias_swiglu_impl(fc1, None, per_token_scale.unsqueeze(-1))
    x = _tokens(r, "x", b, 2 * FFN)
    w = r.unsqueeze(r.view(lift(r, r.input("p", [b, SEQ]), "lp"), [b * SEQ]), -1)
    return loss_of(r, r.megatron_swiglu(x, w))


def _sort_chunks(r, x, counts):
    """sort_chunks_by_idxs at one rank: split, cat in the same order (a copy)."""
    return r.cat(r.split(x, 0, counts), 0)


def megatron_moe_layer(r, x):
    """MoELayer.forward with the all-to-all dispatcher at one expert-parallel rank, as
    engine/models/megatron_moe.cc builds it: x [b, SEQ, DIM] -> [b, SEQ, DIM]."""
    b = x.shape[0]
    n, routed = b * SEQ, b * SEQ * TOP_K
    counts = [b * sum(e in p for p in PREFS) for e in range(EXPERTS)]
    # custom_forward: the dispatcher's self.probs, self.routing_map, and its own locals (the
    # permuted tokens, what the all-to-all returned) until it returns
    with r.frame() as local:
        sorted_indices, permuted, permuted_probs = route_and_permute(r, x, local, PREFS, EXPERTS,
                                                                     TOP_K)
        local(permuted)
        # token_dispatch
        received = local(r.ep_all_to_all(permuted, routed, EXPERTS, TOP_K, "dispatch"))
        received_probs = local(r.ep_all_to_all(permuted_probs, routed, EXPERTS, TOP_K, "dispatch"))
        # routed_experts_compute: dispatch_postprocess, SequentialMLP, combine_preprocess, its
        # locals (dispatched_input, permuted_probs, expert_output) held until it returns
        with r.frame() as experts_local:
            received = experts_local(_sort_chunks(r, received, counts))
            received_probs = experts_local(_sort_chunks(r, received_probs, counts))
            pieces = r.split(received, 0, counts)
            weights = r.split(received_probs, 0, counts)
            outs = []
            for e in range(EXPERTS):
                with r.scope(f"experts.local_experts.{e}"):
                    h = r.linear(pieces[e], r.param(f"experts.{e}.fc1", [2 * FFN, DIM]))
                    h = r.megatron_swiglu(h, r.unsqueeze(weights[e], -1))
                    outs.append(r.linear(h, r.param(f"experts.{e}.fc2", [DIM, FFN])))
            out = experts_local(r.cat(outs, 0))
            out = _sort_chunks(r, out, counts)
        # token_combine, combine_postprocess (unpermute)
        out = r.ep_all_to_all(out, routed, EXPERTS, TOP_K, "combine")
        where = r.expand(r.unsqueeze(sorted_indices, 1), [routed, DIM])
        restored = r.scatter_add_(r.full([n, DIM]), where, out, 0)
        return r.view(restored, [b, SEQ, DIM])


@case("moe", "megatron_moe_layer", configs=BOTH, tracer=NOT_TRACED)
def _(r, b):
    return loss_of(r, megatron_moe_layer(r, lift(r, r.input("x", [b, SEQ, DIM]))))
