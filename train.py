"""train.py: multi-turn GRPO that teaches a policy to write fast kernels (Kevin-32B): config, setup, the loop.

    python train.py                                          # smoke preset: tiny model, CPU, C++ kernels
    torchrun --nproc_per_node=2 train.py --steps 2 --out runs/smoke2                 # 2 CPU ranks, gloo
    torchrun --nproc_per_node=8 train.py --preset kevin --model /path/to/QwQ-32B \\
        --tasks /path/to/KernelBench --out runs/kevin                                 # one node, 8 GPUs
    python train.py --out runs/smoke --resume                # continue from the last checkpoint

One step, each a numbered line of `train`'s loop:
 1. draw tasks (tasks.draw_tasks); rank r takes tasks[r::world], so a task's group lives on one rank;
 2. rollout: G x T attempts per task, judged by kernel_eval -> Samples with discounted returns;
 3. advantages: grpo.group_advantages over each task's G*T samples (or each turn's G);
 4. old log-probs (grpo.completion_logprobs), once, before the first optimizer step;
 5. per mini-batch (`optimizer_steps`): the global normaliser Z (all-reduced), the clipped loss on
    micro-batches (the same count on every rank), grad-norm clip, AdamW step;
 6. metrics gathered from every rank, written by rank 0; a checkpoint every `save_every` steps.

The log-prob contract: the engine samples from softmax(logits / temperature) (--top-p 1), and the old
and new log-probs of the ratio are computed here from the same logits / temperature, both read from
the one RolloutConfig built from Config (`rollout_config`). Completion.logprobs are not used (oracle
answers have none, vLLM's may come from another kernel). Where the rest lives: flags (flags.py), the
policy's load and FSDP2 layout (weights.py), the memory plan (memory_plan.plan_for), ranks, CPU
shares and the time budget (launch.py), checkpoints and resume (checkpoint.py), engines (engines.py).
"""
from __future__ import annotations

import dataclasses
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
import flags
import grpo
import launch
import memory_plan
import offload
import rewards
import rollout
import tasks as tasks_module
import train_log
import weights


@dataclass
class Config(rollout.Sampling):
    """Every field is a flag (flags.py; --max-new-tokens for max_new_tokens), its comment the flag's --help.
    The sampling settings (trajectories, turns, token budgets, temperature, top_p, seed): rollout.Sampling."""
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
    device: str = "auto"              # cpu (gloo, C++ kernels), cuda (nccl, CUDA kernels); auto: cuda if torch sees it
    max_minutes: float = 0.0          # start no step that would end past this many minutes (0: no limit); still exports
    save_every: int = 1               # a checkpoint every N steps (and after the last)
    keep_checkpoints: int = 2         # the newest N checkpoints are kept
    dist_timeout_minutes: int = 120   # collective timeout: judging kernels between collectives can take long
    # a step's rollout (rollout.RolloutConfig, built once by rollout_config)
    tasks_per_step: int = 2           # tasks per batch, over all ranks
    late_max_new_tokens: int = 0      # tokens per response from --late-from-step on (0: never raised)
    late_from_step: int = 30          # the step from which --late-max-new-tokens applies
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
    reuse_verdicts: bool = False      # judge each distinct (task, code) once per run; a timed one keeps its first speedup
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
    advantage_groups: str = "task"    # normalise over each task's G*T samples (Kevin), or each (task, turn)'s G
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
           "aggregation": grpo.AGGREGATIONS, "advantage_groups": ("task", "task_turn"), "sandbox": ("auto", "require", "off")}


