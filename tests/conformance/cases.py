"""The conformance cases. Each is `forward(r, batch)`, written once (recorder.py), returning the
loss (training) or the model's output (inference), and run under one or more configurations.

Keep every case small: it runs in well under a second.
Not covered yet: SDPA (absent from PyTorch 1.13: the CUDA kernels' rules are read from their
source, and the CPU flash path a PyTorch 2.x trace records was checked on 2.15, outside this
suite); autocast (fp32 only here); non-reentrant checkpoint.
"""
import dataclasses
import importlib.util
import math

from measure import Config

SGD = Config()


@dataclasses.dataclass
class Case:
    group: str
    name: str
    fn: object
    batch: int
    configs: list
    note: str = ""
    # Why memest.trace cannot express the case (run.py --via-tracer skips it); "" when it can.
    tracer: str = ""

    def variants(self):
        """(case id, config) pairs."""
        if len(self.configs) == 1:
            return [(f"{self.group}/{self.name}", self.configs[0])]
        return [(f"{self.group}/{self.name}[{c.label()}]", c) for c in self.configs]


CASES = []


def case(group, name, batch=4, configs=None, note="", tracer=""):
    def deco(fn):
        CASES.append(Case(group, name, fn, batch, list(configs or [SGD]), note, tracer))
        return fn
    return deco


def lift(r, x, name="lift"):
    """x + b (b a parameter): a non-leaf that requires grad, so the op under test gets a
    gradient to pass back. add saves nothing."""
    return r.add(x, r.param(f"{name}.b", [x.shape[-1]]))


def loss_of(r, y):
    """The loss of a single-op case: mean(y). Its gradient is dense (expand, then div), as a
    real loss's is; sum(y) would hand back a stride-0 expanded gradient, which some kernels
    copy inside themselves (the `expanded_grad` cases cover that)."""
    return r.mean(y)


def op_case(name, shape, body, batch=4, **kw):
    """A single op on a lifted input, then the loss = mean of its output."""
    def fn(r, b):
        x = lift(r, r.input("x", [b] + list(shape)))
        y = body(r, x)
        return loss_of(r, y)
    case("ops", name, batch=batch, **kw)(fn)


# ------------------------------------------------------------------------------ linear algebra
@case("ops", "linear_2d")
def _(r, b):
    x = r.input("x", [b * 8, 16])
    return loss_of(r, r.linear(x, r.param("w", [12, 16]), r.param("bias", [12])))


@case("ops", "linear_3d_nobias")
def _(r, b):
    x = lift(r, r.input("x", [b, 8, 16]))
    return loss_of(r, r.linear(x, r.param("w", [12, 16])))


@case("ops", "linear_3d_bias_x_no_grad")
def _(r, b):
    x = r.input("x", [b, 8, 16])
    return loss_of(r, r.linear(x, r.param("w", [12, 16]), r.param("bias", [12])))


@case("ops", "linear_3d_transposed_bias", configs=[SGD, Config(mode="inference")])
def _(r, b):
    # A batch-first RNN's output into its head (a [T, B, H] tensor transposed to [B, T, H]): a
    # non-contiguous 3-D input, which at::linear runs as matmul (folded into a contiguous copy)
    # and output.add_(bias) in place.
    x = lift(r, r.input("x", [8, b, 16], batch_dim=1))
    return loss_of(r, r.linear(r.transpose(x, 0, 1), r.param("w", [12, 16]), r.param("bias", [12])))


@case("ops", "matmul_2d")
def _(r, b):
    a = lift(r, r.input("a", [b * 4, 16]))
    return loss_of(r, r.matmul(a, r.param("w", [16, 12])))


@case("ops", "matmul_3d")
def _(r, b):
    a = lift(r, r.input("a", [b, 8, 16]), "la")
    c = lift(r, r.input("c", [b, 16, 12]), "lc")
    return loss_of(r, r.matmul(a, c))


@case("ops", "matmul_3d_2d")
def _(r, b):
    a = lift(r, r.input("a", [b, 8, 16]))
    return loss_of(r, r.matmul(a, r.param("w", [16, 12])))


@case("ops", "matmul_4d_permuted")
def _(r, b):
    # q @ k^T with k transposed (a permuted operand), as attention does.
    q = lift(r, r.input("q", [b, 2, 8, 16]), "lq")
    k = lift(r, r.input("k", [b, 2, 8, 16]), "lk")
    return loss_of(r, r.matmul(q, r.transpose(k, -2, -1)))


@case("ops", "bmm")
def _(r, b):
    a = lift(r, r.input("a", [b, 8, 16]), "la")
    c = lift(r, r.input("c", [b, 16, 12]), "lc")
    return loss_of(r, r.bmm(a, c))


@case("ops", "baddbmm_mask")
def _(r, b):
    # nn.MultiheadAttention's scores with an attn_mask in 1.13: baddbmm(mask[1, L, S], q, k^T).
    q = lift(r, r.input("q", [b * 2, 8, 16]), "lq")
    k = lift(r, r.input("k", [b * 2, 8, 16]), "lk")
    mask = r.input("mask", [1, 8, 8], batch_dim=-1)
    return loss_of(r, r.baddbmm(mask, q, r.transpose(k, -2, -1)))


@case("ops", "baddbmm_beta_alpha")
def _(r, b):
    q = lift(r, r.input("q", [b * 2, 8, 16]), "lq")
    k = lift(r, r.input("k", [b * 2, 16, 8]), "lk")
    bias = r.add(r.input("bias", [1, 8, 8], batch_dim=-1), r.param("bias.b", [8]))
    return loss_of(r, r.baddbmm(bias, q, k, beta=0.5, alpha=0.25))


@case("ops", "addmm")
def _(r, b):
    a = lift(r, r.input("a", [b * 4, 16]))
    return loss_of(r, r.addmm(r.param("bias", [12]), a, r.param("w", [16, 12])))


@case("ops", "einsum_bhqd_bhkd")
def _(r, b):
    q = lift(r, r.input("q", [b, 2, 8, 16]), "lq")
    k = lift(r, r.input("k", [b, 2, 8, 16]), "lk")
    return loss_of(r, r.einsum("bhqd,bhkd->bhqk", q, k))


# ------------------------------------------------------------------------------ conv, pooling
@case("ops", "conv1d")
def _(r, b):
    x = r.input("x", [b, 4, 32])
    return loss_of(r, r.conv1d(x, r.param("w", [8, 4, 3]), r.param("bias", [8]), padding=1))


@case("ops", "conv2d")
def _(r, b):
    x = r.input("x", [b, 3, 16, 16])
    return loss_of(r, r.conv2d(x, r.param("w", [8, 3, 3, 3]), r.param("bias", [8]), stride=1, padding=1))


@case("ops", "conv2d_stride2_lifted")
def _(r, b):
    x = lift(r, r.input("x", [b, 4, 16, 16]))
    return loss_of(r, r.conv2d(x, r.param("w", [8, 4, 3, 3]), None, stride=2, padding=1))


# The output's gradient arrives transposed (flatten(2).transpose(1, 2)'s backward): every
# convolution backward kernel makes grad_output contiguous first, a copy the size of the output.
@case("ops", "conv2d_transposed_grad")
def _(r, b):
    x = r.input("x", [b, 3, 16, 16])
    y = r.conv2d(x, r.param("w", [32, 3, 4, 4]), r.param("bias", [32]), stride=4)
    return loss_of(r, r.exp(r.transpose(r.flatten(y, 2), 1, 2)))


# DeepLabV3's ASPP: a 3x3 kernel dilated by 6 on a 4x4 map, padded to keep the size. oneDNN's
# direct kernels refuse it (the padding is wider than one register block of output columns;
# the dilated kernel is taller than the input), so gemm runs all three passes: forward with an
# im2col buffer blocked to the L2 cache (256 of the 512 channels), backward weights with its
# weight-reduction buffer, four times the weight.
@case("ops", "conv2d_dilated_aspp", batch=2)
def _(r, b):
    x = lift(r, r.input("x", [b, 512, 4, 4]))
    return loss_of(r, r.conv2d(x, r.param("w", [16, 512, 3, 3]), None, padding=6, dilation=6))


