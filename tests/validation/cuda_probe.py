#!/usr/bin/env python3
"""Asks PyTorch on a CUDA GPU two questions memest's rules depend on, and prints the answers as JSON.

1. Which SDPA kernel runs a call (torch._fused_sdp_choice: 0 math, 1 flash, 2 memory-efficient,
   3 cuDNN, as SDPBackend numbers them) for the shapes the recorded models use, in bfloat16,
   float16 and float32, with and without grad, dropout and a causal mask; and the memory order of
   the output (its strides).
2. What a reduction over many rows allocates beyond its input and output (Reduce.cuh's global
   staging buffer and semaphores when the rows are split across blocks): x.sum(0) of [N, C] for a
   grid of N and C, as the bias gradient of a linear layer (or a norm's weight gradient) is.

    python3 tests/validation/cuda_probe.py [--out FILE]

Needs torch with CUDA; exits 1 without a GPU.
"""
import argparse
import json
import sys

import torch

BACKENDS = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn"}


def sdpa_choices(device):
    rows = []
    shapes = [(4, 12, 1024, 64), (4, 16, 1024, 64), (8, 12, 512, 64), (32, 8, 256, 64),
              (16, 12, 197, 64), (1, 16, 512, 192)]
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for (b, h, l, d) in shapes:
            for grad in (True, False):
                for dropout in (0.0, 0.1):
                    for causal in (False, True):
                        q, k, v = (torch.randn(b, l, h, d, device=device, dtype=dtype).transpose(1, 2)
                                   .requires_grad_(grad) for _ in range(3))
                        choice = torch._fused_sdp_choice(q, k, v, None, dropout, causal)
                        row = {"dtype": str(dtype).split(".")[-1], "shape": [b, h, l, d],
                               "grad": grad, "dropout": dropout, "causal": causal,
                               "backend": BACKENDS.get(int(choice), str(choice))}
                        if (b, h, l, d) == shapes[0] or (b, h, l, d) == shapes[3]:
                            ctx = torch.enable_grad() if grad else torch.no_grad()
                            with ctx:
                                out = torch.nn.functional.scaled_dot_product_attention(
                                    q, k, v, dropout_p=dropout, is_causal=causal)
                            row["out_strides"] = list(out.stride())
                            del out
                        rows.append(row)
                        del q, k, v
    return rows


def reduction_scratch(device):
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for n in (1024, 2048, 3152, 4096, 8192, 16384, 32768, 65536):
            for c in (512, 768, 1024, 2048, 3072, 4096):
                x = torch.randn(n, c, device=device, dtype=dtype)
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                y = x.sum(0)
                torch.cuda.synchronize()
                extra = torch.cuda.max_memory_allocated() - base - y.untyped_storage().nbytes()
                rows.append({"dtype": str(dtype).split(".")[-1], "n": n, "c": c,
                             "scratch": extra})
                del x, y
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("cuda_probe: no CUDA device", file=sys.stderr)
        return 1
    device = torch.device("cuda", 0)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
              "multiprocessors": torch.cuda.get_device_properties(0).multi_processor_count,
              "sdpa": sdpa_choices(device), "reduction_scratch": reduction_scratch(device)}
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
