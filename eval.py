"""Evaluation: KernelBench-style metrics of a policy, Kevin's test-time search, and
inference-time scaling, with tables and plots.

A policy runs the training rollout (no gradient) on a task set: N trajectories x T turns per
task (Kevin: 16 x 8), or Kevin's beam search at the same kernel budget. Every kernel is one
record; the metrics come from the records alone. For task i, kernels k (correct c_k, speedup x_k):

    per-kernel correctness = mean of c_k;  avg@N = mean_i mean_j 1[trajectory j has a correct kernel]
    best@N = mean_i 1[task i has a correct kernel];  b_i = max x_k over correct kernels (0 if none)
    speedup_best_mean = mean_i b_i;  speedup_best_geomean = exp(mean log b_i) over b_i > 0
    fast_p = mean_i 1[correct kernel and b_i > p], p in {0, 1, 1.5, 2} (fast_0 = best@N)

A correct kernel whose timing was not trusted has speedup 0. Each metric is given overall, per
level and per turn (best so far over turns 1..t). A kernel the harness could not judge
(harness_error) is counted apart, never as incorrect; a task whose reference failed is left out.

Outputs in --out: records.jsonl (appended per turn; --resume continues from it), code/<hash>.py,
run.json (the protocol, checked on --resume), summary.json/.md and plots; --grid: a sub-folder per
shape, grid.json, grid.md, scaling.png (Kevin's Table 2).

    python eval.py --policy oracle --tasks builtin --device cpu --limit 2 --trajectories 2 --turns 2 --out runs/eval_oracle
    python eval.py --policy /path/to/export --tasks /path/to/KernelBench --levels 1,2 --split heldout --device cuda --out runs/eval_heldout
    python eval.py --policy MODEL --base-url http://localhost:8000/v1 ...   # key from $OPENAI_API_KEY
    python eval.py --policy oracle --corrupt-rate 0.5 --grid 16x8,32x4,128x1,beam:16x4x2 --device cuda --out runs/grid
    python eval.py --policy candidates/ ...   # DIR/<task_id>/<n>.py, each judged as it is
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import io
import json
import math
import os
import random
import shlex
import sys
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

import beam_search
import checkpoint
import engines
import flags
import kernel_gate
import rewards
import rollout
import summarize
import tasks as tasks_module

FAST_P = (0.0, 1.0, 1.5, 2.0)
METRIC_KEYS = ("correct_avg", "correct_best", "speedup_best_mean", "speedup_best_geomean")


# ---------------------------------------------------------------------------------------
# Metrics (plain functions over records: dicts with task_id, trajectory, turn, correct,
# speedup; beam records also carry round and parent)


def _speedup(record: dict) -> float:
    """A correct kernel's speedup; a non-finite or negative one is untrusted and counts 0."""
    x = float(record.get("speedup") or 0.0)
    return x if math.isfinite(x) and x > 0 else 0.0


def kernel_correct_rate(records: Sequence[dict]) -> float:
    return sum(bool(r["correct"]) for r in records) / len(records) if records else 0.0


def trajectory_groups(records: Sequence[dict]) -> dict[tuple[str, int], list[dict]]:
    """The kernels of each (task, trajectory). Beam records (with `round` and `parent`) are
    grouped by lineage: each slot of the last round present with its ancestors' kernels."""
    groups: dict[tuple[str, int], list[dict]] = defaultdict(list)
    if not any("round" in r for r in records):
        for r in records:
            groups[(r["task_id"], r["trajectory"])].append(r)
        return dict(groups)
    by_slot: dict[tuple[str, int, int], list[dict]] = defaultdict(list)
    parent: dict[tuple[str, int, int], int | None] = {}
    for r in records:
        by_slot[(r["task_id"], r["round"], r["trajectory"])].append(r)
        parent[(r["task_id"], r["round"], r["trajectory"])] = r.get("parent")
    last = defaultdict(int)
    for task, rnd, _ in by_slot:
        last[task] = max(last[task], rnd)
    for (task, rnd, slot) in sorted(by_slot):
        if rnd != last[task]:
            continue
        node: tuple[str, int, int] | None = (task, rnd, slot)
        while node is not None and node in by_slot:
            groups[(task, slot)] += by_slot[node]
            up = parent[node]
            node = None if up is None else (task, node[1] - 1, up)
    return dict(groups)


def correct_avg(records: Sequence[dict]) -> float:
    """avg@N: per task, the share of trajectories with a correct kernel; then the mean over tasks."""
    per_task: dict[str, list[bool]] = defaultdict(list)
    for (task, _), kernels in trajectory_groups(records).items():
        per_task[task].append(any(r["correct"] for r in kernels))
    return sum(sum(v) / len(v) for v in per_task.values()) / len(per_task) if per_task else 0.0


def best_speedups(records: Sequence[dict]) -> dict[str, float]:
    """b_i per task: the fastest correct kernel's speedup, 0 when none is correct."""
    best: dict[str, float] = {}
    for r in records:
        best.setdefault(r["task_id"], 0.0)
        if r["correct"]:
            best[r["task_id"]] = max(best[r["task_id"]], _speedup(r))
    return best