# MobileNetV3's and EfficientNet's 5x5 depthwise kernels: oneDNN's depthwise backward-weights
# kernel takes kernels up to 3 wide only; gemm computes the weights' gradient.
@case("ops", "conv2d_depthwise_5x5")
def _(r, b):
    x = lift(r, r.input("x", [b, 32, 8, 8]))
    return loss_of(r, r.conv2d(x, r.param("w", [32, 1, 5, 5]), None, padding=2, groups=32))


# DeepLabV3-MobileNetV3's dilated last stage: a 5x5 depthwise kernel dilated by 2 on a 4x4 map.
# The depthwise backward-data kernel takes no dilation: gemm, for both backward passes.
@case("ops", "conv2d_depthwise_dilated")
def _(r, b):
    x = lift(r, r.input("x", [b, 48, 4, 4]))
    return loss_of(r, r.conv2d(x, r.param("w", [48, 1, 5, 5]), None, padding=4, dilation=2, groups=48))


# ViT-B/16's and B/32's patch embedding: a kernel wider than 14 (stride = kernel). oneDNN's
# AVX-512 and AVX2 backward-weights kernels refuse it: gemm, whose weight-reduction buffer is
# four times the weight.
@case("ops", "conv2d_patch16")
def _(r, b):
    x = r.input("x", [b, 3, 32, 32])
    return loss_of(r, r.conv2d(x, r.param("w", [64, 3, 16, 16]), r.param("bias", [64]), stride=16))


# ConvNeXt's convolutions take a channels-last input (LayerNorm2d permutes, normalises and
# permutes back): the output and both gradients are channels-last, the weight is copied to
# channels-last around the kernel (forward and backward) unless it is already (depthwise), and
# AccumulateGrad copies the channels-last weight gradient into the weight's layout. oneDNN runs
# nhwc kernels: brdgmm / brgconv forward, and a depthwise 7x7 weight gradient in 16 x 16
# blocks per group (256 times the weight).
@case("ops", "conv2d_channels_last_depthwise")
def _(r, b):
    x = r.permute(lift(r, r.input("x", [b, 8, 8, 32])), [0, 3, 1, 2])
    return loss_of(r, r.conv2d(x, r.param("w", [32, 1, 7, 7]), r.param("bias", [32]), padding=3, groups=32))


@case("ops", "conv2d_channels_last_downsample")
def _(r, b):
    x = r.permute(lift(r, r.input("x", [b, 4, 4, 32])), [0, 3, 1, 2])
    return loss_of(r, r.conv2d(x, r.param("w", [64, 32, 2, 2]), r.param("bias", [64]), stride=2))


@case("ops", "conv_transpose2d")
def _(r, b):
    x = lift(r, r.input("x", [b, 8, 8, 8]))
    return loss_of(r, r.conv_transpose2d(x, r.param("w", [8, 4, 2, 2]), r.param("bias", [4]), stride=2))


@case("ops", "conv_transpose2d_transposed_grad")
def _(r, b):
    x = r.input("x", [b, 8, 8, 8])
    y = r.conv_transpose2d(x, r.param("w", [8, 4, 2, 2]), None, stride=2)
    return loss_of(r, r.exp(r.transpose(r.flatten(y, 2), 1, 2)))


@case("ops", "conv_transpose2d_k3_output_padding")
def _(r, b):
    x = lift(r, r.input("x", [b, 8, 8, 8]))
    return loss_of(r, r.conv_transpose2d(x, r.param("w", [8, 4, 3, 3]), r.param("bias", [4]), stride=2,
                                         padding=1, output_padding=1))


@case("ops", "conv_transpose2d_groups_dilation")
def _(r, b):
    x = lift(r, r.input("x", [b, 8, 6, 6]))
    return loss_of(r, r.conv_transpose2d(x, r.param("w", [8, 3, 3, 3]), None, stride=2, padding=1,
                                         output_padding=1, dilation=2, groups=2))


@case("ops", "conv_transpose2d_x_no_grad")
def _(r, b):
    x = r.input("x", [b, 8, 8, 8])
    return loss_of(r, r.conv_transpose2d(x, r.param("w", [8, 4, 4, 4]), r.param("bias", [4]), stride=2, padding=1))


@case("ops", "conv_transpose1d")
def _(r, b):
    x = lift(r, r.input("x", [b, 8, 16]))
    return loss_of(r, r.conv_transpose1d(x, r.param("w", [8, 4, 4]), r.param("bias", [4]), stride=2, padding=1))


op_case("upsample_nearest_x2", [4, 8, 8], lambda r, x: r.upsample(x, "nearest", scale_factor=2))
op_case("upsample_nearest_size", [4, 8, 8], lambda r, x: r.upsample(x, "nearest", size=(5, 7)))
op_case("upsample_bilinear_x2", [4, 8, 8], lambda r, x: r.upsample(x, "bilinear", scale_factor=2))
op_case("upsample_bilinear_align_corners", [4, 8, 8],
        lambda r, x: r.upsample(x, "bilinear", scale_factor=2, align_corners=True))
op_case("max_pool2d", [4, 16, 16], lambda r, x: r.max_pool2d(x, 2))
op_case("max_pool2d_ceil_mode", [4, 15, 15], lambda r, x: r.max_pool2d(x, 3, stride=2, ceil_mode=True))
op_case("avg_pool2d", [4, 16, 16], lambda r, x: r.avg_pool2d(x, 2))
op_case("avg_pool2d_ceil_mode", [4, 15, 15], lambda r, x: r.avg_pool2d(x, 2, ceil_mode=True))
op_case("adaptive_avg_pool2d_3x3", [4, 12, 12], lambda r, x: r.adaptive_avg_pool2d(x, [3, 3]))
op_case("adaptive_avg_pool2d_1x1", [4, 12, 12], lambda r, x: r.adaptive_avg_pool2d(x, [1, 1]))


# ------------------------------------------------------------------------------ norms
# ConvNeXt's LayerNorm2d on a row-major input: layer_norm over a permuted (non-contiguous)
# view copies it contiguous first (forward), and its backward copies both the permuted
# incoming gradient and the saved input contiguous.
@case("ops", "layer_norm_permuted_input")
def _(r, b):
    x = lift(r, r.input("x", [b, 16, 8, 8]))
    y = r.layer_norm(r.permute(x, [0, 2, 3, 1]), r.param("w", [16]), r.param("bias", [16]))
    return loss_of(r, r.permute(y, [0, 3, 1, 2]))


@case("ops", "layer_norm")
def _(r, b):
    x = lift(r, r.input("x", [b, 8, 16]))
    return loss_of(r, r.layer_norm(x, r.param("ln.w", [16], "ones"), r.param("ln.b", [16], "zeros")))


@case("ops", "layer_norm_x_no_grad")
def _(r, b):
    x = r.input("x", [b, 8, 16])
    return loss_of(r, r.layer_norm(x, r.param("ln.w", [16], "ones"), r.param("ln.b", [16], "zeros")))


@case("ops", "batch_norm")
def _(r, b):
    x = lift(r, r.input("x", [b, 4, 8, 8]))
    y = r.batch_norm(x, r.param("bn.w", [4], "ones"), r.param("bn.b", [4], "zeros"),
                     r.buffer("bn.rm", [4]), r.buffer("bn.rv", [4], init="ones"))
    return loss_of(r, y)


@case("ops", "group_norm")
def _(r, b):
    x = lift(r, r.input("x", [b, 8, 4, 4]))
    return loss_of(r, r.group_norm(x, 2, r.param("gn.w", [8], "ones"), r.param("gn.b", [8], "zeros")))


