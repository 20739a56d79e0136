#!/usr/bin/env python3
"""Three-way validation: memest's estimate, memest's validation on the GPU, and PyTorch itself.

For each configuration below (a preset, a batch, a precision and an optimizer; each fits one
H100 80GB by memest's own estimate) this writes one row of docs/validation.md:

  1. memest estimate: `memest estimate --local --json` (always available, no GPU needed);
  2. memest validate: `memest validate --json` against a `memest-server --device 0` this script
     starts, which replays memest's predicted step on the GPU (only when
     torch.cuda.is_available() and the server answers Validate);
  3. PyTorch: the same model written here in plain torch.nn, run on the same GPU in a process
     of its own: cuBLAS warm-up, one warm-up training step, reset_peak_memory_stats(), one
     measured steady-state step; max_memory_allocated() and max_memory_reserved().

Without a GPU the two GPU columns read "not yet measured": they are never filled by hand and
never from a fake device.

    /usr/bin/python3 tests/validation/three_way.py [--build build] [--out docs/validation.md]
        [--json rows.json] [--only NAME] [--skip-torch]

Exit status: 0 when everything that could run ran; 1 when the memest CLI, the server or a
PyTorch measurement failed (the estimate failing stops the run; the doc is still written for
later failures, with the failing cells marked FAILED); 2 for bad arguments.

Standard library and torch only; runs under PyTorch 1.13 on the CPU (the estimate column only)
and PyTorch 2.x with CUDA. tests/validation/test_three_way_models.py checks on the CPU that the
models below have memest's parameter counts and buffer bytes.
"""
import argparse
import dataclasses
import datetime
import json
import os
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

try:
    import torch
    from torch import nn
    import torch.nn.functional as F
except ImportError:  # the estimate column needs no torch
    torch = nn = F = None

from torch_models import build_model, make_optimizer, parameter_count, train_step  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIT_DEVICE = "h100-80gb"  # every configuration must fit it by memest's own estimate
NOT_MEASURED = "not yet measured"
TORCH_RESULT_PREFIX = "THREE_WAY_TORCH "
# Environment that would change what PyTorch allocates away from memest's defaults
# (expandable_segments off, the default cuBLAS workspace); unset for the PyTorch process.
ALLOCATOR_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "CUBLAS_WORKSPACE_CONFIG")


# ---------------------------------------------------------------------------------------------
# The configurations

@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    preset: str
    batch: int
    precision: str  # memest --precision: fp32 | bf16 (autocast, float32 parameters)
    optimizer: str  # memest --optimizer: adamw | momentum
    seq: Optional[int] = None
    params: Tuple[Tuple[str, int], ...] = ()  # other preset parameters (--param NAME=INT)

    def memest_flags(self) -> List[str]:
        """The model and run flags shared by `memest estimate` and `memest validate`."""
        flags = ["--preset", self.preset, "--batch", str(self.batch)]
        if self.seq is not None:
            flags += ["--seq", str(self.seq)]
        for name, value in self.params:
            flags += ["--param", f"{name}={value}"]
        # memest's defaults, spelled out: a steady-state step, foreach optimizer, no weight
        # decay, zero_grad(set_to_none=True), no checkpointing.
        flags += ["--precision", self.precision, "--optimizer", self.optimizer,
                  "--optimizer-impl", "foreach"]
        # The reference models (torch_models.py) write attention out by hand: memest's eager
        # form, not the SDPA it assumes by default on CUDA. Their forward returns the loss
        # alone, which the loop holds: no outputs, no past_key_values.
        flags += ["--attention", "eager", "--no-hold-outputs"]
        return flags

    def overrides(self) -> Dict[str, int]:
        out = dict(self.params)
        if self.seq is not None:
            out["seq"] = self.seq
        return out


CONFIGS = [
    Config("mlp", "mlp", batch=256, precision="fp32", optimizer="adamw"),
    Config("gpt2-small", "gpt2-small", batch=8, seq=1024, precision="bf16", optimizer="adamw"),
    Config("gpt2-medium", "gpt2-medium", batch=4, seq=1024, precision="bf16", optimizer="adamw"),
    Config("resnet18", "resnet18", batch=64, params=(("image", 224),), precision="fp32",
           optimizer="momentum"),
    Config("bert-base", "bert-base", batch=16, seq=512, precision="fp32", optimizer="adamw"),
]

