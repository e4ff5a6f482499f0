"""memory_plan.py: what one rank holds, on its GPU and in host memory, in each phase of a step.

A Kevin-sized run fails by memory before it fails by anything else, and it fails late: after the
load, in the first generation or the first backward. The plan is computed from the model's
`config.json` alone (the model is built on the meta device to count its parameters exactly; no
weight is read) and the run's settings, so `train.py --plan` answers "does it fit, and with which
flags" before a GPU is touched, and every run refuses a plan that cannot fit before loading.

With P parameters (L decoder layers of p_l each, the embedding and head E), N ranks, bf16 compute:

    fp32 shards      4P/N       FSDP2's sharded parameters (on the GPU, or the host with cpu_offload)
    gradients        4P/N       sharded fp32 gradients, from the first backward to the optimizer step
    AdamW moments    8P/N       exp_avg and exp_avg_sq; in host memory with offload_optimizer,
                                streamed to the GPU one layer's share at a time for the step
    generation copy  2P         the whole model in bf16 on every rank while the HF engine decodes
    KV cache         rows x (prompt + new tokens) x 2 x L x kv_heads x head_dim x 2 bytes
    gathered layers  2 x 2p_l   FSDP2 keeps the layer it computes and the prefetched next one in bf16,
                                with the root's embedding and head (2E) gathered for the whole step
    activations      the decoder layers' saved inputs (T x hidden x 2 bytes a layer with activation
                     checkpointing, every temporary of every layer without), one layer's temporaries,
                     and the LM head's: fused (grpo.linear_token_logprobs) one chunk of logits, in
                     backward the head's bf16 weight gradient and an fp32 hidden gradient; unfused
                     the trained tokens' bf16 logits, twice in forward and three times in backward

where T = max(micro_batch_tokens, prompt + new tokens) (a micro-batch holds at least one row; rows
at full length, the worst case). The phases: load, generation, log-probs (no grad), backward, optimizer step; a
phase's peak is the sum of what is alive in it. `offload_for_generation` moves the fp32 shards and
the AdamW moments to host memory while the engine decodes (verl's offload for rollout).

Layer temporaries are counted from the Qwen2 / Llama layer as transformers runs it; the plan is
checked against measured allocations by tests/test_memory_plan.py (CPU) and bench/rehearsal.py (GPU).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

GiB = 1 << 30
CHUNK_ELEMENTS = 1 << 24   # grpo.CHUNK_ELEMENTS (not imported: this file stands alone)
VLLM_PROFILE_TOKENS = 16384   # vLLM 0.34's max_num_batched_tokens for LLM on GPUs of 70 GiB or more
PHASES = ("load", "generation", "logprobs", "backward", "optimizer")


@dataclass
class ModelShape:
    """What the plan needs of a model, counted from its config on the meta device."""
    params: int
    layer_params: int          # one decoder layer's
    root_params: int           # what FSDP2's root group holds: embedding, head (if untied), final norm
    largest_param: int         # elements of the largest single tensor (the embedding, usually)
    layers: int
    heads: int
    hidden: int
    intermediate: int
    vocab: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int           # of the checkpoint's tensors

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2   # keys and values, bf16

    @property
    def forward_bytes_per_token(self) -> int:
        """Bytes a token's activations take at the widest point of a forward without grad (bf16): the
        MLP's act(gate), up and their product, beside the hidden state, residual and k, v."""
        return 2 * (3 * self.intermediate + 2 * self.hidden + 2 * self.kv_heads * self.head_dim)

    @property
    def layer_temp_bytes_per_token(self) -> int:
        """Bytes a token's activations take inside one decoder layer (bf16): what the forward keeps
        for its backward, or what a forward alone has alive at its widest."""
        kv = self.kv_heads * self.head_dim
        return 2 * (6 * self.hidden + 2 * kv + 4 * self.intermediate)


