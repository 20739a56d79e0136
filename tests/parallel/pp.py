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

Interleaved 1F1B (schedule "interleaved", `virtual_stages` V; Stage.interleaved): each rank holds
V chunks of layers/(P V) blocks, chunk c being virtual stage c P + rank, in the order of
forward_backward_pipelining_with_interleaving and get_schedule_table (groups of P micro-batches),
with its lists and loop variables, batched sends and receives (overlap_p2p_comm off). Phases:
"<step>.F<j>c<c>" / "<step>.B<j>c<c>" from the start of micro-batch j's forward / backward on
chunk c; the sends and receives after an action are in its phase (docs/parallelism-truth.md 4.1).
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


class Chunk:
    """One model chunk of a stage: blocks lo..hi-1 of models.gpt, with the embeddings when it is
    the first virtual stage and the head and loss when it is the last; its own record plan."""

    def __init__(self, store, b, lo, hi, first, last):
        self.lo, self.hi, self.first, self.last = lo, hi, first, last
        self.fn = functools.partial(models.gpt_stage, lo=lo, hi=hi, first=first, last=last, **GPT)
        self.plan = common.record(store, self.fn, b)


class Stage:
    """Pipeline rank `rank` of `p`: `v` model chunks of layers / (p v) blocks, chunk c being
    virtual stage c p + rank (v = 1: the stage of the non-interleaved schedules)."""

    def __init__(self, rank, p, layers, b, deallocate, v=1):
        per = layers // (p * v)
        self.rank, self.p, self.v, self.b = rank, p, v, b
        self.first, self.last = rank == 0, rank == p - 1
        self.shape = [b, GPT["t"], GPT["d"]]
        self.deallocate = deallocate
        self.store = ParamStore(seed=rank)
        self.chunks = [Chunk(self.store, b, (c * p + rank) * per, (c * p + rank + 1) * per,
                             c * p + rank == 0, c * p + rank == p * v - 1) for c in range(v)]
        self.lo, self.hi = self.chunks[0].lo, self.chunks[-1].hi

    # ---------------------------------------------------------------- p2p_communication.py
    # Neighbours on a ring (P2PCommunicator: next = (rank + 1) % p, prev = (rank - 1) % p; the
    # interleaved schedule passes the last rank's chunk output to the first rank's next chunk).
    # Activations travel with tag 0, gradients with tag 1: with p = 2 both directions join the
    # same two ranks, which Megatron keeps apart with two process groups (_p2p_ops).
    FWD, BWD = 0, 1

    def _communicate(self, send_next=None, send_prev=None, recv_prev=False, recv_next=False):
        prev = torch.empty(self.shape, requires_grad=True) if recv_prev else None
        nxt = torch.empty(self.shape, requires_grad=True) if recv_next else None
        g, reqs = common.GROUP, []
        before, after = (self.rank - 1) % self.p, (self.rank + 1) % self.p
        if send_prev is not None:
            reqs.append(dist.isend(send_prev, before, group=g, tag=self.BWD))
        if prev is not None:
            reqs.append(dist.irecv(prev, before, group=g, tag=self.FWD))
        if send_next is not None:
            reqs.append(dist.isend(send_next, after, group=g, tag=self.FWD))
        if nxt is not None:
            reqs.append(dist.irecv(nxt, after, group=g, tag=self.BWD))
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
    def forward_step(self, input_tensor, chunk=0):
        c = self.chunks[chunk]
        rec = Recorder(self.store, plan=c.plan, training=True)
        run_inputs(rec, {} if c.first else {"h_in": input_tensor})
        out = rec.take(c.fn(rec, self.b))
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


    # ------------------------------------------- schedules.py, with interleaving (v > 1)
    def interleaved(self, m, mark):
        """forward_backward_pipelining_with_interleaving, training, batch_p2p_comm (the loop's
        own sends and receives, overlap_p2p_comm off: ModelParallelConfig's defaults),
        microbatch_group_size_per_vp_stage = p. Returns the warm-up count."""
        v, p, rank = self.v, self.p, self.rank
        table = schedule_table(m, v, p)
        total = m * v
        warmup = interleaved_warmup(p, rank, v, m)
        all_warmup = warmup == total
        remaining = total - warmup
        input_tensors, output_tensors = [[] for _ in range(v)], [[] for _ in range(v)]
        output_tensor_grads = [[] for _ in range(v)]
        done = {"F": 0, "B": 0}
        premarked = [None]  # the first forward's phase opens before the first receive

        def chunk_id(k, forward):  # get_model_chunk_id
            c = table[k % total][1]
            return c if forward else v - c - 1

        def released(k, c):  # num_released_microbatches
            if k < warmup:
                return 0
            return [x[1] for x in table][:k - warmup].count(v - c - 1)

        def recv_from_previous(k, forward):  # recv_tensor_from_previous_stage
            recv = True
            leading = self.first if forward else self.last
            last_chunk = v - 1 if forward else 0
            if leading:
                if k < p - 1:
                    recv = False
                    nxt = chunk_id(k + 1, forward)
                else:
                    nxt = chunk_id(k - (p - 1), forward)
                if nxt == last_chunk:
                    recv = False
                nxt += 1 if forward else -1
            else:
                nxt = chunk_id(k + 1, forward)
            return recv, nxt

        def forward_helper(k):  # forward_step_helper
            c, j = chunk_id(k, True), table[k][0]
            if premarked[0] != (j, c):
                mark(f"F{j}c{c}", done["F"] + 1 - done["B"])
            premarked[0] = None
            if c == 0 and self.first and len(input_tensors[c]) == len(output_tensors[c]):
                input_tensors[c].append(None)
            input_tensor = input_tensors[c][j - released(k, c)]
            output_tensor = self.forward_step(input_tensor, c)
            output_tensors[c].append(output_tensor)
            done["F"] += 1
            return output_tensor

        def backward_helper(k):  # backward_step_helper
            c = chunk_id(k, False)
            mark(f"B{table[k][0]}c{c}", done["F"] - done["B"])
            if c == v - 1 and self.last and not output_tensor_grads[c]:
                output_tensor_grads[c].append(None)
            input_tensor = input_tensors[c].pop(0)
            output_tensor = output_tensors[c].pop(0)
            output_tensor_grad = output_tensor_grads[c].pop(0)
            input_tensor_grad = self.backward_step(input_tensor, output_tensor, output_tensor_grad)
            done["B"] += 1
            return input_tensor_grad

        def helper(f=None, b=None):  # forward_backward_helper_wrapper: forward, then backward
            forward_output_tensor = backward_input_tensor_grad = None
            if f is not None:
                forward_output_tensor = forward_helper(f)
            if b is not None:
                backward_input_tensor_grad = backward_helper(b)
            return forward_output_tensor, backward_input_tensor_grad

        # Warm-up. The first receive is marked as part of the first forward.
        premarked[0] = (table[0][0], 0)
        mark(f"F{table[0][0]}c0", 1)
        input_tensors[0].append(None if self.first else self._communicate(recv_prev=True)[0])
        for k in range(warmup):
            cur = chunk_id(k, True)
            recv_prev, next_forward_chunk = recv_from_previous(k, True)
            if k == total - 1:
                recv_prev = False
            output_tensor, _ = helper(f=k)
            if cur == v - 1 and self.last:
                output_tensor = None
            if k == warmup - 1 and not all_warmup:
                input_tensor_grad = None
                input_tensor, output_tensor_grad = self._communicate(
                    send_next=output_tensor, send_prev=input_tensor_grad, recv_prev=recv_prev,
                    recv_next=not self.last)
                output_tensor_grads[v - 1].append(output_tensor_grad)
            else:  # send_forward_recv_forward
                input_tensor = self._communicate(send_next=output_tensor, recv_prev=recv_prev)[0]
            if recv_prev:
                input_tensors[next_forward_chunk].append(input_tensor)
            self.deallocate_output_tensor(output_tensor)

        # 1F1B: a forward and a backward, then their sends and the next receives together.
        for k in range(remaining):
            forward_k, backward_k = k + warmup, k
            output_tensor, input_tensor_grad = helper(f=forward_k, b=backward_k)
            if chunk_id(forward_k, True) == v - 1 and self.last:
                output_tensor = None
            if chunk_id(backward_k, False) == 0 and self.first:
                input_tensor_grad = None
            recv_prev, next_forward_chunk = recv_from_previous(forward_k, True)
            recv_next, next_backward_chunk = recv_from_previous(backward_k, False)
            if k == remaining - 1:
                recv_prev = False
            input_tensor, output_tensor_grad = self._communicate(
                send_next=output_tensor, send_prev=input_tensor_grad, recv_prev=recv_prev,
                recv_next=recv_next)
            self.deallocate_output_tensor(output_tensor)
            if recv_prev:
                input_tensors[next_forward_chunk].append(input_tensor)
            if recv_next:
                output_tensor_grads[next_backward_chunk].append(output_tensor_grad)
        if remaining:
            self.deallocate_output_tensor(output_tensor)

        # Cool-down: the remaining backwards, each sending its gradient and receiving the next.
        if all_warmup:
            output_tensor_grads[v - 1].append(None if self.last else self._communicate(recv_next=True)[1])
        for k in range(remaining, total):
            cur = chunk_id(k, False)
            recv_next, next_backward_chunk = recv_from_previous(k, False)
            if k == total - 1:
                recv_next = False
            _, input_tensor_grad = helper(b=k)
            if cur == 0 and self.first:
                input_tensor_grad = None
            output_tensor_grad = self._communicate(send_prev=input_tensor_grad, recv_next=recv_next)[1]
            if recv_next:
                output_tensor_grads[next_backward_chunk].append(output_tensor_grad)
        return warmup