PRECISION_TEXT = {"fp32": "fp32", "bf16": "bf16 autocast, fp32 parameters"}
OPTIMIZER_TEXT = {
    "adamw": "AdamW(foreach=True, weight_decay=0)",
    "momentum": "SGD(momentum=0.9, foreach=True, weight_decay=0)",
}


# ---------------------------------------------------------------------------------------------
# The PyTorch measurement: runs in a process of its own per configuration (a fresh caching
# allocator, no other model's blocks), started by the main run with --torch-worker SPEC.

def torch_worker(spec):
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.manual_seed(0)
    # cuBLAS workspaces: one per (handle, stream), and backward runs on autograd's own thread,
    # which has its own handle; a matmul forward and backward allocates both.
    a = torch.randn(256, 256, device=device, requires_grad=True)
    (a @ a).sum().backward()
    del a
    torch.cuda.synchronize()
    workspace_bytes = torch.cuda.memory_allocated(device)

    if spec["precision"] not in ("fp32", "bf16"):
        raise SystemExit(f"precision {spec['precision']}: not mapped to PyTorch here")
    autocast_dtype = torch.bfloat16 if spec["precision"] == "bf16" else None
    values, preset = spec["values"], spec["preset"]
    model = build_model(preset, values, "cpu")
    count = parameter_count(model)
    if count != spec["expected_parameters"]:
        raise SystemExit(f"{spec['name']}: the PyTorch model has {count} parameters, memest's "
                         f"preset {spec['expected_parameters']}")
    model.to(device)
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    model.train()
    optimizer = make_optimizer(spec["optimizer"], model.parameters())

    train_step(model, optimizer, preset, values, spec["batch"], device, autocast_dtype)  # warm-up
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    train_step(model, optimizer, preset, values, spec["batch"], device, autocast_dtype)
    torch.cuda.synchronize()
    result = {
        "peak_allocated": torch.cuda.max_memory_allocated(device),
        "peak_reserved": torch.cuda.max_memory_reserved(device),
        "allocated_before_step": before,
        "allocated_after_step": torch.cuda.memory_allocated(device),
        "cublas_warmup_bytes": workspace_bytes,
        "parameters": count,
        "device_name": torch.cuda.get_device_name(device),
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
    }
    print(TORCH_RESULT_PREFIX + json.dumps(result), flush=True)


def probe():
    """What this interpreter's torch sees: printed as JSON by --probe (a process of its own, so
    the main run never holds a CUDA context while the server and the measurements run)."""
    out = {"torch_version": None, "cuda_version": None, "cuda_available": False,
           "device_name": None, "total_memory": None}
    if torch is not None:
        out["torch_version"] = torch.__version__
        out["cuda_version"] = torch.version.cuda
        if torch.cuda.is_available():
            out["cuda_available"] = True
            out["device_name"] = torch.cuda.get_device_name(0)
            out["total_memory"] = torch.cuda.get_device_properties(0).total_memory
    print(json.dumps(out), flush=True)


# ---------------------------------------------------------------------------------------------
# The memest CLI and server.

class Failure(Exception):
    """A step that failed; its message goes into the doc's cell footnote and stderr."""


def tail(text, lines=15):
    return "\n".join(text.strip().splitlines()[-lines:])


def last_line(text):
    """The last line of a process's stderr (the error of a CLI, the exception of a traceback);
    the whole tail goes to this script's stderr."""
    if text.strip():
        print(tail(text), file=sys.stderr)
    return tail(text, 1) or "(no output)"


def run_memest(memest, args, timeout=120, ok_codes=(0,)):
    """Runs `memest ARGS` and returns (exit code, parsed JSON stdout)."""
    cmd = [memest] + args
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Failure(f"`{shlex.join(cmd)}` timed out after {timeout} s")
    if proc.returncode not in ok_codes:
        raise Failure(f"`{shlex.join(cmd)}` exited {proc.returncode}: {tail(proc.stderr)}")
    try:
        return proc.returncode, json.loads(proc.stdout)
    except json.JSONDecodeError as e:
        raise Failure(f"`{shlex.join(cmd)}`: not JSON on stdout ({e}): {proc.stdout[:300]!r}")