def correct_best(records: Sequence[dict]) -> float:
    """best@N: the share of tasks with at least one correct kernel."""
    solved = solved_tasks(records)
    return sum(solved.values()) / len(solved) if solved else 0.0


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def geomean(values: Sequence[float]) -> float:
    """exp(mean log v) over the values > 0; 0 when there are none."""
    positive = [v for v in values if v > 0]
    return math.exp(sum(map(math.log, positive)) / len(positive)) if positive else 0.0


def solved_tasks(records: Sequence[dict]) -> dict[str, bool]:
    solved: dict[str, bool] = {}
    for r in records:
        solved[r["task_id"]] = solved.get(r["task_id"], False) or bool(r["correct"])
    return solved


def fast_p(best: dict[str, float], solved: dict[str, bool], p: float) -> float:
    """KernelBench's fast_p: the share of tasks with a correct kernel whose best speedup is
    > p (strictly); for p = 0 every solved task counts, its time trusted or not."""
    if p < 0:
        raise ValueError(f"fast_p: p must be >= 0, got {p}")
    return sum(solved[t] and (b > p or p == 0) for t, b in best.items()) / len(best) if best else 0.0


def metrics(records: Sequence[dict], ps: Sequence[float] = FAST_P) -> dict:
    """The metrics of the module docstring. A record the harness could not judge (status
    harness_error) has no verdict: it is not a kernel (left out of n_kernels and the per-kernel
    correctness) but counted under harness_errors; its task and trajectory stay in every metric,
    with what their judged kernels reached."""
    judged = [r for r in records if r.get("status") != rollout.HARNESS_ERROR]
    best = best_speedups(records)
    return {
        "n_tasks": len(best), "n_kernels": len(judged), "harness_errors": len(records) - len(judged),
        "correct_kernel": kernel_correct_rate(judged),
        "correct_avg": correct_avg(records), "correct_best": correct_best(records),
        "speedup_best_mean": mean(list(best.values())),
        "speedup_best_geomean": geomean(list(best.values())),
        "fast_p": {_p_key(p): fast_p(best, solved_tasks(records), p) for p in ps},
    }


def _p_key(p: float) -> str:
    return f"{p:g}"


def summarize_records(records: Sequence[dict], ps: Sequence[float] = FAST_P) -> dict:
    """Overall metrics, per level, and per turn (best so far: turns 1..t). A task whose reference
    failed in the harness (status reference_error) is the task's fault: all of its records are
    left out of the metrics, not counted against the model, and the task is named under
    "reference_error_tasks". Kernels the harness could not judge (harness_error) are counted apart
    (metrics); a task none of whose kernels was judged is named under "harness_error_tasks"."""
    broken = sorted({r["task_id"] for r in records if r.get("status") == rollout.REFERENCE_ERROR})
    records = [r for r in records if r["task_id"] not in broken]
    summary = metrics(records, ps)
    summary["reference_error_tasks"] = broken
    judged = {r["task_id"] for r in records if r.get("status") != rollout.HARNESS_ERROR}
    summary["harness_error_tasks"] = sorted({r["task_id"] for r in records} - judged)
    levels = sorted({r.get("level") for r in records}, key=lambda x: (x is None, x))
    summary["per_level"] = {str(level): metrics([r for r in records if r.get("level") == level], ps)
                            for level in levels}
    summary["per_turn"] = [{"turn": t, **metrics([r for r in records if r["turn"] <= t], ps)}
                           for t in sorted({r["turn"] for r in records})]
    return summary


# ---------------------------------------------------------------------------------------
# Files


def load_records(path: str) -> list[dict]:
    """The records of a run; a last line cut by a crash is dropped."""
    records = []
    if not os.path.exists(path):
        return records
    with open(path) as f:
        lines = f.read().split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i < len(lines) - 2:  # only the last line can be cut by a crash
                raise
    return records


