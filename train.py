"""train.py: multi-turn GRPO that teaches a policy to write fast kernels (Kevin-32B), one step.

    python train.py                                          # smoke preset: tiny model, CPU, C++ kernels
    torchrun --nproc_per_node=2 train.py --steps 2 --out runs/smoke2                 # 2 CPU ranks, gloo
    torchrun --nproc_per_node=8 train.py --preset kevin --model /path/to/QwQ-32B \\
        --tasks /path/to/KernelBench --out runs/kevin                                 # one node, 8 GPUs
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 \\
        train.py --preset kevin ...                                                   # two nodes
    python train.py --out runs/smoke --resume                # continue from the last checkpoint

One step, each a line of `train`'s loop you can point at:
 1. draw tasks (tasks.draw_tasks: uniform, or Kimi k1.5's prioritised sampling); rank r takes
    tasks[r::world], so a task's whole group (G trajectories x T turns) lives on one rank;
 2. rollout: G x T attempts per task, judged by kernel_eval -> Samples with discounted returns;
 3. advantages: grpo.group_advantages over each task's G*T samples;
 4. old log-probs (grpo.completion_logprobs), once, under no_grad, before the first optimizer step;
 5. for each of `optimizer_steps` mini-batches: the global normaliser Z (all-reduced), the clipped
    loss on micro-batches (the same count on every rank), grad-norm clip, AdamW step;
 6. metrics gathered from every rank, written by rank 0; a checkpoint every `save_every` steps.

The log-prob contract: the engine samples from softmax(logits / temperature) (--top-p 1, the
default), and the old and new log-probs of the ratio are computed here from the same logits /
temperature: both read the one RolloutConfig built from Config (`rollout_config`). Completion.logprobs
are not used: oracle answers have none, and vLLM's may come from another kernel; a ratio of two
different distributions would not start at 1.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import inspect
import json
import os
import pathlib
import random
import re
import shlex
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

import checkpoint
import engines
import grpo
import memory_plan
import offload
import rewards
import rollout
import tasks as tasks_module
import train_log
import weights

TINY_MODELS = {  # named configs, randomly initialised, with the offline ByT5 byte tokenizer
    "tiny-llama": dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768),
}


@dataclass
class Config:
    """Every field is a flag (--max-new-tokens for max_new_tokens); its comment is the flag's --help."""
    # the policy and the tasks
    model: str = "tiny-llama"         # Hugging Face id, local model folder, or a built-in tiny model (tiny-llama)
    engine: str = "hf"                # hf: the policy generates itself; vllm: a colocated vLLM, asleep while training
    vllm_gpu_memory: float = 0.3      # vLLM's whole share of a GPU (weights, activations, KV cache), free when it starts
    tasks: str = "builtin"            # builtin, a KernelBench checkout, or a .jsonl/.parquet export (tasks.py export)
    levels: str = "1,2"               # comma-separated KernelBench levels
    task_ids: str = "builtin/level1/01_relu,builtin/level2/06_bias_tanh_multiply"  # tasks to train on (ids); empty: all
    heldout: int = 0                  # tasks held out of training by tasks.split_tasks
    oracle_share: float = 0.5         # share of answers replaced by built-in solutions, so the smoke run sees rewards
    # the run
    out: str = "runs/smoke"           # folder of the run: metrics.jsonl, plots/, checkpoints/, export/
    resume: bool = False              # continue from the last whole checkpoint in --out
    steps: int = 2                    # training steps (batches of tasks)
    seed: int = 0                     # seeds the weights of a tiny model, the task draws and the sampling
    device: str = "auto"              # cpu (gloo, C++ kernels), cuda (nccl, CUDA kernels); auto: cuda if torch sees it
    max_minutes: float = 0.0          # start no step that would end past this many minutes (0: no limit); still exports
    save_every: int = 1               # a checkpoint every N steps (and after the last)
    keep_checkpoints: int = 2         # the newest N checkpoints are kept
    dist_timeout_minutes: int = 120   # collective timeout: judging kernels between collectives can take long
    # a step's rollout (rollout.RolloutConfig, built once by rollout_config)
    tasks_per_step: int = 2           # tasks per batch, over all ranks
    trajectories: int = 4             # G: trajectories per task
    turns: int = 2                    # T: refinement turns per trajectory
    max_prompt_tokens: int = 8192     # prompt budget; the earliest turns' attempts are dropped first
    max_new_tokens: int = 2560        # tokens per response (the smoke run's: room for an oracle answer in bytes)
    late_max_new_tokens: int = 0      # tokens per response from --late-from-step on (0: never raised)
    late_from_step: int = 30          # the step from which --late-max-new-tokens applies
    temperature: float = 1.0          # sampling temperature, also the one of the loss's log-probs
    top_p: float = 1.0                # nucleus sampling; below 1, samples from a distribution the loss does not model
    stop: tuple[str, ...] = ()        # a string that ends a response (repeat the flag for several)
    expected_thinking_opening: str = "Okay"  # the not-okay ratio counts thinking that does not open with this
    mask_truncated: bool = False      # train on nothing from responses cut at the token limit (DAPO's overlong filter)
    overlap_turns: bool = True        # a trajectory whose verdict needs no harness writes its next turn at once
    correctness_weight: float = 0.3   # score = weight x correct + speedup x correct (Kevin: 0.3)
    speedup_cap: float | None = None  # clip each speedup in the score at this value (Kevin: no cap)
    gamma: float = 0.4                # discount of later turns' scores in a turn's return (Kevin: 0.4)
    return_mode: str = "sum"          # a turn's return: discounted sum or max of the later scores (Kevin: sum)
    sampler: str = "uniform"          # task draws: uniform, or prioritized (Kimi k1.5: weight 1 - success rate + floor)
    priority_floor: float = 0.05      # the floor of --sampler prioritized
    time_kernels: bool = True         # time correct kernels; off: correctness only, so scores are exact (tests)
    reuse_verdicts: bool = False      # judge each distinct (task, code) once per run (needs --no-time-kernels)
    sandbox: str = "auto"             # candidates behind namespaces and uid 65534: auto (else a warning), require, off
    # the update
    lr: float = 1e-4                  # AdamW learning rate, constant after warm-up
    warmup_frac: float = 0.03         # linear warm-up over this share of all optimizer steps (Kevin: 3%)
    weight_decay: float = 0.0         # AdamW weight decay
    grad_clip: float = 0.05           # gradient-norm clip (Kevin: 0.05)
    optimizer_steps: int = 2          # optimizer steps per batch, each on its own share of the samples (Kevin: 2)
    clip_low: float = 0.2             # the ratio's lower clip, 1 - clip_low (Kevin: 0.2)
    clip_high: float = 0.28           # the ratio's upper clip, 1 + clip_high (Kevin: 0.28)
    aggregation: str = "dr_grpo"      # the loss's normaliser over tokens (grpo.py; Kevin: dr_grpo)
    scale_by_std: bool = True         # divide advantages by their task's standard deviation
    micro_batch_tokens: int = 16384   # padded tokens per forward/backward micro-batch
    generation_batch_rows: int = 64   # rows the HF engine decodes at once (0: as many as the memory plan fits)
    compile_decode: bool = False      # torch.compile the HF engine's decode step, sampling and prefill
    activation_checkpointing: bool = False  # recompute activations in the backward: less memory, more time
    fused_lm_head: bool = False       # LM head fused with the log-probs: no (tokens x vocab) logits, more time
    compile: bool = False             # torch.compile each decoder layer's training forward
    cpu_offload: bool = False         # FSDP2 keeps parameters and optimizer state in CPU memory
    offload_optimizer: bool = False   # AdamW's moments in host memory, one layer's on the GPU for its step (Kevin's ZeRO-3 offload)
    offload_for_generation: bool = False  # shards and moments wait in host memory while a bf16 copy decodes (verl)
    # the memory plan (memory_plan.py): printed at every start; a plan that cannot fit is refused before loading
    plan: bool = False                # print the plan's table for --nproc ranks and exit (0: fits, 1: does not)
    nproc: int = 0                    # ranks the plan is for (0: this launch's WORLD_SIZE)
    gpu_memory_gb: float = 0.0        # GPU memory a rank in GB (1e9 bytes) for the plan (0: measured on this GPU)


