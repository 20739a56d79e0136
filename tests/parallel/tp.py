"""Megatron-style tensor parallelism (and sequence parallelism), written here with plain
collectives as megatron/core/tensor_parallel/{layers,mappings}.py writes it (NVIDIA/Megatron-LM,
read at 000c4ac and 00caa53; the linear, the mappings and ColumnParallelLinear read again at
d98e8a64 with the vocabulary end, which is tp_vocab.py):

* `LinearWithGradAccumulationAndAsyncCommunication` (without gradient-accumulation fusion,
  which needs APEX's CUDA kernel): saves (input, weight), where input is the rank's SEQUENCE
  SHARD under sequence parallelism; forward all-gathers that shard into the persistent global
  "mpu" buffer, `matmul(total_input, weight.t())`, then `+ bias` (a second tensor); backward
  re-gathers the input into the same buffer, `grad_input = grad_output.matmul(weight)`, then
  all-reduces grad_input (column-parallel without SP: allreduce_dgrad) or reduce-scatters it
  into a new `sub_grad_input` [s/t, b, h] (SP), and `grad_weight = grad_output.t().matmul(
  total_input)` on 2-D views, `grad_bias = grad_output.sum(0)`.
* ColumnParallelLinear: weight [out/t, in], bias [out/t]. RowParallelLinear: weight [out, in/t],
  the linear without bias, then `_ReduceFromModelParallelRegion` (all-reduce in place, forward;
  identity backward) or `_ReduceScatterToSequenceParallelRegion` (SP: a new [s/t, b, h] output;
  backward all-gathers the gradient into a new [s, b, h] tensor), then `+ bias` (replicated).
* Under SP, `finalize_model_grads` all-reduces the gradients of the replicated parameters
  (LayerNorm, row-parallel bias: `sequence_parallel` attribute) as one flat copy
  (`_flatten_dense_tensors`), copied back: phase GRAD_SYNC here.

Layout [s, b, h] as Megatron's. With tp.size == 1 the same function is the plain model (the
memest model file). Models: an MLP block, an attention block, and the GPT ends in three forms
(tp_lm: lm, lm-tied, lm-rope). Not modelled: Megatron's local DotProductAttention takes its
scores' buffer from the same global "mpu" buffer (baddbmm, beta=0); here the scores are a plain
matmul.
"""
import functools
import operator

import torch
import torch.distributed as dist

import common
from common import ParamStore
from tp_vocab import VocabParallelCrossEntropy, vocab_parallel_embedding


class GlobalMemoryBuffer:
    """megatron/core/utils.py GlobalMemoryBuffer: one buffer per (name, dtype), replaced by a
    larger one when a request does not fit; requests are views of it."""

    def __init__(self):
        self.buffer = {}

    def get_tensor(self, shape, dtype, name):
        n = functools.reduce(operator.mul, shape, 1)
        if self.buffer.get((name, dtype)) is None or self.buffer[(name, dtype)].numel() < n:
            self.buffer[(name, dtype)] = torch.empty(n, dtype=dtype, requires_grad=False)
        return self.buffer[(name, dtype)][0:n].view(*shape)


