"""The learning demo's report: a table per run, issue 14's done-when check, one PNG of all runs.

    python examples/learning_report.py RUN_A/metrics.jsonl RUN_B/metrics.jsonl --png seeds.png > report.md

The table shows, per step, the correct rate (overall and per turn), mean reward, status shares,
and where the step's time went: evaluation seconds and their share of the step, seconds lost to
timeouts, and the distinct kernels compiled / builds found in the harness's cache / verdicts reused
(columns appear when the rows carry them: older runs lack some).

Each argument is a train.py metrics.jsonl (or the older examples/learning_rl.py one: 0-based
steps, `correct_rate_by_turn`); their advantage_nonzero and approx_kl fill the advantage and KL
columns. A run is labelled by its folder's name, or by the file's
name when that is not `metrics.jsonl`.

Done-when (issue 14), per run: the mean correct rate of the last `--window` steps is at least 2x
that of the first `--window` steps, or at least 30 percentage points above it, and the mean reward
of the last steps is above that of the first. With fewer than 2 x window steps the two windows
overlap and the check says "too few steps" instead of passing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys


def load_run(path: str) -> dict:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    rows = [r for r in rows if "correct_rate" in r]
    if rows and rows[0]["step"] == 0:  # learning_rl.py counted from 0; train.py from 1
        rows = [dict(r, step=r["step"] + 1) for r in rows]
    for r in rows:
        r.setdefault("correct_rate_per_turn", r.get("correct_rate_by_turn", []))
    name = os.path.basename(path)
    label = os.path.basename(os.path.dirname(os.path.abspath(path))) if name == "metrics.jsonl" else name.split(".")[0]
    # train.py's approx_kl (k3 KL(old || new) per token over the step's loss calls) and the share of
    # samples with a nonzero advantage; the older learning_rl.py rows call the first approx_kl_old
    extra = {r["step"]: {"kl": r.get("approx_kl", r.get("approx_kl_old")), "nonzero": r.get("advantage_nonzero")}
             for r in rows if "advantage_nonzero" in r}
    return {"label": label, "path": path, "rows": rows, "extra": extra}


def _mean(values: list) -> float:
    return sum(values) / len(values) if values else float("nan")


def done_when(rows: list, window: int = 5) -> dict:
    """Issue 14's check on one run's rows (train.py metrics)."""
    n = len(rows)
    first, last = rows[:window], rows[-window:]
    c0, c1 = _mean([r["correct_rate"] for r in first]), _mean([r["correct_rate"] for r in last])
    r0, r1 = _mean([r["reward_mean"] for r in first]), _mean([r["reward_mean"] for r in last])
    enough = n >= 2 * window
    rate_ok = c1 >= 2 * c0 - 1e-9 or c1 - c0 >= 0.30 - 1e-9   # tolerance: 0.7 - 0.4 < 0.3 in floats
    reward_rose = r1 > r0
    return {"steps": n, "first_correct": c0, "last_correct": c1, "first_reward": r0, "last_reward": r1,
            "enough_steps": enough, "rate_ok": rate_ok, "reward_rose": reward_rose,
            "met": enough and rate_ok and reward_rose}


def _pct(x) -> str:
    return "-" if x is None or x != x else f"{100 * x:.1f}%"


def run_table(run: dict) -> str:
    rows, extra = run["rows"], run["extra"]
    statuses = sorted({s for r in rows for s in r.get("status_counts", {})} - {"correct"})
    turns = max((len(r["correct_rate_per_turn"]) for r in rows), default=0)
    head = ["step", "correct", " / ".join(f"turn {t + 1}" for t in range(turns)) or "per turn", "reward mean"]
    head += [f"{s} share" for s in statuses]
    if extra:
        head += ["adv. nonzero", "KL old (nats/tok)"]
    # where the step's time went (train.py rows; older rows lack some keys: no column, or "-")
    evaluation = any("seconds_evaluation" in r for r in rows)
    timeouts = any("timeout_seconds" in r for r in rows)
    counts = any("kernels_compiled" in r for r in rows)
    calls = any("harness_calls" in r for r in rows)
    head += ["eval s (share)"] * evaluation + ["harness calls"] * calls + ["timeouts s"] * timeouts
    head += ["compiled / cached / verdicts reused"] * counts + ["step s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for r in rows:
        n = max(1, sum(r.get("status_counts", {}).values()))
        cells = [str(r["step"]), _pct(r["correct_rate"]),
                 " / ".join(f"{100 * c:.1f}" for c in r["correct_rate_per_turn"]), f"{r['reward_mean']:.4f}"]
        cells += [_pct(r.get("status_counts", {}).get(s, 0) / n) for s in statuses]
        if extra:
            e = extra.get(r["step"], {})
            cells += [_pct(e.get("nonzero")), "-" if e.get("kl") is None else f"{e['kl']:.3g}"]
        seconds = r.get("seconds_step", r.get("elapsed"))
        if evaluation:
            e = r.get("seconds_evaluation")
            cells += ["-" if e is None else f"{e:.0f}" + (f" ({e / seconds:.0%})" if seconds else "")]
        if calls:
            cells += [str(r.get("harness_calls", "-"))]
        if timeouts:
            cells += ["-" if "timeout_seconds" not in r else f"{r['timeout_seconds']:.0f}"]
        if counts:
            cells += ["-" if "kernels_compiled" not in r else
                      f"{r['kernels_compiled']} / {r.get('builds_reused', 0)} / {r.get('verdicts_reused', 0)}"]
        cells += ["-" if seconds is None else f"{seconds:.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# the phases of a verdict (kernel_eval's EvalResult.seconds) worth a line: the build, the wait for the
# device and the reference, the check, and its latency from the compile's start
SLOWEST_PHASES = ("compile", "compile.build", "compile.probe", "load", "device_wait", "reference", "check", "latency")


def time_lines(run: dict) -> list[str]:
    """Where the run's evaluation time went: its median and slowest step, each timeout's limit, and per
    step the phases of each turn's last verdict and its status with its first diagnostic (metrics.jsonl's
    slowest_seconds, slowest_verdict)."""
    seconds = [r["seconds_evaluation"] for r in run["rows"] if "seconds_evaluation" in r]
    lines = []
    if seconds:
        lost = sum(r.get("timeout_seconds", 0.0) for r in run["rows"])
        lines.append(f"Evaluation a step: median {statistics.median(seconds):.0f} s, max {max(seconds):.0f} s; "
                     f"lost to timeouts {lost:.0f} s in all.")
    for r in run["rows"]:
        lines += [f"- step {r['step']}: {message}" for message in r.get("timeout_messages", [])]
    for r in run["rows"]:  # each turn's last verdict: what the step waited for, and what it was
        phases_of_turns = r.get("slowest_seconds", [])
        verdicts = r.get("slowest_verdict") or [""] * len(phases_of_turns)  # rows from before this key: none
        waited = [", ".join(f"{k} {v:g}" for k, v in phases.items() if k in SLOWEST_PHASES)
                  + (f" [{verdict}]" if verdict else "")
                  for phases, verdict in zip(phases_of_turns, verdicts) if phases]
        if waited:
            lines.append(f"- step {r['step']}, last verdict of each turn (s): " + "; ".join(waited))
    return lines


def check_lines(run: dict, window: int) -> list[str]:
    c = done_when(run["rows"], window)
    if not c["steps"]:
        return [f"- **{run['label']}**: no step finished."]
    verdict = ("**met**" if c["met"] else "not met" + ("" if c["enough_steps"] else
               f" (too few steps: {c['steps']} < {2 * window}, the windows overlap)"))
    ratio = c["last_correct"] / c["first_correct"] if c["first_correct"] else float("inf")
    return [f"- **{run['label']}** ({c['steps']} steps): correct rate, first {window} steps {_pct(c['first_correct'])}, "
            f"last {window} {_pct(c['last_correct'])} ({ratio:.2f}x, {100 * (c['last_correct'] - c['first_correct']):+.1f} "
            f"points; needs >= 2x or >= +30): {'yes' if c['rate_ok'] else 'no'}; mean reward "
            f"{c['first_reward']:.4f} -> {c['last_reward']:.4f}: {'rose' if c['reward_rose'] else 'did not rise'}. "
            f"Done-when: {verdict}."]


def report(runs: list, window: int = 5) -> str:
    out = ["# Learning demo report", "", f"## Done-when (issue 14): last {window} steps vs first {window}", ""]
    for run in runs:
        out += check_lines(run, window)
    met = [done_when(r["rows"], window)["met"] for r in runs]
    out += ["", f"Runs meeting it: {sum(met)} of {len(runs)}.", ""]
    for run in runs:
        out += [f"## {run['label']} (`{run['path']}`)", "", run_table(run), ""]
        timing = time_lines(run)
        out += timing + [""] * bool(timing)
    return "\n".join(out)


def plot(runs: list, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, run in enumerate(runs):
        rows, color = run["rows"], colors[i % len(colors)]
        steps = [r["step"] for r in rows]
        axes[0].plot(steps, [r["correct_rate"] for r in rows], "o-", color=color, label=f"{run['label']}: all turns")
        for t, style in zip(range(max((len(r["correct_rate_per_turn"]) for r in rows), default=0)), (":", "--", "-.")):
            axes[0].plot(steps, [r["correct_rate_per_turn"][t] if t < len(r["correct_rate_per_turn"]) else float("nan")
                                 for r in rows], style, color=color, alpha=0.7, label=f"{run['label']}: turn {t + 1}")
        axes[1].plot(steps, [r["reward_mean"] for r in rows], "o-", color=color, label=run["label"])
        for status, style in (("format_error", "o-"), ("compile_error", "s--"), ("incorrect", "^:")):
            axes[2].plot(steps, [r.get("status_counts", {}).get(status, 0) / max(1, sum(r.get("status_counts", {}).values()))
                                 for r in rows], style, color=color, alpha=0.8, label=f"{run['label']}: {status}")
    axes[0].set(title="correct rate (solid: all turns)", xlabel="step", ylim=(-0.02, 1.02))
    axes[1].set(title="mean reward (0.3 x correct without timing)", xlabel="step")
    axes[2].set(title="status shares", xlabel="step", ylim=(-0.02, 1.02))
    for ax in axes:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("metrics", nargs="+", help="metrics.jsonl of each run")
    p.add_argument("--png", default=None, help="write the comparison plot here")
    p.add_argument("--window", type=int, default=5)
    args = p.parse_args(argv)
    runs = [load_run(path) for path in args.metrics if os.path.exists(path)]
    missing = [path for path in args.metrics if not os.path.exists(path)]
    text = report(runs, args.window)
    if missing:
        text += "\n" + "\n".join(f"- missing: `{m}` (the run wrote no step)" for m in missing) + "\n"
    print(text)
    if args.png and any(r["rows"] for r in runs):
        plot(runs, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
