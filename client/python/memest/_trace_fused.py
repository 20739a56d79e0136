"""Calls PyTorch runs as one fused kernel on CUDA, recorded as one memest op.

While recording, `sdpa_as_one_op` records F.scaled_dot_product_attention (PyTorch 2.x;
nn.MultiheadAttention calls it too) as one op instead of the math decomposition the meta device
runs, and `recurrent_as_one_op` records nn.LSTM / nn.GRU as one lstm / gru op
(engine/passes/rnn_expand.h says what it reads): nn.LSTM.forward calls torch._VF.lstm(input, hx,
flat_weights, bias, num_layers, dropout, training, bidirectional, batch_first) (nn.GRU:
torch._VF.gru). The call runs unrecorded (on CUDA PyTorch runs it as one cuDNN kernel, which the
meta device and the CPU would show as dozens of aten ops per step), and is recorded as one op.
A state that no op of the graph made (the zeros nn.LSTM makes when given none) is left out: the
engine's op makes it itself. PackedSequence inputs are refused.
"""
import contextlib

import torch


@contextlib.contextmanager
def sdpa_as_one_op(tracer):
    """While recording, F.scaled_dot_product_attention (PyTorch 2.x; nn.MultiheadAttention calls
    it too) is recorded as one op instead of the math decomposition the meta device runs."""
    functional = torch.nn.functional
    original = getattr(functional, "scaled_dot_product_attention", None)
    if original is None:  # PyTorch 1.13
        yield
        return

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *args, **kwargs):
        tracer.paused += 1
        try:
            out = original(query, key, value, attn_mask, dropout_p, is_causal, *args, **kwargs)
        finally:
            tracer.paused -= 1
        if kwargs.get("enable_gqa"):
            tracer._current = "scaled_dot_product_attention"
            tracer.unsupported("scaled_dot_product_attention with enable_gqa")
        tracer.record_sdpa(query, key, value, attn_mask, dropout_p, is_causal, out)
        return out

    functional.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = original


@contextlib.contextmanager
def one_hot_as_one_op(tracer):
    """While recording, F.one_hot is recorded as one one_hot op: a composite of zeros and
    scatter_, and on the CPU of the ids' min() and max() checks first (.item(), which the graph
    has no op for), which the engine's one_hot rule accounts for by runtime."""
    functional = torch.nn.functional
    original = functional.one_hot

    def one_hot(tensor, num_classes=-1):
        tracer.paused += 1
        try:
            out = original(tensor, num_classes)
        finally:
            tracer.paused -= 1
        tracer._current = "one_hot"
        tracer.life.watch(tensor)
        tracer.life.watch(out)
        tracer.emit("one_hot", [tensor], [out], {"num_classes": int(out.shape[-1])})
        return out

    functional.one_hot = one_hot
    try:
        yield
    finally:
        functional.one_hot = original


def _is_tensor_list(v):
    return isinstance(v, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in v)


@contextlib.contextmanager
def recurrent_as_one_op(tracer):
    vf = torch._VF
    originals = {}
    for kind in ("lstm", "gru"):
        originals[kind] = getattr(vf, kind)

    def wrap(kind):
        original = originals[kind]

        def call(*args, **kwargs):
            tracer.paused += 1
            try:
                out = original(*args, **kwargs)
            finally:
                tracer.paused -= 1
            if tracer.paused:  # inside another fused op: that op is what is recorded
                return out
            tracer._current = f"torch._VF.{kind}"
            if kwargs or len(args) != 9 or not isinstance(args[0], torch.Tensor):
                tracer.unsupported("a packed sequence, or an unexpected signature")
            x, hx, weights, bias, layers, dropout, training, bidirectional, batch_first = args
            if x.dim() != 3:
                tracer.unsupported("an unbatched input")
            if not _is_tensor_list(weights) or len(weights) != layers * (2 if bidirectional else 1) * (4 if bias else 2):
                tracer.unsupported("projections (proj_size) or an unexpected weight list")
            states = list(hx) if isinstance(hx, (list, tuple)) else [hx]
            given = [s for s in states if isinstance(s, torch.Tensor) and tracer._is_graph(s)]
            if given and len(given) != len(states):
                tracer.unsupported("an initial state only partly made by the graph")
            attrs = {}
            if layers != 1:
                attrs["num_layers"] = int(layers)
            if bidirectional:
                attrs["bidirectional"] = 1
            if batch_first:
                attrs["batch_first"] = 1
            if not bias:
                attrs["bias"] = 0
            if dropout and training and layers > 1:
                attrs["dropout"] = float(dropout)
            outs = list(out) if isinstance(out, (list, tuple)) else [out]
            for t in [x] + list(weights) + states + outs:
                tracer.life.watch(t)
            tracer.emit(kind, [x] + list(weights) + given, outs, attrs)
            return out
        return call

    for kind in originals:
        setattr(vf, kind, wrap(kind))
    try:
        yield
    finally:
        for kind, fn in originals.items():
            # torch._VF resolves names through __getattr__: deleting the instance attribute
            # restores the original lookup.
            try:
                delattr(vf, kind)
            except AttributeError:
                setattr(vf, kind, fn)