def catalog_device(memest, name, total_memory):
    """The memest catalog entry of a GPU named `name` (torch.cuda.get_device_name), or None."""
    _, listing = run_memest(memest, ["devices", "--local", "--json"])
    words = [w for w in "".join(c if c.isalnum() else " " for c in name.lower()).split()]
    tokens = set(words) | {a + b for a, b in zip(words, words[1:])}
    matches = []
    for dev in listing.get("devices", []):
        family = dev["name"].rsplit("-", 1)[0] if dev["name"][-2:] == "gb" else dev["name"]
        if family.replace("-", "") in tokens:
            matches.append(dev)
    if not matches:
        return None
    return min(matches, key=lambda d: abs(int(d["capacityBytes"]) - (total_memory or 0)))["name"]


class Server:
    """memest-server --device 0 on a free port; stopped with SIGTERM."""

    def __init__(self, binary):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [binary, "--address", "127.0.0.1:0", "--device", "0", "--log-level", "warn"],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.address = self._read_address(timeout=60)

    def _read_address(self, timeout):
        prefix = "memest-server listening on "
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                line = self.proc.stdout.readline()
                if line.startswith(prefix):
                    return line[len(prefix):].strip()
                if not line:
                    break
            elif self.proc.poll() is not None:
                break
        self.stop()
        raise Failure(f"memest-server did not start: {self.log_tail()}")

    def log_tail(self):
        self.log.seek(0)
        return tail(self.log.read())

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# The server cannot validate at all (built without CUDA, or no usable device): the column is
# "not measured", which is not a failure of this run.
def server_cannot_validate(message):
    return "UNAVAILABLE" in message and ("cannot validate" in message or "does not validate" in message)


# ---------------------------------------------------------------------------------------------
# One run.

@dataclasses.dataclass
class Cell:
    """A pair (peak allocated, peak reserved) from one source, or why there is none."""
    allocated: Optional[int] = None
    reserved: Optional[int] = None
    status: str = NOT_MEASURED  # "ok", NOT_MEASURED, "skipped (--skip-torch)", "not measured: ..." or "FAILED"
    detail: str = ""

    @property
    def ok(self):
        return self.status == "ok"


@dataclasses.dataclass
class Row:
    config: Config
    values: Dict[str, int]
    parameters: int
    estimate: Cell
    validate: Cell
    torch: Cell
    fits_h100: bool
    raw: dict


def estimate(memest, config, device_flags):
    # Exit code 2 is "does not fit the device", with the estimate on stdout all the same.
    _, out = run_memest(memest, ["estimate", "--local", "--json", "--no-advice"]
                        + config.memest_flags() + device_flags, ok_codes=(0, 2))
    return out


def preset_values(presets, config):
    info = next((p for p in presets if p["name"] == config.preset), None)
    if info is None:
        raise Failure(f"{config.name}: memest has no preset {config.preset!r}")
    values = {p["name"]: int(p["defaultValue"]) for p in info["params"]}
    for name, value in config.overrides().items():
        if name not in values:
            raise Failure(f"{config.name}: preset {config.preset} has no parameter {name!r}")
        values[name] = value
    return values


def validate(memest, address, config):
    args = ["validate", "--server", address, "--json", "--quiet", "--repeats", "1",
            "--deadline-ms", str(30 * 60 * 1000)] + config.memest_flags()
    cmd = [memest] + args
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=31 * 60)
    except subprocess.TimeoutExpired:
        return Cell(status="FAILED", detail=f"`{shlex.join(cmd)}` timed out"), {}
    if proc.returncode != 0:
        message = tail(proc.stderr)
        if server_cannot_validate(message):
            return Cell(status="not measured: the server cannot validate", detail=message), {}
        return Cell(status="FAILED", detail=f"`{shlex.join(cmd)}` exited {proc.returncode}: "
                                            f"{last_line(proc.stderr)}"), {}
    result = json.loads(proc.stdout)
    device = result.get("device", {})
    if "fake" in device.get("name", "").lower() or device.get("driverVersion") == "fake":
        return Cell(status="FAILED", detail="the server validated on a fake device; not a measurement"), result
    if result.get("scaledDown"):
        return Cell(status="FAILED", detail=f"the batch was scaled down: {result.get('scaledDownNote')}"), result
    alloc, reserved = result.get("peakAllocated", {}), result.get("peakReserved", {})
    if not (alloc.get("measured") and reserved.get("measured")):
        return Cell(status="FAILED", detail="the validation did not measure the peaks"), result
    return Cell(int(alloc.get("measuredBytes", 0)), int(reserved.get("measuredBytes", 0)), "ok"), result