class RecordWriter:
    """Appends one turn's records to records.jsonl in one write (then fsync), and stores each
    distinct kernel once as code/<sha256>.py, the file --resume reads histories back from."""

    def __init__(self, out_dir: str, levels: dict[str, Any], progress=None):
        self.out_dir, self.levels, self.progress = out_dir, levels, progress
        self.path = os.path.join(out_dir, "records.jsonl")
        os.makedirs(os.path.join(out_dir, "code"), exist_ok=True)

    def code_hash(self, code: str | None) -> str | None:
        if code is None:
            return None
        digest = hashlib.sha256(code.encode()).hexdigest()
        path = os.path.join(self.out_dir, "code", f"{digest}.py")
        if not os.path.exists(path):
            checkpoint.atomic_write(path, code)
        return digest

    def record(self, s: rollout.Sample, **extra) -> dict:
        """The record of one kernel; its turn counted from 1, as every table and plot counts it."""
        return {
            "task_id": s.task_id, "level": self.levels.get(s.task_id), "trajectory": s.trajectory,
            "turn": s.turn + 1, **extra, "status": s.status, "correct": bool(s.correct), "speedup": s.speedup,
            "score": None if s.status == rollout.HARNESS_ERROR else s.score,   # no verdict: no score, not 0
            "ref_ms": s.ref_ms, "candidate_ms": s.candidate_ms, "timing_ok": s.timing_ok, "message": s.message,
            "boundary": s.boundary,
            "code_hash": self.code_hash(s.code),
            "summary": s.summary, "feedback": s.feedback, "truncated": s.truncated,
            "prompt_tokens": len(s.prompt_ids), "completion_tokens": len(s.completion_ids)}

    def write(self, records: list[dict]) -> None:
        checkpoint.append_synced(self.path, "".join(json.dumps(r) + "\n" for r in records))
        if self.progress is not None:
            self.progress.update(len(records))

    def history(self, records: Sequence[dict]) -> list[summarize.Attempt]:
        """A trajectory's attempts as its next prompt shows them (rollout's own Attempt)."""
        attempts = []
        for r in sorted(records, key=lambda r: r["turn"]):
            code = ""
            if r["code_hash"] is not None:
                with open(os.path.join(self.out_dir, "code", f"{r['code_hash']}.py")) as f:
                    code = f.read()
            attempts.append(summarize.Attempt(code=code, summary=r["summary"], feedback=r["feedback"]))
        return attempts


# ---------------------------------------------------------------------------------------
# Policies


class TurnSeededEngine:
    """An engine whose sampling at turn t is seeded by (seed, t): torch's generator for a
    model, the oracle's own `rng`. A run resumed at turn t then draws what the run that was
    interrupted would have drawn."""

    def __init__(self, engine, seed: int | str):
        self.engine, self.seed, self.turn = engine, seed, 0
        self.prompt_opens_thinking = getattr(engine, "prompt_opens_thinking", False)

    def at(self, turn: int) -> "TurnSeededEngine":
        self.turn = turn
        return self

    def encode_prompt(self, text: str) -> list[int]:
        return self.engine.encode_prompt(text)

    def count_tokens(self, text: str) -> int:
        return self.engine.count_tokens(text)

    def generate(self, prompt_token_ids, **kwargs):
        import torch
        key = f"eval:{self.seed}:{self.turn}"
        torch.manual_seed(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little"))
        if isinstance(getattr(self.engine, "rng", None), random.Random):
            self.engine.rng.seed(key)
        self.turn += 1
        return self.engine.generate(prompt_token_ids, **kwargs)


def build_engine(args, task_list, language: str, local_only: bool = True):
    """--policy: oracle / oracle-corrupt, an OpenAI-compatible endpoint (--base-url), or an HF
    model (hub id or local path with config.json; `local_only`: local_model's answer). A model that
    cannot be loaded is one line."""
    if args.policy in ("oracle", "oracle-corrupt"):
        rate = 1.0 if args.policy == "oracle-corrupt" else args.corrupt_rate
        return engines.OracleEngine(task_list, language=language, corrupt_rate=rate, seed=args.seed)
    if args.base_url:
        return engines.OpenAIEngine(args.base_url, args.model or args.policy,
                                    api_key=os.environ.get(args.api_key_env), max_workers=args.http_workers)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.policy, local_files_only=local_only)
        model = AutoModelForCausalLM.from_pretrained(args.policy, dtype=dtype, local_files_only=local_only)
    except (OSError, ValueError) as error:   # transformers' words for a folder or hub entry that is not a model
        raise SystemExit(f"eval.py: --policy {args.policy}: cannot load it: {str(error).strip().splitlines()[0]}")
    return engines.HFEngine(model.to(args.device), tokenizer, max_batch_rows=args.max_batch_rows)


def local_model(name: str) -> bool:
    """Whether the model `name` is to be loaded from local files only (a folder, or the Hugging Face
    cache when the hub is out of reach); one line when it is nowhere. The hub is asked once, without
    the client's retries, which would take about 48 s to give up offline."""
    from huggingface_hub import constants, model_info, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError, RepositoryNotFoundError
    from huggingface_hub.utils import validate_repo_id
    if os.path.isdir(name):
        return True
    try:
        validate_repo_id(name)
    except HFValidationError:
        raise SystemExit(f"eval.py: --policy {name}: no such folder") from None
    cached = isinstance(try_to_load_from_cache(name, "config.json"), str)
    if constants.HF_HUB_OFFLINE:
        if not cached:
            raise SystemExit(f"eval.py: --policy {name}: no such folder, and not in the Hugging Face cache "
                             "(HF_HUB_OFFLINE is set)")
        return True
    try:
        model_info(name, timeout=10)
    except RepositoryNotFoundError:
        raise SystemExit(f"eval.py: --policy {name}: no such folder, and no such model on the Hugging Face hub "
                         "(a private or gated one needs `hf auth login`)") from None
    except Exception as error:   # the hub out of reach: its client raises its HTTP library's own error classes
        if not cached:
            reason = (str(error).strip().splitlines() or [""])[0]
            raise SystemExit(f"eval.py: --policy {name}: no such folder, not in the Hugging Face cache, and the hub "
                             f"cannot be reached ({type(error).__name__}: {reason})") from None
        return True
    return False


