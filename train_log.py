"""train_log.py: what train.py reports after each step, and the training phase's model flops.

Every rank summarises its own samples (`rank_summary`); rank 0 gathers the summaries and turns
them into one metrics.jsonl line (`step_record`): reward, correct rate (overall and per turn),
best speedup, status counts, response length, truncation, Kevin's "not okay" ratio (a response
that does not open its thinking as the template expects), the candidates the harness could not
judge (harness_errors: no verdict, so no sample and no reward), where the evaluation's time went
(timeout_seconds: the seconds the harness waited on candidates that timed out, timeout_messages: the
limits they broke; kernels_compiled:
distinct kernels built now; builds_reused: distinct kernels whose build came from the harness's cache;
verdicts_reused: candidates given an earlier verdict, --reuse-verdicts; slowest_seconds and
slowest_verdict: per turn, the phases and the status with its first diagnostic of the verdict that came
last; harness_calls and generation_rounds: the rollout's schedule), the
loss's clip fraction, approx KL
between the old and the updated policy, the share of samples with a nonzero advantage, grad
norm, lr, and seconds spent in generation, evaluation and training (the slowest rank's).
`plot_curves` redraws plots/curves.png from metrics.jsonl: a grid of panels against the step.

MFU accounting (`forward_flops`): model flops of a forward over a sample of s tokens of which c
are trained = 2 x P x s (P: decoder-layer parameters) + 2 x d x V x c (the LM head runs on the
trained positions only) + 2 x L x d x s^2 (causal attention: QK^T and AV, half the square). A
backward is twice a forward; train.py's update does one forward for the old log-probs and one
forward + backward per sample, so 4x. Recomputation and padding are not model flops.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import time
from collections import Counter

import checkpoint


def timed(fn, clock: dict, key: str):
    """fn, adding its wall seconds to clock[key] (the step-time split: generation, evaluation) and its
    calls to clock[key + "_calls"]."""
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            clock[key] = clock.get(key, 0.0) + time.perf_counter() - start
            clock[key + "_calls"] = clock.get(key + "_calls", 0) + 1
    return wrapper


@contextlib.contextmanager
def measured(phase: str, into: dict, device):
    """Seconds (summed over a phase's repeats) and, on a GPU, peak bytes allocated (their max) of a phase,
    as into["seconds_<phase>"] and into["gpu_peak_<phase>"]: what bench/rehearsal.py holds against the
    memory plan."""
    import torch
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    try:
        yield
    finally:
        if cuda:
            torch.cuda.synchronize(device)
            into[f"gpu_peak_{phase}"] = max(into.get(f"gpu_peak_{phase}", 0), torch.cuda.max_memory_allocated(device))
        into[f"seconds_{phase}"] = into.get(f"seconds_{phase}", 0.0) + time.perf_counter() - start


def measuring(fn, phase: str, into: dict, device):
    """fn, each call measured as `phase` (measured)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with measured(phase, into, device):
            return fn(*args, **kwargs)
    return wrapper


def forward_flops(layer_params: int, model_config, samples: list) -> float:
    """Model flops of one forward over the samples (a backward is twice that): 2 x decoder-layer
    parameters per token, 2 x d x vocab per trained token for the LM head, 2 x layers x d x s^2
    for causal attention (QK^T and AV, half the square)."""
    d, layers, vocab = model_config.hidden_size, model_config.num_hidden_layers, model_config.vocab_size
    return sum(2.0 * layer_params * len(s.input_ids) + 2.0 * d * vocab * len(s.completion_ids)
               + 2.0 * layers * d * len(s.input_ids) ** 2 for s in samples)


def rank_summary(samples: list, turn_stats: list[dict], update_out: dict, clock: dict, flops: float) -> dict:
    """What one rank sends to rank 0 after a step (all_gather_object): a row per sample, not the samples."""
    return {"rows": [(s.task_id, s.turn, s.status, s.score, s.speedup, len(s.completion_ids), s.truncated,
                      code_id(s.code)) for s in samples],
            "loss": update_out["loss"], "clips": update_out["clip_fraction"], "approx_kl": update_out["approx_kl"],
            "advantage_nonzero": update_out["advantage_nonzero"], "clock": dict(clock), "turn_stats": turn_stats,
            "flops": flops}


def code_id(code: str | None) -> str:
    """A kernel's name in the metrics: the sha256 of its code (leading and trailing blank space left
    out), first 12 hex digits; "" for no code."""
    return hashlib.sha256(code.strip().encode()).hexdigest()[:12] if code and code.strip() else ""


def mean_speedup_of_correct(rows: list) -> float | None:
    """Mean speedup over the correct rows (a correct kernel whose time was not confirmed counts 0);
    None without a correct row."""
    speedups = [r[4] for r in rows if r[2] == "correct"]
    return sum(speedups) / len(speedups) if speedups else None


def step_record(step: int, ranks: list[dict], update_out: dict, n_turns: int) -> dict:
    """One metrics.jsonl line from every rank's rank_summary. Each rank's loss is its share of the
    optimizer step's loss (normalised by the global Z), so the step's loss is their sum (averaged
    over the optimizer steps); grad norm and lr are the same on every rank: rank 0's update_out."""
    rows = [r for part in ranks for r in part["rows"]]
    clips = [c for part in ranks for c in part["clips"]]
    kls = [c for part in ranks for c in part["approx_kl"]]
    turns = [t for part in ranks for t in part["turn_stats"]]
    n = max(1, len(rows))
    per_turn = [[r for r in rows if r[1] == t] for t in range(n_turns)]
    return {"step": step + 1, "reward_mean": sum(r[3] for r in rows) / n,
            "correct_rate": sum(r[2] == "correct" for r in rows) / n,
            "correct_rate_per_turn": [sum(r[2] == "correct" for r in t) / max(1, len(t)) for t in per_turn],
            "best_speedup": max((r[4] for r in rows), default=0.0),
            "speedup_correct_mean": mean_speedup_of_correct(rows),
            "speedup_correct_mean_per_turn": [mean_speedup_of_correct(t) for t in per_turn],
            # one row per sample: (task, turn, status, speedup, code_id), what learning_report.py counts
            "samples": [(r[0], r[1], r[2], round(r[4], 4), r[7]) for r in rows],
            "status_counts": {s: sum(r[2] == s for r in rows) for s in sorted({r[2] for r in rows})},
            "response_tokens_mean": sum(r[5] for r in rows) / n, "truncated_rate": sum(r[6] for r in rows) / n,
            "not_okay_ratio": sum(t["not_okay_ratio"] * t["n"] for t in turns) / max(1, sum(t["n"] for t in turns)),
            "loss": sum(sum(part["loss"]) for part in ranks) / len(update_out["loss"]),
            "clip_fraction": sum(clips) / max(1, len(clips)), "approx_kl": sum(kls) / max(1, len(kls)),
            "advantage_nonzero": sum(p["advantage_nonzero"] * len(p["rows"]) for p in ranks) / n,
            "grad_norm": update_out["grad_norm"][-1], "lr": update_out["lr"],
            "train_flops": sum(part["flops"] for part in ranks), "ranks": len(ranks),   # MFU is per GPU
            # tasks whose reference failed in the harness: their samples were dropped, not paid 0
            "reference_error_tasks": sorted({t for turn in turns for t in turn.get("reference_error_tasks", [])}),
            # candidates the harness could not judge (harness_error): no verdict, so no sample (the rows
            # above) and no reward, neither 0 nor a dropped task; counted from the rollout's turn stats
            "harness_errors": sum(turn["status_counts"].get("harness_error", 0) for turn in turns),
            # seconds the harness waited on candidates' phases that timed out (EvalResult.timeout_seconds)
            "timeout_seconds": sum(turn.get("timeout_seconds", 0.0) for turn in turns),
            "timeout_messages": sorted({m for turn in turns for m in turn.get("timeout_messages", [])}),
            # per turn, over the ranks: each format error's reason and how many responses it refused
            "format_error_reasons": [dict(sum((Counter(t.get("format_error_reasons", {})) for t in turns
                                               if t.get("turn") == k), Counter())) for k in range(n_turns)],
            # where the rest of the evaluation went: builds run now, builds found in the cache (distinct
            # kernels, per turn and rank), candidates that got an earlier verdict instead of a new one
            **{k: sum(turn.get(k, 0) for turn in turns) for k in ("kernels_compiled", "builds_reused", "verdicts_reused")},
            # per turn (and rank), the phases of the verdict that came last (compile, device_wait, check, ...)
            "slowest_seconds": [turn.get("slowest_seconds", {}) for turn in turns],
            "slowest_verdict": [turn.get("slowest_verdict", "") for turn in turns],
            "latency_by_status": {status: [x for turn in turns for x in turn.get("latency_by_status", {}).get(status, [])]
                                  for status in sorted({s for turn in turns for s in turn.get("latency_by_status", {})})},
            "compile_errors": [e for turn in turns for e in turn.get("compile_errors", [])],
            **{f"seconds_{k}": max(part["clock"][k] for part in ranks) for k in ("generation", "evaluation", "training")},
            # the rollout's harness calls and generation rounds (the busiest rank's): turns overlapped, a
            # step whose new kernels come in different trajectories' turns waits for one harness call
            "harness_calls": max(part["clock"].get("evaluation_calls", 0) for part in ranks),
            "generation_rounds": max(part["clock"].get("generation_calls", 0) for part in ranks)}


def step_line(record: dict) -> str:
    """The one line per step on stdout."""
    unjudged = f" harness_error {record['harness_errors']} (no verdict)" if record["harness_errors"] else ""
    step_s = record.get("seconds_step")
    share = f" ({record['seconds_evaluation'] / step_s:.0%} of the step)" if step_s else ""
    return (f"step {record['step']}: reward {record['reward_mean']:.3f} correct {record['correct_rate']:.2f} "
            f"loss {record['loss']:.4g} grad_norm {record['grad_norm']:.3g} {record['status_counts']}{unjudged} "
            f"eval {record['seconds_evaluation']:.1f} s{share} in {record['harness_calls']} harness call(s): "
            f"compiled {record['kernels_compiled']}, cached "
            f"{record['builds_reused']}, verdicts reused {record['verdicts_reused']}, timeouts "
            f"{record['timeout_seconds']:.1f} s; train {record['train_flops'] / record['seconds_training'] / 1e12:.3g} TFLOP/s")


def curves_figure(rows: list[dict]):
    """The curves of metrics.jsonl's rows: a grid of panels against the step (integer ticks), the last
    the correct rate of each turn, counted from 1."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    keys = ["reward_mean", "correct_rate", "speedup_correct_mean", "response_tokens_mean", "seconds_step"]
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5))
    steps = [r["step"] for r in rows]
    for ax, key in zip(axes.flat, keys):   # a step with no correct kernel has no speedup: a gap
        ax.plot(steps, [float("nan") if r.get(key) is None else r[key] for r in rows], marker="o")
        ax.set_title(key)
    per_turn = axes.flat[len(keys)]
    for turn in range(len(rows[-1]["correct_rate_per_turn"])):
        per_turn.plot(steps, [r["correct_rate_per_turn"][turn] for r in rows], marker="o", label=f"turn {turn + 1}")
    per_turn.set_title("correct rate per turn")
    per_turn.legend()
    for ax in axes.flat:
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_curves(out: str) -> None:
    """plots/curves.png from metrics.jsonl, written atomically (never half a PNG)."""
    import matplotlib.pyplot as plt
    with open(os.path.join(out, "metrics.jsonl")) as f:
        fig = curves_figure([json.loads(line) for line in f])
    png = io.BytesIO()
    fig.savefig(png, format="png")
    plt.close(fig)
    checkpoint.atomic_write(os.path.join(out, "plots", "curves.png"), png.getvalue())
