"""nn.TransformerEncoderLayer's and nn.MultiheadAttention's inference fast paths, recorded as
PyTorch 1.13 runs them.

In eval mode without autograd, 1.13's TransformerEncoderLayer.forward calls one aten op,
torch._transformer_encoder_layer_fwd, when its checks pass (_fast_path_checks), and
MultiheadAttention.forward (self-attention, no dropout) calls
torch._native_multi_head_attention (_mha_fast_path_checks); on the meta device the checks fail
("neither CUDA nor CPU") and the Python path runs instead, whose buffers differ. While recording, `encoder_fast_path` evaluates the same checks (the device
apart: the trace stands for the CPU or GPU the model will run on) and records the fast path's
ops as the C++ composite runs them (aten/src/ATen/native/transformers/transformer.cpp,
transformer_encoder_layer_forward; attention.cpp, native_multi_head_attention; measured on
1.13's CPU with the profiler's allocation trace):

  qkv = src @ in_proj_weight^T                  [B, T, 3D]  (gemm_nt, no bias)
  packed = _transform_bias_rescale_qkv(qkv)     [3, B, H, T, dh] (bias and 1/sqrt(dh) folded
                                                in); qkv freed; q, k, v are views of it
  scores = q @ k^T                              [B*H, T, T]
  softmax in place on scores                    (_softmax_out(scores, scores))
  q <- scores @ v                               (bmm_nn into q's storage); scores freed
  ctx = transform_0213(q).contiguous()          [B, T, H, dh]
  proj = ctx @ out_proj^T + bias                [B, T, D]; ctx and packed freed after it
                                                (need_weights: the scores kept until they are
                                                summed over the heads, [B, T, T], and div_ by
                                                H, or returned as [B, H, T, T])
  x = proj.add_(src); x = layer_norm(x)         (norm_first: layer_norm(src) goes into
                                                the attention, and x is not normed after)
  h = linear1(x) with relu_ / gelu_ in place    (_addmm_activation)
  y = linear2(h); h freed; y.add_(x); out = layer_norm(y)
                                                (the layer's input to the FFN, x, is held to
                                                the end: pre_ffn_res)

Python holds each intermediate exactly as long as the C++ code does, so the trace's lifetimes
say when each is freed. PyTorch 2.x runs the attention through its fused kernels inside the
fast path; there the layer's Python path is recorded (with scaled_dot_product_attention as one
op), and so is a call given a padding mask (1.13's encoder turns its input into a nested
tensor) or an attention without biases. Under autocast PyTorch takes the Python path too: the
engine refuses a graph with these ops under an autocast precision, naming them.
"""
import contextlib

import torch


def _fast_path_checks(layer, src, src_mask, src_key_padding_mask):
    """1.13's TransformerEncoderLayer.forward checks, the device apart; plus no padding mask."""
    attn = layer.self_attn
    if (src.dim() != 3 or layer.training or not attn.batch_first or not attn._qkv_same_embed_dim
            or not layer.activation_relu_or_gelu or layer.norm1.eps != layer.norm2.eps
            or src_mask is not None or src_key_padding_mask is not None or src.is_nested
            or attn.num_heads % 2 == 1 or torch.is_autocast_enabled()):
        return False
    tensors = (src, attn.in_proj_weight, attn.in_proj_bias, attn.out_proj.weight,
               attn.out_proj.bias, layer.norm1.weight, layer.norm1.bias, layer.norm2.weight,
               layer.norm2.bias, layer.linear1.weight, layer.linear1.bias, layer.linear2.weight,
               layer.linear2.bias)
    if any(t is None for t in tensors) or torch.overrides.has_torch_function(tensors):
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def _mha_fast_path_checks(attn, query, key, value, key_padding_mask, attn_mask):
    """1.13's MultiheadAttention.forward checks, the device apart; plus no padding mask and
    both projection biases."""
    if (query.dim() != 3 or query is not key or key is not value or attn.training
            or not attn.batch_first or attn.bias_k is not None or attn.bias_v is not None
            or attn.dropout or attn.add_zero_attn or not attn._qkv_same_embed_dim
            or attn_mask is not None or key_padding_mask is not None or query.is_nested
            or attn.num_heads % 2 == 1 or torch.is_autocast_enabled()):
        return False
    tensors = (query, attn.in_proj_weight, attn.in_proj_bias, attn.out_proj.weight,
               attn.out_proj.bias)
    if any(t is None for t in tensors) or any(t.dtype != query.dtype for t in tensors[1:3]):
        return False
    if torch.overrides.has_torch_function(tensors):
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


class _Ops:
    """Emits one op of the fast path: `out` is the tensor object that carries its output (a
    view made with the same view op, a new tensor, or the input itself for an in-place op)."""

    def __init__(self, tracer):
        self.tr = tracer

    def __call__(self, kind, inputs, out, attrs=None):
        for t in inputs:
            self.tr.life.watch(t)
        self.tr.emit(kind, list(inputs), [out], attrs or {})
        return out

    def layer_norm(self, x, norm):
        return self(
            "layer_norm", [x, norm.weight, norm.bias], torch.empty_like(x), {"normalized_ndim": 1})


