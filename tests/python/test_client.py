"""memest.Client against a real memest-server: estimates, catalogs, errors, deadlines."""

import json

import pytest

import memest
from memest import v1

PHASES = ["data", "forward", "loss", "backward", "optimizer_step"]
MLP_PARAMETERS = 784 * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * 10 + 10


def test_preset_estimate_counts_and_phases(gpt2):
    assert gpt2.parameter_count == 124439808
    assert gpt2.trainable_parameter_count == 124439808
    assert gpt2.micro_batch == 2
    assert gpt2.op_count > 0
    assert [p.phase for p in gpt2.phases] == PHASES
    assert gpt2.peak.phase in PHASES
    assert gpt2.peak.allocated_bytes == max(p.allocated_bytes for p in gpt2.phases)
    assert gpt2.saved_for_backward_bytes > 0
    assert gpt2.label == "gpt2-small seq=128, batch 2"


def test_breakdown_sums_as_the_proto_says(gpt2):
    # breakdown: the allocated categories at the peak, + allocator overhead (reserved -
    # allocated) + the CUDA context; so it sums to what nvidia-smi would show.
    assert gpt2.breakdown.total == gpt2.peak_reserved_bytes + gpt2.breakdown.cuda_context
    assert gpt2.breakdown.total == gpt2.fit.required_bytes == gpt2.required_bytes
    allocated = gpt2.breakdown.as_dict()
    at_peak = gpt2.peak.by_category.as_dict()
    for name in memest.results.CATEGORIES:
        if name not in ("allocator_overhead", "cuda_context"):
            assert allocated[name] == at_peak[name], name
    assert at_peak["allocator_overhead"] == 0 and at_peak["cuda_context"] == 0
    assert gpt2.breakdown.allocator_overhead == (gpt2.peak_reserved_bytes
                                                 - gpt2.peak.by_category.total)


def test_fit_and_advice(gpt2):
    assert gpt2.fit.device == "a100-80gb"
    assert gpt2.fit.fits
    assert gpt2.fit.headroom_bytes == gpt2.fit.capacity_bytes - gpt2.fit.required_bytes
    assert gpt2.advice[0].kind == "peak"
    savings = [a.saving_bytes for a in gpt2.fixes()]
    assert savings == sorted(savings, reverse=True)
    assert gpt2.notes


def test_no_device_means_no_fit_and_no_advice_when_skipped(client):
    result = client.estimate(preset="gpt2-small", seq=64, batch_size=1, advice=False)
    assert result.fit is None
    assert result.advice == []


def test_options_change_the_request_as_the_cli_words_say(client):
    base = dict(preset="gpt2-small", seq=128, batch_size=4, advice=False)
    plain = client.estimate(**base)
    checkpointed = client.estimate(checkpoint="every-block", **base)
    assert checkpointed.saved_for_backward_bytes < plain.saved_for_backward_bytes
    non_reentrant = client.estimate(checkpoint="every-block", checkpoint_non_reentrant=True, **base)
    assert non_reentrant.saved_for_backward_bytes < checkpointed.saved_for_backward_bytes
    assert any("use_reentrant=False" in n for n in non_reentrant.notes)
    accumulated = client.estimate(grad_accum_steps=2, **base)
    assert accumulated.micro_batch == 2
    first = client.estimate(first_step=True, optimizer="adam", optimizer_impl="fused", **base)
    assert first.peak.allocated_bytes > 0
    sgd = client.estimate(optimizer="sgd", **base)
    assert sgd.breakdown.optimizer_state == 0
    cpu = client.estimate(runtime="cpu-1.13", **base)
    assert cpu.breakdown.cuda_context == 0
    with pytest.raises(memest.InvalidArgument, match="config.cpu_isa"):
        client.estimate(cpu_isa="avx2", **base)  # the ISA is the CPU runtime's
    with pytest.raises(memest.InvalidArgument, match="cpu_isa"):
        client.estimate(runtime="cpu-1.13", cpu_isa="sse4", **base)
    inference = client.estimate(mode="inference", generate_tokens=16, precision="bf16-pure",
                                **base)
    assert [p.phase for p in inference.phases] == ["data", "forward"]
    assert inference.breakdown.kv_cache > 0
    small = client.estimate(capacity_bytes="1GiB", **base)
    assert small.fit.capacity_bytes == 1 << 30
    assert not small.fit.fits and small.fit.headroom_bytes < 0
    # The loop keeps the [4, 128, 50257] logits through backward by default, not when told.
    let_go = client.estimate(hold_outputs=False, **base)
    held = client.estimate(hold_outputs=True, **base)
    assert held.peak.allocated_bytes == plain.peak.allocated_bytes > let_go.peak.allocated_bytes
    assert any("holds the model's outputs" in n for n in held.notes)
    assert not any("holds the model's outputs" in n for n in let_go.notes)
    with pytest.raises(memest.InvalidArgument, match="config.hold_outputs"):
        client.estimate(mode="inference", hold_outputs=False, **base)