class LinearTP(torch.autograd.Function):
    """LinearWithGradAccumulationAndAsyncCommunication (gradient_accumulation_fusion off)."""

    @staticmethod
    def forward(ctx, input, weight, bias, allreduce_dgrad, sequence_parallel, tp):
        ctx.save_for_backward(input, weight)
        ctx.use_bias = bias is not None
        ctx.allreduce_dgrad, ctx.sequence_parallel, ctx.tp = allreduce_dgrad, sequence_parallel, tp
        if sequence_parallel:
            dim = list(input.size())
            dim[0] *= tp.size
            total_input = tp.buffer.get_tensor(dim, input.dtype, "mpu")
            common.all_gather_into_tensor(total_input, input)
        else:
            total_input = input
        output = torch.matmul(total_input, weight.t())
        if bias is not None:
            output = output + bias
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        tp = ctx.tp
        if ctx.sequence_parallel:
            dim = list(input.size())
            dim[0] *= tp.size
            total_input = tp.buffer.get_tensor(dim, input.dtype, "mpu")
            common.all_gather_into_tensor(total_input, input)
        else:
            total_input = input
        grad_input = grad_output.matmul(weight)
        # prepare_input_tensors_for_wgrad_compute
        grad_output = grad_output.contiguous()
        if grad_output.dim() == 3:
            grad_output = grad_output.view(grad_output.shape[0] * grad_output.shape[1], grad_output.shape[2])
            total_input = total_input.view(total_input.shape[0] * total_input.shape[1], total_input.shape[2])
        if ctx.allreduce_dgrad:
            common.all_reduce(grad_input)
        if ctx.sequence_parallel:
            sub_grad_input = torch.empty(list(input.size()), dtype=input.dtype, requires_grad=False)
            common.reduce_scatter_tensor(sub_grad_input, grad_input)
        grad_weight = grad_output.t().matmul(total_input)
        grad_bias = grad_output.sum(dim=0) if ctx.use_bias else None
        if ctx.sequence_parallel:
            return sub_grad_input, grad_weight, grad_bias, None, None, None
        return grad_input, grad_weight, grad_bias, None, None, None


class ReduceFromTP(torch.autograd.Function):
    """_ReduceFromModelParallelRegion: all-reduce in place forward, identity backward."""

    @staticmethod
    def forward(ctx, input_):
        common.all_reduce(input_)
        return input_

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output


def gather_along_first_dim(t, tp):
    """mappings.py _gather_along_first_dim: a new [s, ...] tensor all-gathered from the ranks'
    [s/t, ...] shards."""
    dim = list(t.size())
    dim[0] *= tp.size
    output = torch.empty(dim, dtype=t.dtype)
    common.all_gather_into_tensor(output, t.contiguous())
    return output


class ReduceScatterToSP(torch.autograd.Function):
    """_ReduceScatterToSequenceParallelRegion: a new [s/t, ...] output forward; backward
    _gather_along_first_dim into a new [s, ...] tensor."""

    @staticmethod
    def forward(ctx, input_, tp):
        ctx.tp = tp
        dim = list(input_.size())
        dim[0] //= tp.size
        output = torch.empty(dim, dtype=input_.dtype)
        common.reduce_scatter_tensor(output, input_.contiguous())
        return output

    @staticmethod
    def backward(ctx, grad_output):
        return gather_along_first_dim(grad_output, ctx.tp), None


class ScatterToSP(torch.autograd.Function):
    """scatter_to_sequence_parallel_region (_split_along_first_dim: this rank's chunk, a view),
    then the clone of clone_scatter_output_in_embedding; backward gathers a new [s, ...]."""

    @staticmethod
    def forward(ctx, input_, tp):
        ctx.tp = tp
        n = input_.shape[0] // tp.size
        rank = dist.get_rank(common.GROUP)
        return input_[rank * n:(rank + 1) * n].contiguous().clone()

    @staticmethod
    def backward(ctx, grad_output):
        return gather_along_first_dim(grad_output, ctx.tp), None


class TP:
    """A tensor-parallel group of `size` ranks (1: the plain model), with or without sequence
    parallelism."""

    def __init__(self, size=1, sp=False):
        self.size, self.sp = size, sp
        self.buffer = GlobalMemoryBuffer()

    def column(self, r, x, w, b):
        if self.size == 1:
            return r.linear(x, w, b)
        if b is None:  # the head: no bias
            return r._op("megatron.column_parallel_linear", [x, w], {},
                         lambda x_, w_: LinearTP.apply(x_, w_, None, not self.sp, self.sp, self))
        return r._op("megatron.column_parallel_linear", [x, w, b], {},
                     lambda x_, w_, b_: LinearTP.apply(x_, w_, b_, not self.sp, self.sp, self))

    def row(self, r, x, w, b):
        if self.size == 1:
            return r.linear(x, w, b)
        y = r._op("megatron.row_parallel_linear", [x, w], {},
                  lambda x_, w_: LinearTP.apply(x_, w_, None, False, False, self))
        if self.sp:
            y = r._op("megatron.reduce_scatter_to_sequence_parallel_region", [y], {},
                      lambda t: ReduceScatterToSP.apply(t, self))
        else:
            y = r._op("megatron.reduce_from_tensor_model_parallel_region", [y], {}, ReduceFromTP.apply)
        return r.add(y, b)


