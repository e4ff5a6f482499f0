"""train.py: multi-turn GRPO that teaches a policy to write fast kernels (Kevin-32B), one step.

    python train.py                                          # smoke preset: tiny model, CPU, C++ kernels
    torchrun --nproc_per_node=2 train.py --steps 2 --out runs/smoke2                 # 2 CPU ranks, gloo
    torchrun --nproc_per_node=8 train.py --preset kevin --model /path/to/QwQ-32B \\
        --tasks /path/to/KernelBench --out runs/kevin                                 # one node, 8 GPUs
    torchrun --nnodes=2 --nproc_per_node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 \\
        train.py --preset kevin ...                                                   # two nodes
    python train.py --out runs/smoke --resume                # continue from the last checkpoint

One step, each a line of `main`'s loop you can point at:
 1. draw tasks (tasks.draw_tasks: uniform, or Kimi k1.5's prioritised sampling); rank r takes
    tasks[r::world], so a task's whole group (G trajectories x T turns) lives on one rank;
 2. rollout: G x T attempts per task, judged by kernel_eval -> Samples with discounted returns;
 3. advantages: grpo.group_advantages over each task's G*T samples;
 4. old log-probs (grpo.completion_logprobs), once, under no_grad, before the first optimizer step;
 5. for each of `optimizer_steps` mini-batches: the global normaliser Z (all-reduced), the clipped
    loss on micro-batches (the same count on every rank), grad-norm clip, AdamW step;
 6. metrics gathered from every rank, written by rank 0; a checkpoint every `save_every` steps.

The log-prob contract: the engine samples from softmax(logits / temperature) (top_p = 1 for
training), and the old and new log-probs of the ratio are computed here from the same
logits / temperature. Completion.logprobs are not used: oracle answers have none, and vLLM's
may come from another kernel; a ratio of two different distributions would not start at 1.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import os
import random
import sys
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

import checkpoint
import engines
import grpo
import rewards
import rollout
import tasks as tasks_module
import train_log

TINY_MODELS = {  # named configs, randomly initialised, with the offline ByT5 byte tokenizer
    "tiny-llama": dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768),
}


@dataclass
class Config:
    model: str = "tiny-llama"         # HF id, local path, or a TINY_MODELS name
    engine: str = "hf"                # "hf" (the policy itself) or "vllm" (colocated, asleep while training)
    vllm_memory: float = 0.3          # the GPU share vLLM's KV cache may take when awake
    tasks: str = "builtin"            # "builtin", a KernelBench checkout, or a .jsonl/.parquet export
    levels: str = "1,2"
    task_ids: str = "builtin/level1/01_relu,builtin/level2/06_bias_tanh_multiply"  # "" = all
    heldout: int = 0                  # tasks held out of training by tasks.split_tasks (Kevin: 20)
    out: str = "runs/smoke"
    resume: bool = False
    steps: int = 2
    seed: int = 0
    device: str = "auto"              # "cpu" (gloo, C++ kernels), "cuda" (nccl, CUDA kernels); auto: cuda if present
    tasks_per_step: int = 2           # Kevin: 8
    trajectories: int = 4             # G (Kevin: 16)
    turns: int = 2                    # T (Kevin: 4)
    max_prompt_tokens: int = 8192
    max_new_tokens: int = 2560        # Kevin: 16384 ... (smoke: room for an oracle answer in bytes)
    late_max_new_tokens: int = 0      # ... raised to 22528 (0: never)
    late_from_step: int = 30          # ... at step 30
    temperature: float = 1.0          # Kevin: 0.9
    gamma: float = 0.4
    return_mode: str = "sum"
    sampler: str = "uniform"          # or "prioritized" (Kimi k1.5: weight 1 - success rate + floor)
    priority_floor: float = 0.05
    oracle_share: float = 0.5         # share of answers replaced by built-in solutions (smoke only)
    time_kernels: bool = True         # off: correctness only, so scores are exact (tests)
    reuse_verdicts: bool = False      # judge each distinct (task, code) once per run (needs --no-time-kernels)
    lr: float = 1e-4                  # Kevin: 2e-6
    warmup_frac: float = 0.03
    weight_decay: float = 0.0
    grad_clip: float = 0.05
    optimizer_steps: int = 2
    clip_low: float = 0.2
    clip_high: float = 0.28
    aggregation: str = "dr_grpo"
    scale_by_std: bool = True
    micro_batch_tokens: int = 16384   # padded tokens per micro-batch
    generation_batch_rows: int = 64   # rows the HF engine decodes at once
    compile_decode: bool = False      # torch.compile the HF engine's decode step, sampling and prefill
    activation_checkpointing: bool = False
    compile: bool = False             # torch.compile each decoder layer's training forward
    cpu_offload: bool = False
    save_every: int = 1
    keep_checkpoints: int = 2
    dist_timeout_minutes: int = 120   # evaluation between collectives can take many minutes
    max_minutes: float = 0.0          # no step starts that would end past this (0: none); the export is written


PRESETS = {
    "smoke": {},
    "kevin": dict(model="Qwen/QwQ-32B", device="cuda", task_ids="", heldout=20, steps=100, tasks_per_step=8,
                  trajectories=16, turns=4, max_new_tokens=16384, late_max_new_tokens=22528,
                  temperature=0.9, oracle_share=0.0, lr=2e-6, micro_batch_tokens=32768,
                  activation_checkpointing=True, save_every=5),
}

CHOICES = {"engine": ("hf", "vllm"), "sampler": tasks_module.SAMPLERS, "return_mode": rewards.RETURN_MODES,
           "aggregation": grpo.AGGREGATIONS}


def parse_config(argv=None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="smoke")
    for f in dataclasses.fields(Config):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        else:
            parser.add_argument(flag, type={"int": int, "float": float}.get(f.type, str), default=None)
    args = parser.parse_args(argv)
    values = {**PRESETS[args.preset], **{k: v for k, v in vars(args).items() if v is not None and k != "preset"}}
    return Config(**values)


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
    """The training part of tasks.split_tasks (heldout tasks never train), then --task-ids."""
    return tasks_module.select_tasks(config.tasks, config.levels, "train.py", split="train",
                                     n_heldout=config.heldout, task_ids=config.task_ids)


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

def update(model, optimizer, samples: list, advantages: torch.Tensor, config: Config, step: int, max_new: int,
           pad_id: int, device, world: int) -> dict:
    """Steps 4 and 5: old log-probs, then `optimizer_steps` clipped-loss updates on this batch."""
    order = list(range(len(samples)))
    random.Random(f"minibatch:{config.seed}:{step}:{dist.get_rank()}").shuffle(order)
    minis = [order[k::config.optimizer_steps] for k in range(config.optimizer_steps)]
    mini_batches = [rollout.micro_batches([samples[i] for i in rows], pad_id, config.micro_batch_tokens, device) for rows in minis]
    # every rank runs as many forwards as the busiest one: FSDP2's all-gathers are collectives
    counts = torch.tensor([len(b) for b in mini_batches], device=device)
    dist.all_reduce(counts, op=dist.ReduceOp.MAX)
    for batches, n in zip(mini_batches, counts.tolist()):
        batches += [rollout.empty_micro_batch(pad_id, device) for _ in range(n - len(batches))]
    # 4. old log-probs, once, before any optimizer step changes the weights
    with torch.no_grad():
        for batch in (b for batches in mini_batches for b in batches):
            batch["old_logprobs"] = grpo.completion_logprobs(model, batch, config.temperature)[0]
    out = {"loss": [], "clip_fraction": [], "grad_norm": [], "approx_kl": [],
           "advantage_nonzero": float((advantages != 0).float().mean()) if len(samples) else 0.0}
    for k, (batches, rows) in enumerate(zip(mini_batches, minis)):
        # 5a. the global normaliser Z of this optimizer step, over every rank's real rows
        total = sum((grpo.loss_denominator(b["loss_mask"], config.aggregation, max_new).to(device, torch.float32)
                     for b in batches if b["rows"]), torch.zeros((), device=device))
        dist.all_reduce(total)
        step_loss = 0.0
        for batch in batches:
            logp, mask = grpo.completion_logprobs(model, batch, config.temperature)
            row_adv = advantages[[rows[i] for i in batch["rows"]]].to(device) if batch["rows"] else torch.zeros(1, device=device)
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
        for group in optimizer.param_groups:
            group["lr"] = out["lr"]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
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


def out_of_time(projected_seconds: float, max_minutes: float, device) -> bool:
    """Whether the next step would end past --max-minutes, agreed by all ranks (their clocks differ)."""
    late = torch.tensor(float(projected_seconds > 60 * max_minutes), device=device)
    dist.all_reduce(late, op=dist.ReduceOp.MAX)
    return bool(late)


# ----------------------------------------------------------------------------- main

def main(argv=None) -> None:
    config = parse_config(argv)
    if config.temperature <= 0:
        raise SystemExit("train.py: --temperature must be > 0 (the loss's log-probs are of logits / temperature)")
    if config.reuse_verdicts and config.time_kernels:
        raise SystemExit("train.py: --reuse-verdicts needs --no-time-kernels (a speedup is a new measurement each time)")
    for name in ("steps", "tasks_per_step", "trajectories", "turns", "max_new_tokens", "optimizer_steps",
                 "micro_batch_tokens", "generation_batch_rows", "save_every", "keep_checkpoints"):
        if getattr(config, name) < 1:
            raise SystemExit(f"train.py: --{name.replace('_', '-')} {getattr(config, name)}: must be at least 1")
    tasks_module.parse_levels(config.levels, "train.py")
    for name, allowed in CHOICES.items():
        if getattr(config, name) not in allowed:
            raise SystemExit(f"train.py: --{name.replace('_', '-')} {getattr(config, name)}: expected one of "
                             f"{', '.join(allowed)}")
    if config.engine == "vllm" and config.model in TINY_MODELS:
        raise SystemExit(f"train.py: --engine vllm loads --model from disk; {config.model} is built in memory")
    import kernel_eval   # its device check: a one-line error for a missing GPU or CUDA toolkit
    config.device = kernel_eval.resolve_device(None if config.device == "auto" else config.device, "train.py")
    config.device = config.device.split(":")[0]   # each rank takes cuda:LOCAL_RANK
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")   # `python train.py` is a world of one
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    device = torch.device("cuda", local_rank) if config.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        bind_rank_cpus(local_rank, local_world)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(minutes=config.dist_timeout_minutes))
    try:
        train(config, rank, world, local_world, device)
    finally:
        dist.destroy_process_group()


def train(config: Config, rank: int, world: int, local_world: int, device: torch.device) -> None:
    started = time.perf_counter()   # --max-minutes counts the setup too
    import kernel_eval
    from tqdm import tqdm
    language = tasks_module.LANGUAGE_FOR_DEVICE[config.device]
    train_tasks = load_tasks(config)
    if min(config.tasks_per_step, len(train_tasks)) < world:  # every rank generates: a collective under FSDP2
        raise SystemExit(f"train.py: {min(config.tasks_per_step, len(train_tasks))} tasks per step for {world} ranks; "
                         "each rank needs at least one task")
    torch.manual_seed(config.seed)   # same initial weights on every rank
    model, tokenizer = load_policy(config)
    layer_params = sum(p.numel() for p in model.model.layers.parameters())
    model = shard(model.to(device), config, device, world)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    vllm = None
    if config.engine == "vllm":   # weights from --model, then synced from the policy before each rollout
        if rank == 0:
            print("train.py: --engine vllm has never run on this project's machines (vLLM cannot be installed "
                  "there); it is written against vLLM's public API", flush=True)
        vllm = engines.VLLMEngine(config.model, tokenizer, gpu_memory_utilization=config.vllm_memory,
                                  seed=config.seed + rank, distributed_executor_backend="external_launcher")
        vllm.sleep()
    engine = vllm or engines.HFEngine(model, tokenizer, max_batch_rows=config.generation_batch_rows,
                                      compile_decode=config.compile_decode)
    if config.oracle_share > 0:
        engine = engines.OracleMixedEngine(engine, tokenizer, train_tasks, oracle_share=config.oracle_share,
                                           language=language, seed=config.seed + rank)
        longest = engine.longest_answer_tokens()
        if longest > config.max_new_tokens:  # a cut oracle answer is a format error: no real work at all
            raise SystemExit(f"train.py: the longest oracle answer is {longest} tokens; raise --max-new-tokens "
                             f"above {config.max_new_tokens}")
    clock = {}   # seconds per phase of this step
    engine.generate = train_log.timed(engine.generate, clock, "generation")
    evaluate = train_log.timed(functools.partial(
        kernel_eval.evaluate_batch, device=str(device) if device.type == "cuda" else "cpu",
        time_candidate=config.time_kernels,
        max_parallel_compiles=max(1, (os.cpu_count() or 2) // (4 * local_world))), clock, "evaluation")
    if config.reuse_verdicts:   # a policy that repeats itself would rebuild the same kernels every step
        evaluate = rollout.reusing_verdicts(evaluate)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    step_seconds = []   # this process's steps; its first carries one-time costs (compiles, cold caches)
    start_step, state = checkpoint.start(model, optimizer, config.out, config.resume, rank)
    success = {k: tuple(v) for k, v in state.get("success", {}).items()}   # the sampler's statistics
    if rank == 0:
        os.makedirs(config.out, exist_ok=True)
        with open(os.path.join(config.out, "config.json"), "w") as f:
            json.dump(dataclasses.asdict(config), f, indent=1)
        print(f"train.py: {len(train_tasks)} tasks, {world} rank(s) on {device.type}, {language} kernels, model "
              f"{config.model}" + (f", oracle-mixed engine ({config.oracle_share:.0%} of answers are built-in "
                                    "solutions)" if config.oracle_share else ""), flush=True)

    completed = start_step
    for step in tqdm(range(start_step, config.steps), disable=rank != 0, desc="steps", initial=start_step, total=config.steps):
        step_start = time.perf_counter()
        next_step = max(step_seconds[1:] or step_seconds or [0.0])   # the longest, the first left out once possible
        if config.max_minutes and out_of_time(step_start - started + next_step, config.max_minutes, device):
            if rank == 0:
                tqdm.write(f"train.py: stopping before step {step + 1}: --max-minutes {config.max_minutes} would pass")
            break
        clock.update(generation=0.0, evaluation=0.0)
        if isinstance(engine, engines.OracleMixedEngine):  # seeded per step, so a resumed run redraws the same mix
            engine.rng.seed(f"oracle-mixed:{config.seed}:{rank}:{step}")
        # 1. this step's tasks; each task's whole group on one rank
        my_tasks = tasks_module.draw_tasks(train_tasks, config.tasks_per_step, seed=config.seed, step=step,
                                            sampler=config.sampler, success=success,
                                            priority_floor=config.priority_floor)[rank::world]
        max_new = config.late_max_new_tokens if config.late_max_new_tokens and step >= config.late_from_step else config.max_new_tokens
        # 2. rollout: generation and judging, no collective inside
        rollout_config = rollout.RolloutConfig(
            n_trajectories=config.trajectories, n_turns=config.turns, max_new_tokens=max_new,
            max_prompt_tokens=config.max_prompt_tokens, temperature=config.temperature,
            language=language, gamma=config.gamma, return_mode=config.return_mode)
        if vllm:   # every rank syncs (FSDP2's all-gathers)
            vllm.refresh(model)
        with torch.compiler.set_stance("force_eager"):   # decoding's shapes would recompile each step
            samples, turn_stats = rollout.rollout(my_tasks, engine, evaluate, rollout_config)
        if vllm:
            vllm.sleep()
        train_start = time.perf_counter()
        # 3. advantages per task over its G*T samples
        advantages = grpo.group_advantages([s.discounted_return for s in samples], [s.task_id for s in samples],
                                           scale_by_std=config.scale_by_std)
        # 4-5. old log-probs, then optimizer steps (global Z, clipped loss, grad clip, AdamW)
        update_out = update(model, optimizer, samples, advantages, config, step, max_new, pad_id, device, world)
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
            checkpoint.write_metrics(config.out, record)
            train_log.plot_curves(config.out)
            tqdm.write(train_log.step_line(record))
        step_seconds.append(time.perf_counter() - step_start)
        if (step + 1) % config.save_every == 0 or step + 1 == config.steps:
            checkpoint.save(model, optimizer, config.out, step + 1, {"success": success}, rank, config.keep_checkpoints)
        completed = step + 1
    if completed % config.save_every and completed < config.steps:   # stopped early by --max-minutes
        checkpoint.save(model, optimizer, config.out, completed, {"success": success}, rank, config.keep_checkpoints)
    checkpoint.export(model, tokenizer, config.out, rank)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:   # kernel_eval has stopped its workers; checkpoints are whole or absent
        print("train.py: interrupted; resume with --resume", file=sys.stderr)
        os._exit(130)
