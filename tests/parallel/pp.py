"""Pipeline parallelism with plain send/recv: each rank is one stage of models.gpt (the first
holds the embeddings, the last the final LayerNorm, the head and the loss), written as
Megatron-LM writes its non-interleaved schedule (megatron/core/pipeline_parallel/schedules.py
forward_backward_pipelining_without_interleaving, p2p_communication.py; NVIDIA/Megatron-LM
d98e8a6):

* 1F1B: `warmup = min(p - rank - 1, m)` forwards, then one forward and one backward in turn,
  then the remaining backwards. GPipe (all forwards, then all backwards, as
  torch.distributed.pipelining's ScheduleGPipe orders them) is the same code with warmup = m.
* Every receive allocates its buffer: `torch.empty(shape, requires_grad=True)` (_communicate);
  the received activation is the stage's input until that micro-batch's backward, the
  received gradient lives until the loop variable holding it is reassigned.
* `deallocate_output_tensor` (Megatron's default in training): once sent, a stage output's
  .data becomes a 1-element tensor (only its grad_fn is kept), and the backward runs through
  `custom_backward` (the engine called directly, no shape check). Cases marked keep-outputs keep
  the outputs whole until their backward, as torch.distributed.pipelining does.
* Sends and receives of one exchange are posted together (isend/irecv) and waited on, as
  batch_isend_irecv does. The loss is not divided by m here (one 0-dim tensor less).

Phases: "<step>.F<j>" from the start of micro-batch j's forward (its receive included),
"<step>.B<j>" from the start of its backward (the receive of its gradient included when it is
separate), then OPTIMIZER_STEP.
"""
import functools

import torch
import torch.distributed as dist

import common
from common import (ParamStore, Recorder, SavedBytes, Trace, model_state, optimizer_state_tensors,
                    param_storages, run_inputs)
import measure
import models

GPT = {"vocab": 512, "t": 16, "d": 64, "heads": 4}


class Stage:
    def __init__(self, rank, p, layers, b, deallocate):
        per = layers // p
        self.rank, self.p, self.b = rank, p, b
        self.first, self.last = rank == 0, rank == p - 1
        self.lo, self.hi = rank * per, (rank + 1) * per
        self.fn = functools.partial(models.gpt_stage, lo=self.lo, hi=self.hi, first=self.first,
                                    last=self.last, **GPT)
        self.shape = [b, GPT["t"], GPT["d"]]
        self.deallocate = deallocate
        self.store = ParamStore(seed=rank)
        self.plan = common.record(self.store, self.fn, b)

    # ---------------------------------------------------------------- p2p_communication.py
    def _communicate(self, send_next=None, send_prev=None, recv_prev=False, recv_next=False):
        prev = torch.empty(self.shape, requires_grad=True) if recv_prev else None
        nxt = torch.empty(self.shape, requires_grad=True) if recv_next else None
        g, reqs = common.GROUP, []
        if send_prev is not None:
            reqs.append(dist.isend(send_prev, self.rank - 1, group=g))
        if prev is not None:
            reqs.append(dist.irecv(prev, self.rank - 1, group=g))
        if send_next is not None:
            reqs.append(dist.isend(send_next, self.rank + 1, group=g))
        if nxt is not None:
            reqs.append(dist.irecv(nxt, self.rank + 1, group=g))
        for r in reqs:
            r.wait()
        return prev, nxt

    def recv_forward(self):
        return None if self.first else self._communicate(recv_prev=True)[0]

    def send_forward(self, out):
        if not self.last:
            self._communicate(send_next=out)

    def recv_backward(self):
        return None if self.last else self._communicate(recv_next=True)[1]

    def send_backward(self, grad):
        if not self.first:
            self._communicate(send_prev=grad)

    def send_forward_recv_backward(self, out):
        return None if self.last else self._communicate(send_next=out, recv_next=True)[1]

    def send_backward_recv_forward(self, grad):
        return None if self.first else self._communicate(send_prev=grad, recv_prev=True)[0]

    # ---------------------------------------------------------------- schedules.py
    def forward_step(self, input_tensor):
        rec = Recorder(self.store, plan=self.plan, training=True)
        run_inputs(rec, {} if self.first else {"h_in": input_tensor})
        out = rec.take(self.fn(rec, self.b))
        rec.release_all()
        return out

    def deallocate_output_tensor(self, out):
        if self.deallocate and out is not None:
            out.data = torch.empty((1,), dtype=out.dtype)

    def backward_step(self, input_tensor, output_tensor, output_tensor_grad):
        if input_tensor is not None:
            input_tensor.retain_grad()
        if self.deallocate:  # custom_backward
            if output_tensor_grad is None:
                output_tensor_grad = torch.ones_like(output_tensor, memory_format=torch.preserve_format)
            torch.autograd.Variable._execution_engine.run_backward(
                (output_tensor,), (output_tensor_grad,), False, False, (), True, True)
        else:
            torch.autograd.backward(output_tensor, grad_tensors=output_tensor_grad)
        return None if input_tensor is None else input_tensor.grad

    def schedule(self, m, warmup, mark):
        """forward_backward_pipelining_without_interleaving with `warmup` forwards first."""
        input_tensors, output_tensors = [], []
        fwd = bwd = 0
        for _ in range(warmup):
            mark(f"F{fwd}", fwd + 1 - bwd)
            input_tensor = self.recv_forward()
            output_tensor = self.forward_step(input_tensor)
            self.send_forward(output_tensor)
            input_tensors.append(input_tensor)
            output_tensors.append(output_tensor)
            self.deallocate_output_tensor(output_tensor)
            fwd += 1
        remaining = m - warmup
        if remaining > 0:
            mark(f"F{fwd}", fwd + 1 - bwd)
            input_tensor = self.recv_forward()
        for i in range(remaining):
            last_iteration = i == remaining - 1
            if i > 0:
                mark(f"F{fwd}", fwd + 1 - bwd)
            output_tensor = self.forward_step(input_tensor)
            output_tensor_grad = self.send_forward_recv_backward(output_tensor)
            input_tensors.append(input_tensor)
            output_tensors.append(output_tensor)
            self.deallocate_output_tensor(output_tensor)
            fwd += 1
            input_tensor, output_tensor = input_tensors.pop(0), output_tensors.pop(0)
            mark(f"B{bwd}", fwd - bwd)
            input_tensor_grad = self.backward_step(input_tensor, output_tensor, output_tensor_grad)
            if last_iteration:
                input_tensor = None
                self.send_backward(input_tensor_grad)
            else:
                input_tensor = self.send_backward_recv_forward(input_tensor_grad)
            bwd += 1
        for _ in range(warmup):
            input_tensor, output_tensor = input_tensors.pop(0), output_tensors.pop(0)
            mark(f"B{bwd}", fwd - bwd)
            output_tensor_grad = self.recv_backward()
            input_tensor_grad = self.backward_step(input_tensor, output_tensor, output_tensor_grad)
            self.send_backward(input_tensor_grad)
            bwd += 1