def is_candidate_folder(policy: str) -> bool:
    return os.path.isdir(policy) and not os.path.exists(os.path.join(policy, "config.json"))


# ---------------------------------------------------------------------------------------
# Protocols


def run_trajectories(task_list, engine, evaluate_batch, config: rollout.RolloutConfig,
                     writer: RecordWriter, resume: bool, seed: int | str) -> list[dict]:
    """N independent trajectories x T turns per task; on --resume, the turns already in
    records.jsonl for every trajectory are kept and the rest run from their histories."""
    G, T = config.n_trajectories, config.n_turns
    done = load_records(writer.path) if resume else []
    keys = [(t.task_id, g) for t in task_list for g in range(G)]
    have = defaultdict(set)
    for r in done:
        have[(r["task_id"], r["trajectory"])].add(r["turn"] - 1)   # the rollout counts turns from 0
    start = 0
    while start < T and all(start in have[k] for k in keys):
        start += 1
    done = [r for r in done if r["turn"] <= start]
    # Turns that only some trajectories reached are run again: drop their records first.
    checkpoint.atomic_write(writer.path, "".join(json.dumps(r) + "\n" for r in done))
    if writer.progress is not None:
        writer.progress.update(len(done))
    if start == T:
        return done
    histories = None
    if start > 0:
        by_key = defaultdict(list)
        for r in done:
            by_key[(r["task_id"], r["trajectory"])].append(r)
        histories = [writer.history(by_key[k]) for k in keys]
    written: list[dict] = []

    def on_turn(turn, samples):
        records = [writer.record(s) for s in samples]
        writer.write(records)
        written.extend(records)

    rollout.rollout(task_list, TurnSeededEngine(engine, seed).at(start), evaluate_batch,
                    dataclasses.replace(config, n_turns=T - start), histories=histories,
                    start_turn=start, on_turn=on_turn)
    return done + written


def run_beam(task_list, engine, evaluate_batch, config: rollout.RolloutConfig,
             beam: beam_search.BeamConfig, writer: RecordWriter, seed: int | str) -> tuple[list[dict], beam_search.BeamResult]:
    """Kevin's beam search; every refinement round is one rollout over all tasks' W trajectories."""
    seeded = TurnSeededEngine(engine, seed)
    written: list[dict] = []

    def refine(states, *, start_turn, n_turns, parents):
        round_index = start_turn // n_turns

        def on_turn(turn, samples):
            records = [writer.record(s, round=round_index, parent=parents[i])
                       for i, s in enumerate(samples)]
            writer.write(records)
            written.extend(records)

        fresh = all(len(s) == 0 for s in states)
        samples, _ = rollout.rollout(
            task_list, seeded.at(start_turn), evaluate_batch,
            dataclasses.replace(config, n_trajectories=beam.width, n_turns=n_turns),
            histories=None if fresh else states, start_turn=start_turn, on_turn=on_turn)
        out = []
        for i, state in enumerate(states):   # samples: task-major, trajectory, turn
            own = samples[i * n_turns:(i + 1) * n_turns]
            out.append((list(state) + [summarize.Attempt(s.code or "", s.summary, s.feedback) for s in own],
                        [s.score for s in own]))
        return out

    result = beam_search.beam_search([[] for _ in task_list], refine, beam)
    return written, result


def run_folder(task_list, folder: str, evaluate_batch, language: str, writer: RecordWriter) -> tuple[list, list[dict]]:
    """Candidate files DIR/<task_id>/<n>.py, each judged as it is (the same format gate as the
    reward first): trajectory n, turn 0. Tasks with no folder are left out of the metrics."""
    rows = []
    for task in task_list:
        files = glob.glob(os.path.join(folder, task.task_id, "*.py"))
        for path in sorted(files, key=lambda p: int(os.path.basename(p)[:-3]) if os.path.basename(p)[:-3].isdigit() else -1):
            stem = os.path.basename(path)[:-3]
            if not stem.isdigit():
                raise SystemExit(f"eval.py: candidate files are named <n>.py, got {path}")
            with open(path) as f:
                code = f.read()
            rows.append((task, int(stem), code, kernel_gate.check_format(code, language)))
    gated = [i for i, row in enumerate(rows) if row[3] is None]
    verdicts = evaluate_batch([(rows[i][0].reference_src, rows[i][2]) for i in gated]) if gated else []
    by_row = {i: rollout.verdict_record(v) for i, v in zip(gated, verdicts)}
    records = []
    for i, (task, n, code, reason) in enumerate(rows):
        verdict = by_row.get(i, {})   # none: the gate refused it (reason)
        sample = rollout.Sample(
            task_id=task.task_id, trajectory=n, turn=0, prompt_ids=[], completion_ids=[], loss_mask=[],
            logprobs=None, text="", truncated=False,
            status=verdict.get("status", "format_error"), score=rewards.kernel_score(verdict) if verdict else 0.0,
            discounted_return=0.0, speedup=float(verdict.get("speedup", 0.0) or 0.0), code=code,
            feedback=summarize.feedback(verdict or reason),
            correct=bool(verdict.get("correct", False)), ref_ms=float(verdict.get("ref_ms", 0.0) or 0.0),
            candidate_ms=float(verdict.get("candidate_ms", 0.0) or 0.0),
            timing_ok=bool(verdict.get("timing_ok", False)), message=str(verdict.get("message", reason or "")),
            boundary=str(verdict.get("boundary", "")))
        records.append(writer.record(sample))
    writer.write(records)
    covered = {task.task_id for task, *_ in rows}
    return [t for t in task_list if t.task_id in covered], records


