"""A single-process GRPO loop for the learning demo, written because train.py (issue 13) did not
exist yet when the demo's one device run had to be made. It joins the same pieces train.py
joins, in the order DESIGN.md gives, with none of train.py's scale (no FSDP2, no torchrun, no
checkpoints): one step is

    samples  = rollout.rollout(tasks, HFEngine(model), evaluate, config)     # G x T per task
    A_i      = grpo.group_advantages(R_i, task_id)                            # Kevin: per task
    old_lp   = log pi_old(o_it) under the sampling distribution (logits / temperature), once
    for k in range(optimizer_steps):                                          # Kevin: 2
        loss = grpo.policy_loss(lp, old_lp, A, mask, total=Z of this mini-batch)   # Dr. GRPO
        AdamW step, grad-norm clip

`evaluate` is kernel_eval.evaluate_batch on the demo's device, correctness only (no timing:
the reward is 0.3 * correct), called once per distinct (reference, code) pair: identical
candidates share one verdict, and with --verdict-cache (default) a pair judged at an earlier
step is not judged again (metrics: judged_by_harness per step). Logged per step in OUT/metrics.jsonl: reward_mean, correct_rate,
correct rate per turn, status counts, loss, clip fractions, grad norm, seconds; OUT/plots.png
at the end. Usage: examples/learning_run.sh, or

    python examples/learning_rl.py --model runs/warm_cpp --language cpp --tasks level1/01_relu \\
        --G 4 --T 2 --steps 10 --out runs/rl_cpp
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo  # noqa: E402
import kernel_eval  # noqa: E402
import rollout  # noqa: E402
import tasks as tasks_module  # noqa: E402
from warm_start import select_tasks  # noqa: E402


def sequence_logprobs(model, batch, temperature: float, device) -> torch.Tensor:
    """log pi(token_{i+1} | tokens_<=i) of every position, (B, W-1), under logits / temperature:
    the distribution HFEngine sampled from (top-p off), so the ratio compares like with like."""
    ids = batch["input_ids"].to(device)
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        logits = model(input_ids=ids, attention_mask=batch["attention_mask"].to(device), use_cache=False).logits
    return grpo.token_logprobs(logits[:, :-1].float() / temperature, ids[:, 1:])


def grpo_update(model, optimizer, samples, args, device) -> dict:
    advantages = grpo.group_advantages([s.discounted_return for s in samples],
                                       [s.task_id for s in samples], scale_by_std=True)
    order = list(range(len(samples)))
    rows = args.micro_batch
    old = {}
    with torch.no_grad():  # pi_old: the policy that sampled, before any update of this step
        for start in range(0, len(order), rows):
            idx = order[start:start + rows]
            batch = rollout.collate_samples([samples[i] for i in idx], pad_token_id=0)
            lp = sequence_logprobs(model, batch, args.temperature, device)
            for row, i in enumerate(idx):
                old[i] = lp[row]
    metrics = []
    random.Random(args.seed).shuffle(order)
    per_step = -(-len(order) // args.optimizer_steps)
    for k in range(args.optimizer_steps):
        mini = order[k * per_step:(k + 1) * per_step]
        # Dr. GRPO's constant normaliser for this optimizer step: sequences x max_new_tokens
        total = torch.tensor(float(len(mini) * args.max_new_tokens), device=device)
        optimizer.zero_grad(set_to_none=True)
        for start in range(0, len(mini), rows):
            idx = mini[start:start + rows]
            batch = rollout.collate_samples([samples[i] for i in idx], pad_token_id=0)
            lp = sequence_logprobs(model, batch, args.temperature, device)
            width = lp.shape[1]
            old_lp = torch.stack([torch.nn.functional.pad(old[i], (0, width - old[i].shape[0]))[:width] for i in idx])
            mask = batch["loss_mask"][:, 1:].to(device)
            loss, m = grpo.policy_loss(lp, old_lp, advantages[idx].to(device), mask,
                                       clip_low=args.clip_low, clip_high=args.clip_high,
                                       aggregation="dr_grpo", total=total)
            loss.backward()
            metrics.append(m)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        metrics[-1]["grad_norm"] = float(grad_norm)
    return {"loss": sum(m["loss"] for m in metrics),
            "clip_frac_low": sum(m["clip_frac_low"] for m in metrics) / len(metrics),
            "clip_frac_high": sum(m["clip_frac_high"] for m in metrics) / len(metrics),
            "approx_kl_old": sum(m["approx_kl_old"] for m in metrics) / len(metrics),
            "grad_norm": max(m.get("grad_norm", 0.0) for m in metrics),
            "advantage_nonzero": float((advantages != 0).float().mean())}


def plot(records, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = [r["step"] for r in records]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].plot(steps, [r["correct_rate"] for r in records], "o-", label="all turns")
    n_turns = len(records[0]["correct_rate_by_turn"])
    for t in range(n_turns):
        axes[0].plot(steps, [r["correct_rate_by_turn"][t] for r in records], ".--", label=f"turn {t + 1}")
    axes[0].set(title="correct rate", xlabel="step", ylim=(0, 1))
    axes[0].legend()
    axes[1].plot(steps, [r["reward_mean"] for r in records], "o-")
    axes[1].set(title="mean score (0.3 x correct)", xlabel="step")
    for status in sorted({s for r in records for s in r["status_counts"]}):
        axes[2].plot(steps, [r["status_counts"].get(status, 0) / r["n"] for r in records], ".-", label=status)
    axes[2].set(title="status shares", xlabel="step", ylim=(0, 1))
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--language", choices=("cuda", "cpp"), default="cuda")
    p.add_argument("--tasks", required=True, help="comma-separated built-in task names")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--G", type=int, default=8, help="trajectories per task")
    p.add_argument("--T", type=int, default=2, help="turns per trajectory")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--max-seconds", type=float, default=float("inf"), help="no new step after this long")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--optimizer-steps", type=int, default=2)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--clip-low", type=float, default=0.2)
    p.add_argument("--clip-high", type=float, default=0.28)
    p.add_argument("--gamma", type=float, default=0.4)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-new-tokens", type=int, default=1024)
    p.add_argument("--max-prompt-tokens", type=int, default=3072)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--max-parallel-runs", type=int, default=None, help="kernel_eval's run slots")
    p.add_argument("--verdict-cache", action=argparse.BooleanOptionalAction, default=True,
                   help="keep verdicts of (reference, code) across steps (within a batch, always)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    device = torch.device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model).to(device)
    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tasks")
    train_tasks = select_tasks(tasks_module.load_builtin(root), args.tasks)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    engine = rollout.HFEngine(model, tokenizer)
    config = rollout.RolloutConfig(
        n_trajectories=args.G, n_turns=args.T, max_new_tokens=args.max_new_tokens,
        max_prompt_tokens=args.max_prompt_tokens, temperature=args.temperature,
        language=args.language, gamma=args.gamma)
    harness_device = "cuda" if args.language == "cuda" else "cpu"
    eval_seconds, judged = [0.0], [0]
    verdicts: dict = {}  # (reference, code) -> verdict, when --verdict-cache

    def evaluate(pairs):
        """kernel_eval on each distinct (reference, code) pair once; identical candidates share
        the verdict. A memorising policy repeats a few kernels many times: judging each copy
        again would cost a fresh process each and tell nothing new (correctness only, same
        inputs within a batch). With --verdict-cache the memo lasts across steps too."""
        t0 = time.monotonic()
        if not args.verdict_cache:
            verdicts.clear()
        todo = sorted({pair for pair in pairs if pair not in verdicts})
        if todo:
            for pair, result in zip(todo, kernel_eval.evaluate_batch(
                    todo, device=harness_device, time_candidate=False,
                    max_parallel_runs=args.max_parallel_runs)):
                verdicts[pair] = result
        judged[0] += len(todo)
        eval_seconds[0] += time.monotonic() - t0
        return [verdicts[pair] for pair in pairs]

    records = []
    start = time.monotonic()
    with open(os.path.join(args.out, "metrics.jsonl"), "a") as log:
        for step in range(args.steps):
            if time.monotonic() - start > args.max_seconds:
                break
            t0, eval_seconds[0], judged[0] = time.monotonic(), 0.0, 0
            samples, stats = rollout.rollout(train_tasks, engine, evaluate, config)
            t1 = time.monotonic()
            update = grpo_update(model, optimizer, samples, args, device)
            record = {
                "step": step, "n": len(samples),
                "reward_mean": sum(s.score for s in samples) / len(samples),
                "correct_rate": sum(s.status == "correct" for s in samples) / len(samples),
                "correct_rate_by_turn": [s["correct_rate"] for s in stats],
                "status_counts": {k: sum(s["status_counts"].get(k, 0) for s in stats)
                                  for k in {k for s in stats for k in s["status_counts"]}},
                "distinct_codes": len({(s.task_id, s.code) for s in samples}),
                "judged_by_harness": judged[0],
                "response_tokens_mean": sum(len(s.completion_ids) for s in samples) / len(samples),
                "truncated_rate": sum(s.truncated for s in samples) / len(samples),
                **update,
                "seconds_rollout": t1 - t0 - eval_seconds[0], "seconds_eval": eval_seconds[0],
                "seconds_train": time.monotonic() - t1, "elapsed": time.monotonic() - start}
            records.append(record)
            log.write(json.dumps(record) + "\n")
            log.flush()
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in record.items()}), flush=True)
            plot(records, os.path.join(args.out, "plots.png"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
