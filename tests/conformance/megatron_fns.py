"""Megatron-LM's autograd Functions of its mixture-of-experts layer, as the conformance suite
runs them (recorder.py: `r.ep_all_to_all`, `r.megatron_swiglu`), from NVIDIA/Megatron-LM
d98e8a64:

* `AllToAllOneRank`: tensor_parallel/mappings.py `_AllToAll` over an expert-parallel group of
  one rank: forward returns its input (autograd hands back a view of it, `view_as`, no
  allocation); backward runs `_AllToAll.apply` on the gradient, which again returns it.
* `route_and_permute`: the router and the dispatcher's permute as recorder ops, shared by the
  conformance layer (cases_megatron_moe.py) and the multi-rank one (tests/parallel/ep.py).
* `WeightedSwiGLU` / `SwiGLU`: fusions/fused_bias_swiglu.py `WeightedSwiGLUFunction` /
  `SwiGLUFunction`: `ctx.save_for_backward(input, weights)`; the output silu(y1) * y2 (* w)
  made with one allocation, as the fused kernel does on the GPU (silu of the first half into a
  new tensor, then multiplied in place); the backward is `weighted_swiglu_back` /
  `swiglu_back` as Megatron writes them, run op by op (its `jit_fuser` is torch.jit.script on
  PyTorch < 2.2, which fuses nothing on the CPU): each product a new tensor, the two halves of
  the input's gradient concatenated.
"""
import torch
import torch.nn.functional as F


class AllToAllOneRank(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x  # `if world_size == 1: return input`

    @staticmethod
    def backward(ctx, g):
        return AllToAllOneRank.apply(g)


def swiglu(y):
    y_1, y_2 = torch.chunk(y, 2, -1)
    return F.silu(y_1) * y_2


def swiglu_back(g, y):
    y_1, y_2 = torch.chunk(y, 2, -1)
    return torch.cat(
        (g * torch.sigmoid(y_1) * (1 + y_1 * (1 - torch.sigmoid(y_1))) * y_2, g * F.silu(y_1)), -1
    )


def weighted_swiglu_back(g, y, weights):
    input_dtype = y.dtype
    w_dtype = weights.dtype
    input_grad = swiglu_back(g * weights, y)
    # precison of w may be higher than y and g, so we need to cast g to w_dtype
    weights_grad = swiglu(y) * g.to(w_dtype)
    weights_grad = torch.sum(weights_grad, dim=-1, keepdim=True)
    return input_grad.to(input_dtype), weights_grad.to(w_dtype)


def _fused_swiglu(y, weights=None):
    """silu(y1) * y2 (* weights) into one new tensor (the fused kernel's single output)."""
    y_1, y_2 = torch.chunk(y, 2, -1)
    out = F.silu(y_1)
    out.mul_(y_2)
    if weights is not None:
        out.mul_(weights)
    return out


class WeightedSwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, weights):
        ctx.save_for_backward(input, weights)
        return _fused_swiglu(input, weights)

    @staticmethod
    def backward(ctx, grad_output):
        input, weights = ctx.saved_tensors
        return weighted_swiglu_back(grad_output, input, weights)


class SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input):
        ctx.save_for_backward(input)
        return _fused_swiglu(input)

    @staticmethod
    def backward(ctx, grad_output):
        input = ctx.saved_tensors[0]
        return swiglu_back(grad_output, input)


def route_and_permute(r, x, local, prefs, experts, top_k, start=0):
    """TopKRouter and MoEAlltoAllTokenDispatcher's permute (the argsort path) on one rank's
    tokens, as the recorder `r` runs them (engine/models/megatron_moe.cc builds the same):
    x [b, s, d]; `prefs` gives each position's two experts a fixed preference added to the
    router's logits (far larger than the linear's part, so every pass routes alike), a buffer
    [len(prefs), E] of which x's positions are start .. start + s (sequence parallelism: a
    rank's share); `local` holds what the dispatcher keeps (self.probs, self.routing_map).
    Returns (sorted_indices, permuted tokens, permuted probabilities)."""
    b, s, d = x.shape
    n, routed = b * s, b * s * top_k
    flat = r.view(x, [n, d])
    # TopKRouter: logits [s, b, E] (plus the preference), viewed [-1, E];
    # topk_routing_with_score_function(softmax): top-k of the logits, softmax in float32
    logits = r.linear(x, r.param("router.weight", [experts, d]))
    bias = torch.zeros(len(prefs), experts)
    for pos, (first, second) in enumerate(prefs):
        bias[pos, first], bias[pos, second] = 8.0, 4.0
    preference = r.buffer("router.preference", [len(prefs), experts], value=bias)
    if s != len(prefs):
        preference = r.slice(preference, 0, start, start + s)
    logits = r.view(r.add(logits, preference), [n, experts])
    scores, top = r.topk(logits, top_k)
    probs = r.to(r.softmax(r.to(scores, "float32"), -1), "float32")
    routing_probs = local(r.scatter(r.full([n, experts]), top, probs, dim=1))
    # zeros_like(logits).int().scatter(1, top_indices, 1).bool()
    routing_map = r.to(r.full([n, experts]), "int32")
    routing_map = local(r.to(r.scatter(routing_map, top, dim=1, value=1), "bool"))
    # permute: the map's nonzeros in expert-major order, the tokens and their weights gathered
    by_expert = r.view(r.contiguous(r.transpose(routing_map, 0, 1)), [-1])
    _, order = r.sort(by_expert, 0, descending=True, stable=True)
    flat_sorted = r.slice(order, 0, 0, routed)
    sorted_indices = r.remainder(flat_sorted, n)
    probs_t = r.view(r.contiguous(r.transpose(routing_probs, 0, 1)), [-1])
    permuted_probs = r.index(probs_t, flat_sorted)
    permuted = r.index_select(flat, sorted_indices, 0)
    return sorted_indices, permuted, permuted_probs