# ---------------------------------------------------------------------------------------
# Tables and plots


def _f(x: float) -> str:
    return f"{x:.3f}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def _metric_row(name: str, m: dict) -> list[str]:
    return [name, str(m["n_tasks"]), str(m["n_kernels"]), _f(m["correct_kernel"]), _f(m["correct_avg"]),
            _f(m["correct_best"]), _f(m["speedup_best_mean"]), _f(m["speedup_best_geomean"]),
            *[_f(v) for v in m["fast_p"].values()]]


def summary_markdown(summary: dict, title: str) -> str:
    ps = list(summary["fast_p"])
    header = ["", "tasks", "kernels", "correct (kernel)", "avg@N", "best@N", "best speedup (mean)",
              "best speedup (geomean)", *[f"fast_{p}" for p in ps]]
    out = [f"# {title}\n", _table(header, [_metric_row("all", summary)])]
    if summary.get("reference_error_tasks"):
        out.append(f"\nLeft out, their reference failed in the harness (the task's fault, not the model's): "
                   f"{', '.join(summary['reference_error_tasks'])}\n")
    if summary.get("harness_errors"):
        unjudged = summary.get("harness_error_tasks")
        out.append(f"\nNo verdict for {summary['harness_errors']} kernels (harness_error: the harness could not fit "
                   "the task's copies in memory): not counted as kernels, nor as failed ones; their tasks count with "
                   "what their judged kernels reached" + (f" (none for {', '.join(unjudged)})" if unjudged else "")
                   + ".\n")
    out += ["\n## Per level\n", _table(header, [_metric_row(f"level {lv}", m) for lv, m in summary["per_level"].items()])]
    out += ["\n## Per turn (best so far over turns 1..t)\n",
            _table(header, [_metric_row(f"turn {m['turn']}", m) for m in summary["per_turn"]])]
    return "".join(out)


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: str) -> None:
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=120, bbox_inches="tight")
    checkpoint.atomic_write(path, png.getvalue())


def plot_turns(summary: dict, path: str, title: str) -> None:
    """best@N / avg@N correctness and the best speedup (mean, geomean) against the turn."""
    plt = _pyplot()
    turns = [m["turn"] for m in summary["per_turn"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for key, label in (("correct_best", "best@N"), ("correct_avg", "avg@N")):
        left.plot(turns, [m[key] for m in summary["per_turn"]], marker="o", label=label)
    left.set(xlabel="turn", ylabel="correctness (best so far)", ylim=(-0.02, 1.02))
    for key, label in (("speedup_best_mean", "mean"), ("speedup_best_geomean", "geomean (solved tasks)")):
        right.plot(turns, [m[key] for m in summary["per_turn"]], marker="o", label=label)
    right.set(xlabel="turn", ylabel="best speedup so far")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
        ax.set_xticks(turns)
    fig.suptitle(title)
    _save(fig, path)
    plt.close(fig)


def plot_fast_p(records: Sequence[dict], summary: dict, path: str, title: str) -> None:
    """fast_p as a curve over p, the reported p marked."""
    plt = _pyplot()
    best, solved = best_speedups(records), solved_tasks(records)
    top = max([2.5, *[1.1 * b for b in best.values()]])
    grid = [top * i / 400 for i in range(401)]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.plot(grid, [fast_p(best, solved, p) for p in grid], drawstyle="steps-post")
    ps = [float(p) for p in summary["fast_p"]]
    ax.plot(ps, list(summary["fast_p"].values()), "o")
    ax.set(xlabel="p (speedup over the reference)", ylabel="fast_p", ylim=(-0.02, 1.02), title=title)
    ax.grid(alpha=0.3)
    _save(fig, path)
    plt.close(fig)


def write_outputs(out_dir: str, records: list[dict], title: str, extra: dict | None = None) -> dict:
    summary = {**summarize_records(records), **(extra or {})}
    checkpoint.atomic_write(os.path.join(out_dir, "summary.json"), json.dumps(summary, indent=2) + "\n")
    checkpoint.atomic_write(os.path.join(out_dir, "summary.md"), summary_markdown(summary, title))
    plot_turns(summary, os.path.join(out_dir, "speedup_vs_turn.png"), title)
    plot_fast_p(records, summary, os.path.join(out_dir, "fast_p.png"), title)
    return summary


def parse_shape(text: str) -> dict:
    """'16x8' (trajectories x turns) or 'beam:16x4x2' (width x turns a round x rounds)."""
    beam = text.startswith("beam:")
    parts = text.removeprefix("beam:").split("x")
    if len(parts) != (3 if beam else 2) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"--grid entries are GxT or beam:WxSxR with positive integers, got {text!r}")
    n = [int(p) for p in parts]
    if beam:
        return {"name": text.replace(":", "_"), "search": "beam", "width": n[0], "steps": n[1], "rounds": n[2],
                "budget": n[0] * n[1] * n[2]}
    return {"name": text, "search": "trajectories", "trajectories": n[0], "turns": n[1], "budget": n[0] * n[1]}


def grid_markdown(rows: list[dict]) -> str:
    ps = list(rows[0]["summary"]["fast_p"])
    header = ["shape", "search", "kernels per task", "avg@N", "best@N", "best speedup (mean)",
              "best speedup (geomean)", *[f"fast_{p}" for p in ps]]
    body = [[r["name"], r["search"], str(r["budget"]), _f(r["summary"]["correct_avg"]),
             _f(r["summary"]["correct_best"]), _f(r["summary"]["speedup_best_mean"]),
             _f(r["summary"]["speedup_best_geomean"]), *[_f(v) for v in r["summary"]["fast_p"].values()]]
            for r in rows]
    return "# Inference-time scaling\n\n" + _table(header, body)


def plot_grid(rows: list[dict], path: str, title: str) -> None:
    plt = _pyplot()
    names = [r["name"] for r in rows]
    panels = (("correct_best", "best@N correctness"), ("correct_avg", "avg@N correctness"),
              ("speedup_best_mean", "best speedup (mean)"), ("fast_1", "fast_1"))
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.6))
    for ax, (key, label) in zip(axes, panels):
        values = [r["summary"]["fast_p"].get("1", 0.0) if key == "fast_1" else r["summary"][key] for r in rows]
        ax.bar(range(len(rows)), values, color=["C1" if r["search"] == "beam" else "C0" for r in rows])
        ax.set_xticks(range(len(rows)), names, rotation=30, ha="right")
        ax.set_title(label)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(title, y=1.03)
    _save(fig, path)
    plt.close(fig)