def test_attention_module_loading_and_hf_optimizers(client):
    base = dict(preset="gpt2-small", seq=256, batch_size=4, precision="bf16", advice=False)
    sdpa = client.estimate(**base)  # the default on CUDA
    eager = client.estimate(attention="eager", **base)
    flash = client.estimate(attention="flash_attention_2", **base)  # HF's name
    assert sdpa.saved_for_backward_bytes == flash.saved_for_backward_bytes
    assert flash.saved_for_backward_bytes < eager.saved_for_backward_bytes
    assert any("flash" in n for n in sdpa.notes)
    with pytest.raises(memest.InvalidArgument, match="config.attention"):
        client.estimate(attention="flash", **dict(base, precision="fp32"))
    with pytest.raises(memest.InvalidArgument, match="attention"):
        client.estimate(attention="xformers", **base)
    lazy = client.estimate(device="Tesla-T4", **base)
    eager_ctx = client.estimate(device="Tesla-T4", cuda_module_loading="eager", **base)
    assert eager_ctx.breakdown.cuda_context > lazy.breakdown.cuda_context
    # a T4's default workspace is 8 MiB + 128 KiB a handle; :4096:8 is 32 MiB
    wide = client.estimate(device="Tesla-T4", cublas_workspace_config=":4096:8", **base)
    assert wide.end_of_step.workspace == lazy.end_of_step.workspace // (8 * 1024 + 128) * 32 * 1024
    with pytest.raises(memest.InvalidArgument, match="config.cublas_workspace_config"):
        client.estimate(cublas_workspace_config="4096:8", **base)
    with pytest.raises(memest.InvalidArgument, match="cublas_workspace_config"):
        client.estimate(cublas_workspace_config=4096, **base)
    adafactor = client.estimate(optimizer="hf-adafactor", **base)
    adamw = client.estimate(optimizer="hf-adamw", **base)
    assert 0 < adafactor.breakdown.optimizer_state < adamw.breakdown.optimizer_state