@case("ops", "rms_norm_op")
def _(r, b):
    x = lift(r, r.input("x", [b, 8, 16]))
    return loss_of(r, r.rms_norm(x, r.param("rms.w", [16], "ones")))


@case("ops", "rms_norm_written_out")
def _(r, b):
    x = lift(r, r.input("x", [b, 8, 16]))
    ms = r.mean(r.pow(x, 2.0), dim=[-1], keepdim=True)
    h = r.mul(x, r.rsqrt(r.add(ms, 1e-6)))
    return loss_of(r, r.mul(h, r.param("rms.w", [16], "ones")))


# ------------------------------------------------------------------------------ pointwise
SHAPE = [8, 16]
op_case("relu", SHAPE, lambda r, x: r.relu(x))
op_case("relu_inplace", SHAPE, lambda r, x: r.relu(x, inplace=True))
op_case("gelu", SHAPE, lambda r, x: r.gelu(x))
op_case("gelu_tanh", SHAPE, lambda r, x: r.gelu(x, "tanh"))
op_case("silu", SHAPE, lambda r, x: r.silu(x))
op_case("silu_inplace", SHAPE, lambda r, x: r.silu(x, inplace=True))
op_case("hardtanh", SHAPE, lambda r, x: r.hardtanh(x))
op_case("relu6_inplace", SHAPE, lambda r, x: r.hardtanh(x, 0.0, 6.0, inplace=True))
op_case("hardswish", SHAPE, lambda r, x: r.hardswish(x))
op_case("hardswish_inplace", SHAPE, lambda r, x: r.hardswish(x, inplace=True))
op_case("hardsigmoid", SHAPE, lambda r, x: r.hardsigmoid(x))
op_case("hardsigmoid_inplace", SHAPE, lambda r, x: r.hardsigmoid(x, inplace=True))
op_case("sigmoid", SHAPE, lambda r, x: r.sigmoid(x))
op_case("sigmoid_inplace", SHAPE, lambda r, x: r.sigmoid(x, inplace=True))
op_case("tanh", SHAPE, lambda r, x: r.tanh(x))
op_case("tanh_inplace", SHAPE, lambda r, x: r.tanh(x, inplace=True))
op_case("exp", SHAPE, lambda r, x: r.exp(x))
op_case("rsqrt", SHAPE, lambda r, x: r.rsqrt(r.exp(x)))
op_case("sqrt", SHAPE, lambda r, x: r.sqrt(r.exp(x)))
op_case("neg", SHAPE, lambda r, x: r.neg(x))
op_case("log1p", SHAPE, lambda r, x: r.log1p(r.exp(x)))
op_case("pow2", SHAPE, lambda r, x: r.pow(x, 2.0))
op_case("softmax", SHAPE, lambda r, x: r.softmax(x, -1))
op_case("log_softmax", SHAPE, lambda r, x: r.log_softmax(x, -1))
op_case("dropout", SHAPE, lambda r, x: r.dropout(x, 0.1))
op_case("dropout_inplace", SHAPE, lambda r, x: r.dropout(x, 0.2, inplace=True))
op_case("stochastic_depth_row", [4, 6, 6], lambda r, x: r.stochastic_depth(x, 0.25))
op_case("stochastic_depth_batch", [4, 6, 6], lambda r, x: r.stochastic_depth(x, 0.25, "batch"))
op_case("add_tensor", SHAPE, lambda r, x: r.add(x, r.exp(x)))
op_case("sub_tensor", SHAPE, lambda r, x: r.sub(x, r.exp(x)))
op_case("mul_tensor", SHAPE, lambda r, x: r.mul(x, r.exp(x)))
op_case("div_tensor", SHAPE, lambda r, x: r.div(x, r.exp(x)))
op_case("add_scalar", SHAPE, lambda r, x: r.add(x, 2.0))
op_case("mul_scalar", SHAPE, lambda r, x: r.mul(x, 2.0))
op_case("div_scalar", SHAPE, lambda r, x: r.div(x, 2.0))
op_case("mul_broadcast_param", SHAPE, lambda r, x: r.mul(x, r.param("s", [16])))
op_case("add_broadcast_param", SHAPE, lambda r, x: r.add(x, r.param("s", [8, 1])))
op_case("div_broadcast_param", SHAPE, lambda r, x: r.div(x, r.param("s", [16], "ones")))
op_case("add_inplace", SHAPE, lambda r, x: r.add_(r.neg(x), x))
op_case("mul_inplace", SHAPE, lambda r, x: r.mul_(r.neg(x), x))


@case("ops", "mul_input_not_grad")
def _(r, b):
    # mul where one operand does not require grad: only that operand is saved.
    x = lift(r, r.input("x", [b, 8, 16]))
    m = r.input("m", [b, 8, 16])
    return loss_of(r, r.mul(x, m))


@case("ops", "masked_fill")
def _(r, b):
    x = lift(r, r.input("x", [b, 8, 16]))
    return loss_of(r, r.masked_fill(x, r.input("mask", [b, 8, 16], "bool"), -1e4))


@case("ops", "where")
def _(r, b):
    x = lift(r, r.input("x", [b, 8, 16]))
    return loss_of(r, r.where(r.input("cond", [b, 8, 16], "bool"), x, r.exp(x)))


@case("ops", "compare_masks")
def _(r, b):
    # Comparisons make bool masks that masked_fill and where keep: HF's `mask == 0` of an int
    # attention mask, and each comparison of activations, of a tensor and of a number.
    x = lift(r, r.input("x", [b, 8, 16]))
    am = r.input("am", [b, 1, 16], "int64", high=2)
    y = r.masked_fill(x, r.compare("eq", am, 0), -1e4)
    e = r.exp(y)
    y = r.masked_fill(y, r.compare("ne", y, e), 0.5)
    y = r.masked_fill(y, r.compare("lt", y, e), 0.25)
    y = r.masked_fill(y, r.compare("le", y, 0.1), 0.0)
    y = r.masked_fill(y, r.compare("ge", y, 2.0), 2.0)
    return loss_of(r, r.where(r.compare("gt", y, 0.0), y, e))


@case("ops", "all_any_checks", configs=[SGD, Config(mode="inference")])
def _(r, b):
    # The checks Hugging Face's mask code branches on (transformers 5's
    # find_packed_sequence_indices: `(mask[:, -1] == 0).all()`), over ints, bools and floats; on
    # the CPU a non-bool input is cast to bool first. A reduction over a dim feeds where.
    x = lift(r, r.input("x", [b, 8, 16]))
    ids = r.input("ids", [b, 16], "int64", high=4)
    r.all(r.compare("eq", ids, 0))
    r.any(ids)
    r.all(x)
    keep = r.any(r.compare("gt", x, 0.0), dim=2, keepdim=True)
    return loss_of(r, r.where(keep, x, r.exp(x)))


@case("ops", "all_of_floats", configs=[SGD, Config(mode="inference")])
def _(r, b):
    # torch.all of a float tensor at the forward's peak: the CPU's bool copy of it (a byte an
    # element) is the step's largest moment.
    y = r.exp(lift(r, r.input("x", [b, 64, 64])))
    z = r.mul(y, y)
    r.all(z)
    return loss_of(r, r.sum(z, dim=[2]))


@case("ops", "maximum_constant", configs=[SGD, Config(mode="inference")])
def _(r, b):
    # HF OPT's clamp of masked scores: torch.max(scores, torch.tensor(finfo.min)); autograd
    # keeps the scores and the 0-dim constant.
    x = lift(r, r.input("x", [b, 8, 16]))
    return loss_of(r, r.maximum(x, r.full([], value=-3.0)))


op_case("maximum_both_grad", SHAPE, lambda r, x: r.maximum(x, r.exp(x)))
op_case("minimum_broadcast_param", SHAPE, lambda r, x: r.minimum(x, r.param("m", [16])))
op_case("cumsum", SHAPE, lambda r, x: r.cumsum(x, 1))