def _attention(op, attn, src, out, need_weights=False, average=True, weights=None):
    """native_multi_head_attention(src, src, src): the output projection into `out`, with the
    packed q/k/v buffer and the transposed context alive until it is made; with need_weights,
    the scores kept until they are averaged over the heads into `weights` (summed, then
    div_ in place), or returned as they are."""
    d, h = attn.embed_dim, attn.num_heads
    dh, t = d // h, src.shape[1]
    qkv = op("linear", [src, attn.in_proj_weight], src.new_empty(src.shape[0], t, 3 * d))
    split = op("reshape", [qkv], qkv.view(-1, t, 3, h, dh), {"shape": [-1, t, 3, h, dh]})
    order = op("permute", [split], split.permute(2, 0, 3, 1, 4), {"dims": [2, 0, 3, 1, 4]})
    packed = op("contiguous", [order], order.contiguous())
    del qkv, split, order
    q, k, v = packed.split(1, 0)
    op.tr.emit("split", [packed], [q, k, v], {"dim": 0, "sizes": [1, 1, 1]})
    q, k, v = (op("reshape", [x], x.view(-1, t, dh), {"shape": [-1, t, dh]}) for x in (q, k, v))
    kt = op("transpose", [k], k.transpose(1, 2), {"dim0": 1, "dim1": 2})
    scores = op("bmm", [q, kt], q.new_empty(q.shape[0], t, t))
    scores = op("softmax", [scores], scores, {"dim": -1, "inplace": 1})
    q = op("bmm_into", [q, scores, v], q)
    del k, kt, v
    if not need_weights:
        del scores
    heads = op("reshape", [q], q.view(-1, h, t, dh), {"shape": [-1, h, t, dh]})
    moved = op("transpose", [heads], heads.transpose(1, 2), {"dim0": 1, "dim1": 2})
    ctx = op("contiguous", [moved], moved.contiguous())
    ctx = op("reshape", [ctx], ctx.view(-1, t, d), {"shape": [-1, t, d]})
    out = op("linear", [ctx, attn.out_proj.weight, attn.out_proj.bias], out)
    del q, heads, moved, ctx
    if need_weights:
        per_head = scores.view(-1, h, t, t)
        if average:
            per_head = op("reshape", [scores], per_head, {"shape": [-1, h, t, t]})
            summed = op("sum", [per_head], per_head.new_empty(per_head.shape[0], t, t),
                        {"dim": [1]})
            del scores, per_head
            op("div_", [summed], weights, {"scalar": float(h)})
            del summed
        else:
            op("reshape", [scores], weights, {"shape": [-1, h, t, t]})
            del scores, per_head
    del packed
    return out


def _ffn(op, layer, x):
    """linear2(act_(linear1(x))): the hidden activation freed once linear2 has returned."""
    hidden = op("linear", [x, layer.linear1.weight, layer.linear1.bias],
                x.new_empty(*x.shape[:2], layer.linear1.out_features))
    act = "gelu" if layer.activation_relu_or_gelu == 2 else "relu"
    hidden = op(act, [hidden], hidden, {"inplace": 1})
    y = op("linear", [hidden, layer.linear2.weight, layer.linear2.bias], torch.empty_like(x))
    del hidden
    return y


def _record_layer(tracer, layer, src, out):
    tracer._current = "_transformer_encoder_layer_fwd"
    op = _Ops(tracer)
    if layer.norm_first:
        normed = op.layer_norm(src, layer.norm1)
        x = _attention(op, layer.self_attn, normed, torch.empty_like(src))
        del normed
        x = op("add_", [x, src], x)
        normed = op.layer_norm(x, layer.norm2)
        y = _ffn(op, layer, normed)
        del normed
        op("add_", [y, x], out)
    else:
        x = _attention(op, layer.self_attn, src, torch.empty_like(src))
        x = op("add_", [x, src], x)
        x = op.layer_norm(x, layer.norm1)  # the attention's sum freed when it returns
        y = _ffn(op, layer, x)
        y = op("add_", [y, x], y)
        op("layer_norm", [y, layer.norm2.weight, layer.norm2.bias], out, {"normalized_ndim": 1})
        del y
    del x


@contextlib.contextmanager
def encoder_fast_path(tracer):
    """While recording on PyTorch 1.13, an nn.TransformerEncoderLayer or nn.MultiheadAttention
    that would take its fast path is recorded as the fast path's ops (the module docstring)."""
    functional = torch.nn.functional
    if hasattr(functional, "scaled_dot_product_attention"):  # 2.x: the Python path
        yield
        return
    layer_cls, mha_cls = torch.nn.TransformerEncoderLayer, torch.nn.MultiheadAttention
    layer_forward, mha_forward = layer_cls.forward, mha_cls.forward

    def run_unrecorded(original, record, *args):
        tracer.paused += 1
        try:  # the output's values (on the CPU) or its shape (on meta), unrecorded
            out = original(*args)
            record(out)
        finally:
            tracer.paused -= 1
        return out

    def layer(self, src, src_mask=None, src_key_padding_mask=None):
        args = (self, src, src_mask, src_key_padding_mask)
        if tracer.paused or not _fast_path_checks(*args):
            return layer_forward(*args)
        return run_unrecorded(layer_forward, lambda out: _record_layer(tracer, self, src, out), *args)

    def mha(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
            average_attn_weights=True):
        args = (self, query, key, value, key_padding_mask, need_weights, attn_mask,
                average_attn_weights)
        if tracer.paused or not _mha_fast_path_checks(self, query, key, value, key_padding_mask,
                                                      attn_mask):
            return mha_forward(*args)

        def record(out):
            tracer._current = "_native_multi_head_attention"
            _attention(_Ops(tracer), self, query, out[0], need_weights, average_attn_weights,
                       out[1])
        return run_unrecorded(mha_forward, record, *args)

    layer_cls.forward, mha_cls.forward = layer, mha
    try:
        yield
    finally:
        layer_cls.forward, mha_cls.forward = layer_forward, mha_forward