def test_data_parallel_strategies_shard_what_they_say(client):
    base = dict(preset="gpt2-small", seq=128, batch_size=2, precision="bf16-pure",
                data_parallel=4, advice=False)
    ddp = client.estimate(dp_strategy="ddp", **base)
    fsdp = client.estimate(dp_strategy="fsdp2", **base)
    kept = client.estimate(dp_strategy="fsdp2", reshard_after_forward=False, **base)
    mixed = client.estimate(dp_strategy="fsdp2", fsdp_mixed_precision=True, **base)
    assert ddp.data_parallel.world == fsdp.data_parallel.world == 4
    assert ddp.breakdown.communication > 0  # the gradient buckets
    # FSDP2's sharded gradients: a quarter of DDP's (padding and rounding aside); buffers
    # (GPT-2's causal masks) are not sharded, so parameters are compared less tightly.
    whole = ddp.end_of_step.gradients
    assert whole // 4 <= fsdp.end_of_step.gradients < whole // 4 + (1 << 20)
    assert fsdp.end_of_step.parameters < ddp.end_of_step.parameters // 3
    shards = fsdp.end_of_step.gradients
    assert 2 * shards - (1 << 20) < mixed.end_of_step.gradients < 2 * shards + (1 << 20)
    assert fsdp.peak.allocated_bytes < kept.peak.allocated_bytes < ddp.peak.allocated_bytes
    last = client.estimate(dp_strategy="fsdp2", keep_last_block_gathered=True, **base)
    assert fsdp.peak.allocated_bytes <= last.peak.allocated_bytes < kept.peak.allocated_bytes
    assert any("the last block keeps its parameters gathered" in n for n in last.notes)
    assert any(n.startswith("FSDP2 over 4 ranks") for n in fsdp.notes)
    # The bytes sent: DDP all-reduces the gradients once, 2 (d - 1) / d of them.
    assert ddp.communicated_bytes_per_step == int(2 * 3 / 4 * ddp.end_of_step.gradients)
    assert fsdp.communicated_bytes_per_step > ddp.communicated_bytes_per_step
    one = client.estimate(preset="gpt2-small", seq=128, batch_size=2, advice=False)
    assert one.communicated_bytes_per_step == 0 and one.recompute_fraction == 0
    ckpt = client.estimate(preset="gpt2-small", seq=128, batch_size=2, checkpoint="every-block",
                           advice=False)
    assert 0.5 < ckpt.recompute_fraction < 1
    # HSDP over 4 ranks as 2 replicas of 2 shards: the model states of FSDP2 over 2.
    hybrid = client.estimate(dp_strategy="fsdp2", data_shard=2, **base)
    pair = client.estimate(dp_strategy="fsdp2", **{**base, "data_parallel": 2})
    assert hybrid.end_of_step.gradients == pair.end_of_step.gradients
    assert any("HSDP: sharded within groups of 2, replicated 2 times" in n for n in hybrid.notes)
    with pytest.raises(memest.InvalidArgument, match="data_shard"):
        client.estimate(dp_strategy="fsdp2", data_shard=3, **base)
    with pytest.raises(memest.InvalidArgument, match="reshard_after_forward"):
        client.estimate(dp_strategy="ddp", reshard_after_forward=False, **base)
    with pytest.raises(memest.InvalidArgument, match="dp_strategy"):
        client.estimate(dp_strategy="fsdp3", **base)