def measure_torch(config, values, parameters):
    spec = {"name": config.name, "preset": config.preset, "values": values, "batch": config.batch,
            "precision": config.precision, "optimizer": config.optimizer,
            "expected_parameters": parameters}
    env = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_ENV}
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=30 * 60, env=env)
    except subprocess.TimeoutExpired:
        return Cell(status="FAILED", detail="the PyTorch measurement timed out"), {}
    lines = [l for l in proc.stdout.splitlines() if l.startswith(TORCH_RESULT_PREFIX)]
    if proc.returncode != 0 or not lines:
        return Cell(status="FAILED", detail=f"the PyTorch measurement exited {proc.returncode}: "
                                            f"{last_line(proc.stderr)}"), {}
    out = json.loads(lines[-1][len(TORCH_RESULT_PREFIX):])
    return Cell(out["peak_allocated"], out["peak_reserved"], "ok"), out


def gib(n):
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def rel(memest_bytes, torch_bytes):
    return (memest_bytes - torch_bytes) / torch_bytes


def pair_text(cell, reference, notes):
    """The (allocated, reserved) cells of one source; a failure's detail becomes a note."""
    if not cell.ok:
        text = cell.status
        if cell.detail:
            notes.append(cell.detail)
            text += f" [{len(notes)}]"
        return text, text
    out = []
    for which in ("allocated", "reserved"):
        value = getattr(cell, which)
        text = gib(value)
        if reference is not None and reference.ok:
            text += f" ({rel(value, getattr(reference, which)):+.2%})"
        out.append(text)
    return tuple(out)


def render(rows, context):
    notes = []
    lines = []
    w = lines.append
    w("# Validation: memest against PyTorch on one GPU")
    w("")
    w("<!-- Generated by tests/validation/three_way.py; do not edit by hand: rerun it. -->")
    w("")
    w(f"- Command: `{context['command']}` (run in {context['cwd']})")
    w(f"- Date: {context['date']}")
    w(f"- Device: {context['device']}")
    w(f"- PyTorch: {context['torch']}")
    w(f"- memest: {context['memest']}")
    w(f"- Estimates for: `--device {context['estimate_device']}`" if context["estimate_device"]
      else "- Estimates for: the GPU's capacity (`--capacity`), which is not in memest's catalog")
    if context["failures"]:
        w(f"- **This run had {context['failures']} failure(s); see the notes under the table.**")
    w("")
    w("Each row is one steady-state training step (the optimizer state exists already) of a "
      "memest preset. Every number is the peak over the step of memory in PyTorch's CUDA caching "
      "allocator: *allocated* as `torch.cuda.max_memory_allocated()` reports it, *reserved* as "
      "`torch.cuda.max_memory_reserved()` does; the CUDA context is in neither. The percentages "
      "are memest's relative error against PyTorch, (memest - PyTorch) / PyTorch: positive when "
      "memest says more.")
    w("")
    w("| configuration | estimate: allocated | estimate: reserved | validate: allocated "
      "| validate: reserved | PyTorch: allocated | PyTorch: reserved |")
    w("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        cells = (pair_text(row.estimate, row.torch, notes) + pair_text(row.validate, row.torch, notes)
                 + pair_text(row.torch, None, notes))
        w(f"| {row.config.name} | " + " | ".join(cells) + " |")
    w("")
    for i, note in enumerate(notes, 1):
        w(f"[{i}] " + " ".join(note.split()))
        w("")
    w("## Configurations")
    w("")
    w("| configuration | memest flags | PyTorch | parameters | fits h100-80gb (memest) |")
    w("| --- | --- | --- | ---: | --- |")
    for row in rows:
        c = row.config
        w(f"| {c.name} | `{shlex.join(c.memest_flags())}` | {PRECISION_TEXT[c.precision]}, "
          f"{OPTIMIZER_TEXT[c.optimizer]}, batch {c.batch} | {row.parameters:,} | "
          f"{'yes' if row.fits_h100 else 'NO'} |")
    w("")
    w("## The columns")
    w("")
    for paragraph in COLUMN_TEXT:
        w(paragraph)
        w("")
    w("## The PyTorch models")
    w("")
    for item in MODEL_NOTES:
        w("- " + item)
    w("")
    w("## How to reproduce")
    w("")
    w("On a machine with an NVIDIA GPU, PyTorch 2.x with CUDA and memest built with CUDA "
      "(`build/bin/memest`, `build/bin/memest-server`, `build/bin/memest-validate-worker`), from "
      "the repository root:")
    w("")
    w("```sh")
    w("python3 tests/validation/three_way.py            # all rows; --only NAME for one, --json FILE for the raw numbers")
    w("```")
    w("")
    w("Without a GPU the script fills the estimate columns only and writes \"not yet measured\" "
      "in the others. `tests/validation/test_three_way_models.py` checks on the CPU that the "
      "PyTorch models have exactly the parameters and buffers of memest's presets.")
    return "\n".join(lines) + "\n"


