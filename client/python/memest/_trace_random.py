"""Random-noise patterns the tracer records as one memest op (see tracer.py, _Tracer.record).

torchvision.ops.stochastic_depth (ConvNeXt, EfficientNet, Swin, MaxViT blocks) runs, in
training with 0 < p:

    noise = torch.empty([N, 1, ...] for mode "row", [1, ...] for "batch")   # a factory: static
    noise.bernoulli_(1 - p)
    noise.div_(1 - p)                    # left out when p == 1
    out = input * noise

`stochastic_depth(tracer, key, args, kwargs, out)` follows the noise from its bernoulli_ to the
mul and records memest's stochastic_depth(input; p, mode) there; it returns True for the aten
calls it took. A noise that something else reads stays a constant of the graph.
"""
import torch

_STATE = "_sd_noise"  # tracer attribute: id(noise) -> {"keep": float, "scaled": bool}


def _noise(tracer):
    st = getattr(tracer, _STATE, None)
    if st is None:
        st = {}
        setattr(tracer, _STATE, st)
    return st


def _mode(x, noise):
    """"row" or "batch" for a noise of stochastic depth's shape for input x, else None."""
    if noise.dim() != x.dim() or x.dim() == 0:
        return None
    if any(d != 1 for d in noise.shape[1:]):
        return None
    if noise.shape[0] == x.shape[0]:
        return "row"
    return "batch" if noise.shape[0] == 1 else None


def forget(tracer, oid):
    """The tensor with id `oid` died (its id may be reused)."""
    _noise(tracer).pop(oid, None)


def stochastic_depth(tracer, key, args, kwargs, out):
    noises = _noise(tracer)
    if key == "bernoulli_.float" and isinstance(args[0], torch.Tensor):
        n = args[0]
        if id(n) in tracer.statics.made and not tracer._is_graph(n):
            keep = args[1] if len(args) > 1 else kwargs.get("p", 0.5)  # 0.5: the default, left out
            noises[id(n)] = {"keep": float(keep), "scaled": False}
            tracer.life.watch(n)
            return True
        return False
    if key in ("div_.Scalar", "div_.Tensor") and id(args[0]) in noises:
        st = noises[id(args[0])]
        scale = tracer.scalar_of(args[1])  # Python's noise.div_(s) wraps s in a 0-dim tensor
        if scale is None or abs(scale - st["keep"]) > 1e-12 or st["scaled"]:
            tracer.unsupported("a stochastic-depth-like noise with an unexpected scale")
        st["scaled"] = True
        return True
    if key == "mul.Tensor" and len(args) == 2:
        a, b = args
        for x, n in ((a, b), (b, a)):
            st = noises.get(id(n)) if isinstance(n, torch.Tensor) else None
            if st is None or not isinstance(x, torch.Tensor) or not tracer._is_graph(x):
                continue
            mode = _mode(x, n)
            if mode is None or not (st["scaled"] or st["keep"] == 0.0):
                tracer.unsupported("a bernoulli noise of shape %s on an input of shape %s"
                                   % (list(n.shape), list(x.shape)))
            tracer.emit("stochastic_depth", [x], [out], {"p": 1.0 - st["keep"], "mode": mode})
            return True
    return False