def test_deepspeed_offload_reports_host_bytes(client):
    base = dict(preset="gpt2-small", seq=128, batch_size=2, precision="bf16-pure",
                data_parallel=8, advice=False)
    zero1 = client.estimate(dp_strategy="deepspeed-zero1", **base)
    offloaded = client.estimate(dp_strategy="deepspeed-zero1", offload_optimizer=True, **base)
    assert zero1.data_parallel.host_bytes == 0
    assert zero1.breakdown.optimizer_state + zero1.end_of_step.master_and_casts > 0
    # fp32 master, its gradient and AdamW's two states: 16 bytes a partition element, and a
    # staging buffer of the largest parameter (the embedding, bf16).
    partition = -(-zero1.trainable_parameter_count // 16) * 16 // 8
    staging = 50257 * 768 * 2
    assert offloaded.data_parallel.host_bytes == 16 * partition + staging
    assert offloaded.end_of_step.optimizer_state == 0
    assert offloaded.end_of_step.master_and_casts == 0
    assert any("offload_optimizer cpu" in n for n in offloaded.notes)
    with pytest.raises(memest.InvalidArgument, match="offload_optimizer"):
        client.estimate(dp_strategy="fsdp2", offload_optimizer=True, **base)


def test_deepspeed_zero3_offloads_the_optimizer_and_the_parameters(client):
    base = dict(preset="gpt2-small", seq=128, batch_size=2, precision="bf16-pure",
                data_parallel=8, dp_strategy="deepspeed-zero3", advice=False)
    plain = client.estimate(**base)
    both = client.estimate(offload_optimizer=True, offload_param=True, **base)
    assert plain.data_parallel.host_bytes == 0
    # Per partition element: the 16-bit partition (pinned, rounded up to a power of two: at
    # most twice), the fp32 master, its gradient and AdamW's two states, the 16-bit gradient
    # partition; and a pinned fp32 staging buffer of the largest partition.
    partition = both.trainable_parameter_count / 8
    assert 20 * partition <= both.data_parallel.host_bytes <= 22 * partition + 4 * 2**24
    assert both.end_of_step.optimizer_state == both.end_of_step.master_and_casts == 0
    assert both.end_of_step.parameters < plain.end_of_step.parameters
    assert both.peak.allocated_bytes < plain.peak.allocated_bytes
    assert any(n.startswith("host memory ") for n in both.notes)
    with pytest.raises(memest.InvalidArgument, match="offload_param"):
        client.estimate(offload_param=True, **{**base, "dp_strategy": "deepspeed-zero2"})


def test_fsdp2_cpu_offload_reports_host_bytes(client):
    base = dict(preset="gpt2-small", seq=128, batch_size=2, data_parallel=8,
                dp_strategy="fsdp2", advice=False)
    plain = client.estimate(**base)
    off = client.estimate(fsdp_cpu_offload=True, **base)
    # float32 shards and their gradients, pinned (each rounded up to a power of two: at most
    # twice), and AdamW's two states: between 16 and 24 bytes a shard element.
    shard = plain.trainable_parameter_count / 8
    assert 16 * shard <= off.data_parallel.host_bytes <= 24 * shard + 2**26
    # The GPU keeps only the model's buffers (GPT-2's 12 causal masks, bool [1024, 1024]).
    assert off.end_of_step.parameters == 12 * 2**20
    assert off.end_of_step.optimizer_state == off.end_of_step.gradients == 0
    assert off.peak.allocated_bytes < plain.peak.allocated_bytes
    with pytest.raises(memest.InvalidArgument, match="fsdp_cpu_offload"):
        client.estimate(fsdp_cpu_offload=True, **{**base, "dp_strategy": "ddp"})
    # FSDP1's CPUOffload: the flat shards, their gradients and the state on the host too
    fsdp1 = dict(base, dp_strategy="fsdp1")
    off1 = client.estimate(fsdp_cpu_offload=True, **fsdp1)
    assert 16 * shard <= off1.data_parallel.host_bytes <= 24 * shard + 2**26
    assert off1.end_of_step.gradients == off1.end_of_step.optimizer_state == 0
    assert off1.peak.allocated_bytes < client.estimate(**fsdp1).peak.allocated_bytes


def test_deepspeed_zero3_partitions_parameters_and_takes_its_settings(client):
    base = dict(preset="gpt2-small", seq=128, batch_size=2, precision="bf16-pure",
                data_parallel=8, advice=False)
    zero2 = client.estimate(dp_strategy="deepspeed-zero2", **base)
    zero3 = client.estimate(dp_strategy="deepspeed-zero3", **base)
    # 16-bit parameter partitions: an eighth of the parameters ZeRO-2 keeps whole (GPT-2's
    # causal-mask buffers, 12 MiB, are not partitioned); the 16-bit gradient partitions too.
    assert zero3.end_of_step.parameters < zero2.end_of_step.parameters // 5
    eighth = 2 * zero3.trainable_parameter_count // 8  # bf16, each parameter padded to 8
    assert eighth <= zero3.end_of_step.gradients < eighth + 2 * 8 * 200
    assert any(n.startswith("DeepSpeed ZeRO-3 over 8 ranks") for n in zero3.notes)
    # Without prefetch and with a short reuse distance fewer parameters stay gathered in forward.
    def at_loss(estimate):
        return next(p for p in estimate.phases if p.phase == "loss").by_category.parameters
    short = client.estimate(dp_strategy="deepspeed-zero3", stage3_prefetch_bucket_size=0,
                            stage3_max_reuse_distance=1000, **base)
    assert at_loss(short) < at_loss(zero3)
    with pytest.raises(memest.InvalidArgument, match="stage3_max_reuse_distance"):
        client.estimate(dp_strategy="deepspeed-zero2", stage3_max_reuse_distance=1000, **base)


def test_pipeline_stages_are_each_estimated(client):
    base = dict(preset="gpt2-small", seq=128, batch_size=8, grad_accum_steps=8, pipeline=4,
                advice=False)
    one_f_one_b = client.estimate(**base)
    gpipe = client.estimate(pipeline_schedule="gpipe", **base)
    p = one_f_one_b.pipeline
    assert (p.stages, p.micro_batches) == (4, 8)
    assert [s.stage for s in p.per_stage] == [0, 1, 2, 3]
    assert [(s.first_block, s.last_block) for s in p.per_stage] == [(0, 2), (3, 5), (6, 8),
                                                                    (9, 11)]
    worst = p.per_stage[p.worst_stage]
    assert worst.peak_reserved_bytes == max(s.peak_reserved_bytes for s in p.per_stage)
    assert one_f_one_b.peak.allocated_bytes == worst.peak_allocated_bytes
    assert one_f_one_b.parameter_count == 124439808  # the whole model's
    # GPipe keeps all 8 micro-batches in flight, 1F1B at most 4 on the first stage.
    assert gpipe.pipeline.per_stage[0].peak_allocated_bytes > worst.peak_allocated_bytes
    assert client.estimate(preset="gpt2-small", seq=128, batch_size=2).pipeline is None
    with pytest.raises(memest.InvalidArgument, match="config.parallelism.pipeline"):
        client.estimate(**dict(base, pipeline=5))  # 12 blocks over 5 stages
    with pytest.raises(memest.InvalidArgument, match="pipeline_schedule"):
        client.estimate(pipeline_schedule="zero-bubble", **base)
    # Megatron's interleaved 1F1B: 12 blocks as 4 stages of 3 chunks; the first stage holds more.
    inter = client.estimate(pipeline_virtual_stages=3, **base)
    assert inter.pipeline.per_stage[0].peak_allocated_bytes > p.per_stage[0].peak_allocated_bytes
    with pytest.raises(memest.InvalidArgument, match="pipeline_virtual_stages"):
        client.estimate(pipeline_virtual_stages=3, **dict(base, pipeline=1))


def test_tensor_parallel_splits_the_plans_modules(client):
    base = dict(preset="llama-7b", params={"layers": 2}, seq=256, batch_size=1,
                precision="bf16", advice=False)
    one = client.estimate(**base)
    eight = client.estimate(tensor_parallel=8, sequence_parallel=True, **base)
    assert eight.parameter_count == one.parameter_count  # the whole model's
    assert eight.peak.allocated_bytes < one.peak.allocated_bytes / 4
    assert any("tensor parallelism over 8 ranks" in n for n in eight.notes)
    planned = client.estimate(tensor_parallel=2, advice=False, preset="gpt2-small", seq=128,
                              batch_size=1, params={"vocab": 50304},
                              tensor_plan={"c_attn": "colwise", "attn.c_proj": "rowwise"})
    assert planned.peak.allocated_bytes > 0
    with pytest.raises(memest.InvalidArgument, match="tensor_plan"):
        client.estimate(tensor_parallel=2, tensor_plan={"c_attn": "diagonal"}, **base)
    # DTensor (torchtitan): the gathered sequence saved, the embedding's whole-table gradient.
    titan = client.estimate(tensor_parallel=8, sequence_parallel=True, tensor_layers="dtensor", **base)
    assert titan.saved_for_backward_bytes > eight.saved_for_backward_bytes
    assert titan.end_of_step.gradients > eight.end_of_step.gradients
    assert any("DTensor" in n for n in titan.notes)
    with pytest.raises(memest.InvalidArgument, match="tensor_layers"):
        client.estimate(tensor_layers="apex", **base)
    with pytest.raises(memest.InvalidArgument, match="config.parallelism.tensor_layers"):
        client.estimate(tensor_layers="dtensor", **base)  # without tensor parallelism
    ring = client.estimate(context_parallel=4, **dict(base, seq=1024))
    assert any("context parallelism over 4 ranks" in n for n in ring.notes)
    with pytest.raises(memest.InvalidArgument, match="matches no module"):
        client.estimate(tensor_parallel=2, tensor_plan={"nope": "colwise"}, **base)


SMALL_MIXTRAL = {"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
                 "vocab_size": 512, "num_local_experts": 4, "num_experts_per_tok": 2}


def test_expert_parallel_estimates_the_rank_that_receives_the_most(client):
    base = dict(hf_config=SMALL_MIXTRAL, seq=16, batch_size=2, precision="bf16-pure",
                data_parallel=4, dp_strategy="megatron-distopt", optimizer="adam")
    whole = client.estimate(**base)
    assert whole.expert_parallel is None
    split = client.estimate(expert_parallel=2, **base)
    ep = split.expert_parallel
    # By default every token's two choices go to experts 2 and 3, both on rank 1.
    assert (ep.size, ep.rank, ep.local_experts) == (2, 1, 2)
    assert (ep.least_rank, ep.least_received_rows) == (0, 0)
    assert ep.received_rows == 2 * 32 * 2
    assert split.parameter_count == whole.parameter_count  # the whole model's
    assert split.end_of_step.parameters < whole.end_of_step.parameters
    assert any("expert parallelism over 2 ranks" in n for n in split.notes)
    balanced = client.estimate(expert_parallel=2, expert_load="balanced", **base)
    assert balanced.expert_parallel.least_received_rows == balanced.expert_parallel.received_rows
    with pytest.raises(memest.InvalidArgument, match="config.parallelism.expert"):
        client.estimate(expert_parallel=3, **base)
    with pytest.raises(memest.InvalidArgument, match="expert_parallel"):
        client.estimate(expert_parallel="two", **base)
    # Each expert split over 2 tensor ranks as well (Megatron's expert tensor parallelism), which
    # its MoELayer runs with sequence parallelism only.
    tensor = client.estimate(expert_parallel=2, tensor_parallel=2, sequence_parallel=True, **base)
    assert tensor.expert_parallel.rank == 1
    assert tensor.end_of_step.parameters < split.end_of_step.parameters
    with pytest.raises(memest.InvalidArgument, match="config.parallelism.sequence_parallel"):
        client.estimate(expert_parallel=2, tensor_parallel=2, **base)


def test_plans_fit_fewest_gpus_first(client):
    seen = []
    plans = client.plan(preset="llama-7b", seq=1024, batch_size=16, precision="bf16-pure",
                        devices=["a100-40gb"], max_gpus=16, max_plans=5, on_plan=seen.append)
    assert plans == seen and len(plans) == 5
    assert [p.gpus for p in plans] == sorted(p.gpus for p in plans)
    assert plans[0].gpus > 1  # 7B's bf16 model states alone exceed one 40 GB A100
    for p in plans:
        assert p.gpus == p.data * p.tensor * p.context * p.pipeline
        assert p.sequence_parallel == (p.tensor > 1)
        assert 0 <= p.headroom_bytes == p.capacity_bytes - p.required_bytes
        assert p.micro_batch * p.grad_accum_steps * p.data == 16
    # The first plan is what estimate says of it.
    p = plans[0]
    again = client.estimate(preset="llama-7b", seq=1024, batch_size=16 // p.data,
                            grad_accum_steps=p.grad_accum_steps, precision="bf16-pure",
                            device="a100-40gb", checkpoint=p.checkpoint,
                            data_parallel=p.data, dp_strategy=None if p.data == 1 else p.strategy,
                            pipeline=p.pipeline, tensor_parallel=p.tensor,
                            sequence_parallel=p.sequence_parallel, advice=False)
    assert again.fit.required_bytes == p.required_bytes
    with pytest.raises(memest.InvalidArgument, match="config.grad_accum_steps"):
        client.plan(preset="gpt2-small", batch_size=8, grad_accum_steps=2, device="a100-80gb")
    with pytest.raises(memest.DeadlineExceeded):
        client.plan(preset="llama-70b", seq=4096, batch_size=1024, precision="bf16-pure",
                    device="h100-80gb", max_gpus=1024, timeout=0.5)


def test_plans_shard_within_a_node(client):
    plans = client.plan(preset="gpt2-small", seq=256, batch_size=8, device="t4", max_gpus=4,
                        max_plans=1000, gpus_per_node=2)
    hybrid = [p for p in plans if p.data_shard]
    assert hybrid and all(p.strategy in ("fsdp1", "fsdp2") for p in hybrid)
    assert all(p.data > p.data_shard == 2 // p.tensor for p in hybrid)
    assert "sharded within groups of" in str(hybrid[0])


def test_plans_with_dtensor_layers_run_over_fsdp2(client):
    plans = client.plan(preset="llama-7b", seq=1024, batch_size=16, precision="bf16-pure",
                        device="a100-40gb", max_gpus=4, max_plans=100, tensor_layers="dtensor")
    tensor = [p for p in plans if p.tensor > 1]
    assert tensor and all(p.tensor_layers == "dtensor" for p in tensor)
    assert all(p.strategy in ("fsdp2", "none") for p in tensor)
    assert any(p.tensor == 1 for p in plans)


def test_plans_split_the_sequence_where_nothing_else_fits(client):
    plans = client.plan(preset="llama-7b", seq=262144, batch_size=1, precision="bf16-pure",
                        device="l4", max_gpus=4, max_plans=1000,
                        params={"layers": 2, "heads": 1, "kv_heads": 1, "d_model": 1024,
                                "ffn": 2048, "vocab": 1024})
    ring = [p for p in plans if p.context > 1]
    assert ring and all(p.gpus == 4 == p.data * p.tensor * p.context * p.pipeline for p in ring)
    assert "context" in str(ring[0])


def test_plans_with_offload_where_the_gpus_alone_do_not_fit(client):
    base = dict(preset="llama-7b", seq=1024, batch_size=16, precision="bf16-pure",
                devices=["rtx-4090"], max_gpus=1, max_plans=4)
    assert client.plan(**base) == []  # 7B's 50 GiB of model states on one 24 GB card
    plans = client.plan(host_memory_per_gpu="256GiB", **base)
    assert plans and all(p.gpus == 1 and p.strategy == "deepspeed-zero3" for p in plans)
    for p in plans:
        assert p.offload in ("optimizer", "optimizer+param")
        assert 0 < p.host_bytes <= 256 << 30 and p.host_transfer_bytes_per_step > 0
        assert "offloaded" in str(p)
    p = plans[0]
    again = client.estimate(preset="llama-7b", seq=1024, batch_size=16,
                            grad_accum_steps=p.grad_accum_steps, precision="bf16-pure",
                            device="rtx-4090", checkpoint=p.checkpoint, data_parallel=1,
                            dp_strategy="deepspeed-zero3", offload_optimizer=True,
                            offload_param=p.offload == "optimizer+param", advice=False)
    assert again.fit.required_bytes == p.required_bytes
    assert again.data_parallel.host_bytes == p.host_bytes
    with pytest.raises(memest.InvalidArgument, match="host_memory_per_gpu_bytes"):
        client.plan(host_memory_per_gpu=-1, **base)
    with pytest.raises(memest.InvalidArgument, match="host_memory_per_gpu"):
        client.plan(host_memory_per_gpu="lots", **base)


def test_layers_model_as_dict_file_and_message(client, mlp_model, tmp_path):
    from_dict = client.estimate(model=mlp_model, batch_size=256, capacity_bytes=24 << 30)
    assert from_dict.parameter_count == MLP_PARAMETERS
    assert [row.scope for row in from_dict.layers][:1] == ["fc1"]
    assert {"fc1", "fc2", "head"} <= {row.scope for row in from_dict.layers}
    assert from_dict.label == "layers model (6 layers), batch 256"

    path = tmp_path / "mlp.json"
    path.write_text(json.dumps(mlp_model))
    from_file = client.estimate(model=str(path), batch_size=256, capacity_bytes=24 << 30)
    assert from_file == from_dict

    message = v1.Model()
    message.layers.input_shape.append(784)
    layer = message.layers.layers.add(kind="linear", name="fc")
    layer.attrs["out_features"].i = 10
    from_message = client.estimate(model=message, batch_size=8)
    assert from_message.parameter_count == 784 * 10 + 10


def test_negative_batch_is_invalid_argument_naming_the_field(client):
    with pytest.raises(memest.InvalidArgument) as caught:
        client.estimate(preset="gpt2-small", batch_size=-1)
    assert "config.batch_size" in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_bad_layer_attribute_names_the_layer(client, mlp_model):
    mlp_model["layers"]["layers"][0]["attrs"]["out_features"]["i"] = -4
    with pytest.raises(memest.InvalidArgument, match=r"model\.layers\[0\]"):
        client.estimate(model=mlp_model, batch_size=2)


def test_unknown_preset_param_names_it(client):
    with pytest.raises(memest.InvalidArgument, match=r"model\.preset\.params\.nope"):
        client.estimate(preset="gpt2-small", params={"nope": 3})


def test_unknown_preset_and_device_are_not_found(client):
    with pytest.raises(memest.NotFound, match="unknown preset 'no-such-model'"):
        client.estimate(preset="no-such-model")
    with pytest.raises(memest.NotFound):
        client.estimate(preset="mlp", device="no-such-gpu")


def test_client_side_refusals_name_the_argument(client, tmp_path):
    with pytest.raises(memest.InvalidArgument, match='precision: unknown value "fp8"'):
        client.estimate(preset="gpt2-small", precision="fp8")
    with pytest.raises(memest.InvalidArgument, match="preset, model or hf_config: one is required"):
        client.estimate()
    with pytest.raises(memest.InvalidArgument, match="give one, not both"):
        client.estimate(preset="mlp", device="a100", capacity_bytes=1 << 30)
    with pytest.raises(memest.InvalidArgument, match="capacity_bytes"):
        client.estimate(preset="mlp", capacity_bytes="lots")
    with pytest.raises(memest.InvalidArgument, match="batch_size"):
        client.estimate(preset="mlp", batch_size="two")
    with pytest.raises(memest.InvalidArgument, match="not a memest.v1.Model"):
        client.estimate(model={"layerz": {}})
    with pytest.raises(memest.InvalidArgument, match="cannot open the file"):
        client.estimate(model=str(tmp_path / "missing.json"))


def test_presets_and_devices(client):
    presets = {p.name: p for p in client.presets()}
    assert "gpt2-small" in presets
    seq = {param.name: param for param in presets["gpt2-small"].params}["seq"]
    assert seq.default_value == 1024 and seq.description
    devices = {d.name: d for d in client.devices()}
    assert devices["a100-80gb"].capacity_bytes > 80 * 10**9
    assert devices["a100-80gb"].compute_capability == 80


def test_dead_server_is_unavailable(closed_port):
    with memest.Client("127.0.0.1:%d" % closed_port, timeout=2) as dead:
        with pytest.raises(memest.Unavailable) as caught:
            dead.presets()
    assert str(caught.value)
    assert isinstance(caught.value, ConnectionError)


def test_deadline_exceeded(client):
    with pytest.raises(memest.DeadlineExceeded):
        client.estimate(preset="llama-7b", batch_size=4, timeout=1e-6)


def test_closed_client_refuses_calls(server):
    c = memest.Client(server)
    c.close()
    with pytest.raises(memest.MemestError, match="closed"):
        c.presets()