@case("ops", "cumsum_positions", configs=[SGD, Config(mode="inference")])
def _(r, b):
    # HF RoBERTa's create_position_ids_from_input_ids: mask = ids.ne(pad).int(),
    # (cumsum(mask, 1).type_as(mask)) * mask, .long(): ints, no gradient.
    ids = r.input("ids", [b, 16], "int64", high=4)
    m = r.to(r.compare("ne", ids, 1), "int32")
    pos = r.to(r.mul(r.to(r.cumsum(m, 1), "int32"), m), "int64")
    return loss_of(r, r.embedding(r.param("wpe", [18, 32]), pos))


@case("ops", "copy_into_slice", configs=[SGD, Config(mode="inference")])
def _(r, b):
    # torchvision's batch_images: images copied into a slice of a zeroed, padded batch (no new
    # storage), which the first convolution reads.
    x = r.exp(r.input("x", [b, 3, 10, 10]))
    buf = r.full([b, 3, 12, 12])
    r.copy_(r.slice(r.slice(buf, 2, 0, 10), 3, 0, 10), x)
    return loss_of(r, r.conv2d(buf, r.param("w", [4, 3, 3, 3])))


# ------------------------------------------------------------------------------ reductions, views
op_case("sum_dim", SHAPE, lambda r, x: r.exp(r.sum(x, dim=[-1])))
op_case("sum_dim_keepdim", SHAPE, lambda r, x: r.exp(r.sum(x, dim=[-1], keepdim=True)))
op_case("mean_all", SHAPE, lambda r, x: r.exp(r.mean(x)))
op_case("mean_dim", SHAPE, lambda r, x: r.exp(r.mean(x, dim=[-1])))
op_case("mean_dim_keepdim", SHAPE, lambda r, x: r.exp(r.mean(x, dim=[-1], keepdim=True)))
op_case("view", SHAPE, lambda r, x: r.exp(r.view(x, [x.shape[0] * 8, 16])))
op_case("reshape_viewable", SHAPE, lambda r, x: r.exp(r.reshape(x, [x.shape[0], 128])))
op_case("reshape_copy", SHAPE, lambda r, x: r.exp(r.reshape(r.transpose(x, 1, 2), [x.shape[0], 128])))
op_case("transpose_contiguous", SHAPE, lambda r, x: r.exp(r.contiguous(r.transpose(x, 1, 2))))
op_case("permute", [4, 8, 16], lambda r, x: r.exp(r.permute(x, [0, 3, 1, 2])))
op_case("expand", [1, 16], lambda r, x: r.exp(r.expand(x, [x.shape[0], 8, 16])))
op_case("unsqueeze_squeeze", SHAPE, lambda r, x: r.exp(r.squeeze(r.unsqueeze(x, 1), 1)))
op_case("slice", SHAPE, lambda r, x: r.exp(r.slice(x, 1, 2, 6)))
op_case("split", SHAPE, lambda r, x: r.mul(*r.split(x, 2, [8, 8])))
# Swin's patch merging: x[:, 0::2] and x[:, 1::2], concatenated.
op_case("slice_step2_cat", [8, 6], lambda r, x: r.exp(r.cat([r.slice(x, 1, 0, 8, 2), r.slice(x, 1, 1, 8, 2)], dim=2)))
op_case("pad", [5, 4, 8], lambda r, x: r.exp(r.pad(x, [0, 0, 0, 3, 0, 2])))
op_case("clone", SHAPE, lambda r, x: r.exp(r.clone(x)))
op_case("norm_keepdim", [4, 16], lambda r, x: r.exp(r.norm(x, [-1], keepdim=True)))
op_case("clamp_min", SHAPE, lambda r, x: r.clamp(x, min=0.0))
op_case("clamp_max", SHAPE, lambda r, x: r.clamp(x, max=0.05))
op_case("clamp_both", SHAPE, lambda r, x: r.clamp(x, -0.05, 0.05))
# F.normalize(x, dim=-1) as 1.13 runs it: norm, clamp_min, expand_as, div (Swin V2's cosine
# attention).
op_case("normalize", [4, 16], lambda r, x: r.div(
    x, r.expand(r.clamp(r.norm(x, [-1], keepdim=True), min=1e-12), [x.shape[0], 4, 16])))
op_case("roll_two_dims", [5, 4, 8], lambda r, x: r.exp(r.roll(x, [-2, -2], [1, 2])))
op_case("roll_one_dim", [5, 4, 8], lambda r, x: r.exp(r.roll(x, [3], [1])))
op_case("flatten", SHAPE, lambda r, x: r.exp(r.flatten(x, 1, 2)))
op_case("cat", SHAPE, lambda r, x: r.exp(r.cat([x, r.exp(x)], dim=1)))
op_case("contiguous_noop", SHAPE, lambda r, x: r.exp(r.contiguous(x)))


@case("ops", "embedding")
def _(r, b):
    idx = r.input("idx", [b, 8], "int64", high=20)
    return loss_of(r, r.embedding(r.param("wte", [20, 16]), idx))


@case("ops", "arange_embedding")
def _(r, b):
    x = lift(r, r.input("x", [b, 8, 16]))
    pos = r.embedding(r.param("wpe", [8, 16]), r.arange(8))
    return loss_of(r, r.add(x, pos))


@case("ops", "arange_start_step")
def _(r, b):
    x = lift(r, r.input("x", [b, 8, 16]))
    pos = r.embedding(r.param("wpe", [20, 16]), r.arange(19, start=3, step=2))
    return loss_of(r, r.add(x, pos))


for _mode in ("sum", "mean", "max"):
    @case("ops", f"embedding_bag_2d_{_mode}")
    def _(r, b, mode=_mode):
        # nn.EmbeddingBag on [B, L] indices (F.embedding_bag makes the offsets with an arange)
        idx = r.input("idx", [b, 6], "int64", high=20)
        return loss_of(r, r.embedding_bag(r.param("w", [20, 16]), idx, mode=mode))


@case("ops", "embedding_bag_offsets")
def _(r, b):
    idx = r.input("idx", [b], "int64", high=20)
    offsets = r.input("offsets", [b], "int64", high=1)  # all 0: valid, and memory does not depend on them
    return loss_of(r, r.embedding_bag(r.param("w", [20, 16]), idx, offsets, mode="mean"))


@case("ops", "embedding_bag_per_sample_weights")
def _(r, b):
    idx = r.input("idx", [b, 6], "int64", high=20)
    psw = r.input("psw", [b, 6])
    return loss_of(r, r.embedding_bag(r.param("w", [20, 16]), idx, mode="sum", per_sample_weights=psw))


@case("ops", "index_table")
def _(r, b):
    # Swin's relative position bias: table[index] with an index buffer.
    table = r.param("table", [25, 4])
    idx = r.buffer("index", [81], "int64", value=_index_buffer(81, 25))
    y = r.index(table, idx)
    x = lift(r, r.input("x", [b, 81, 4]))
    return loss_of(r, r.add(x, y))


# x[:, idx]: Python runs a full slice of dim 0 first (a view whose backward copies into zeros).
op_case("index_dim1", [20, 16], lambda r, x: r.index(r.slice(x, 0, 0, x.shape[0]),
                                                   r.input("idx", [6], "int64", high=20, batch_dim=-1), dim=1))


def _index_buffer(n, high):
    import torch
    return torch.arange(n) % high


# ------------------------------------------------------------------------------ recurrent layers
def rnn_weights(r, prefix, kind, input_size, hidden, layers=1, dirs=1, bias=True):
    """nn.LSTM / nn.GRU's parameters in _flat_weights' order."""
    g = (4 if kind == "lstm" else 3) * hidden
    ws = []
    for l in range(layers):
        for d in range(dirs):
            sfx = f"l{l}" + ("_reverse" if d else "")
            width = input_size if l == 0 else dirs * hidden
            ws.append(r.param(f"{prefix}.weight_ih_{sfx}", [g, width]))
            ws.append(r.param(f"{prefix}.weight_hh_{sfx}", [g, hidden]))
            if bias:
                ws.append(r.param(f"{prefix}.bias_ih_{sfx}", [g]))
                ws.append(r.param(f"{prefix}.bias_hh_{sfx}", [g]))
    return ws