# ---------------------------------------------------------------------------------------
# CLI


def load_tasks(args) -> list:
    return tasks_module.select_tasks(args.tasks, args.levels, "eval.py", split=args.split, n_heldout=args.n_heldout,
                                     split_seed=args.split_seed, task_ids=args.task_ids, limit=args.limit,
                                     device=args.device)


def protocol(args, language: str, task_list) -> dict:
    """What a resumed run must share with the run it continues."""
    return {"policy": args.policy, "base_url": args.base_url, "model": args.model,
            "corrupt_rate": args.corrupt_rate, "tasks_arg": args.tasks, "tasks": [t.task_id for t in task_list],
            "trajectories": args.trajectories, "turns": args.turns, "search": args.search,
            "beam": [args.beam_width, args.beam_keep, args.beam_steps, args.beam_rounds],
            "grid": args.grid, "language": language, "device": args.device, "seed": args.seed,
            "max_new_tokens": args.max_new_tokens, "max_prompt_tokens": args.max_prompt_tokens,
            "temperature": args.temperature, "top_p": args.top_p}


def size_line(task_list, shapes: list[dict], device: str) -> str:
    """How many kernels a run is about to judge, said before it starts (Kevin's 16 x 8 protocol over
    every task is thousands of kernels: hours of C++ builds on a CPU)."""
    per_task = " + ".join(f"{s['trajectories']} trajectories x {s['turns']} turns" if s["search"] == "trajectories"
                          else f"beam {s['width']} x {s['steps']} turns x {s['rounds']} rounds" for s in shapes)
    tasks = f"{len(task_list)} task{'s' * (len(task_list) != 1)}"
    total = len(task_list) * sum(s["budget"] for s in shapes)
    return (f"eval.py: {tasks} x {per_task if len(shapes) == 1 else f'({per_task})'} = {total} kernels to judge "
            f"on {device} (--limit, --trajectories and --turns make it smaller)")