MODEL_NOTES = [
    "They are written in `tests/validation/three_way.py` (no transformers or torchvision needed), "
    "each asserted to have memest's `parameter_count` before it runs; "
    "`tests/validation/test_three_way_models.py` also checks on the CPU that their parameter and "
    "buffer bytes equal memest's (tied weights once, causal masks, BatchNorm statistics, id buffers).",
    "GPT-2: Hugging Face `GPT2LMHeadModel` with eager attention: HF's `Conv1D` (addmm), a causal "
    "`bias` buffer of n_positions x n_positions per layer, `torch.where` with `finfo.min`, softmax, "
    "the cast back to the values' dtype (`attn_weights.type(value.dtype)`, a float32 to bfloat16 "
    "copy under autocast), dropout 0.1 throughout, `gelu_new` written out as HF's "
    "`NewGELUActivation`, `lm_head` tied to `wte`, and the loss as HF computes it "
    "(`logits.float()`, cross_entropy; the label shift, a few int64 bytes, is left out).",
    "BERT: Hugging Face `BertForMaskedLM` (post-LN, exact GELU, dropout 0.1), eager attention "
    "without an attention mask (the batch has no padding), the masked-LM decoder tied to the word "
    "embeddings with its own bias, cross_entropy at every position.",
    "ResNet: torchvision's `resnet18` (BasicBlock, in-place ReLU, `out += identity`, BatchNorm in "
    "training mode). MLP: memest's own preset, Linear + ReLU blocks and a Linear head.",
    "Batches are made inside each step on the GPU (int64 token ids and labels, or float32 images "
    "and int64 classes) and dropped after backward, before the optimizer step, as memest's step "
    "model does.",
]


