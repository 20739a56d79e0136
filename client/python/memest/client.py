"""memest.Client: the synchronous client of memest.v1.MemoryEstimator.

    with memest.Client("127.0.0.1:50051") as client:
        result = client.estimate(preset="gpt2-small", seq=1024, batch_size=8,
                                 precision="bf16", device="a100-80gb")
        print(result)

Each call has a deadline (the client's `timeout`, or the call's own `timeout=`), and a failed
call raises a memest.MemestError subclass carrying the server's message.
"""

import grpc

from memest import v1
from memest.errors import (MemestError, call_metadata, from_rpc_error, request_id_of,
                           token_metadata)
from memest.tls import channel
from memest.planning import PlanCollector, plan_request
from memest.request import build_request
from memest.results import DeviceInfo, Estimate, PresetInfo
from memest.sweeping import SWEEP_DOC, SWEEP_TIMEOUT, SweepCollector, sweep_request
from memest.validation import _Collector

# The server accepts requests up to 64 MiB; answers for large op graphs can be as large.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]

ESTIMATE_DOC = """Estimates the memory of one step; returns a memest.Estimate.

        The model: `preset` (a name from presets(), with `params` {name: int} overrides and
        `seq` as a shortcut for params["seq"]), `model` (a dict in the proto JSON mapping of
        memest.v1.Model, e.g. {"layers": {...}} as in examples/mlp.json, a path to such a JSON
        file, or a memest.v1.Model), or `hf_config` with `seq` (a Hugging Face config.json's
        path, its dict, or a transformers PretrainedConfig: model_type llama, mistral, mixtral,
        qwen2, qwen2_moe, qwen3, qwen3_moe, deepseek_v3, gemma, gemma2, gemma3_text, phi3,
        gpt_neox, gpt2, falcon, opt, bert, roberta, t5 or vit, built without weights; its torch_dtype is the precision when none is given).

        The run, in the `memest estimate` command's words:
          batch_size (samples per optimizer step, default 1), grad_accum_steps,
          mode: training | inference,
          precision: fp32 | fp16 | bf16 | bf16-pure | fp16-pure (fp16/bf16: autocast),
          optimizer: sgd | momentum | adam | adamw | adagrad | rmsprop | lion | adafactor |
            hf-adamw | hf-adafactor (transformers' own) | adamw-bnb-8bit | paged-adamw-8bit |
            paged-adamw-32bit (bitsandbytes'),
          optimizer_impl: for-loop | foreach | fused, weight_decay, keep_grads,
          checkpoint: none | every-block | every-k | sqrt | attention | scopes,
          checkpoint_k, checkpoint_scopes, checkpoint_non_reentrant (use_reentrant=False),
          first_step, generate_tokens,
          expandable_segments, runtime: cuda | cpu-1.13,
          cpu_isa: avx512 | avx2 (cpu-1.13 only: the ISA oneDNN's convolutions use),
          cpu_l1_cache_bytes, cpu_l2_cache_bytes (cpu-1.13 only: the per-core caches oneDNN
            blocks convolutions by; default its 32 KiB and 512 KiB),
          hold_outputs (training: True, the default, for a loop that keeps the model's outputs
          in a variable, `outputs = model(**batch)`, through backward and the optimizer step;
          False for one that lets them go once the loss exists: Hugging Face's Trainer,
          Lightning),
          attention: eager | sdpa | flash | mem-efficient | cudnn (HF's flash_attention_2 is
            flash; unset: sdpa on CUDA, eager on cpu-1.13),
          cuda_module_loading: lazy | eager (CUDA_MODULE_LOADING; unset: lazy),
          cublas_workspace_config: CUBLAS_WORKSPACE_CONFIG's text, ":SIZE_KIB:COUNT" pairs
            (":4096:8" as deterministic runs set it; unset: PyTorch's default),
          expert_load: worst | balanced, how a mixture-of-experts router spreads the tokens
            (unset: worst, every token to the same top-k experts; balanced: evenly),
          serving: the model served by vLLM's engine on each GPU (docs/serving.md): True, or a
            dict of its engine arguments: gpu_memory_utilization, block_size, max_num_seqs,
            max_num_batched_tokens, max_model_len, kv_cache_dtype (auto | fp8 | fp8_e4m3 |
            fp8_e5m2), and the questions request_tokens (how many requests of that length fit
            at once) and concurrency (the longest request with that many at once), and with
            lora= (vLLM's --enable-lora: its r is max_lora_rank, its target_modules vLLM's
            module suffixes, none for every module) max_loras and fully_sharded_loras; give a
            device, no batch_size; the answer's .serving holds the budget and the KV cache,
          data_parallel (ranks; batch_size stays per rank), dp_strategy: ddp | zero1 |
            deepspeed-zero1 | deepspeed-zero2 | deepspeed-zero3 | fsdp1 | fsdp2 | megatron-ddp |
            megatron-distopt (unset: ddp with more than one rank), bucket_cap_mb,
            gradient_as_bucket_view (DistributedDataParallel's), reduce_bucket_size,
            overlap_comm (DeepSpeed ZeRO's), stage3_prefetch_bucket_size,
            stage3_max_live_parameters, stage3_max_reuse_distance,
            stage3_param_persistence_threshold (DeepSpeed ZeRO-3's, in elements),
            offload_optimizer (DeepSpeed ZeRO's
            offload_optimizer device cpu), offload_param (ZeRO-3's offload_param device cpu;
            for both, Estimate.data_parallel.host_bytes is the host memory the rank takes),
            reshard_after_forward (FSDP2's, for the blocks;
            unset: True), keep_last_block_gathered (FSDP2's reshard_after_forward=False on the
            last block alone, torchtitan's default), fsdp_mixed_precision (FSDP2's MixedPrecisionPolicy with float32
            shards, with precision bf16-pure or fp16-pure), fsdp_cpu_offload (FSDP2's
            CPUOffloadPolicy or FSDP1's CPUOffload(offload_params=True):
            Estimate.data_parallel.host_bytes holds the shards, their gradients and the
            optimizer state), data_shard (HSDP: FSDP shards
            within groups of this many data ranks, replicated across the groups): the
            estimate is the rank that
            holds the most, Estimate.data_parallel says which,
          pipeline (stages; grad_accum_steps micro-batches), pipeline_schedule: 1f1b | gpipe,
            pipeline_virtual_stages (Megatron's interleaved 1F1B: model chunks per stage),
            pipeline_keep_outputs: every stage is estimated, the estimate is the one that
            needs the most, Estimate.pipeline lists them all,
          tensor_parallel (ranks), sequence_parallel, tensor_plan ({module pattern: "colwise" |
            "rowwise" | "colwise-gathered"}; default: the presets' Hugging Face names): Megatron-LM's column- and
            row-parallel linears, the estimate is one rank of the group; tensor_layers:
            "megatron" (the default) or "dtensor" (PyTorch's parallelize_module as torchtitan
            runs it: functional collectives, loss_parallel, the embedding's whole-table grad),
          context_parallel (ranks): each holds its share of every sequence (ring attention),
          expert_parallel (ranks, with dp_strategy "megatron-ddp" or "megatron-distopt"):
            Megatron-LM's expert_model_parallel_size, each rank holds its share of every
            mixture-of-experts layer's experts; the estimate is the rank that receives the most,
          lora: LoRA adapters as PEFT's get_peft_model adds them, from a peft LoraConfig, a dict
            of its fields (r, lora_alpha, lora_dropout, target_modules, modules_to_save; and
            autocast_adapter_dtype, get_peft_model's) or a path to adapter_config.json (or the
            adapter's directory): the base frozen, the adapters trained,
          quantization: QLoRA's 4-bit base, from a transformers BitsAndBytesConfig or a dict of
            its fields (load_in_4bit, bnb_4bit_quant_type, bnb_4bit_use_double_quant,
            bnb_4bit_compute_dtype, llm_int8_skip_modules; load_in_8bit, llm_int8_threshold;
            and prepare_model_for_kbit_training, PEFT's, default True), or a TorchAoConfig,
          fp8 ("delayed" or "current", or {"recipe": "delayed", "amax_history_len": 16}):
            fp8 training with TransformerEngine as accelerate runs it (docs/fp8.md),
          gpus_per_node (default 8): which process groups NCCL connects within a node, for
            NCCL's memory (Estimate.breakdown.nccl),
          device (a catalog name, see devices()) or capacity_bytes (int, or "24GiB"),
          advice (False skips the advice: faster), layer_rows (the per-layer table's rows: the N
            layers that hold the most, in model order; 0: none; None: every layer),
          timeout (seconds, this call only),
          request_id (the call's id in the server's log, 1 to 64 of [A-Za-z0-9._:-]; the
            Estimate's request_id is the one the server used, its own when none is given).
        None means the server's default. Unset words raise InvalidArgument before any call.
        """