def run_one(args, shape: dict, task_list, engine, evaluate_batch, config, out_dir: str, title: str) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    levels = {t.task_id: t.level for t in task_list}
    total = len(task_list) * shape["budget"]
    progress = None
    if args.progress:
        from tqdm import tqdm
        progress = tqdm(total=total, desc=shape["name"], unit="kernel", file=sys.stderr)
    writer = RecordWriter(out_dir, levels, progress)
    extra: dict = {"shape": shape["name"], "search": shape["search"], "kernel_budget_per_task": shape["budget"]}
    # Each shape samples on its own: shapes of a grid do not share their first turn's draws.
    seed = f"{args.seed}:{shape['name']}"
    try:
        if shape["search"] == "beam":
            summary_path = os.path.join(out_dir, "summary.json")
            if args.resume and os.path.exists(summary_path):   # finished before: nothing to do
                with open(summary_path) as f:
                    return json.load(f)
            # An unfinished beam search starts again: its later rounds depend on every
            # ranking before them, which the records alone do not pin down.
            checkpoint.atomic_write(writer.path, "")
            beam = beam_search.BeamConfig(width=shape["width"], keep=args.beam_keep,
                                          steps_per_round=shape["steps"], rounds=shape["rounds"])
            records, result = run_beam(task_list, engine, evaluate_batch, config, beam, writer, seed)
            extra["beam"] = {"width": beam.width, "keep": beam.keep, "steps_per_round": beam.steps_per_round,
                             "rounds": beam.rounds, "budget": result.budget, "kernels": result.kernels,
                             "kept": [r.kept for r in result.rounds], "all_failed": [r.all_failed for r in result.rounds]}
        else:
            records = run_trajectories(task_list, engine, evaluate_batch,
                                       dataclasses.replace(config, n_trajectories=shape["trajectories"],
                                                           n_turns=shape["turns"]),
                                       writer, args.resume, seed)
    finally:
        if progress is not None:
            progress.close()
    return write_outputs(out_dir, records, title, extra)


@dataclass
class Args(rollout.Sampling):
    """eval.py's flags (flags.py: each field a flag, its comment the --help); the sampling settings are
    rollout.Sampling's, with Kevin's protocol as their defaults (KEVIN_PROTOCOL)."""
    policy: str                       # oracle, oracle-corrupt, a Hugging Face model id or folder, a model name at --base-url, or a folder DIR/<task_id>/<n>.py of candidates
    out: str                          # the run's folder: records, summary, tables and plots
    base_url: str | None = None       # an OpenAI-compatible endpoint, .../v1
    model: str | None = None          # the model's name at --base-url (none: --policy)
    api_key_env: str = "OPENAI_API_KEY"  # the environment variable that holds --base-url's key
    http_workers: int = 8             # requests to --base-url at once
    corrupt_rate: float = 0.0         # --policy oracle: the share of answers corrupted
    tasks: str = "builtin"            # builtin, a KernelBench checkout, or a .jsonl/.parquet export
    levels: str | None = None         # comma-separated levels, e.g. 1,2 (none: all)
    split: str = "all"                # the part of tasks.split_tasks' train/held-out split
    n_heldout: int = 20               # tasks in the held-out part (Kevin's 20)
    split_seed: int = 0               # the split's seed
    task_ids: str | None = None       # only these task ids, comma-separated (none: all)
    limit: int = 0                    # the first N tasks after --split and --task-ids (0: all)
    search: str = "trajectories"      # independent trajectories, or Kevin's beam search
    beam_width: int = 16              # beam search: trajectories a round
    beam_keep: int = 4                # beam search: the best trajectories kept after a round, each replicated W/K times
    beam_steps: int = 4               # beam search: turns a round
    beam_rounds: int = 2              # beam search: rounds
    grid: str | None = None           # several shapes, each its own run: GxT (trajectories x turns) or beam:WxSxR, e.g. 16x8,32x4,128x1,beam:16x4x2
    device: str | None = None         # cpu, cuda or cuda:N, for the harness and the model (none: cuda when torch sees one, else cpu)
    language: str | None = None       # the kernels' language (none: cpp with --device cpu, cuda on a GPU)
    max_batch_rows: int = 64          # rows the Hugging Face engine decodes at once
    resume: bool = False              # continue from --out's records.jsonl
    progress: bool = True             # a progress bar on stderr
    sandbox: str = "auto"             # the candidates' processes behind namespaces and uid 65534 (kernel_boundary): auto (where they work, else a warning), require (refuse without them), off


KEVIN_PROTOCOL = dict(trajectories=16, turns=8, max_new_tokens=16384, temperature=0.9)
CHOICES = {"split": ("all", "train", "heldout"), "search": ("trajectories", "beam"),
           "language": tasks_module.LANGUAGES, "sandbox": ("auto", "require", "off")}