def _rnn_case(kind, layers=1, bidirectional=False, batch_first=False, dropout=0.0, bias=True,
              state=False, lifted=True):
    def fn(r, b):
        t, i, h = 5, 8, 6
        shape = [b, t, i] if batch_first else [t, b, i]
        x = r.input("x", shape, batch_dim=0 if batch_first else 1)
        if lifted:
            x = lift(r, x)
        dirs = 2 if bidirectional else 1
        st = ()
        if state:
            n = 2 if kind == "lstm" else 1
            st = tuple(lift(r, r.input(f"h{k}", [layers * dirs, b, h], batch_dim=1), f"lh{k}") for k in range(n))
        ws = rnn_weights(r, kind, kind, i, h, layers, dirs, bias)
        outs = r.recurrent(kind, x, ws, st, layers, bidirectional, batch_first, dropout, bias)
        return loss_of(r, outs[0])
    return fn


for _kind in ("lstm", "gru"):
    case("ops", _kind)(_rnn_case(_kind))
    case("ops", f"{_kind}_batch_first_input_no_grad")(_rnn_case(_kind, batch_first=True, lifted=False))
    case("ops", f"{_kind}_2_layers_bidirectional_dropout")(
        _rnn_case(_kind, layers=2, bidirectional=True, dropout=0.25))
    case("ops", f"{_kind}_state_no_bias")(_rnn_case(_kind, bias=False, state=True))


# ------------------------------------------------------------------------------ losses
@case("ops", "cross_entropy")
def _(r, b):
    x = r.input("x", [b * 8, 16])
    logits = r.linear(x, r.param("w", [10, 16]))
    return r.cross_entropy(logits, r.target("y", [b * 8], high=10))


@case("ops", "cross_entropy_reduction_none")
def _(r, b):
    x = r.input("x", [b * 8, 16])
    logits = r.linear(x, r.param("w", [10, 16]))
    return r.mean(r.cross_entropy(logits, r.target("y", [b * 8], high=10), reduction="none"))


@case("ops", "cross_entropy_sum_4d")
def _(r, b):
    # Segmentation-style logits [N, C, H, W] (nll_loss2d in aten), summed.
    x = lift(r, r.input("x", [b, 10, 3, 3]))
    return r.cross_entropy(x, r.target("y", [b, 3, 3], high=10), reduction="sum")


@case("ops", "mse_loss")
def _(r, b):
    x = r.input("x", [b * 8, 16])
    y = r.linear(x, r.param("w", [10, 16]))
    return r.mse_loss(y, r.target("y", [b * 8, 10], "float32"))


# ------------------------------------------------------------------------------ expanded grads
# loss = sum(y): backward hands the op a stride-0 expanded gradient of ones.
@case("expanded_grad", "linear_2d_sum_loss")
def _(r, b):
    x = r.input("x", [b * 8, 16])
    return r.sum(r.linear(x, r.param("w", [12, 16]), r.param("bias", [12])))


@case("expanded_grad", "layer_norm_sum_loss")
def _(r, b):
    x = lift(r, r.input("x", [b, 8, 16]))
    return r.sum(r.layer_norm(x, r.param("ln.w", [16], "ones"), r.param("ln.b", [16], "zeros")))


@case("expanded_grad", "group_norm_sum_loss")
def _(r, b):
    x = lift(r, r.input("x", [b, 8, 4, 4]))
    return r.sum(r.group_norm(x, 2, r.param("gn.w", [8], "ones"), r.param("gn.b", [8], "zeros")))


@case("expanded_grad", "softmax_sum_loss")
def _(r, b):
    x = lift(r, r.input("x", [b, 8, 16]))
    return r.sum(r.softmax(x, -1))


@case("expanded_grad", "max_pool2d_sum_loss")
def _(r, b):
    x = lift(r, r.input("x", [b, 4, 16, 16]))
    return r.sum(r.max_pool2d(x, 2))


@case("expanded_grad", "conv2d_sum_loss")
def _(r, b):
    x = r.input("x", [b, 8, 12, 12])
    return r.sum(r.conv2d(x, r.param("w", [8, 8, 3, 3]), None, padding=1))


# ------------------------------------------------------------------------------ phenomena
@case("phenomena", "broadcast_mul_then_sum")
def _(r, b):
    # [M,1,T,D] * [M,T,D] -> [M,M,T,D], then sum(-1): the big product is a forward temporary,
    # and backward makes two product-sized temporaries.
    x = lift(r, r.input("x", [b, 8, 16]), "lx")
    y = lift(r, r.input("y", [b, 8, 16]), "ly")
    s = r.sum(r.mul(r.unsqueeze(x, 1), y), dim=[-1])
    return loss_of(r, s)


@case("phenomena", "einsum_contraction")
def _(r, b):
    x = lift(r, r.input("x", [b, 8, 16]), "lx")
    y = lift(r, r.input("y", [b, 8, 16]), "ly")
    return loss_of(r, r.einsum("itd,jtd->ijt", x, y))


@case("phenomena", "swish_by_hand")
def _(r, b):
    h = r.linear(r.input("x", [b * 4, 32]), r.param("fc1.w", [64, 32]), r.param("fc1.b", [64]))
    a = r.mul(h, r.sigmoid(h))
    return r.cross_entropy(r.linear(a, r.param("fc2.w", [10, 64])), r.target("y", [b * 4], high=10))


@case("phenomena", "swish_silu")
def _(r, b):
    h = r.linear(r.input("x", [b * 4, 32]), r.param("fc1.w", [64, 32]), r.param("fc1.b", [64]))
    a = r.silu(h)
    return r.cross_entropy(r.linear(a, r.param("fc2.w", [10, 64])), r.target("y", [b * 4], high=10))


def _attention(r, b, scale_qk):
    x = lift(r, r.input("x", [b, 2, 8, 16]), "lx")
    with r.scope("attn"):
        q = r.linear(x, r.param("q.w", [16, 16]))
        k = r.linear(x, r.param("k.w", [16, 16]))
        v = r.linear(x, r.param("v.w", [16, 16]))
        if scale_qk:
            s = 16 ** -0.25
            scores = r.matmul(r.mul(q, s), r.transpose(r.mul(k, s), -2, -1))
        else:
            scores = r.div(r.matmul(q, r.transpose(k, -2, -1)), math.sqrt(16))
        o = r.matmul(r.softmax(scores, -1), v)
    return loss_of(r, o)


@case("phenomena", "vit_patch_embedding")
def _(r, b):
    # ViT's embeddings (HF ViTEmbeddings, torchvision's VisionTransformer): patches by a strided
    # conv, flatten(2).transpose(1, 2), a class token in front, position embeddings added. The
    # conv's output gradient is a transposed slice of cat's: its backward copies it contiguous.
    x = r.input("x", [b, 3, 32, 32])
    with r.scope("patch_embeddings"):
        p = r.conv2d(x, r.param("proj.w", [64, 3, 8, 8]), r.param("proj.b", [64]), stride=8)
        p = r.transpose(r.flatten(p, 2), 1, 2)
    cls = r.expand(r.param("cls_token", [1, 1, 64], "zeros"), [b, 1, 64])
    h = r.add(r.cat([cls, p], dim=1), r.param("position_embeddings", [1, 17, 64]))
    h = r.layer_norm(h, r.param("ln.w", [64], "ones"), r.param("ln.b", [64], "zeros"))
    return r.cross_entropy(r.linear(r.squeeze(r.slice(h, 1, 0, 1), 1), r.param("head.w", [10, 64])),
                           r.target("y", [b], high=10))