COLUMN_TEXT = [
    "**estimate.** `memest estimate --local --json` with the row's flags, the engine run in-process "
    "without a server or a GPU: `peak.allocated_bytes` and `peak_reserved_bytes` of the "
    "EstimateResponse. It is what a user gets before running anything, and it is available on "
    "every machine, so this column is always filled. The engine walks its schedule of the step "
    "(forward op by op, loss, backward, optimizer step) and rounds every allocation as the "
    "caching allocator does; reserved comes from its simulation of the allocator's segments. "
    "The device flag only sets the fixed costs inside these peaks, such as the size of the "
    "cuBLAS workspaces.",
    "**validate.** `memest validate --json` against a `memest-server --device 0` that the script "
    "starts on the GPU: `peak_allocated.measured_bytes` and `peak_reserved.measured_bytes` of "
    "the ValidationResult. The server replays memest's own predicted schedule on the device: "
    "every allocation and free goes through PyTorch's caching policy on real device memory, each "
    "op runs its kernels at the model's shapes, and the cuDNN workspace the convolutions really "
    "ask for is allocated as PyTorch would. It measures what memest's schedule costs on the "
    "hardware, not what PyTorch does: a gap between it and PyTorch points to the op rules or the "
    "schedule, a gap between it and the estimate to the allocator model or the workspaces. It "
    "is filled only when `torch.cuda.is_available()` and the server answers Validate; a fake "
    "device is refused.",
    "**PyTorch.** The same model written in plain `torch.nn` in the script (the structure of the "
    "Hugging Face or torchvision module the preset names, checked to have memest's parameter "
    "count), run on the same GPU in a fresh process: a small matmul forward and backward first, "
    "which allocates the cuBLAS workspaces of the main and the autograd thread, one warm-up "
    "training step, `torch.cuda.reset_peak_memory_stats()`, then one measured step (batch, "
    "forward and loss, under `torch.autocast(\"cuda\", dtype=torch.bfloat16)` for bf16 with "
    "float32 parameters, backward, `optimizer.step()`, `zero_grad(set_to_none=True)`), and "
    "`torch.cuda.max_memory_allocated()` and `max_memory_reserved()` after it. The optimizers "
    "are memest's defaults made explicit: `foreach=True`, `weight_decay=0`. "
    "`PYTORCH_CUDA_ALLOC_CONF` and `CUBLAS_WORKSPACE_CONFIG` are unset for it, as memest assumes "
    "PyTorch's defaults. This is the reference the percentages are computed against.",
    "**The percentages.** Each memest number is followed by (memest - PyTorch) / PyTorch for the "
    "same quantity on the same row, when PyTorch was measured: positive means memest predicts "
    "more memory than PyTorch used, negative less (the dangerous direction: a job planned on it "
    "could run out of memory). Allocated errors judge the op rules and the schedule; reserved "
    "errors add the allocator model. A cell reading \"not yet measured\" was not run on a GPU; "
    "it is never filled by hand.",
]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default=os.path.join(REPO, "build"),
                        help="build directory holding bin/memest and bin/memest-server")
    parser.add_argument("--out", default=os.path.join(REPO, "docs", "validation.md"))
    parser.add_argument("--json", dest="json_out", help="also write the raw rows as JSON here")
    parser.add_argument("--only", help="run one configuration: " + ", ".join(c.name for c in CONFIGS))
    parser.add_argument("--skip-torch", action="store_true", help="leave out the PyTorch column")
    parser.add_argument("--torch-worker", help=argparse.SUPPRESS)
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.torch_worker:
        torch_worker(json.loads(args.torch_worker))
        return 0
    if args.probe:
        probe()
        return 0

    configs = CONFIGS
    if args.only:
        configs = [c for c in CONFIGS if c.name == args.only]
        if not configs:
            parser.error(f"--only {args.only}: unknown; known: {', '.join(c.name for c in CONFIGS)}")
    memest = os.path.join(args.build, "bin", "memest")
    if not os.access(memest, os.X_OK):
        print(f"three_way: {memest}: not found; build it (ninja -C build memest)", file=sys.stderr)
        return 1

    shown_argv = [os.path.relpath(os.path.abspath(__file__), os.getcwd())] + list(sys.argv[1:] if argv is None else argv)
    try:
        return run(args, configs, memest, shown_argv)
    except Failure as e:
        print(f"three_way: {e}", file=sys.stderr)
        return 1