def run(rank, world, p):
    m, layers = p["microbatches"], p["layers"]
    st = Stage(rank, world, layers, p["batch"], p.get("deallocate_outputs", True))
    warmup = m if p["schedule"] == "gpipe" else min(world - rank - 1, m)
    store = st.store

    # Saved for backward by one micro-batch's forward (the received input included).
    sb = SavedBytes(param_storages(store.params.values()))
    x = None if st.first else torch.empty(st.shape, requires_grad=True)
    with sb:
        out = st.forward_step(x)
    saved = sb.total()
    del out, x

    trace = Trace()
    for n, prm in store.params.items():
        trace.register(prm, f"parameter {n}")
    steps, results = 2, []
    with trace:
        opt = measure.make_optimizer(measure.Config(optimizer=p["optimizer"], impl="for-loop"),
                                     store.trainable())
        trace.mark("0.END")
        for s in range(1, steps + 1):
            opt.zero_grad(set_to_none=True)
            flight = {}

            def mark(label, n, s=s):
                flight[label] = n
                trace.mark(f"{s}.{label}")
            st.schedule(m, warmup, mark)
            trace.mark(f"{s}.OPTIMIZER_STEP")
            opt.step()
            trace.mark(f"{s}.END")
            results.append({"step": s, "in_flight": flight,
                            "end_of_step": model_state(store.params.values(), optimizer_state_tensors(opt))})
        trace.mark("TEARDOWN")
        opt.zero_grad(set_to_none=True)
        del opt
    peaks, at_mark, _ = trace.analyse(alive=store.params.values())
    for r in results:
        s = r["step"]
        ph = {k.split(".", 1)[1]: v for k, v in peaks.items() if k.startswith(f"{s}.") and not k.endswith(".END")}
        top = max(ph, key=lambda k: ph[k])
        flight = r.pop("in_flight")
        r.update({"peak": ph[top], "peak_phase": top, "in_flight_at_peak": flight.get(top, 0),
                  "phases": ph, "live_at_end": at_mark[f"{s}.END"]})
        r["other_at_end"] = r["live_at_end"] - sum(r["end_of_step"].values())
    dist.barrier(group=common.GROUP)
    return {"stage": {"blocks": [st.lo, st.hi], "first": st.first, "last": st.last, "warmup": warmup},
            "saved_per_microbatch": saved, "steps": results, "unseen_frees": trace.unseen_frees,
            **common.explained(trace, [f"{r['step']}.{ph}" for r in results
                                       for ph in (r["peak_phase"], "OPTIMIZER_STEP")])}
