"""The learning demo's report: per run (seed), a table per step, the done-when check, one plot.

    python examples/learning_report.py RUN_A/metrics.jsonl RUN_B/metrics.jsonl \\
        --variants WARM/variants.json --png-dir OUT > report.md

Each argument is a train.py metrics.jsonl; a run is named by its folder. Per step: the correct rate
(all samples, then per turn), the mean speedup of the correct kernels (all, per turn), the share of
samples that are each warm-start variant (`--variants`: examples/warm_start.py's variants.json names
their code ids; "other" is code the warm start never wrote), the mean reward, the evaluation's
seconds, the median latency of the step's compile errors, and the step's seconds.

Done-when, per run (issue 61): at least 10 steps; the correct rate of the last 5 steps at least step
1's + 30 points or 2x step 1's (step 1 samples the policy before any update); the mean speedup of
correct kernels over the last 5 steps at least 1.5x step 1's; turn 2's correct rate over the last 5
steps at least turn 1's; evaluation a step: median <= 20 s and no step after the first over 45 s.
Beside it, the latency of every compile error's verdict in the run (p50, p90; goal: p50 <= 8 s), and
where a later turn wins and loses: of the trajectories whose earlier turn was correct, how many stayed
correct; of those whose earlier turn was not, how many the next turn fixed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import Counter

RATE_POINTS, RATE_FACTOR, SPEEDUP_FACTOR = 0.30, 2.0, 1.5
EVAL_MEDIAN_S, EVAL_MAX_S, COMPILE_ERROR_P50_S = 20.0, 45.0, 8.0


def load_run(path: str) -> dict:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return {"label": os.path.basename(os.path.dirname(os.path.abspath(path))), "path": path,
            "rows": [r for r in rows if "correct_rate" in r]}


def load_variants(path: str | None) -> dict:
    """{code_id: variant} from warm_start.py's variants.json; {} without one."""
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        return {v["code_id"]: v["variant"] for v in json.load(f).values()}


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _quantile(values: list, q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def variant_shares(row: dict, variants: dict) -> dict:
    """The share of the step's samples whose code is each variant ("no code": a response without one)."""
    samples = row.get("samples", [])
    names = [variants.get(s[4], "other") if s[4] else "no code" for s in samples]
    return {name: names.count(name) / len(names) for name in sorted(set(names))} if names else {}


def format_errors_per_turn(row: dict) -> list:
    """Each turn's share of samples that are format errors (no code, or code the gate refused)."""
    turns = sorted({s[1] for s in row.get("samples", [])})
    return [_mean(float(s[2] == "format_error") for s in row["samples"] if s[1] == t) for t in turns]


def format_error_reasons(rows: list, top: int = 3) -> list[str]:
    """Per turn, over all steps, the most frequent reasons responses were format errors (train.py's
    metrics have them from the next runs on)."""
    by_turn = {}
    for r in rows:
        for turn, reasons in enumerate(r.get("format_error_reasons", [])):
            by_turn.setdefault(turn, Counter()).update(reasons)
    return [f"- turn {turn + 1}: " + "; ".join(f"{n} x `{reason}`" for reason, n in counts.most_common(top))
            for turn, counts in sorted(by_turn.items()) if counts]


def turn_transitions(rows: list) -> Counter:
    """Over all steps, each pair of consecutive turns of one trajectory: (earlier correct, later correct)
    -> count. The samples are task-major, then trajectory, then turn (rollout.py's order), so a turn's
    sample follows its trajectory's earlier turn."""
    pairs = Counter()
    for earlier, later in consecutive_turns(rows):
        pairs[earlier[2] == "correct", later[2] == "correct"] += 1
    return pairs


def consecutive_turns(rows: list):
    """Each (earlier, later) pair of samples that are consecutive turns of one trajectory, over all steps."""
    for r in rows:
        samples = r.get("samples", [])
        for earlier, later in zip(samples, samples[1:]):
            if later[0] == earlier[0] and later[1] == earlier[1] + 1:
                yield earlier, later


def after_a_correct_kernel(rows: list) -> tuple[int, Counter]:
    """Over all steps, the later turns after a correct one: (how many wrote the same code again (its code
    id), {status: count} of those that wrote anything else)."""
    same, other = 0, Counter()
    for earlier, later in consecutive_turns(rows):
        if earlier[2] == "correct":
            if later[4] == earlier[4]:
                same += 1
            else:
                other[later[2]] += 1
    return same, other


def transition_line(rows: list) -> str | None:
    """Where a later turn wins and loses: correct kernels it kept, broken ones it fixed."""
    pairs = turn_transitions(rows)
    if not pairs:
        return None

    def share(earlier_correct: bool) -> str:
        good, n = pairs[earlier_correct, True], pairs[earlier_correct, True] + pairs[earlier_correct, False]
        return f"{good} / {n}" + (f" ({good / n:.0%})" if n else "")

    same, other = after_a_correct_kernel(rows)
    rewritten = ", ".join(f"{status} {n}" for status, n in other.most_common())
    return (f"A later turn after the turn before it (all steps): correct kept {share(True)}; "
            f"wrong fixed {share(False)}. After a correct kernel: the same kernel again {same}, "
            f"other code {sum(other.values())}" + (f" ({rewritten})." if rewritten else "."))


def done_when(rows: list, window: int = 5) -> dict:
    """Issue 61's lines on one run's rows; each value None where the rows cannot say."""
    last = rows[-window:]
    c1, cl = rows[0]["correct_rate"], _mean(r["correct_rate"] for r in last)
    s1, sl = rows[0].get("speedup_correct_mean"), _mean(r.get("speedup_correct_mean") for r in last)
    turns = [_mean(r["correct_rate_per_turn"][t] for r in last if len(r["correct_rate_per_turn"]) > t) for t in (0, 1)]
    evaluation = [r["seconds_evaluation"] for r in rows if "seconds_evaluation" in r]
    checks = {
        "steps": (len(rows), len(rows) >= 2 * window),
        # 2x of a zero start is zero: a run that never writes a correct kernel must not pass by the factor
        "correct rate": ((c1, cl), cl >= c1 + RATE_POINTS - 1e-9 or (c1 > 0 and cl >= RATE_FACTOR * c1 - 1e-9)),
        "speedup of correct kernels": ((s1, sl), None if s1 is None or sl is None else sl >= SPEEDUP_FACTOR * s1),
        "turn 2 vs turn 1": (tuple(turns), None if None in turns else turns[1] >= turns[0] - 1e-9),
        "evaluation": ((statistics.median(evaluation), max(evaluation[1:], default=0.0)) if evaluation else (None, None),
                       bool(evaluation) and statistics.median(evaluation) <= EVAL_MEDIAN_S
                       and max(evaluation[1:], default=0.0) <= EVAL_MAX_S),
    }
    return {"checks": checks, "met": all(ok for _, ok in checks.values())}


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _x(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def run_table(run: dict, variants: dict) -> str:
    rows = run["rows"]
    names = sorted({n for r in rows for n in variant_shares(r, variants)},
                   key=lambda n: (["fast", "slow", "wrong_values", "no_compile", "other", "no code"] + [n]).index(n))
    head = ["step", "correct", "turn 1 / 2", "speedup (correct)", "turn 1 / 2", *names, "format errors turn 1 / 2", "reward",
            "eval s", "compile error p50 s", "step s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for r in rows:
        shares = variant_shares(r, variants)
        errors = r.get("latency_by_status", {}).get("compile_error", [])
        cells = [str(r["step"]), _pct(r["correct_rate"]), " / ".join(f"{100 * c:.0f}" for c in r["correct_rate_per_turn"]),
                 _x(r.get("speedup_correct_mean")), " / ".join(_x(s) for s in r.get("speedup_correct_mean_per_turn", [])),
                 *[_pct(shares.get(n, 0.0)) for n in names],
                 " / ".join(f"{100 * f:.0f}" for f in format_errors_per_turn(r)), f"{r['reward_mean']:.3f}",
                 f"{r.get('seconds_evaluation', float('nan')):.0f}",
                 "-" if not errors else f"{statistics.median(errors):.1f} ({len(errors)})",
                 f"{r.get('seconds_step', float('nan')):.0f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def check_lines(run: dict, window: int) -> list[str]:
    if not run["rows"]:
        return [f"- **{run['label']}**: no step finished."]
    result = done_when(run["rows"], window)
    c = result["checks"]
    mark = {True: "yes", False: "**no**", None: "- (no data)"}
    (c1, cl), (s1, sl), (t1, t2) = c["correct rate"][0], c["speedup of correct kernels"][0], c["turn 2 vs turn 1"][0]
    median, worst = c["evaluation"][0]
    errors = [x for r in run["rows"] for x in r.get("latency_by_status", {}).get("compile_error", [])]
    lines = [f"- **{run['label']}**: done-when {'**met**' if result['met'] else 'not met'}",
             f"  - steps: {c['steps'][0]} (>= {2 * window}): {mark[c['steps'][1]]}",
             f"  - correct rate: step 1 {_pct(c1)}, last {window} {_pct(cl)} (>= +{100 * RATE_POINTS:.0f} points "
             f"or >= {RATE_FACTOR:g}x): {mark[c['correct rate'][1]]}",
             f"  - speedup of correct kernels: step 1 {_x(s1)}, last {window} {_x(sl)} (>= {SPEEDUP_FACTOR:g}x "
             f"step 1): {mark[c['speedup of correct kernels'][1]]}",
             f"  - correct rate over the last {window}, turn 1 {_pct(t1)}, turn 2 {_pct(t2)} (turn 2 >= turn 1): "
             f"{mark[c['turn 2 vs turn 1'][1]]}",
             f"  - evaluation a step: median {median if median is None else round(median, 1)} s (<= {EVAL_MEDIAN_S:g}), "
             f"slowest after step 1 {worst if worst is None else round(worst, 1)} s (<= {EVAL_MAX_S:g}): "
             f"{mark[c['evaluation'][1]]}"]
    if errors:
        p50, p90 = _quantile(errors, 0.5), _quantile(errors, 0.9)
        lines.append(f"  - compile errors' verdict latency, {len(errors)} verdicts: p50 {p50:.1f} s, p90 {p90:.1f} s "
                     f"(goal p50 <= {COMPILE_ERROR_P50_S:g} s): {mark[p50 <= COMPILE_ERROR_P50_S]}")
    return lines


def report(runs: list, variants: dict, window: int = 5) -> str:
    out = ["# Learning demo report", "", f"## Done-when: step 1 against the last {window} steps", ""]
    for run in runs:
        out += check_lines(run, window)
    out += ["", f"Runs meeting it: {sum(bool(r['rows']) and done_when(r['rows'], window)['met'] for r in runs)} "
            f"of {len(runs)}.", ""]
    for run in runs:
        out += [f"## {run['label']}", "", run_table(run, variants), ""]
        transitions = transition_line(run["rows"])
        if transitions:
            out += [transitions, ""]
        reasons = format_error_reasons(run["rows"])
        if reasons:
            out += ["Why responses were format errors (all steps):", "", *reasons, ""]
        out += compile_error_lines(run["rows"])
    return "\n".join(out)


def compile_error_lines(rows: list) -> list[str]:
    """The distinct kernels that failed to compile, built now (train.py's `compile_errors`, kept since
    the early verdicts): those judged early (the rule) apart from those that waited for the build as
    written, each with its latency and first diagnostic, slowest first."""
    errors = [(r["step"], *e) for r in rows for e in r.get("compile_errors", [])]
    if not errors:
        return []
    summary = []
    for title, group in (("judged early", [e for e in errors if e[2]]),
                         ("built as written", [e for e in errors if not e[2]])):
        if group:
            seconds = [e[1] for e in group]
            summary.append(f"- {title}: {len(group)}, p50 {_quantile(seconds, 0.5):.1f} s, max {max(seconds):.1f} s")
    lines = ["Compile errors, each distinct kernel once (latency from its compile's start):", "", *summary, "",
             "| step | s | rule | first diagnostic |", "|---:|---:|---|---|"]
    for step, seconds, rule, first in sorted(errors, key=lambda e: -e[1]):
        lines.append(f"| {step} | {seconds:.1f} | {rule or 'as written'} | {first.replace('|', '/')} |")
    return lines + [""]


def plot(run: dict, variants: dict, path: str) -> None:
    """One run: correct rate (all, per turn), mean speedup of correct kernels (all, per turn), variant shares."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = run["rows"]
    steps = [r["step"] for r in rows]
    turns = max(len(r["correct_rate_per_turn"]) for r in rows)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    nan = float("nan")
    axes[0].plot(steps, [r["correct_rate"] for r in rows], "o-", color="black", label="all turns")
    axes[1].plot(steps, [nan if r.get("speedup_correct_mean") is None else r["speedup_correct_mean"] for r in rows],
                 "o-", color="black", label="all turns")
    for t, style in zip(range(turns), ("s--", "^:", "v-.", "d--")):
        axes[0].plot(steps, [r["correct_rate_per_turn"][t] if t < len(r["correct_rate_per_turn"]) else nan
                             for r in rows], style, alpha=0.8, label=f"turn {t + 1}")
        per_turn = [r.get("speedup_correct_mean_per_turn", []) for r in rows]
        axes[1].plot(steps, [p[t] if t < len(p) and p[t] is not None else nan for p in per_turn], style, alpha=0.8,
                     label=f"turn {t + 1}")
    shares = [variant_shares(r, variants) for r in rows]
    for name in sorted({n for s in shares for n in s}):
        axes[2].plot(steps, [s.get(name, 0.0) for s in shares], "o-", alpha=0.8, label=name)
    axes[0].set(title=f"{run['label']}: correct rate", xlabel="step", ylim=(-0.02, 1.02))
    axes[1].set(title="mean speedup of correct kernels", xlabel="step")
    axes[2].set(title="share of samples by kernel", xlabel="step", ylim=(-0.02, 1.02))
    for ax in axes:
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("metrics", nargs="+", help="metrics.jsonl of each run")
    p.add_argument("--variants", default=None, help="examples/warm_start.py's variants.json (names the kernels)")
    p.add_argument("--png-dir", default=None, help="write one plot per run here, <run>.png")
    p.add_argument("--window", type=int, default=5)
    args = p.parse_args(argv)
    runs = [load_run(path) for path in args.metrics if os.path.exists(path)]
    variants = load_variants(args.variants)
    text = report(runs, variants, args.window)
    missing = [path for path in args.metrics if not os.path.exists(path)]
    text += "".join(f"\n- missing: `{m}` (the run wrote no step)" for m in missing)
    print(text)
    if args.png_dir:
        os.makedirs(args.png_dir, exist_ok=True)
        for run in runs:
            if run["rows"]:
                plot(run, variants, os.path.join(args.png_dir, f"{run['label']}.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