def run(args, configs, memest, shown_argv):
    started = datetime.datetime.now(datetime.timezone.utc)
    probe_proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                timeout=300)
    if probe_proc.returncode != 0:
        raise Failure(f"probing torch failed: {tail(probe_proc.stderr)}")
    env = json.loads(probe_proc.stdout.strip().splitlines()[-1])
    cuda = env["cuda_available"]
    say = lambda *a: print("three_way:", *a, file=sys.stderr, flush=True)
    say(f"torch {env['torch_version']}, CUDA available: {cuda}"
        + (f", device 0: {env['device_name']}" if cuda else ""))

    # 1. The estimates (and the fit on an H100 80GB, which every configuration must pass).
    estimate_device = FIT_DEVICE
    device_flags = ["--device", FIT_DEVICE]
    if cuda:
        estimate_device = catalog_device(memest, env["device_name"], env["total_memory"])
        device_flags = (["--device", estimate_device] if estimate_device
                        else ["--capacity", str(env["total_memory"])])
    _, presets = run_memest(memest, ["presets", "--local", "--json"])
    rows = []
    for config in configs:
        values = preset_values(presets["presets"], config)
        est = estimate(memest, config, device_flags)
        fit = est if estimate_device == FIT_DEVICE else estimate(memest, config, ["--device", FIT_DEVICE])
        fits = bool(fit.get("fit", {}).get("fits"))
        if not fits:
            raise Failure(f"{config.name}: does not fit {FIT_DEVICE} by memest's estimate; "
                          "the configurations must")
        cell = Cell(int(est["peak"]["allocatedBytes"]), int(est["peakReservedBytes"]), "ok")
        say(f"{config.name}: estimate {gib(cell.allocated)} allocated, {gib(cell.reserved)} reserved")
        rows.append(Row(config, values, int(est["parameterCount"]), cell, Cell(), Cell(), fits,
                        {"estimate": est}))

    # 2. memest validate, against a server on GPU 0 (before any PyTorch process holds memory).
    if cuda:
        server = None
        try:
            server = Server(os.path.join(args.build, "bin", "memest-server"))
        except Failure as e:
            for row in rows:
                row.validate = Cell(status="FAILED", detail=str(e))
        if server is not None:
            try:
                for i, row in enumerate(rows):
                    say(f"{row.config.name}: validating on {server.address} ...")
                    row.validate, row.raw["validate"] = validate(memest, server.address, row.config)
                    say(f"{row.config.name}: validate {row.validate.status}")
                    if row.validate.status.startswith("not measured"):
                        for later in rows[i + 1:]:  # the server cannot validate anything
                            later.validate = dataclasses.replace(row.validate)
                        break
            finally:
                server.stop()

    # 3. PyTorch, one fresh process per configuration.
    for row in rows:
        if args.skip_torch:
            row.torch = Cell(status="skipped (--skip-torch)")
        elif cuda:
            say(f"{row.config.name}: measuring PyTorch ...")
            row.torch, row.raw["torch"] = measure_torch(row.config, row.values, row.parameters)
            say(f"{row.config.name}: PyTorch {row.torch.status}"
                + (f" {gib(row.torch.allocated)} allocated" if row.torch.ok else ""))

    failures = sum(c.status == "FAILED" for r in rows for c in (r.validate, r.torch))
    device = (f"{env['device_name']} (torch.cuda.get_device_name(0))" if cuda else
              "none: torch.cuda.is_available() is False here, so the GPU columns are not measured")
    torch_text = (f"{env['torch_version']}" + (f", CUDA {env['cuda_version']}" if env["cuda_version"] else "")
                  if env["torch_version"] else "not installed")
    context = {
        "command": shlex.join([sys.executable] + shown_argv),
        "cwd": ("the repository root" if os.path.abspath(os.getcwd()) == REPO
                else f"`{os.path.abspath(os.getcwd())}`"),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "device": device,
        "torch": torch_text,
        "memest": git_description(),
        "estimate_device": estimate_device,
        "failures": failures,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(render(rows, context))
    say(f"wrote {args.out}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"context": context, "rows": [row_json(r) for r in rows]}, f, indent=1)
        say(f"wrote {args.json_out}")
    for row in rows:
        for name, cell in (("validate", row.validate), ("PyTorch", row.torch)):
            if cell.status == "FAILED":
                say(f"{row.config.name}: {name} FAILED: {cell.detail}")
    return 1 if failures else 0


def row_json(row):
    def cell(c):
        return dataclasses.asdict(c)
    return {"name": row.config.name, "memest_flags": row.config.memest_flags(),
            "preset_values": row.values, "parameters": row.parameters, "fits_h100_80gb": row.fits_h100,
            "estimate": cell(row.estimate), "validate": cell(row.validate), "torch": cell(row.torch),
            "raw": row.raw}


def git_description():
    try:
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True).stdout.strip()
    except OSError:
        head = ""
    if not head:  # a copy of the tree without git (a GPU machine): the commit it was made from
        return f"commit {os.environ['MEMEST_COMMIT']}" if os.environ.get("MEMEST_COMMIT") else "unknown commit"
    return f"commit {head}" + (" with uncommitted changes" if dirty else "")


if __name__ == "__main__":
    sys.exit(main())