VALIDATE_DOC = """Runs the step on the server's GPU and compares it with the estimate.

        Takes estimate()'s arguments, plus: scale_batch_to_fit (validate the largest
        micro-batch that fits the free memory instead of refusing), repeats (timed runs per
        kernel, default 3), progress (called with a memest.Progress for each event: the queue
        position, then the stages). Returns a memest.Validation. The server must have been
        started with --device (otherwise Unavailable); timeout defaults to 30 minutes.
        """

VALIDATE_TIMEOUT = 30 * 60.0

PLAN_DOC = """The ways to split a training job over GPUs that fit, fewest GPUs first, as a list of
memest.Plan (docs/planning.md). The model and the run as for estimate, with batch_size the
GLOBAL batch; devices (GPU types, or device=), max_gpus (the GPU budget, default 8), max_plans
(default 20), host_memory_per_gpu (what each GPU's rank may take of host memory for CPU
offload, bytes or a size such as "256GiB": where nothing fits on the GPUs alone, plans with
DeepSpeed's or FSDP's offload are tried; default none). on_plan(plan) is called as each
arrives. The search honours `timeout` (seconds): DeadlineExceeded after it."""


def validate_request(preset=None, model=None, *, scale_batch_to_fit=False, repeats=None,
                     **kwargs):
    """The ValidateRequest for Client.validate's arguments, and its label."""
    kwargs.pop("advice", None)
    estimate = build_request(preset=preset, model=model, **kwargs)
    request = v1.ValidateRequest(model=estimate.model, config=estimate.config,
                                 scale_batch_to_fit=bool(scale_batch_to_fit), repeats=repeats or 0)
    return request, request_label(estimate)