PRESETS = {
    "smoke": {},
    "kevin": dict(model="Qwen/QwQ-32B", device="cuda", task_ids="", heldout=20, steps=100, tasks_per_step=8,
                  trajectories=16, turns=4, max_new_tokens=16384, late_max_new_tokens=22528,
                  temperature=0.9, oracle_share=0.0, lr=2e-6, micro_batch_tokens=32768,
                  activation_checkpointing=True, save_every=5, offload_optimizer=True,
                  offload_for_generation=True, generation_batch_rows=0, fused_lm_head=True),
}

CHOICES = {"engine": ("hf", "vllm"), "sampler": tasks_module.SAMPLERS, "return_mode": rewards.RETURN_MODES,
           "aggregation": grpo.AGGREGATIONS, "sandbox": ("auto", "require", "off")}


FLAG_KINDS = {"bool": dict(action=argparse.BooleanOptionalAction), "int": dict(type=int, metavar="N"),
              "float": dict(type=float, metavar="X"), "float | None": dict(type=float, metavar="X"),
              "str": dict(metavar="TEXT"), "tuple[str, ...]": dict(action="append", metavar="TEXT")}


def field_help(cls) -> dict[str, str]:
    """Each field's trailing comment in the class's source: what a reader of Config sees, --help shows."""
    matches = (re.match(r"\s+(\w+): .*?\s# (.*)", line) for line in inspect.getsource(cls).splitlines())
    return {m[1]: m[2] for m in matches if m}


def shown(value) -> str:
    return "none" if value is None or value == () else repr(value) if value == "" else str(value)