def parse_args(argv=None) -> Args:
    parser = flags.parser("eval.py", __doc__.split("\n\n")[0], raw=True)
    flags.add_fields(parser, Args, CHOICES, defaults=KEVIN_PROTOCOL, note=", Kevin's protocol")
    args = Args(**{**KEVIN_PROTOCOL, **flags.given(parser.parse_args(argv))})
    flags.refuse_file_out(parser, args.out)
    flags.refuse_out_of_range(args, "eval.py", at_least_one=(
        "trajectories", "turns", "beam_width", "beam_keep", "beam_steps", "beam_rounds", "max_new_tokens",
        "http_workers", "max_batch_rows"))
    if not 0 < args.top_p <= 1 or args.temperature < 0:
        raise SystemExit(f"eval.py: --top-p {args.top_p} --temperature {args.temperature}: expected 0 < top-p <= 1 "
                         "and temperature >= 0 (0: greedy)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if args.grid:
            shapes = [parse_shape(s) for s in args.grid.split(",")]
        elif args.search == "beam":
            shapes = [parse_shape(f"beam:{args.beam_width}x{args.beam_steps}x{args.beam_rounds}")]
        else:
            shapes = [parse_shape(f"{args.trajectories}x{args.turns}")]
    except ValueError as error:
        raise SystemExit(f"eval.py: {error}")
    # Everything that can refuse the run does so before --out is written to: first a model that is nowhere.
    model_policy = args.policy not in ("oracle", "oracle-corrupt") and not args.base_url
    local_only = local_model(args.policy) if model_policy and not is_candidate_folder(args.policy) else True
    import kernel_boundary
    import kernel_eval
    args.device = kernel_eval.resolve_device(args.device, "eval.py")
    try:  # --sandbox require refuses here, before --out is written to
        kernel_boundary.boundary_for(args.sandbox, gpu=args.device != "cpu")
    except kernel_boundary.BoundaryUnavailable as error:
        raise SystemExit(f"eval.py: {error}")
    language = args.language or tasks_module.LANGUAGE_FOR_DEVICE[args.device.split(":")[0]]
    task_list = load_tasks(args)
    import kernel_sandbox
    with kernel_sandbox.Zygotes() as zygotes:  # the harness's forking processes serve every turn of the run
        evaluate_batch = functools.partial(kernel_eval.evaluate_batch, device=args.device, sandbox=args.sandbox,
                                           zygotes=zygotes)
        return judge_policy(args, shapes, task_list, language, local_only, evaluate_batch)


def judge_policy(args, shapes: list, task_list: list, language: str, local_only: bool, evaluate_batch) -> int:
    """main's run once nothing refuses it: a folder of candidates judged, or the policy's turns (--grid: each
    shape), records and summaries under --out."""
    policy_name = os.path.basename(args.policy.rstrip('/'))
    if args.policy == "oracle" and args.corrupt_rate > 0:
        policy_name += f" (corrupt rate {args.corrupt_rate:g})"
    title = f"{policy_name} on {args.tasks} ({language}, {args.device})"

    if is_candidate_folder(args.policy):
        writer = RecordWriter(args.out, {t.task_id: t.level for t in task_list})
        if os.path.exists(writer.path) and os.path.getsize(writer.path):
            raise SystemExit(f"eval.py: {writer.path} exists; pass another --out")
        covered, records = run_folder(task_list, args.policy, evaluate_batch, language, writer)
        if not records:
            raise SystemExit(f"eval.py: no candidate files {args.policy}/<task_id>/<n>.py for the selected tasks")
        summary = write_outputs(args.out, records, title, {"search": "folder",
                                "tasks_without_candidates": len(task_list) - len(covered)})
        print(summary_markdown(summary, title))
        return 0

    run_file = os.path.join(args.out, "run.json")
    wanted = protocol(args, language, task_list)
    if args.resume and os.path.exists(run_file):
        with open(run_file) as f:
            previous = json.load(f)
        differ = sorted(k for k in wanted if previous.get(k) != wanted[k])
        if differ:
            raise SystemExit(f"eval.py: --resume with a different protocol than {run_file}: {', '.join(differ)}")
    elif not args.resume and os.path.exists(run_file):
        raise SystemExit(f"eval.py: {args.out} already holds a run ({run_file}); pass --resume or another --out")
    engine = build_engine(args, task_list, language, local_only)
    print(size_line(task_list, shapes, args.device), file=sys.stderr, flush=True)
    os.makedirs(args.out, exist_ok=True)
    checkpoint.atomic_write(run_file, json.dumps(wanted, indent=2) + "\n")
    # turn by turn: TurnSeededEngine seeds each turn's one generate call, so --resume draws the same
    config = rollout.RolloutConfig(max_new_tokens=args.max_new_tokens, max_prompt_tokens=args.max_prompt_tokens,
                                   temperature=args.temperature, top_p=args.top_p, language=language,
                                   overlap_turns=False)
    if args.grid:
        rows = []
        for shape in shapes:
            summary = run_one(args, shape, task_list, engine, evaluate_batch, config,
                              os.path.join(args.out, shape["name"]), f"{title}, {shape['name']}")
            rows.append({**shape, "summary": summary})
        checkpoint.atomic_write(os.path.join(args.out, "grid.json"), json.dumps(rows, indent=2) + "\n")
        checkpoint.atomic_write(os.path.join(args.out, "grid.md"), grid_markdown(rows))
        plot_grid(rows, os.path.join(args.out, "scaling.png"), title)
        print(grid_markdown(rows))
        return 0
    summary = run_one(args, shapes[0], task_list, engine, evaluate_batch, config, args.out, title)
    print(summary_markdown(summary, title))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # kernel_eval stopped its workers; every judged turn is in records.jsonl
        command = shlex.join(["python", os.path.relpath(__file__)] + [a for a in sys.argv[1:] if a != "--resume"])
        print(f"eval.py: interrupted; the turns judged so far are in --out's records.jsonl; continue with: "
              f"{command} --resume", file=sys.stderr)
        sys.stderr.flush()
        os._exit(130)