def request_label(request):
    """A short name for the request: "gpt2-small seq=128, batch 2"."""
    model = request.model
    source = model.WhichOneof("source")
    if source == "preset":
        params = " ".join("%s=%d" % item for item in sorted(model.preset.params.items()))
        name = model.preset.name + (" " + params if params else "")
    elif source == "layers":
        name = "layers model (%d layers)" % len(model.layers.layers)
    elif source == "hf_config":
        fields = model.hf_config.config.fields
        kind = fields["model_type"].string_value if "model_type" in fields else "?"
        name = "%s config seq=%d" % (kind, model.hf_config.seq)
    else:
        name = "op graph (%d ops)" % len(model.ops.ops)
    return "%s, batch %d" % (name, request.config.batch_size)


class Client:
    """A connection to a memest-server at `address` ("host:port", or a memest.Server).

    token: the server's bearer token, for a server started with --auth-token-file (each call
    carries 'authorization: Bearer <token>'; without it the server answers Unauthenticated).
    tls: for a server started with --tls-cert: True (trust the system's CAs) or a memest.Tls
    (the server's CA, this client's certificate for mutual TLS, the server's name).
    """

    def __init__(self, address, timeout=30.0, token=None, tls=None):
        self.address = getattr(address, "address", address)
        self.timeout = timeout
        self._metadata = token_metadata(token)
        self._channel = channel(self.address, tls, CHANNEL_OPTIONS)
        self._stub = v1.MemoryEstimatorStub(self._channel)
        self._closed = False

    def _call(self, method, request, timeout, request_id=None):
        """The reply of a unary call and the id the server gave the call."""
        if self._closed:
            raise MemestError("%r: closed" % self)
        try:
            response, call = method.with_call(
                request, timeout=self.timeout if timeout is None else timeout,
                metadata=call_metadata(self._metadata, request_id))
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        return response, request_id_of(call.initial_metadata())

    def estimate(self, preset=None, model=None, *, timeout=None, request_id=None, **kwargs):
        request = build_request(preset=preset, model=model, **kwargs)
        return self.estimate_request(request, timeout=timeout, request_id=request_id)

    estimate.__doc__ = ESTIMATE_DOC

    def estimate_request(self, request, *, timeout=None, request_id=None):
        """Sends a prepared memest.v1.EstimateRequest; returns a memest.Estimate."""
        response, server_id = self._call(self._stub.Estimate, request, timeout, request_id)
        return Estimate.from_proto(response, label=request_label(request), request_id=server_id)

    def validate(self, preset=None, model=None, *, progress=None, timeout=None, **kwargs):
        request, label = validate_request(preset, model, **kwargs)
        if self._closed:
            raise MemestError("%r: closed" % self)
        events = _Collector(progress, label)
        try:
            for event in self._stub.Validate(request, timeout=timeout or VALIDATE_TIMEOUT,
                                             metadata=self._metadata):
                events.take(event)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        return events.validation()

    validate.__doc__ = VALIDATE_DOC

    def plan(self, preset=None, model=None, *, on_plan=None, timeout=None, **kwargs):
        request = plan_request(preset, model, **kwargs)
        if self._closed:
            raise MemestError("%r: closed" % self)
        plans = PlanCollector(on_plan)
        try:
            for event in self._stub.Plan(request, timeout=timeout or self.timeout,
                                         metadata=self._metadata):
                plans.take(event)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        return plans.plans

    plan.__doc__ = PLAN_DOC

    def sweep(self, preset=None, model=None, *, configs, on_result=None, timeout=None, **kwargs):
        request, labels = sweep_request(preset, model, configs=configs, **kwargs)
        if self._closed:
            raise MemestError("%r: closed" % self)
        results = SweepCollector(labels, on_result)
        try:
            for result in self._stub.Sweep(request, timeout=timeout or SWEEP_TIMEOUT,
                                           metadata=self._metadata):
                results.take(result)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        return results.results

    sweep.__doc__ = SWEEP_DOC

    def presets(self, *, timeout=None):
        """The built-in models, as a list of memest.PresetInfo."""
        response, _ = self._call(self._stub.ListPresets, v1.ListPresetsRequest(), timeout)
        return [PresetInfo.from_proto(p) for p in response.presets]

    def devices(self, *, timeout=None):
        """The device catalog, as a list of memest.DeviceInfo."""
        response, _ = self._call(self._stub.ListDevices, v1.ListDevicesRequest(), timeout)
        return [DeviceInfo.from_proto(d) for d in response.devices]

    def close(self):
        """Closes the channel; calls after this fail."""
        self._closed = True
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "memest.Client(%r)" % (self.address,)