def parse_config(argv=None) -> Config:
    """Config from the command line: the preset's values, then the flags given."""
    parser = argparse.ArgumentParser(prog="train.py", description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.error = lambda message: parser.exit(2, f"train.py: {message}\n")   # one line, not 60 flags of usage
    parser.add_argument("--preset", choices=sorted(PRESETS), default="smoke", help="a named set of defaults: "
                        "smoke (tiny model, CPU) or kevin (Kevin-32B's run) (default: smoke)")
    comments = field_help(Config)
    for f in dataclasses.fields(Config):
        kevin = f"; --preset kevin: {shown(PRESETS['kevin'][f.name])}" if f.name in PRESETS["kevin"] else ""
        parser.add_argument("--" + f.name.replace("_", "-"), default=None,
                            help=f"{comments[f.name]} (default: {shown(f.default)}{kevin})".replace("%", "%%"),
                            **(dict(choices=CHOICES[f.name]) if f.name in CHOICES else FLAG_KINDS[f.type]))
    args = parser.parse_args(argv)
    values = {**PRESETS[args.preset], **{k: v for k, v in vars(args).items() if v is not None and k != "preset"}}
    out = pathlib.Path(values.get("out", Config.out))
    blocked = next((path for path in (out, *out.parents) if path.is_file()), None)   # makedirs would fail there
    if blocked:
        parser.error(f"--out {out}: {blocked} is a file, not a folder")
    return Config(**values)


def rollout_config(config: Config, language: str) -> rollout.RolloutConfig:
    """The rollout's settings, built once from Config. Its temperature is the sampler's and the loss's
    (the log-prob contract above), so the update reads it from here, never from Config."""
    return rollout.RolloutConfig(
        n_trajectories=config.trajectories, n_turns=config.turns, max_new_tokens=config.max_new_tokens,
        max_prompt_tokens=config.max_prompt_tokens, temperature=config.temperature, top_p=config.top_p,
        stop=tuple(config.stop), language=language, gamma=config.gamma, return_mode=config.return_mode,
        correctness_weight=config.correctness_weight, speedup_cap=config.speedup_cap,
        expected_thinking_opening=config.expected_thinking_opening, mask_truncated=config.mask_truncated,
        overlap_turns=config.overlap_turns)


# ----------------------------------------------------------------------------- setup

def load_policy(config: Config):
    """(model, tokenizer); every failure is one line that names the problem."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, ByT5Tokenizer, LlamaConfig, LlamaForCausalLM
    if config.model in TINY_MODELS:
        tokenizer = ByT5Tokenizer()
        model = LlamaForCausalLM(LlamaConfig(**TINY_MODELS[config.model], eos_token_id=tokenizer.eos_token_id,
                                             pad_token_id=tokenizer.pad_token_id, bos_token_id=None))
    else:
        if config.model.startswith((".", "/", "~")) and not os.path.isdir(os.path.expanduser(config.model)):
            raise SystemExit(f"train.py: --model {config.model}: no such directory")
        try:
            tokenizer = AutoTokenizer.from_pretrained(config.model)
            model = AutoModelForCausalLM.from_pretrained(config.model, dtype=torch.float32)
        except OSError as error:
            raise SystemExit(f"train.py: --model {config.model}: cannot load it: {str(error).splitlines()[0]}")
    if tokenizer.eos_token_id is None:
        raise SystemExit(f"train.py: the tokenizer of {config.model} has no eos_token_id: completions could never end")
    model.config.use_cache = False  # the training forward keeps no KV cache
    return model, tokenizer


def load_tasks(config: Config) -> list:
    """The training part of tasks.split_tasks (heldout tasks never train), then --task-ids; the built-in
    references at config.device's sizes (tasks.sized_for)."""
    return tasks_module.select_tasks(config.tasks, config.levels, "train.py", split="train",
                                     n_heldout=config.heldout, task_ids=config.task_ids, device=config.device)


def setup_policy(config: Config, device: torch.device, world: int):
    """(FSDP2 model, tokenizer, the host memory the weights' load took). A built-in tiny model is built whole
    and sharded; a checkpoint is built on the meta device, sharded, and each rank reads only its own rows
    (weights.load_sharded): no rank's host memory holds the model."""
    from transformers import AutoConfig, AutoTokenizer
    before = memory_plan.reset_host_peak()
    if config.model in TINY_MODELS:
        model, tokenizer = load_policy(config)
        return shard(model.to(device), config, device, world), tokenizer, memory_plan.host_peak() - before
    try:
        if dist.get_rank() == 0:   # a hub id's files: downloaded once, then the others find them cached
            weights.local_folder(config.model)
        dist.barrier()
        folder = weights.local_folder(config.model)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        hf_config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError) as error:
        raise SystemExit(f"train.py: --model {config.model}: cannot load it: {str(error).splitlines()[0]}")
    if tokenizer.eos_token_id is None:
        raise SystemExit(f"train.py: the tokenizer of {config.model} has no eos_token_id: completions could never end")
    before = memory_plan.reset_host_peak()   # the weights' load alone: what the plan's load phase counts
    try:
        model = weights.load_sharded(folder, hf_config, functools.partial(shard, config=config, device=device,
                                                                          world=world),
                                     torch.device("cpu") if config.cpu_offload else device)
    except (KeyError, ValueError, FileNotFoundError) as error:
        raise SystemExit(f"train.py: --model {config.model}: {str(error).strip(chr(39))}")
    return model, tokenizer, memory_plan.host_peak() - before