# ------------------------------------------------------------------------------ models
def tp_mlp(r, b, tp, s=32, h=128, ffn=512):
    """x -> LayerNorm -> ColumnParallelLinear(h, ffn) -> GELU -> RowParallelLinear(ffn, h) -> + x;
    loss = mean. Under SP, x and everything outside the two linears is the rank's s/t rows."""
    t = tp.size
    x = r.input("x", [s // t if tp.sp else s, b, h], batch_dim=1)
    a = r.layer_norm(x, r.param("ln.w", [h], "ones"), r.param("ln.b", [h], "zeros"))
    u = r.gelu(tp.column(r, a, r.param("fc1.w", [ffn // t, h]), r.param("fc1.b", [ffn // t])))
    y = tp.row(r, u, r.param("fc2.w", [h, ffn // t]), r.param("fc2.b", [h]))
    return r.mean(r.add(x, y))


def tp_attention(r, b, tp, s=32, h=128, heads=8):
    """x -> LayerNorm -> ColumnParallelLinear(h, 3h) (q, k, v of heads/t heads) -> attention ->
    RowParallelLinear(h, h) -> + x; loss = mean."""
    t = tp.size
    np_, hn = heads // t, h // heads
    x = r.input("x", [s // t if tp.sp else s, b, h], batch_dim=1)
    a = r.layer_norm(x, r.param("ln.w", [h], "ones"), r.param("ln.b", [h], "zeros"))
    qkv = tp.column(r, a, r.param("qkv.w", [3 * h // t, h]), r.param("qkv.b", [3 * h // t]))
    q, k, v = r.split(r.view(qkv, [s, b, np_, 3 * hn]), 3, [hn, hn, hn])
    scores = r.div(r.matmul(r.permute(q, [1, 2, 0, 3]), r.permute(k, [1, 2, 3, 0])), hn ** 0.5)
    c = r.matmul(r.softmax(scores, -1), r.permute(v, [1, 2, 0, 3]))
    c = r.reshape(r.permute(c, [2, 0, 1, 3]), [s, b, np_ * hn])
    y = tp.row(r, c, r.param("proj.w", [h, h // t]), r.param("proj.b", [h]))
    return r.mean(r.add(x, y))


def tp_lm(r, b, tp, s=32, h=128, vocab=256, positions="arange", tied=False, labels_bs=False):
    """Megatron's GPT ends (models/common/embeddings/language_model_embedding.py, gpt_model.py,
    language_module.py at d98e8a64): ids [b, s] -> VocabParallelEmbedding -> + a learned
    position embedding -> transpose to [s, b, h] (contiguous) -> under SP the rank's shard,
    cloned (`clone_scatter_output_in_embedding`) -> block h.0: LayerNorm -> a column-parallel
    head (vocab/t rows, no bias, parallel_output) -> vocab-parallel cross entropy -> mean.
    hidden_dropout = 0 (the embedding's dropout is the identity). With t == 1 the plain model.

    positions: "arange" (model lm: one [s] arange broadcast over the batch), "input" (a [b, s]
    int64 input, as Megatron's data loader hands position_ids to GPTModel.forward) or None
    (position_embedding_type 'rope' or 'none': no table, and under SP the embedding itself
    reduce-scatters, `reduce_scatter_embeddings`). tied: the head's weight is the embedding's
    shard (share_embeddings_and_output_weights). labels_bs: labels [b, s] transposed to [s, b]
    and the loss back to [b, s], both made contiguous (compute_language_model_loss); without it
    the targets are given as [s, b]."""
    t = tp.size
    ids = r.input("ids", [b, s], "int64", high=vocab)
    pos = r.input("pos", [b, s], "int64", high=s) if positions == "input" else None
    wte = r.param("wte", [vocab // t, h])
    scatter = positions is None and tp.sp  # LanguageModelEmbedding.reduce_scatter_embeddings
    if t == 1:
        x = r.embedding(wte, ids)
    else:
        x = r._op("megatron.vocab_parallel_embedding", [ids, wte], {}, vocab_parallel_embedding)
        if not scatter:
            x = r._op("megatron.reduce_from_tensor_model_parallel_region", [x], {}, ReduceFromTP.apply)
    if positions is not None:
        x = r.add(x, r.embedding(r.param("wpe", [s, h]), pos if pos is not None else r.arange(s)))
    x = r.contiguous(r.transpose(x, 0, 1))
    if scatter:  # layers.py 367-380, then language_model_embedding.py 151-152
        x = r._op("megatron.reduce_scatter_to_sequence_parallel_region", [x], {},
                  lambda x_: ReduceScatterToSP.apply(x_, tp))
        x = r.clone(x)
    elif tp.sp:
        x = r._op("megatron.scatter_to_sequence_parallel_region", [x], {},
                  lambda x_: ScatterToSP.apply(x_, tp))
    with r.scope("h.0", block=True):
        a = r.layer_norm(x, r.param("ln.w", [h], "ones"), r.param("ln.b", [h], "zeros"))
    logits = tp.column(r, a, wte if tied else r.param("head.w", [vocab // t, h]), None)
    if not labels_bs:
        y = r.target("y", [s, b], high=vocab, batch_dim=1)
        if t == 1:
            return r.cross_entropy(r.view(logits, [s * b, vocab]), r.view(y, [s * b]))
        return r.mean(r._op("megatron.vocab_parallel_cross_entropy", [logits, y], {},
                            VocabParallelCrossEntropy.apply))
    y = r.contiguous(r.transpose(r.target("y", [b, s], high=vocab), 0, 1))  # language_module.py 172
    if t == 1:
        loss = r.view(r.cross_entropy(r.view(logits, [s * b, vocab]), r.view(y, [s * b]), "none"), [s, b])
    else:
        loss = r._op("megatron.vocab_parallel_cross_entropy", [logits, y], {},
                     VocabParallelCrossEntropy.apply)
    return r.mean(r.contiguous(r.transpose(loss, 0, 1)))  # language_module.py 205


MODELS = {"mlp": tp_mlp, "attention": tp_attention, "lm": tp_lm,
          "lm-tied": functools.partial(tp_lm, positions="input", tied=True, labels_bs=True),
          "lm-rope": functools.partial(tp_lm, positions=None, labels_bs=True)}
SP_REPLICATED = ("ln.w", "ln.b", "fc2.b", "proj.b")  # Megatron's `sequence_parallel` params


def grad_sync(store):
    """finalize_model_grads' _allreduce_layernorm_grads under SP: the replicated parameters'
    gradients flattened into one tensor, all-reduced, copied back."""
    params = [p for n, p in store.params.items() if n in SP_REPLICATED and p.grad is not None]
    grads = [p.grad.data for p in params]
    coalesced = torch._utils._flatten_dense_tensors(grads)
    common.all_reduce(coalesced)
    for buf, synced in zip(grads, torch._utils._unflatten_dense_tensors(coalesced, grads)):
        buf.copy_(synced)


def run(rank, world, p):
    tp = TP(world, p["sp"])
    batch = p["batch"]
    fn = functools.partial(MODELS[p["model"]], tp=tp)
    store = ParamStore(seed=0)
    plan = common.record(store, fn, batch)

    tp.buffer = GlobalMemoryBuffer()
    saved = common.saved_by_forward(store, plan, fn, batch)

    tp.buffer = GlobalMemoryBuffer()  # Megatron's: made at the first forward that asks
    buffers = {}

    def teardown():
        buffers.update({f"{k[0]}": v.numel() * v.element_size() for k, v in tp.buffer.buffer.items()})
        tp.buffer = None
    results, explained = common.measure_steps(
        store, plan, fn, batch, p["optimizer"], sync=(lambda: grad_sync(store)) if tp.sp else None,
        teardown=teardown)
    dist.barrier(group=common.GROUP)
    return {"saved_for_backward": saved, "steps": results, "global_buffers": buffers, **explained}
