"""The vocabulary end of a Megatron GPT under tensor parallelism, written with plain collectives
as NVIDIA/Megatron-LM d98e8a64 writes it (read 2026-11-24; the line numbers below are that
commit's):

* `VocabParallelEmbedding.forward` (megatron/core/tensor_parallel/layers.py 336-386): the rank's
  rows [V/t, h] looked up with the other ranks' tokens masked to row 0, their outputs zeroed
  through a view (`output_parallel[input_mask, :] = 0.0`, so autograd's node is CopySlices);
  then the all-reduce (`reduce_from_tensor_model_parallel_region`) or, with
  `reduce_scatter_embeddings` (LanguageModelEmbedding without a learned position embedding under
  sequence parallelism), the transpose to [s, b, h] made contiguous and a reduce-scatter.
* `_VocabParallelCrossEntropy` (megatron/core/tensor_parallel/cross_entropy.py 119-210) with the
  `VocabParallelCrossEntropy` helpers it calls (13-116), without label smoothing. Each helper is
  a function here as there, so its locals (`arange_1d`, the advanced-indexing result) die when it
  returns, as they do in Megatron.

Only float32 logits: `.float()` is then the tensor itself, so the logits the head made are
worked on in place and saved as the softmax (under bf16 it would be a float32 copy).
"""
import torch
import torch.distributed as dist

import common


def vocab_parallel_embedding(ids, weight):
    """layers.py 336-365, tp_group.size() > 1: [b, s] ids -> [b, s, h], the rank's part of the
    sum (the reduction is the caller's). Plain autograd ops, as Megatron writes them."""
    part = weight.shape[0]
    start = dist.get_rank(common.GROUP) * part  # VocabUtility.vocab_range_from_global_vocab_size
    input_mask = (ids < start) | (ids >= start + part)        # 344: bool [b, s]; two temporaries
    masked_input = ids.clone() - start                          # 346: int64 [b, s]; the clone dies
    masked_input[input_mask] = 0                                # 347
    output_parallel = torch.nn.functional.embedding(masked_input, weight)  # 362: saves the ids
    output_parallel[input_mask, :] = 0.0                        # 365: CopySlices, saves the mask
    return output_parallel


# ------------------------------------------------------------------------------ cross entropy
def calculate_logits_max(vocab_parallel_logits):
    """cross_entropy.py 20-29."""
    vocab_parallel_logits = vocab_parallel_logits.float()      # the same tensor under float32
    logits_max = torch.max(vocab_parallel_logits, dim=-1)[0]    # [s, b] values; int64 indices die
    return vocab_parallel_logits, logits_max


def calculate_predicted_logits(vocab_parallel_logits, target, logits_max, start, end):
    """cross_entropy.py 32-65: the logits shifted in place, the target masked, the target's
    logit gathered and cloned, the logits exponentiated in place and summed."""
    vocab_parallel_logits -= logits_max.unsqueeze(dim=-1)                   # 42
    target_mask = (target < start) | (target >= end)                        # 45: bool [s, b]
    masked_target = target.clone() - start                                  # 46: int64 [s, b]
    masked_target[target_mask] = 0                                          # 47
    partition_vocab_size = vocab_parallel_logits.size()[-1]
    logits_2d = vocab_parallel_logits.view(-1, partition_vocab_size)        # 53
    masked_target_1d = masked_target.view(-1)                               # 54
    arange_1d = torch.arange(start=0, end=logits_2d.size()[0])              # 55: int64 [s*b]
    predicted_logits_1d = logits_2d[arange_1d, masked_target_1d]            # 56: f32 [s*b]
    predicted_logits_1d = predicted_logits_1d.clone().contiguous()          # 57: a second, 56's dies
    predicted_logits = predicted_logits_1d.view_as(target)                  # 58
    predicted_logits[target_mask] = 0.0                                     # 59
    exp_logits = vocab_parallel_logits                                      # 61
    torch.exp(vocab_parallel_logits, out=exp_logits)                        # 62: in place
    sum_exp_logits = exp_logits.sum(dim=-1)                                 # 63: f32 [s, b]
    return target_mask, masked_target_1d, predicted_logits, sum_exp_logits, exp_logits


def calculate_cross_entropy_loss(exp_logits, predicted_logits, sum_exp_logits):
    """cross_entropy.py 68-79."""
    loss = torch.log(sum_exp_logits) - predicted_logits        # 74: log's temporary, then the loss
    exp_logits.div_(sum_exp_logits.unsqueeze(dim=-1))           # 77: the softmax, in place
    return exp_logits, loss


def prepare_gradient_calculation_operands(softmax, target_mask):
    """cross_entropy.py 82-98."""
    grad_input = softmax                                        # 88: the saved softmax itself
    partition_vocab_size = softmax.size()[-1]
    grad_2d = grad_input.view(-1, partition_vocab_size)
    arange_1d = torch.arange(start=0, end=grad_2d.size()[0])    # 94: int64 [s*b]
    softmax_update = 1.0 - target_mask.view(-1).float()         # 96: f32 [s*b]; .float()'s dies
    return grad_2d, arange_1d, softmax_update, grad_input


def calculate_gradients(grad_2d, arange_1d, masked_target_1d, softmax_update, grad_input, grad_output):
    """cross_entropy.py 101-116."""
    grad_2d[arange_1d, masked_target_1d] -= softmax_update      # 111: gather, sub_, scatter back
    grad_input.mul_(grad_output.unsqueeze(dim=-1))              # 114: in place
    return grad_input


class VocabParallelCrossEntropy(torch.autograd.Function):
    """_VocabParallelCrossEntropy (cross_entropy.py 119-210), label_smoothing = 0: logits
    [s, b, V/t] and int64 targets [s, b] -> the per-token loss [s, b]. Saves the softmax (the
    logits' own storage), the target mask and the masked target; backward writes the gradient
    into the softmax and returns it."""

    @staticmethod
    def forward(ctx, vocab_parallel_logits, target):
        vocab_parallel_logits, logits_max = calculate_logits_max(vocab_parallel_logits)  # 127
        dist.all_reduce(logits_max, op=dist.ReduceOp.MAX, group=common.GROUP)           # 130
        common.flush()
        partition_vocab_size = vocab_parallel_logits.size()[-1]
        start = dist.get_rank(common.GROUP) * partition_vocab_size                       # 133-137
        (target_mask, masked_target_1d, predicted_logits, sum_exp_logits,
         exp_logits) = calculate_predicted_logits(vocab_parallel_logits, target, logits_max,
                                                  start, start + partition_vocab_size)  # 139-143
        common.all_reduce(predicted_logits)                                              # 146
        common.all_reduce(sum_exp_logits)                                                # 150
        exp_logits, loss = calculate_cross_entropy_loss(exp_logits, predicted_logits,
                                                        sum_exp_logits)                 # 154
        ctx.save_for_backward(exp_logits, target_mask, masked_target_1d)                 # 181
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        softmax, target_mask, masked_target_1d = ctx.saved_tensors                       # 190
        grad_2d, arange_1d, softmax_update, grad_input = prepare_gradient_calculation_operands(
            softmax, target_mask)                                                        # 193
        grad_input = calculate_gradients(grad_2d, arange_1d, masked_target_1d, softmax_update,
                                         grad_input, grad_output)                        # 206
        return grad_input, None