def shard(model, config: Config, device: torch.device, world: int):
    """FSDP2: each decoder layer its own group, then the root (torchtitan's layout)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh(device.type, (world,))
    kwargs = dict(mesh=mesh)
    if device.type == "cuda":  # bf16 compute, fp32 master weights and gradient reduction
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if config.cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    if config.activation_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):   # transformers >= 5.2x renamed it
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for layer in model.model.layers:
        if config.compile:   # fuses norms, rotary, SwiGLU; forward only, so FSDP2's hooks stay eager
            layer.forward = torch.compile(layer.forward, dynamic=True)
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def lr_at(optimizer_step: int, total: int, config: Config) -> float:
    """Constant after a linear warm-up over warmup_frac of all optimizer steps (Kevin: 3%)."""
    warmup = max(1, round(config.warmup_frac * total))
    return config.lr * min(1.0, (optimizer_step + 1) / warmup)


# ----------------------------------------------------------------------------- the update

def update(model, optimizers: list, samples: list, advantages: torch.Tensor, config: Config,
           sampling: rollout.RolloutConfig, step: int, pad_id: int, device, world: int) -> dict:
    """Steps 4 and 5: old log-probs, then `optimizer_steps` clipped-loss updates on this batch. The
    log-probs are of logits / the temperature the samples were drawn at (`sampling`, the rollout's
    settings), and Dr. GRPO's normaliser counts its max_new_tokens."""
    temperature, max_new = sampling.temperature, sampling.max_new_tokens
    order = list(range(len(samples)))
    random.Random(f"minibatch:{config.seed}:{step}:{dist.get_rank()}").shuffle(order)
    minis = [order[k::config.optimizer_steps] for k in range(config.optimizer_steps)]
    mini_batches = [rollout.micro_batches([samples[i] for i in rows], pad_id, config.micro_batch_tokens, device) for rows in minis]
    # every rank runs as many forwards as the busiest one: FSDP2's all-gathers are collectives
    counts = torch.tensor([len(b) for b in mini_batches], device=device)
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    for batches, n in zip(mini_batches, counts.tolist()):
        batches += [rollout.empty_micro_batch(pad_id, device) for _ in range(n - len(batches))]
    phases = {}   # seconds and GPU peak bytes of each phase
    # 4. old log-probs, once, before any optimizer step changes the weights
    with torch.no_grad(), train_log.measured("logprobs", phases, device):
        for batch in (b for batches in mini_batches for b in batches):
            batch["old_logprobs"] = grpo.completion_logprobs(model, batch, temperature, config.fused_lm_head)[0]
    out = {"loss": [], "clip_fraction": [], "grad_norm": [], "approx_kl": [], "phases": phases,
           "advantage_nonzero": float((advantages != 0).float().mean()) if len(samples) else 0.0}
    for k, (batches, rows) in enumerate(zip(mini_batches, minis)):
        # 5a. the global normaliser Z of this optimizer step, over every rank's real rows
        total = sum((grpo.loss_denominator(b["loss_mask"], config.aggregation, max_new).to(device, torch.float32)
                     for b in batches if b["rows"]), torch.zeros((), device=device))
        dist.all_reduce(total)
        step_loss = 0.0
        for batch in batches:
            with train_log.measured("backward", phases, device):   # the forward with grad, then the backward
                logp, mask = grpo.completion_logprobs(model, batch, temperature, config.fused_lm_head)
                row_adv = (advantages[[rows[i] for i in batch["rows"]]].to(device) if batch["rows"]
                           else torch.zeros(1, device=device))
                # 5b. the clipped loss (grpo.policy_loss), normalised by the global Z
                loss, metrics = grpo.policy_loss(logp, batch["old_logprobs"], row_adv, mask, clip_low=config.clip_low,
                                                 clip_high=config.clip_high, aggregation=config.aggregation,
                                                 max_tokens=max_new, total=total)
                (loss * world).backward()   # FSDP2 averages gradients over ranks; Z is already global
            step_loss += metrics["loss"]
            if metrics["tokens"]:
                out["clip_fraction"].append(metrics["clip_frac_low"] + metrics["clip_frac_high"])
                out["approx_kl"].append(metrics["approx_kl_old"])   # k3 KL(old || new): how far updates moved
        # 5c. grad-norm clip, the lr schedule, the optimizer step
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        out["lr"] = lr_at(step * config.optimizer_steps + k, config.steps * config.optimizer_steps, config)
        for group in (g for optimizer in optimizers for g in optimizer.param_groups):
            group["lr"] = out["lr"]
        with train_log.measured("optimizer", phases, device):
            offload.optimizer_step(optimizers, config.offload_optimizer, device)
        out["loss"].append(step_loss)
        out["grad_norm"].append(float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm))
    return out


