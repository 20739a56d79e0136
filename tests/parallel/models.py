"""The models of the parallel truth, in the conformance recorder's vocabulary
(tests/conformance/recorder.py): each is `fn(r, batch)`, recorded once into memest's model file
(the whole, unsharded model, as a user hands it to memest) and run per rank.

mlp           4 Linear layers (256-512-512-256-16), ReLU, cross entropy: 2,118,720 B of float32
              parameters, the largest a 1 MiB weight; DDP and ZeroRedundancyOptimizer cases.
gpt           token and position embeddings, L pre-LayerNorm transformer blocks (attention
              without mask or dropout, GELU MLP of 4d), a final LayerNorm, an untied head and
              cross entropy; `gpt_stage` is the part of it one pipeline stage runs.
"""
import math


def mlp(r, b, dims=(256, 512, 512, 256, 16)):
    h = r.input("x", [b, dims[0]])
    for i in range(len(dims) - 1):
        with r.scope(f"fc{i}"):
            h = r.linear(h, r.param(f"fc{i}.w", [dims[i + 1], dims[i]]), r.param(f"fc{i}.b", [dims[i + 1]]))
            if i < len(dims) - 2:
                h = r.relu(h)
    return r.cross_entropy(h, r.target("y", [b], high=dims[-1]))


def block(r, x, i, b, t, d, heads):
    """One pre-LayerNorm transformer block on [b, t, d]."""
    hd = d // heads
    pre = f"h.{i}"
    with r.scope(pre, block=True):
        a = r.layer_norm(x, r.param(f"{pre}.ln1.w", [d], "ones"), r.param(f"{pre}.ln1.b", [d], "zeros"))
        qkv = r.linear(a, r.param(f"{pre}.attn.w", [3 * d, d]), r.param(f"{pre}.attn.b", [3 * d]))
        q, k, v = r.split(qkv, 2, [d, d, d])
        q = r.transpose(r.view(q, [b, t, heads, hd]), 1, 2)
        k = r.transpose(r.view(k, [b, t, heads, hd]), 1, 2)
        v = r.transpose(r.view(v, [b, t, heads, hd]), 1, 2)
        s = r.div(r.matmul(q, r.transpose(k, -2, -1)), math.sqrt(hd))
        y = r.matmul(r.softmax(s, -1), v)
        y = r.reshape(r.transpose(y, 1, 2), [b, t, d])
        y = r.linear(y, r.param(f"{pre}.proj.w", [d, d]), r.param(f"{pre}.proj.b", [d]))
        x = r.add(x, y)
        m = r.layer_norm(x, r.param(f"{pre}.ln2.w", [d], "ones"), r.param(f"{pre}.ln2.b", [d], "zeros"))
        m = r.gelu(r.linear(m, r.param(f"{pre}.fc.w", [4 * d, d]), r.param(f"{pre}.fc.b", [4 * d])))
        m = r.linear(m, r.param(f"{pre}.mproj.w", [d, 4 * d]), r.param(f"{pre}.mproj.b", [d]))
        return r.add(x, m)


def gpt_stage(r, b, lo, hi, first, last, vocab, t, d, heads):
    """Blocks lo..hi-1; the first stage embeds the tokens, the others take the previous stage's
    activation as input `h_in` ([b, t, d]); the last adds the final LayerNorm, the head and the
    loss, the others return their last block's output."""
    if first:
        idx = r.input("idx", [b, t], "int64", high=vocab)
        x = r.add(r.embedding(r.param("wte", [vocab, d]), idx),
                  r.embedding(r.param("wpe", [t, d]), r.arange(t)))
    else:
        x = r.input("h_in", [b, t, d])
    for i in range(lo, hi):
        x = block(r, x, i, b, t, d, heads)
    if not last:
        return x
    x = r.layer_norm(x, r.param("lnf.w", [d], "ones"), r.param("lnf.b", [d], "zeros"))
    logits = r.linear(x, r.param("head.w", [vocab, d]))
    return r.cross_entropy(r.view(logits, [b * t, vocab]), r.target("y", [b * t], high=vocab))


def gpt(r, b, layers=2, vocab=256, t=16, d=128, heads=4):
    return gpt_stage(r, b, 0, layers, True, True, vocab, t, d, heads)
