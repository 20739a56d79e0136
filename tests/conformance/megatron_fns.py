"""Megatron-LM's autograd Functions of its mixture-of-experts layer, as the conformance suite
runs them (recorder.py: `r.ep_all_to_all`, `r.megatron_swiglu`), from NVIDIA/Megatron-LM
d98e8a64:

* `AllToAllOneRank`: tensor_parallel/mappings.py `_AllToAll` over an expert-parallel group of
  one rank: forward returns its input (autograd hands back a view of it, `view_as`, no
  allocation); backward runs `_AllToAll.apply` on the gradient, which again returns it.
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