def bind_rank_cpus(local_rank: int, local_world: int) -> None:
    """This rank's own share of the node's CPUs (contiguous, equal): kernel_eval keeps the last
    CPUs a process may use for its timing windows (EvalConfig.timing_cpus), so without a share of
    its own every rank on a node would time its kernels on the same few cores at once."""
    cpus = sorted(os.sched_getaffinity(0))
    share = len(cpus) // local_world
    if local_world > 1 and share >= 1:
        os.sched_setaffinity(0, cpus[local_rank * share:(local_rank + 1) * share])


def builds_at_once(eval_device: str, local_world: int) -> int:
    """The harness's own count of builds at once, every build CPU busy: a harness call's batch ends sooner
    than with fewer (docs/PERFORMANCE.md, "A training step's evaluation"). A cuda rank's CPUs are its own
    share already (bind_rank_cpus); ranks on cpu share the node's."""
    import kernel_eval
    builds = kernel_eval.default_parallel_compiles(eval_device, kernel_eval.EvalConfig())
    return builds if eval_device != "cpu" else max(1, builds // local_world)


def out_of_time(projected_seconds: float, max_minutes: float, device) -> bool:
    """Whether the next step would end past --max-minutes, agreed by all ranks (their clocks differ)."""
    late = torch.tensor(float(projected_seconds > 60 * max_minutes), device=device)
    dist.all_reduce(late, op=dist.ReduceOp.MAX)
    return bool(late)


def plan_settings(config: Config, world: int, gpu_bytes: int) -> memory_plan.Settings:
    """The memory plan's view of a run: a rank's generation rows are its tasks' trajectories (at most
    --generation-batch-rows), a micro-batch holds at least one whole row."""
    rows_per_rank = -(-min(config.tasks_per_step, 10**9) // world) * config.trajectories
    new_tokens = max(config.max_new_tokens, config.late_max_new_tokens)
    return memory_plan.Settings(
        nproc=world, device=config.device, gpu_bytes=gpu_bytes,
        rows=min(config.generation_batch_rows or rows_per_rank, rows_per_rank), prompt_tokens=config.max_prompt_tokens,
        new_tokens=new_tokens, micro_batch_tokens=config.micro_batch_tokens,
        activation_checkpointing=config.activation_checkpointing, fused_lm_head=config.fused_lm_head,
        offload_optimizer=config.offload_optimizer,
        offload_for_generation=config.offload_for_generation, cpu_offload=config.cpu_offload, engine=config.engine,
        vllm_gpu_memory=config.vllm_gpu_memory)


def model_config(config: Config):
    """The model's transformers config, without its weights."""
    if config.model in TINY_MODELS:
        from transformers import LlamaConfig
        return LlamaConfig(**TINY_MODELS[config.model])
    try:
        return memory_plan.read_config(config.model)
    except (OSError, ValueError) as error:
        raise SystemExit(f"train.py: --model {config.model}: {str(error).splitlines()[0]}")


def make_plan(config: Config, world: int) -> tuple[memory_plan.Plan, str]:
    """(the plan, the flags that would make it fit or ''), for this GPU or --gpu-memory-gb."""
    if config.gpu_memory_gb:
        gpu_bytes = int(config.gpu_memory_gb * 1e9)
    elif config.device == "cuda" and torch.cuda.is_available():
        gpu_bytes = torch.cuda.mem_get_info()[1]
    elif config.device == "cuda":
        raise SystemExit("train.py: no GPU here to measure: pass --gpu-memory-gb for the plan")
    else:
        gpu_bytes = 0
    shape = memory_plan.model_shape(model_config(config))
    settings = plan_settings(config, world, gpu_bytes)
    if config.generation_batch_rows == 0 and config.device == "cuda":
        settings.rows = memory_plan.rows_that_fit(shape, settings, settings.rows) or 1
    plan = memory_plan.make_plan(shape, settings)
    return plan, ("" if plan.fits else memory_plan.remedies(shape, settings))


def refusal(plan: memory_plan.Plan, remedy: str) -> str:
    return f"train.py: {memory_plan.refusal(plan, remedy)}"


# ----------------------------------------------------------------------------- main

def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    config = parse_config(argv)
    if not sys.stderr.isatty():   # a log file gets a progress bar's line every 30 s, not ten a second
        os.environ.setdefault("TQDM_MININTERVAL", "30")
    if config.reuse_verdicts and config.time_kernels:
        raise SystemExit("train.py: --reuse-verdicts needs --no-time-kernels (a speedup is a new measurement each time)")
    for name in ("steps", "tasks_per_step", "trajectories", "turns", "max_new_tokens", "optimizer_steps",
                 "micro_batch_tokens", "save_every", "keep_checkpoints"):
        if getattr(config, name) < 1:
            raise SystemExit(f"train.py: --{name.replace('_', '-')} {getattr(config, name)}: must be at least 1")
    for name in ("lr", "grad_clip"):
        if not getattr(config, name) > 0:
            raise SystemExit(f"train.py: --{name.replace('_', '-')} {getattr(config, name)}: must be > 0")
    for name in ("generation_batch_rows", "nproc", "gpu_memory_gb", "weight_decay", "warmup_frac", "max_minutes"):
        if getattr(config, name) < 0:
            raise SystemExit(f"train.py: --{name.replace('_', '-')} {getattr(config, name)}: must be >= 0")
    tasks_module.parse_levels(config.levels, "train.py")
    if config.plan:   # before any device check: a plan is made on any machine
        if config.device == "auto":
            config.device = "cuda" if torch.cuda.is_available() or config.gpu_memory_gb else "cpu"
        plan, remedy = make_plan(config, config.nproc or int(os.environ.get("WORLD_SIZE", 1)))
        print(memory_plan.table(plan))
        print(memory_plan.summary(plan))
        if not plan.fits:
            raise SystemExit(refusal(plan, remedy))
        return
    if config.engine == "vllm" and config.model in TINY_MODELS:
        raise SystemExit(f"train.py: --engine vllm loads --model from disk; {config.model} is built in memory")
    if config.engine == "vllm" and not {"RANK", "WORLD_SIZE", "LOCAL_RANK"} <= os.environ.keys():
        raise SystemExit("train.py: --engine vllm runs under torchrun (vLLM's launcher reads RANK and LOCAL_RANK): "
                         "torchrun --nproc_per_node=N train.py --engine vllm ...")
    if config.engine == "vllm":
        try:
            import vllm  # noqa: F401
        except ImportError as error:
            raise SystemExit(f"train.py: --engine vllm needs vLLM (pip install vllm): {error}")
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if config.resume and finished_steps(config.out) >= config.steps:
        if rank == 0:
            print(f"train.py: {config.out} has finished its {config.steps} steps and exported its model; "
                  "nothing to do (a larger --steps trains on)")
        return
    import kernel_boundary
    import kernel_sandbox
    import kernel_eval   # its device check: a one-line error for a missing GPU or CUDA toolkit
    config.device = kernel_eval.resolve_device(None if config.device == "auto" else config.device, "train.py")
    config.device = config.device.split(":")[0]   # each rank takes cuda:LOCAL_RANK
    try:   # --sandbox require refuses before any work
        kernel_boundary.boundary_for(config.sandbox, gpu=config.device != "cpu")
    except kernel_boundary.BoundaryUnavailable as error:
        raise SystemExit(f"train.py: {error}")
    sampling = rollout_config(config, tasks_module.LANGUAGE_FOR_DEVICE[config.device])
    if sampling.temperature <= 0:
        raise SystemExit("train.py: --temperature must be > 0 (the loss's log-probs are of logits / temperature)")
    if not 0 < sampling.top_p <= 1:
        raise SystemExit(f"train.py: --top-p {sampling.top_p}: must be in (0, 1]")
    if sampling.top_p < 1 and rank == 0:
        print(f"train.py: --top-p {sampling.top_p}: samples come from the nucleus, the loss's log-probs from the "
              "whole softmax(logits / temperature): the log-prob contract holds at 1 only", file=sys.stderr)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")   # `python train.py` is a world of one
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    device = torch.device("cuda", local_rank) if config.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)   # the CUDA context now, so that the load's measured memory is the load's
        bind_rank_cpus(local_rank, local_world)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(minutes=config.dist_timeout_minutes))
    try:
        with kernel_sandbox.Zygotes() as zygotes:   # the harness's forking processes live for the run
            train(config, sampling, rank, world, local_world, device, resume_command(argv), zygotes)
    finally:
        dist.destroy_process_group()