@dataclass
class Settings:
    """A run's settings, as far as memory is concerned (train.Config's fields of the same names)."""
    nproc: int = 1
    device: str = "cuda"            # cpu: gloo ranks, everything the GPU would hold is in host memory
    gpu_bytes: int = 80 * 10**9
    rows: int = 64                  # generation rows decoded at once on a rank
    prompt_tokens: int = 8192
    new_tokens: int = 16384
    micro_batch_tokens: int = 16384
    prefill_chunk_tokens: int = 1 << 16
    initial_cache_tokens: int = 1024  # new positions the fast decoder's cache starts with (it doubles)
    activation_checkpointing: bool = True
    fused_lm_head: bool = True
    offload_optimizer: bool = False
    offload_for_generation: bool = False
    cpu_offload: bool = False
    engine: str = "hf"
    vllm_gpu_memory: float = 0.0    # vLLM's whole share of the GPU when awake (engine vllm)
    headroom: float = 0.05          # share of the GPU a plan leaves free: the allocator's fragmentation,
                                    # the CUDA context, NCCL's buffers, CUDA graphs (none of them counted)

    @property
    def usable_bytes(self) -> int:
        return int(self.gpu_bytes * (1 - self.headroom))


@dataclass
class Plan:
    shape: ModelShape
    settings: Settings
    gpu: dict[str, dict[str, int]] = field(default_factory=dict)    # phase -> category -> bytes
    host: dict[str, dict[str, int]] = field(default_factory=dict)
    short: list[str] = field(default_factory=list)   # what cannot work whatever the peaks say

    def peak(self, phase: str, where: str = "gpu") -> int:
        return sum(getattr(self, where)[phase].values())

    @property
    def gpu_peak(self) -> int:
        return max(self.peak(p) for p in PHASES)

    @property
    def host_peak(self) -> int:
        return max(self.peak(p, "host") for p in PHASES)

    @property
    def fits(self) -> bool:
        return not self.short and (self.settings.device == "cpu" or self.gpu_peak <= self.settings.usable_bytes)


def model_shape(config) -> ModelShape:
    """Count a transformers config's model on the meta device (no memory, no weights)."""
    import torch
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    layers = model.model.layers
    params = {id(p): p for p in model.parameters()}   # a tied head counted once
    layer_params = sum(p.numel() for p in layers[0].parameters())
    in_layers = {id(p) for p in layers.parameters()}
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    dtype = getattr(text, "dtype", None) or getattr(text, "torch_dtype", None) or torch.float32
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    return ModelShape(
        params=sum(p.numel() for p in params.values()), layer_params=layer_params,
        root_params=sum(p.numel() for i, p in params.items() if i not in in_layers),
        largest_param=max(p.numel() for p in params.values()), layers=len(layers), heads=text.num_attention_heads,
        hidden=text.hidden_size,
        intermediate=text.intermediate_size, vocab=text.vocab_size,
        kv_heads=getattr(text, "num_key_value_heads", None) or text.num_attention_heads, head_dim=head_dim,
        dtype_bytes=torch.empty((), dtype=dtype).element_size())


def read_config(model: str):
    """The transformers config of a local folder, or of a hub id from the Hugging Face cache (config.json
    only: nothing is downloaded if it is there)."""
    from transformers import AutoConfig
    path = os.path.expanduser(model)
    if os.path.isdir(path):
        if not os.path.exists(os.path.join(path, "config.json")):
            raise FileNotFoundError("no config.json in it")
        return AutoConfig.from_pretrained(path)
    if model.startswith((".", "/", "~")):
        raise FileNotFoundError("no such directory")
    return AutoConfig.from_pretrained(model)