def interleaved_warmup(p, rank, v, m):
    """get_pp_rank_microbatches: (p - rank - 1) 2 + (v - 1) p forwards first, at most all m v."""
    return min((p - rank - 1) * 2 + (v - 1) * p, m * v)


def schedule_table(m, v, group):
    """get_schedule_table: [(micro-batch, chunk)] per virtual micro-batch, `group` micro-batches
    per chunk in turn (the last group takes what remains)."""
    out = []
    for lo in range(0, m, group):
        hi = m if lo + group >= m else lo + group
        out += [(j, c) for c in range(v) for j in range(lo, hi)]
    return out

def run(rank, world, p):
    m, layers, chunks = p["microbatches"], p["layers"], p.get("virtual_stages", 1)
    st = Stage(rank, world, layers, p["batch"], p.get("deallocate_outputs", True), chunks)
    if p["schedule"] == "interleaved":
        warmup = interleaved_warmup(world, rank, chunks, m)
    else:
        warmup = m if p["schedule"] == "gpipe" else min(world - rank - 1, m)
    store = st.store

    # Saved for backward by one micro-batch's forward (the received input included), per chunk.
    saved = []
    for c, chunk in enumerate(st.chunks):
        sb = SavedBytes(param_storages(store.params.values()))
        x = None if chunk.first else torch.empty(st.shape, requires_grad=True)
        with sb:
            out = st.forward_step(x, c)
        saved.append(sb.total())
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
            if chunks > 1:
                st.interleaved(m, mark)
            else:
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
    stage = {"blocks": [st.lo, st.hi], "first": st.first, "last": st.last, "warmup": warmup}
    per_chunk = {}
    if chunks > 1:  # chunk c is virtual stage c p + rank: blocks [lo, hi) each
        stage = {"chunks": [[c.lo, c.hi] for c in st.chunks], "first": st.first, "last": st.last,
                 "warmup": warmup}
        per_chunk = {"saved_per_chunk": saved}
    return {"stage": stage, "saved_per_microbatch": sum(saved), **per_chunk, "steps": results,
            "unseen_frees": trace.unseen_frees,
            **common.explained(trace, [f"{r['step']}.{ph}" for r in results
                                       for ph in (r["peak_phase"], "OPTIMIZER_STEP")])}