def train(config: Config, sampling: rollout.RolloutConfig, rank: int, world: int, local_world: int,
          device: torch.device, resume_hint: str, zygotes=None) -> None:
    started = time.perf_counter()   # --max-minutes counts the setup too
    import kernel_eval
    from tqdm import tqdm
    train_tasks = load_tasks(config)
    if min(config.tasks_per_step, len(train_tasks)) < world:  # every rank generates: a collective under FSDP2
        raise SystemExit(f"train.py: {min(config.tasks_per_step, len(train_tasks))} tasks per step for {world} ranks; "
                         "each rank needs at least one task")
    plan, remedy = make_plan(config, world)   # before anything is loaded: refuse what cannot fit
    if rank == 0:
        print(f"train.py: {memory_plan.summary(plan)}" + (f" (generation rows: {plan.settings.rows})"
              if config.generation_batch_rows == 0 else ""), flush=True)
    if not plan.fits:
        raise SystemExit(refusal(plan, remedy))
    torch.manual_seed(config.seed)   # same initial weights on every rank
    with train_log.measured("load", load_phase := {}, device):
        model, tokenizer, host_growth = setup_policy(config, device, world)
    if rank == 0:
        gpu = f", GPU peak {memory_plan.gb(load_phase['gpu_peak_load'])} GB" if "gpu_peak_load" in load_phase else ""
        print(f"train.py: loaded in {load_phase['seconds_load']:.1f} s: host peak +{memory_plan.gb(host_growth)} GB"
              f"{gpu}", flush=True)
    layer_params = sum(p.numel() for p in model.model.layers.parameters())   # a DTensor's numel is global
    optimizers = offload.make_optimizers(model, config.lr, config.weight_decay, per_unit=config.offload_optimizer)
    vllm = None
    if config.engine == "vllm":   # weights from --model, then synced from the policy before each rollout
        if rank == 0:
            print("train.py: --engine vllm has never run on this project's machines (vLLM cannot be installed "
                  "there); it is written against vLLM 0.34.0's source", flush=True)
        max_model_len = engines.vllm_max_model_len(tokenizer, config.max_prompt_tokens,
                                                   max(config.max_new_tokens, config.late_max_new_tokens))
        vllm = engines.VLLMEngine(config.model, tokenizer, gpu_memory_utilization=config.vllm_gpu_memory,
                                  max_model_len=max_model_len, device=device, seed=config.seed + rank,
                                  dtype=torch.bfloat16)   # shard()'s compute dtype
        vllm.sleep()
    for_generation = (functools.partial(offload.decoding_copy, optimizers=optimizers, device=device,
                                        moments_on_gpu=not config.offload_optimizer)
                      if config.offload_for_generation else None)
    engine = vllm or engines.HFEngine(model, tokenizer, max_batch_rows=plan.settings.rows if
                                      config.generation_batch_rows == 0 else config.generation_batch_rows,
                                      compile_decode=config.compile_decode, for_generation=for_generation,
                                      progress=rank == 0)
    if config.oracle_share > 0:
        engine = engines.OracleMixedEngine(engine, tokenizer, train_tasks, oracle_share=config.oracle_share,
                                           language=sampling.language, seed=config.seed + rank)
        longest = engine.longest_answer_tokens()
        if longest > sampling.max_new_tokens:  # a cut oracle answer is a format error: no real work at all
            raise SystemExit(f"train.py: the longest oracle answer is {longest} tokens; raise --max-new-tokens "
                             f"above {sampling.max_new_tokens}")
    late = dataclasses.replace(sampling, max_new_tokens=config.late_max_new_tokens or sampling.max_new_tokens)
    clock = {}   # seconds per phase of this step
    engine.generate = train_log.timed(engine.generate, clock, "generation")
    generation_phase = {}   # seconds and GPU peak bytes of this step's generation
    engine.generate = train_log.measuring(engine.generate, "generation", generation_phase, device)
    eval_device = str(device) if device.type == "cuda" else "cpu"
    evaluate = train_log.timed(functools.partial(
        kernel_eval.evaluate_batch, device=eval_device, time_candidate=config.time_kernels, sandbox=config.sandbox,
        progress=rank == 0,
        max_parallel_compiles=builds_at_once(eval_device, local_world), zygotes=zygotes), clock, "evaluation")
    if config.reuse_verdicts:   # a policy that repeats itself would rebuild the same kernels every step
        evaluate = rollout.reusing_verdicts(evaluate)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    step_seconds = []   # this process's steps; its first carries one-time costs (compiles, cold caches)
    start_step, state = checkpoint.start(model, optimizers, config.out, config.resume, rank)
    if config.offload_optimizer:   # a restored optimizer's moments were made on the GPU
        offload.move_moments(optimizers, "cpu")
    success = {k: tuple(v) for k, v in state.get("success", {}).items()}   # the sampler's statistics
    if rank == 0:
        checkpoint.atomic_write(os.path.join(config.out, "config.json"), json.dumps(dataclasses.asdict(config), indent=1))
        print(f"train.py: {len(train_tasks)} tasks, {world} rank(s) on {device.type}, {sampling.language} kernels, "
              f"model {config.model}" + (f", oracle-mixed engine ({config.oracle_share:.0%} of answers are built-in "
                                         "solutions)" if config.oracle_share else ""), flush=True)

    completed = start_step
    progress = tqdm(range(start_step, config.steps), disable=rank != 0, desc="steps", initial=start_step,
                    total=config.steps)
    for step in progress:
        step_start = time.perf_counter()
        next_step = max(step_seconds[1:] or step_seconds or [0.0])   # the longest, the first left out once possible
        if config.max_minutes and out_of_time(step_start - started + next_step, config.max_minutes, device):
            if rank == 0:
                tqdm.write(f"train.py: stopping before step {step + 1}: --max-minutes {config.max_minutes} would pass")
            break
        clock.update(generation=0.0, evaluation=0.0, generation_calls=0, evaluation_calls=0)
        generation_phase.clear()
        if isinstance(engine, engines.OracleMixedEngine):  # seeded per step, so a resumed run redraws the same mix
            engine.rng.seed(f"oracle-mixed:{config.seed}:{rank}:{step}")
        # 1. this step's tasks; each task's whole group on one rank
        my_tasks = tasks_module.draw_tasks(train_tasks, config.tasks_per_step, seed=config.seed, step=step,
                                            sampler=config.sampler, success=success,
                                            priority_floor=config.priority_floor)[rank::world]
        # 2. rollout: generation and judging, no collective inside
        step_sampling = late if step >= config.late_from_step else sampling
        if vllm:   # every rank syncs (FSDP2's all-gathers)
            vllm.refresh(model)
        with torch.compiler.set_stance("force_eager"):   # decoding's shapes would recompile each step
            samples, turn_stats = rollout.rollout(my_tasks, engine, evaluate, step_sampling)
        if vllm:
            vllm.sleep()
        train_start = time.perf_counter()
        # 3. advantages per task over its G*T samples
        advantages = grpo.group_advantages([s.discounted_return for s in samples], [s.task_id for s in samples],
                                           scale_by_std=config.scale_by_std)
        # 4-5. old log-probs, then optimizer steps (global Z, clipped loss, grad clip, AdamW)
        update_out = update(model, optimizers, samples, advantages, config, step_sampling, step, pad_id, device, world)
        clock["training"] = time.perf_counter() - train_start
        # 6. metrics from every rank, written by rank 0; a checkpoint
        # flops: the old log-probs' forward, then forward + backward (2x) in the update
        mine = train_log.rank_summary(samples, turn_stats, update_out, clock,
                                      4 * train_log.forward_flops(layer_params, model.config, samples))
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
        for task_id, turn, status, *_ in (r for part in gathered for r in part["rows"]):
            done, tried = success.get(task_id, (0, 0))
            success[task_id] = (done + (status == "correct"), tried + 1)
        if rank == 0:
            record = train_log.step_record(step, gathered, update_out, config.turns)
            record["seconds_step"] = time.perf_counter() - step_start
            # each phase's GPU peak bytes (generation's included) and the training phases' seconds (rank 0's)
            record.update({k: v for k, v in {**generation_phase, **update_out["phases"]}.items()
                           if k.startswith("gpu_peak") or k in ("seconds_logprobs", "seconds_backward", "seconds_optimizer")})
            checkpoint.write_metrics(config.out, record)
            train_log.plot_curves(config.out)
            tqdm.write(train_log.step_line(record))
        step_seconds.append(time.perf_counter() - step_start)
        if (step + 1) % config.save_every == 0 or step + 1 == config.steps:
            checkpoint.save(model, optimizers, config.out, step + 1, {"success": success}, rank, config.keep_checkpoints)
        completed = step + 1
    progress.close()
    if completed % config.save_every and completed < config.steps:   # stopped early by --max-minutes
        checkpoint.save(model, optimizers, config.out, completed, {"success": success}, rank, config.keep_checkpoints)
    checkpoint.export(model, tokenizer, config.out, rank)
    if rank == 0:
        print(f"train.py: {'done' if completed >= config.steps else 'stopped'} after {completed} of {config.steps} "
              f"steps; metrics.jsonl, plots/, checkpoints/ and the exported model (export/) are in {config.out}"
              + ("" if completed >= config.steps else f"; continue with: {resume_hint}"), flush=True)