def make_plan(shape: ModelShape, s: Settings) -> Plan:
    P, N = shape.params, s.nproc
    shards, grads, moments = 4 * P // N, 4 * P // N, 8 * P // N
    largest_unit = max(shape.layer_params, shape.root_params)          # the root (embedding, head) usually
    unit_moments = 8 * largest_unit // N                               # streamed to the GPU for its step
    adamw_temp = 4 * shape.largest_param // N                          # AdamW's foreach temporaries (measured)
    root, layer = shape.root_params, shape.layer_params
    gathered = 2 * 2 * layer + 2 * root                                # two layers and the root, bf16
    row = s.prompt_tokens + s.new_tokens
    T = max(1, s.micro_batch_tokens // row) * row                     # whole rows at full length, the worst case
    trained = T * s.new_tokens // row                                  # positions the LM head runs on
    chunk = CHUNK_ELEMENTS * 4 * 3 // 2                                # grpo's fp32 chunk and its bf16 copy
    if s.fused_lm_head:
        head_forward = trained * shape.hidden * 2 + chunk              # h / T, and one chunk of logits
        head_backward = shape.vocab * shape.hidden * 2 + trained * shape.hidden * 6 + chunk
    else:   # bf16 logits and logits / T; in backward their gradients too (not measured on a GPU)
        head_forward = 2 * trained * shape.vocab * 2 + chunk
        head_backward = 3 * trained * shape.vocab * 2 + chunk
    saved_inputs = shape.layers * T * shape.hidden * 2 if s.activation_checkpointing else 0
    layer_acts = (1 if s.activation_checkpointing else shape.layers) * T * shape.layer_temp_bytes_per_token
    # the slice a rank reads at load: its rows of the largest tensor in the file's dtype, on the host and
    # again on the GPU before the shard's in-place upcast
    slice_bytes = -(-shape.largest_param // N) * shape.dtype_bytes
    # Decoding: the whole cache, the step's logits and the sampler's passes over them. A prefill forward
    # (fast_decoder): whole prompts, at most prefill_chunk_tokens tokens and 2^27 mask entries; attention
    # with a mask and grouped heads runs SDPA's math path, whose bf16 scores (heads x prompts x w x w) are
    # the widest point (measured on the H100), else the MLP's; the cache then holds the prompts and the
    # initial new positions.
    w = s.prompt_tokens
    prompts = max(1, min((1 << 27) // w ** 2, s.prefill_chunk_tokens // w, s.rows))
    prefill = {"KV cache": s.rows * (w + s.initial_cache_tokens) * shape.kv_bytes_per_token,
               "prefill work": max(shape.heads * prompts * w * w * 2, prompts * w * shape.forward_bytes_per_token)}
    decode = {"KV cache": s.rows * row * shape.kv_bytes_per_token, "decode work": s.rows * shape.vocab * 4 * 4}
    decoding = prefill if sum(prefill.values()) > sum(decode.values()) else decode
    full_tensor = 4 * shape.largest_param if N > 1 else 0              # an all-gathered fp32 tensor (one rank: none)

    on_gpu = not s.cpu_offload
    train_state = {"fp32 shards": shards if on_gpu else 0}
    moments_gpu = 0 if (s.offload_optimizer or s.cpu_offload) else moments
    plan = Plan(shape, s)
    plan.gpu["load"] = {**train_state, "slice read": slice_bytes}
    if s.engine == "vllm":   # the trainer's state stays; vLLM's share was free when it started (engines.py)
        share = int(s.vllm_gpu_memory * s.gpu_bytes)
        plan.gpu["generation"] = {**train_state, "AdamW moments": moments_gpu, "vLLM (its whole share)": share}
        # vLLM's start: its bf16 weights, its profile run's activations (16,384 tokens, vLLM's default batch
        # on large GPUs) and the KV cache of one request of max_model_len must fit its share
        need = 2 * P + VLLM_PROFILE_TOKENS * shape.forward_bytes_per_token + row * shape.kv_bytes_per_token
        if share < need and s.device != "cpu":   # (a CPU run of the engine is a test with a fake vLLM)
            plan.short.append(f"vLLM's share ({gb(share)} GB) holds less than its weights, a profile run and one "
                              f"request ({gb(need)} GB): raise --vllm-gpu-memory")
    elif s.offload_for_generation:   # the copy is built with the training state already on the host
        build = {"copy's build (one gathered tensor)": full_tensor + 4 * shape.largest_param // N}
        plan.gpu["generation"] = {"generation copy (bf16)": 2 * P,
                                  **(decoding if sum(decoding.values()) >= sum(build.values()) else build)}
    else:   # FSDP2 unshards the policy in bf16 beside its shards
        plan.gpu["generation"] = {**train_state, "AdamW moments": moments_gpu, "generation copy (bf16)": 2 * P,
                                  **decoding}
    plan.gpu["logprobs"] = {**train_state, "AdamW moments": moments_gpu, "gathered params (bf16)": gathered,
                            "layer activations": T * shape.forward_bytes_per_token, "LM head": head_forward}
    # backward's peak is the larger of a layer's recompute (mid-backward) and the root's reduce-scatter at
    # its end (the root's bf16 grads and their fp32 copy in and out)
    middle = {"gathered params (bf16)": gathered, "saved layer inputs": saved_inputs, "layer activations": layer_acts, "LM head": head_backward}
    end = {"gathered params (bf16)": 2 * root, "root grads (bf16, fp32 in and out)": root * (2 + 4) + 4 * root // N}
    plan.gpu["backward"] = {**train_state, "gradients": grads if on_gpu else 0, "AdamW moments": moments_gpu,
                            **(middle if sum(middle.values()) >= sum(end.values()) else end)}
    plan.gpu["optimizer"] = {**train_state, "gradients": grads if on_gpu else 0,
                             "AdamW moments": moments if moments_gpu else (unit_moments if on_gpu else 0),
                             "AdamW temporaries": adamw_temp if on_gpu else 0}
    host_state = {"fp32 shards": 0 if on_gpu else shards, "gradients": 0 if on_gpu else grads,
                  "AdamW moments": moments if (s.offload_optimizer or s.cpu_offload) else 0}
    plan.host["load"] = {"fp32 shards": 0 if on_gpu else shards, "slice read": slice_bytes}
    generation_host = dict(host_state)
    if s.offload_for_generation and s.engine != "vllm":
        generation_host.update({"fp32 shards": shards, "AdamW moments": moments})
    plan.host["generation"] = generation_host
    for phase in ("logprobs", "backward", "optimizer"):
        plan.host[phase] = dict(host_state)
    if s.device == "cpu":   # no GPU: its share of every phase is host memory
        for phase in PHASES:
            plan.host[phase] = {k: plan.host[phase].get(k, 0) + plan.gpu[phase].get(k, 0)
                                for k in {**plan.host[phase], **plan.gpu[phase]}
                                if not (phase == "load" and k == "slice read")}   # the host's copy is the one
            plan.gpu[phase] = {}
    return plan


def rows_that_fit(shape: ModelShape, s: Settings, most: int) -> int:
    """The most generation rows (<= most) whose generation phase fits the GPU; 0 if not one does."""
    import dataclasses
    for rows in range(most, 0, -1):
        if make_plan(shape, dataclasses.replace(s, rows=rows)).peak("generation") <= s.usable_bytes:
            return rows
    return 0


def gb(n: int) -> str:
    return f"{n / 1e9:.1f}"


def table(plan: Plan) -> str:
    """Each phase's bytes by category, GPU and host, per rank."""
    s = plan.settings
    memory = "CPU ranks" if s.device == "cpu" else f"GPU {gb(s.gpu_bytes)} GB"
    lines = [f"per rank of {s.nproc}: {plan.shape.params / 1e9:.2f}B parameters, {plan.shape.layers} layers; "
             f"{memory}; {s.rows} generation rows x {s.prompt_tokens + s.new_tokens} tokens; "
             f"micro-batch {s.micro_batch_tokens} tokens",
             f"{'phase':<11} {'where':<5} {'GB':>7}  what"]
    for phase in PHASES:
        for where in (("host",) if s.device == "cpu" else ("gpu", "host")):
            parts = {k: v for k, v in getattr(plan, where)[phase].items() if v}
            detail = ", ".join(f"{k} {gb(v)}" for k, v in parts.items())
            lines.append(f"{phase:<11} {where:<5} {gb(sum(parts.values())):>7}  {detail}")
    return "\n".join(lines)


def summary(plan: Plan) -> str:
    """One line: the GPU and host peaks, and whether it fits."""
    worst = max(PHASES, key=plan.peak)
    verdict = "fits" if plan.fits else "does not fit"
    gpu = ("" if plan.settings.device == "cpu" else
           f"GPU peak {gb(plan.gpu_peak)} of {gb(plan.settings.gpu_bytes)} GB a rank ({worst}), ")
    room = "" if plan.settings.device == "cpu" else f" ({plan.settings.headroom:.0%} of the GPU kept free)"
    return f"memory plan: {gpu}host peak {gb(plan.host_peak)} GB a rank: {verdict}{room}" + "".join(
        f"; {reason}" for reason in plan.short)


def remedies(shape: ModelShape, s: Settings) -> str:
    """The flags that would make a plan fit, tried from the cheapest in seconds a step; empty if none."""
    import dataclasses
    tries = [("--offload-optimizer", dict(offload_optimizer=True)),
             ("--offload-optimizer --offload-for-generation", dict(offload_optimizer=True, offload_for_generation=True))]
    for rows in (s.rows // 2, s.rows // 4, 8, 4, 2, 1):
        if 0 < rows < s.rows:
            tries.append((f"--offload-optimizer --offload-for-generation --generation-batch-rows {rows}",
                          dict(offload_optimizer=True, offload_for_generation=True, rows=rows)))
    for tokens in (s.micro_batch_tokens // 2, s.micro_batch_tokens // 4):
        if tokens < s.prompt_tokens + s.new_tokens:
            continue   # a micro-batch holds one row whatever the flag says
        tries.append((f"--offload-optimizer --offload-for-generation --generation-batch-rows 1 "
                      f"--micro-batch-tokens {tokens}", dict(offload_optimizer=True, offload_for_generation=True,
                                                             rows=1, micro_batch_tokens=tokens)))
    for flags, change in tries:
        if make_plan(shape, dataclasses.replace(s, **change)).fits:
            return flags
    return ""


def refusal(plan: Plan, remedy: str) -> str:
    """One line: why the plan does not fit and what would make it fit."""
    if plan.short:
        return f"the memory plan does not fit: {plan.short[0]}"
    worst = max(PHASES, key=plan.peak)
    return (f"the memory plan does not fit: {worst} needs {gb(plan.peak(worst))} GB of {gb(plan.settings.gpu_bytes)} "
            f"GB a GPU at {plan.settings.nproc} ranks; " + (f"it fits with {remedy}" if remedy else
            "no offload or batch flag makes it fit: more ranks or larger GPUs (train.py --plan shows each phase)"))


def plan_json(plan: Plan) -> str:
    return json.dumps({"settings": plan.settings.__dict__, "params": plan.shape.params, "gpu": plan.gpu,
                       "host": plan.host, "gpu_peak": plan.gpu_peak, "host_peak": plan.host_peak,
                       "fits": plan.fits}, indent=1)


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def reset_host_peak() -> int:
    """Reset this process's peak resident memory (Linux: clear_refs 5) and return the resident bytes now."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:   # not Linux, or not allowed: the peak then counts from the process's start
        pass
    return _status_bytes("VmRSS")


def host_peak() -> int:
    """This process's peak resident bytes since its start or the last reset_host_peak."""
    return _status_bytes("VmHWM")


# ----------------------------------------------------------------------------- train.py's plan

def settings_for(config, world: int, gpu_bytes: int) -> Settings:
    """The memory plan's view of a run: a rank's generation rows are its tasks' trajectories (at most
    --generation-batch-rows), a micro-batch holds at least one whole row."""
    rows_per_rank = -(-min(config.tasks_per_step, 10**9) // world) * config.trajectories
    new_tokens = max(config.max_new_tokens, config.late_max_new_tokens)
    return Settings(
        nproc=world, device=config.device, gpu_bytes=gpu_bytes,
        rows=min(config.generation_batch_rows or rows_per_rank, rows_per_rank), prompt_tokens=config.max_prompt_tokens,
        new_tokens=new_tokens, micro_batch_tokens=config.micro_batch_tokens,
        activation_checkpointing=config.activation_checkpointing, fused_lm_head=config.fused_lm_head,
        offload_optimizer=config.offload_optimizer,
        offload_for_generation=config.offload_for_generation, cpu_offload=config.cpu_offload, engine=config.engine,
        vllm_gpu_memory=config.vllm_gpu_memory)


def plan_for(config, world: int, model_config) -> tuple[Plan, str]:
    """train.py's plan: (the plan, the flags that would make it fit or ''), for this GPU or --gpu-memory-gb.
    `config` is train.Config, `model_config` the model's transformers config (weights.model_config)."""
    import torch
    if config.gpu_memory_gb:
        gpu_bytes = int(config.gpu_memory_gb * 1e9)
    elif config.device == "cuda" and torch.cuda.is_available():
        gpu_bytes = torch.cuda.mem_get_info()[1]
    elif config.device == "cuda":
        raise SystemExit("train.py: no GPU here to measure: pass --gpu-memory-gb for the plan")
    else:
        gpu_bytes = 0
    shape = model_shape(model_config)
    settings = settings_for(config, world, gpu_bytes)
    if config.generation_batch_rows == 0 and config.device == "cuda":
        settings.rows = rows_that_fit(shape, settings, settings.rows) or 1
    plan = make_plan(shape, settings)
    return plan, ("" if plan.fits else remedies(shape, settings))