def parse_config(argv=None) -> Config:
    """Config from the command line: the preset's values, then the flags given."""
    parser = flags.parser("train.py", __doc__.split("\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="smoke", help="a named set of defaults: "
                        "smoke (tiny model, CPU) or kevin (Kevin-32B's run) (default: smoke)")
    flags.add_fields(parser, Config, CHOICES,
                     also={k: f"; --preset kevin: {flags.shown(v)}" for k, v in PRESETS["kevin"].items()})
    args = parser.parse_args(argv)
    values = {**PRESETS[args.preset], **flags.given(args, skip=("preset",))}
    flags.refuse_file_out(parser, values.get("out", Config.out))
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

def load_tasks(config: Config) -> list:
    """The training part of tasks.split_tasks (heldout tasks never train), then --task-ids; the built-in
    references at config.device's sizes (tasks.sized_for)."""
    return tasks_module.select_tasks(config.tasks, config.levels, "train.py", split="train",
                                     n_heldout=config.heldout, task_ids=config.task_ids, device=config.device)


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


# ----------------------------------------------------------------------------- main

def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    config = parse_config(argv)
    if not sys.stderr.isatty():   # a log file gets a progress bar's line every 30 s, not ten a second
        os.environ.setdefault("TQDM_MININTERVAL", "30")
    flags.refuse_out_of_range(
        config, "train.py", at_least_one=("steps", "tasks_per_step", "trajectories", "turns", "max_new_tokens",
                                          "optimizer_steps", "micro_batch_tokens", "save_every", "keep_checkpoints"),
        positive=("lr", "grad_clip"),
        non_negative=("generation_batch_rows", "nproc", "gpu_memory_gb", "weight_decay", "warmup_frac", "max_minutes"))
    tasks_module.parse_levels(config.levels, "train.py")
    if config.plan:   # before any device check: a plan is made on any machine
        if config.device == "auto":
            config.device = "cuda" if torch.cuda.is_available() or config.gpu_memory_gb else "cpu"
        plan, remedy = memory_plan.plan_for(config, config.nproc or launch.ranks()[1], weights.model_config(config))
        print(memory_plan.table(plan))
        print(memory_plan.summary(plan))
        if not plan.fits:
            raise SystemExit(f"train.py: {memory_plan.refusal(plan, remedy)}")
        return
    if config.engine == "vllm" and config.model in weights.TINY_MODELS:
        raise SystemExit(f"train.py: --engine vllm loads --model from disk; {config.model} is built in memory")
    if config.engine == "vllm" and not {"RANK", "WORLD_SIZE", "LOCAL_RANK"} <= os.environ.keys():
        raise SystemExit("train.py: --engine vllm runs under torchrun (vLLM's launcher reads RANK and LOCAL_RANK): "
                         "torchrun --nproc_per_node=N train.py --engine vllm ...")
    if config.engine == "vllm":
        try:
            import vllm  # noqa: F401
        except ImportError as error:
            raise SystemExit(f"train.py: --engine vllm needs vLLM (pip install vllm): {error}")
    if config.resume and checkpoint.finished_steps(config.out) >= config.steps:
        if launch.ranks()[0] == 0:
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
    if sampling.top_p < 1 and launch.ranks()[0] == 0:
        print(f"train.py: --top-p {sampling.top_p}: samples come from the nucleus, the loss's log-probs from the "
              "whole softmax(logits / temperature): the log-prob contract holds at 1 only", file=sys.stderr)
    me = launch.start(config.device, config.dist_timeout_minutes)
    try:
        with kernel_sandbox.Zygotes() as zygotes:   # the harness's forking processes live for the run
            train(config, sampling, me, launch.resume_command(os.path.relpath(__file__), argv, config.out), zygotes)
    finally:
        dist.destroy_process_group()


def train(config: Config, sampling: rollout.RolloutConfig, me: launch.Rank, resume_hint: str, zygotes=None) -> None:
    rank, world, device = me.rank, me.world, me.device
    started = time.perf_counter()   # --max-minutes counts the setup too
    import kernel_eval
    from tqdm import tqdm
    train_tasks = load_tasks(config)
    if min(config.tasks_per_step, len(train_tasks)) < world:  # every rank generates: a collective under FSDP2
        raise SystemExit(f"train.py: {min(config.tasks_per_step, len(train_tasks))} tasks per step for {world} ranks; "
                         "each rank needs at least one task")
    plan, remedy = memory_plan.plan_for(config, world, weights.model_config(config))   # refused before any load
    if rank == 0:
        print(f"train.py: {memory_plan.summary(plan)}" + (f" (generation rows: {plan.settings.rows})"
              if config.generation_batch_rows == 0 else ""), flush=True)
    if not plan.fits:
        raise SystemExit(f"train.py: {memory_plan.refusal(plan, remedy)}")
    torch.manual_seed(config.seed)   # same initial weights on every rank
    with train_log.measured("load", load_phase := {}, device):
        model, tokenizer, host_growth = weights.setup_policy(config, device, world)
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
        max_parallel_compiles=launch.builds_at_once(eval_device, me.local_world), zygotes=zygotes), clock, "evaluation")
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
        if config.max_minutes and launch.out_of_time(step_start - started + next_step, config.max_minutes, device):
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
        # per (task, turn): a turn's own baseline; a turn-1 return also counts the later turns' scores, so
        # over all turns the later turns' samples sit below the task's mean whatever they did
        groups = [s.task_id if config.advantage_groups == "task" else (s.task_id, s.turn) for s in samples]
        advantages = grpo.group_advantages([s.discounted_return for s in samples], groups,
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


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:   # kernel_eval has stopped its workers; checkpoints are whole or absent
        if os.environ.get("RANK", "0") == "0":
            hint = launch.resume_command(os.path.relpath(__file__), sys.argv[1:], parse_config(sys.argv[1:]).out)
            print(f"train.py: interrupted; continue with: {hint}", file=sys.stderr)
        os._exit(130)