def finished_steps(out: str) -> int:
    """The steps of out's last whole checkpoint when the model was exported after it (a run that ended), else 0."""
    found = checkpoint.complete(out)
    exported = os.path.join(out, "export", "config.json")
    if not found or not os.path.exists(exported):
        return 0
    state = os.path.join(found[-1], "trainer_state.json")
    if os.path.getmtime(exported) < os.path.getmtime(state):   # trained on after its export, then stopped
        return 0
    with open(state) as f:
        return json.load(f)["step"]


def resume_command(argv: list[str]) -> str:
    """The command that continues this run: the same launch and flags, --out spelled out, and --resume."""
    args = [a for a in argv if a not in ("--resume", "--no-resume")]
    if not any(a == "--out" or a.startswith("--out=") for a in args):
        args += ["--out", parse_config(argv).out]
    script = os.path.relpath(__file__)
    world, local_world = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    launch = (f"python {script}" if "TORCHELASTIC_RUN_ID" not in os.environ else
              f"torchrun --nproc_per_node={local_world} {script}" if world == local_world else
              f"torchrun <the same launch options> {script}")
    return f"{launch} {shlex.join(args + ['--resume'])}"


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:   # kernel_eval has stopped its workers; checkpoints are whole or absent
        if os.environ.get("RANK", "0") == "0":
            print(f"train.py: interrupted; continue with: {resume_command(sys.argv[1:])}", file=sys.stderr)
        os._exit(130)