case("phenomena", "attention_scale_scores")(lambda r, b: _attention(r, b, False))
case("phenomena", "attention_scale_qk")(lambda r, b: _attention(r, b, True))


@case("phenomena", "attention_softcap")
def _(r, b):
    # Gemma 2's eager scores (attn_logit_softcapping): q @ k^T * scaling, / cap, tanh, * cap,
    # softmax, @ v. tanh keeps its output; the division and products by a number keep nothing.
    x = lift(r, r.input("x", [b, 2, 8, 16]), "lx")
    with r.scope("attn"):
        q = r.linear(x, r.param("q.w", [16, 16]))
        k = r.linear(x, r.param("k.w", [16, 16]))
        v = r.linear(x, r.param("v.w", [16, 16]))
        scores = r.mul(r.matmul(q, r.transpose(k, -2, -1)), 144 ** -0.5)
        scores = r.mul(r.tanh(r.div(scores, 50.0)), 50.0)
        o = r.matmul(r.softmax(scores, -1), v)
    return loss_of(r, o)


@case("phenomena", "unet_down_path")
def _(r, b):
    # A small diffusion-UNet-like down path: conv, group norm, SiLU, strided conv, twice.
    h = r.input("x", [b, 3, 16, 16])
    cin = 3
    for i, c in enumerate((8, 16)):
        with r.scope(f"down.{i}"):
            h = r.conv2d(h, r.param(f"down.{i}.conv.w", [c, cin, 3, 3]), r.param(f"down.{i}.conv.b", [c]), padding=1)
            h = r.group_norm(h, 4, r.param(f"down.{i}.gn.w", [c], "ones"), r.param(f"down.{i}.gn.b", [c], "zeros"))
            h = r.silu(h)
            h = r.conv2d(h, r.param(f"down.{i}.ds.w", [c, c, 3, 3]), r.param(f"down.{i}.ds.b", [c]), stride=2, padding=1)
            cin = c
    return r.mse_loss(h, r.target("y", [b, 16, 4, 4], "float32"))


def deep_mlp(r, b, layers=6, d=32):
    h = r.input("x", [b * 4, d])
    for i in range(layers):
        with r.scope(f"blocks.{i}", block=True):
            u = r.linear(h, r.param(f"blocks.{i}.fc1.w", [4 * d, d]), r.param(f"blocks.{i}.fc1.b", [4 * d]))
            u = r.gelu(u)
            h = r.linear(u, r.param(f"blocks.{i}.fc2.w", [d, 4 * d]), r.param(f"blocks.{i}.fc2.b", [d]))
    return r.cross_entropy(h, r.target("y", [b * 4], high=d))


case("phenomena", "deep_linear_gelu_stack",
     note="no checkpointing; the checkpointed variants are deep_linear_gelu_stack_checkpointed")(deep_mlp)
case("phenomena", "grad_accumulation", batch=4,
     configs=[Config(accum=2), Config(optimizer="adam", accum=2), Config(accum=2, keep_grads=True)])(
    lambda r, b: deep_mlp(r, b, layers=2))


def checkpointed_mlp(r, b, layers=9, d=32):
    """The deep Linear-GELU-Linear stack behind a plain Linear (so the first checkpointed
    block's input requires grad, as in real models), its blocks wrapped in reentrant
    torch.utils.checkpoint per the run's policy: one checkpoint per segment of k consecutive
    blocks (checkpoint_sequential's grouping; the last segment may be shorter)."""
    h = r.linear(r.input("x", [b * 4, d]), r.param("embed.w", [d, d]), r.param("embed.b", [d]))

    def block(i, h):
        with r.scope(f"blocks.{i}", block=True):
            u = r.linear(h, r.param(f"blocks.{i}.fc1.w", [4 * d, d]), r.param(f"blocks.{i}.fc1.b", [4 * d]))
            u = r.gelu(u)
            return r.linear(u, r.param(f"blocks.{i}.fc2.w", [d, 4 * d]), r.param(f"blocks.{i}.fc2.b", [d]))

    k = r.checkpoint_segment(layers)
    if k == 0:
        for i in range(layers):
            h = block(i, h)
    else:
        for s in range(0, layers, k):
            def segment(h, s=s):
                for i in range(s, min(layers, s + k)):
                    h = block(i, h)
                return h
            h = r.checkpoint(segment, h)
    return r.cross_entropy(h, r.target("y", [b * 4], high=d))


case("phenomena", "deep_linear_gelu_stack_checkpointed",
     configs=[Config(), Config(checkpoint="every-block"), Config(checkpoint="every-k", checkpoint_k=4),
              Config(checkpoint="sqrt"), Config(optimizer="adam", checkpoint="every-k", checkpoint_k=4),
              Config(checkpoint="every-block", non_reentrant=True),
              Config(checkpoint="every-k", checkpoint_k=4, non_reentrant=True),
              Config(optimizer="adam", checkpoint="sqrt", non_reentrant=True)],
     note="9 blocks behind a plain Linear; torch.utils.checkpoint (reentrant, 1.13's default, or "
          "use_reentrant=False; preserve_rng_state=True) per segment: every block (9 segments), "
          "every 4 (4, 4, 1), sqrt (round(sqrt 9) = 3: 3, 3, 3)")(checkpointed_mlp)


# ------------------------------------------------------------------------------ models
def gpt(r, b, vocab=64, t=8, d=32, heads=2, layers=2, p=0.1):
    hd = d // heads
    idx = r.input("idx", [b, t], "int64", high=vocab)
    wte = r.param("wte", [vocab, d])
    x = r.add(r.embedding(wte, idx), r.embedding(r.param("wpe", [t, d]), r.arange(t)))
    x = r.dropout(x, p) if r.training else x
    mask = r.buffer("causal_mask", [t, t], "bool", value=_causal(t))
    for i in range(layers):
        with r.scope(f"h.{i}", block=True):
            pre = f"h.{i}"
            with r.scope("attn"):
                a = r.layer_norm(x, r.param(f"{pre}.ln1.w", [d], "ones"), r.param(f"{pre}.ln1.b", [d], "zeros"))
                qkv = r.linear(a, r.param(f"{pre}.attn.w", [3 * d, d]), r.param(f"{pre}.attn.b", [3 * d]))
                q, k, v = r.split(qkv, 2, [d, d, d])
                q = r.transpose(r.view(q, [b, t, heads, hd]), 1, 2)
                k = r.transpose(r.view(k, [b, t, heads, hd]), 1, 2)
                v = r.transpose(r.view(v, [b, t, heads, hd]), 1, 2)
                s = r.div(r.matmul(q, r.transpose(k, -2, -1)), math.sqrt(hd))
                s = r.masked_fill(s, mask, -1e4)
                att = r.dropout(r.softmax(s, -1), p)
                y = r.matmul(att, v)
                y = r.reshape(r.transpose(y, 1, 2), [b, t, d])
                y = r.dropout(r.linear(y, r.param(f"{pre}.proj.w", [d, d]), r.param(f"{pre}.proj.b", [d])), p)
                x = r.add(x, y)
            with r.scope("mlp"):
                m = r.layer_norm(x, r.param(f"{pre}.ln2.w", [d], "ones"), r.param(f"{pre}.ln2.b", [d], "zeros"))
                m = r.gelu(r.linear(m, r.param(f"{pre}.fc.w", [4 * d, d]), r.param(f"{pre}.fc.b", [4 * d])))
                m = r.dropout(r.linear(m, r.param(f"{pre}.mproj.w", [d, 4 * d]), r.param(f"{pre}.mproj.b", [d])), p)
                x = r.add(x, m)
    x = r.layer_norm(x, r.param("lnf.w", [d], "ones"), r.param("lnf.b", [d], "zeros"))
    logits = r.linear(x, wte)  # tied head
    if not r.training:
        return logits
    return r.cross_entropy(r.view(logits, [b * t, vocab]), r.target("y", [b * t], high=vocab))


def _causal(t):
    import torch
    return torch.ones(t, t, dtype=torch.bool).triu(1)


case("models", "gpt_decoder", batch=2,
     configs=[SGD, Config(optimizer="adamw", impl="foreach"), Config(mode="inference")])(gpt)


def mlp(r, b):
    h = r.relu(r.linear(r.input("x", [b, 64]), r.param("fc1.w", [128, 64]), r.param("fc1.b", [128])))
    h = r.linear(h, r.param("fc2.w", [32, 128]), r.param("fc2.b", [32]))
    return r.cross_entropy(h, r.target("y", [b], high=32)) if r.training else h


case("models", "mlp_inference", batch=8, configs=[Config(mode="inference")])(mlp)
case("models", "deep_stack_inference", batch=4, configs=[Config(mode="inference")])(
    lambda r, b: deep_mlp(r, b) if r.training else _deep_mlp_out(r, b))


def _deep_mlp_out(r, b, layers=6, d=32):
    h = r.input("x", [b * 4, d])
    for i in range(layers):
        with r.scope(f"blocks.{i}"):
            u = r.gelu(r.linear(h, r.param(f"blocks.{i}.fc1.w", [4 * d, d]), r.param(f"blocks.{i}.fc1.b", [4 * d])))
            h = r.linear(u, r.param(f"blocks.{i}.fc2.w", [d, 4 * d]), r.param(f"blocks.{i}.fc2.b", [d]))
    return h


def _bn(r, x, name, c):
    return r.batch_norm(x, r.param(f"{name}.w", [c], "ones"), r.param(f"{name}.b", [c], "zeros"),
                        r.buffer(f"{name}.running_mean", [c]), r.buffer(f"{name}.running_var", [c], init="ones"))


def _basic_block(r, x, name, cin, cout, stride):
    """torchvision's BasicBlock: conv3x3-bn-relu(inplace)-conv3x3-bn, downsample (conv1x1 + bn)
    where the shape changes, `out += identity`, relu(inplace)."""
    with r.scope(name, block=True):
        identity = x
        out = r.conv2d(x, r.param(f"{name}.conv1.w", [cout, cin, 3, 3]), None, stride=stride, padding=1)
        out = r.relu(_bn(r, out, f"{name}.bn1", cout), inplace=True)
        out = r.conv2d(out, r.param(f"{name}.conv2.w", [cout, cout, 3, 3]), None, stride=1, padding=1)
        out = _bn(r, out, f"{name}.bn2", cout)
        if stride != 1 or cin != cout:
            with r.scope("downsample"):
                identity = r.conv2d(x, r.param(f"{name}.downsample.0.w", [cout, cin, 1, 1]), None, stride=stride)
                identity = _bn(r, identity, f"{name}.downsample.1", cout)
        out = r.add_(out, identity)
        return r.relu(out, inplace=True)


def resnet18_small(r, b, widths=(8, 16, 32, 64), classes=10):
    """torchvision's ResNet-18 structure, narrow and with one BasicBlock per stage: conv7x7/2 -
    bn - relu(inplace) - maxpool3x3/2, four stages (stride 1, 2, 2, 2), adaptive average pool to
    1x1, flatten, fc, cross-entropy. (num_batches_tracked, an int64 counter BatchNorm bumps in
    place, is left out.)"""
    x = r.input("x", [b, 3, 32, 32])
    h = r.conv2d(x, r.param("conv1.w", [widths[0], 3, 7, 7]), None, stride=2, padding=3)
    h = r.relu(_bn(r, h, "bn1", widths[0]), inplace=True)
    h = r.max_pool2d(h, 3, stride=2, padding=1)
    cin = widths[0]
    for i, c in enumerate(widths):
        h = _basic_block(r, h, f"layer{i + 1}.0", cin, c, 1 if i == 0 else 2)
        cin = c
    h = r.flatten(r.adaptive_avg_pool2d(h, [1, 1]), 1)
    logits = r.linear(h, r.param("fc.w", [classes, cin]), r.param("fc.b", [classes]))
    if not r.training:
        return logits
    return r.cross_entropy(logits, r.target("y", [b], high=classes))


case("models", "resnet18_small", batch=2,
     configs=[SGD, Config(optimizer="momentum"), Config(mode="inference")],
     note="ResNet-18 structure (torchvision), channels 8-16-32-64, one BasicBlock per stage, "
          "input [2, 3, 32, 32]")(resnet18_small)


def lstm_lm(r, b, vocab=40, t=6, d=16, h=24):
    """An RNN language model: embedding, a 2-layer batch-first LSTM with dropout between the
    layers, a linear head over every step, cross-entropy."""
    idx = r.input("idx", [b, t], "int64", high=vocab)
    x = r.embedding(r.param("emb", [vocab, d]), idx)
    with r.scope("rnn"):
        out = r.recurrent("lstm", x, rnn_weights(r, "rnn", "lstm", d, h, layers=2), num_layers=2,
                          batch_first=True, dropout=0.2)[0]
    logits = r.linear(out, r.param("head.w", [vocab, h]), r.param("head.b", [vocab]))
    if not r.training:
        return logits
    return r.cross_entropy(r.view(logits, [b * t, vocab]), r.target("y", [b * t], high=vocab))


# Not with for-loop Adam: 1.13 keeps the previous parameter's denom while the next one's are
# made, which memest does not model yet (issue 10, section 2), and this model's weights come in
# runs of equal size, so the step's peak shows it.
case("models", "lstm_lm", batch=3, configs=[SGD, Config(optimizer="momentum"), Config(mode="inference")],
     note="embedding 40x16, nn.LSTM(16, 24, num_layers=2, batch_first, dropout=0.2), head; T = 6")(lstm_lm)


def unet_small(r, b):
    """A small UNet: two strided convs down, up by a transposed convolution and by nearest
    upsampling, skip connections concatenated, ReLU6 and hardswish in place."""
    x = r.input("x", [b, 3, 16, 16])
    d1 = r.hardtanh(r.conv2d(x, r.param("d1.w", [8, 3, 3, 3]), r.param("d1.b", [8]), stride=2, padding=1),
                    0.0, 6.0, inplace=True)                                                   # [b, 8, 8, 8]
    d2 = r.hardswish(r.conv2d(d1, r.param("d2.w", [16, 8, 3, 3]), r.param("d2.b", [16]), stride=2, padding=1),
                     inplace=True)                                                            # [b, 16, 4, 4]
    u1 = r.conv_transpose2d(d2, r.param("u1.w", [16, 8, 2, 2]), r.param("u1.b", [8]), stride=2)  # [b, 8, 8, 8]
    u1 = r.conv2d(r.cat([u1, d1], dim=1), r.param("c1.w", [8, 16, 3, 3]), None, padding=1)
    u2 = r.upsample(r.silu(u1, inplace=True), "nearest", scale_factor=2)                      # [b, 8, 16, 16]
    y = r.conv2d(u2, r.param("out.w", [2, 8, 1, 1]), r.param("out.b", [2]))
    if not r.training:
        return y
    return r.mse_loss(y, r.target("y", [b, 2, 16, 16], "float32"))


case("models", "unet_small", batch=2, configs=[SGD, Config(mode="inference")],
     note="down: conv3x3/2 + ReLU6_, conv3x3/2 + hardswish_; up: conv_transpose 2x2/2, cat skip, "
          "conv, SiLU_, nearest x2; mse")(unet_small)


# ------------------------------------------------------------------------------ optimizers
OPTIMIZER_CONFIGS = [
    Config(optimizer=o, impl=i, keep_grads=k)
    for o in ("sgd", "momentum", "adam", "adamw")
    for i in ("for-loop", "foreach")
    for k in (False, True)
] + [
    Config(optimizer="adam", impl="for-loop", weight_decay=0.01),
    Config(optimizer="momentum", impl="for-loop", weight_decay=0.01),
]
# transformers' AdamW and Adafactor, where transformers is installed (build/pyenv has it; Debian's
# /usr/bin/python3 does not, and run.py says the cases were left out).
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
if HAS_TRANSFORMERS:
    OPTIMIZER_CONFIGS += [
        Config(optimizer="hf-adamw"),
        Config(optimizer="hf-adamw", keep_grads=True),
        Config(optimizer="hf-adamw", weight_decay=0.01),
        Config(optimizer="hf-adafactor"),
        Config(optimizer="hf-adafactor", keep_grads=True),
    ]
case("optim", "mlp", batch=8, configs=OPTIMIZER_CONFIGS)(mlp)


# ------------------------------------------------------------------------------ what Python holds
# The program's own references (docs/step-model.md, "What the Python program holds"): locals that
# outlive their last use (`r.frame()`: the model file's `held`; the tracer finds them with weak
# references) and a loop that keeps the model's outputs (hold_outputs).
HOLD = Config(hold_outputs=True)
INFERENCE = Config(mode="inference")


def _attention_holding_dot(r, b, t=32, d=8, heads=2):
    """A hand-written attention function: `dot = q @ k.transpose(-2, -1)` stays referenced by
    its local until the function returns, through the softmax and `att @ v`."""
    x = lift(r, r.input("x", [b, heads, t, d]), "lx")
    with r.scope("attn"):
        q = r.linear(x, r.param("q.w", [d, d]))
        k = r.linear(x, r.param("k.w", [d, d]))
        v = r.linear(x, r.param("v.w", [d, d]))
        with r.frame() as local:
            dot = local(r.matmul(q, r.transpose(k, -2, -1)))
            att = r.softmax(r.div(dot, math.sqrt(d)), -1)
            out = r.matmul(att, v)
    return loss_of(r, out) if r.training else out


case("lifetimes", "attention_holds_dot", configs=[SGD, INFERENCE],
     note="`dot` ([4, 2, 32, 32]) held by its local through softmax and att @ v")(_attention_holding_dot)


def _resnet_holding_stem(r, b, c=8, classes=10):
    """ResNet's _forward_impl: `x = self.maxpool(x); x = self.layer1(x)` keeps the stem's
    output referenced while both blocks of layer1 run (nn.Sequential and nn.Module.__call__
    hold their input too); then layer2 (one block, downsampling), pool and fc. The stem keeps
    the resolution (3x3 conv, stride-1 max pool), so that layer1, not the stem, peaks."""
    x = r.input("x", [b, 3, 16, 16])
    h = r.conv2d(x, r.param("conv1.w", [c, 3, 3, 3]), None, stride=1, padding=1)
    h = r.relu(_bn(r, h, "bn1", c), inplace=True)
    with r.frame() as local:
        h = local(r.max_pool2d(h, 3, stride=1, padding=1))
        for j in range(2):
            h = _basic_block(r, h, f"layer1.{j}", c, c, 1)
    h = _basic_block(r, h, "layer2.0", c, 2 * c, 2)
    h = r.flatten(r.adaptive_avg_pool2d(h, [1, 1]), 1)
    logits = r.linear(h, r.param("fc.w", [classes, 2 * c]), r.param("fc.b", [classes]))
    return r.cross_entropy(logits, r.target("y", [b], high=classes)) if r.training else logits


case("lifetimes", "resnet_stem_held_by_x", batch=2, configs=[SGD, INFERENCE],
     note="the stem's output ([2, 8, 16, 16]) held by `x` while layer1's two BasicBlocks run")(
    _resnet_holding_stem)


def _encoder_layer(r, x, name, b, t, d, heads, ff):
    """nn.TransformerEncoderLayer (post-norm, ReLU, as 1.13's math path runs it): its input
    `src` stays referenced (the argument, and nn.Module.__call__'s) until the layer returns."""
    hd = d // heads
    with r.scope(name, block=True), r.frame() as local:
        local(x)
        qkv = r.linear(x, r.param(f"{name}.in_proj.w", [3 * d, d]), r.param(f"{name}.in_proj.b", [3 * d]))
        q, k, v = (r.transpose(r.view(u, [b, t, heads, hd]), 1, 2) for u in r.split(qkv, 2, [d, d, d]))
        att = r.softmax(r.div(r.matmul(q, r.transpose(k, -2, -1)), math.sqrt(hd)), -1)
        y = r.reshape(r.transpose(r.matmul(att, v), 1, 2), [b, t, d])
        y = r.linear(y, r.param(f"{name}.out_proj.w", [d, d]), r.param(f"{name}.out_proj.b", [d]))
        x1 = r.layer_norm(r.add(x, y), r.param(f"{name}.norm1.w", [d], "ones"), r.param(f"{name}.norm1.b", [d], "zeros"))
        f = r.relu(r.linear(x1, r.param(f"{name}.linear1.w", [ff, d]), r.param(f"{name}.linear1.b", [ff])))
        f = r.linear(f, r.param(f"{name}.linear2.w", [d, ff]), r.param(f"{name}.linear2.b", [d]))
        return r.layer_norm(r.add(x1, f), r.param(f"{name}.norm2.w", [d], "ones"), r.param(f"{name}.norm2.b", [d], "zeros"))


def _transformer_encoder(r, b, t=16, d=32, heads=2, ff=128, layers=2):
    x = lift(r, r.input("x", [b, t, d]), "embed")
    for i in range(layers):
        x = _encoder_layer(r, x, f"layers.{i}", b, t, d, heads, ff)
    return loss_of(r, x) if r.training else x


case("lifetimes", "transformer_encoder_layer_inputs", batch=2, configs=[SGD, INFERENCE],
     note="each layer's input ([2, 16, 32]) held until the layer returns, through its feed-forward")(
    _transformer_encoder)


def _lm_holding_logits(r, b, t=16, vocab=512, d=32):
    """A small language model whose logits ([B, T, vocab]) outweigh the rest; its loop keeps
    `outputs` (hold_outputs): through backward and the optimizer step, and into the next
    micro-batch or step until its forward and loss have returned."""
    idx = r.input("idx", [b, t], "int64", high=vocab)
    h = r.embedding(r.param("wte", [vocab, d]), idx)
    h = r.gelu(r.linear(h, r.param("fc.w", [d, d]), r.param("fc.b", [d])))
    logits = r.linear(h, r.param("head.w", [vocab, d]))
    return r.cross_entropy(r.view(logits, [b * t, vocab]), r.target("y", [b * t], high=vocab))


case("lifetimes", "lm_loop_holds_logits", batch=2,
     configs=[HOLD, Config(optimizer="adamw", impl="foreach", hold_outputs=True),
              Config(accum=2, hold_outputs=True), SGD],
     note="logits [2, 16, 512] (64 KiB); `outputs = model(**batch)` holds them (hold-outputs) or "
          "the loop lets them go once the loss exists")(_lm_holding_logits)


def _two_square_layers(r, b, d=256):
    h = r.linear(r.input("x", [b, d]), r.param("fc1.w", [d, d]))
    h = r.linear(r.relu(h), r.param("fc2.w", [d, d]))
    return r.cross_entropy(h, r.target("y", [b], high=d))


case("optim", "adam_for_loop_keeps_previous_denom", batch=4,
     configs=[Config(optimizer="adam"), Config(optimizer="adamw"),
              Config(optimizer="adam", weight_decay=0.01), Config(optimizer="adamw", accum=2)],
     note="two [256, 256] weights; for-loop Adam's `denom` of fc1.w is alive while fc2.w's sqrt "
          "and quotient are made")(_two_square_layers)


# The ops of detection models (nonzero, index_put_, topk, sort, nms, roi_align, ...).
import cases_detection  # noqa: E402,F401  (registers its cases here)
# Mixture-of-experts routing (one_hot, div_, index_add_).
import cases_moe  # noqa: E402,F401
# Megatron-LM's MoELayer (index_select, scatter, scatter_add_, remainder, the fused SwiGLU).
import cases_megatron_moe  # noqa: E402,F401
