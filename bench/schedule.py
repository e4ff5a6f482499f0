"""A training step's evaluation under rollout's two schedules, side by side: turn by turn (every turn
waits for all verdicts of the turn before; RolloutConfig.overlap_turns=False) and overlapped (a
trajectory whose verdict needs no harness writes its next turn at once; the default). Each step runs
rollout.rollout with the real harness as train.py binds it (kernel_eval.evaluate_batch behind
rollout.reusing_verdicts, correctness only, zygotes kept across calls) and an engine that replays a
script, so both schedules judge the same answers and only the waiting differs:

  new in both turns   a step of the learning demo once its policy repeats itself: per task, G=4
                      trajectories of T=2 turns; trajectory 0 writes a new kernel and repeats it,
                      trajectory 1 a kernel judged in an earlier step and then a new one, trajectory 2
                      the known kernel twice, trajectory 3 no code and then the known kernel
  new after new       trajectory 0 writes a new kernel, then another; the rest repeat the known kernel
                      (the case the overlap cannot shorten: the second kernel needs the first's verdict)

New kernels are the task's built-in solution with a comment that makes the source new to the build
cache; the known kernel is judged before each row (the earlier step; not counted), built once. Rows
alternate schedules, `--repeats` times. The engine takes no time: a real decoder adds its own time per
generation round (train.py logs it as seconds_generation).

    python bench/schedule.py --device cpu                 # C++ kernels, one task
    python bench/schedule.py --device cuda --tasks level1/01_relu,level1/07_row_sum

Prints per row: harness calls, generation rounds, seconds in evaluate_batch, the step's seconds.
"""
from __future__ import annotations

import argparse
import functools
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import engines  # noqa: E402
import kernel_eval  # noqa: E402
import kernel_sandbox  # noqa: E402
import rollout  # noqa: E402
import tasks  # noqa: E402
import train_log  # noqa: E402

G, T = 4, 2
# per scenario, per trajectory: what it writes at each turn ("new1", "new2": new kernels; "known"; "none": no code)
SCENARIOS = {
    "new in both turns": [("new1", "new1"), ("known", "new2"), ("known", "known"), ("none", "known")],
    "new after new": [("new1", "new2"), ("known", "known"), ("known", "known"), ("known", "known")],
}
RESPONSE = "<think>\nOkay.\n</think>\n{code}trajectory {k}, turn {turn}"


class ReplayEngine:
    """Writes the scripted answer of the trajectory and turn a prompt asks for: every answer's summary
    names its trajectory and turn, so a prompt's last summary says whose next turn it is (a task's
    first prompt is shared by its G trajectories: the k-th answer of the group is trajectory k's).
    Token ids are UTF-8 bytes."""

    def __init__(self, script: dict):
        self.script = script   # (task_id, k, turn) -> code, or None for no code

    def encode_prompt(self, text: str) -> list[int]:
        return engines.utf8_ids(text)

    def count_tokens(self, text: str) -> int:
        return len(engines.utf8_ids(text))

    def generate(self, prompt_token_ids, *, n=1, **_):
        out = []
        for ids in prompt_token_ids:
            prompt = engines.utf8_text(ids)
            task_id = next(t for t, _, _ in self.script if f"# task {t}\n" in prompt)
            shown = re.findall(r"Summary: trajectory (\d+), turn (\d+)", prompt)
            k, turn = (int(shown[-1][0]), int(shown[-1][1]) + 1) if shown else (None, 0)
            group = []
            for j in range(n):
                row = k if k is not None else j
                code = self.script[(task_id, row, turn)]
                text = RESPONSE.format(code=f"```python\n{code}\n```\n" if code else "", k=row, turn=turn)
                ids_out = engines.utf8_ids(text)
                group.append(engines.Completion(ids_out, None, text, "stop"))
            out.append(group)
        return out


class Task:
    """A built-in task whose reference names it (the engine finds the task a prompt is for)."""

    def __init__(self, task, language: str):
        self.task_id, self.solution = task.task_id, task.solutions[language]
        self.reference_src = task.reference_src.rstrip("\n") + f"\n# task {task.task_id}\n"


def tagged(source: str, tag: str) -> str:
    return source.replace("import torch", f"import torch  # {tag}", 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tasks", default="level1/01_relu", help="built-in task ids without 'builtin/', comma-separated")
    p.add_argument("--repeats", type=int, default=1, help="rows per schedule and scenario, alternating")
    p.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated, of: " + ", ".join(SCENARIOS))
    p.add_argument("--sandbox", default="auto", choices=("auto", "require", "off"))
    a = p.parse_args()
    unknown = set(a.scenarios.split(",")) - set(SCENARIOS)
    if unknown:
        raise SystemExit(f"bench/schedule.py: no scenario {sorted(unknown)[0]!r} (known: {', '.join(SCENARIOS)})")
    by_id = {t.task_id: t for t in tasks.load_builtin(device=a.device)}   # the CPU sizes on cpu
    language = "cpp" if a.device == "cpu" else "cuda"
    try:
        task_list = [Task(by_id["builtin/" + t], language) for t in a.tasks.split(",")]
    except KeyError as e:
        raise SystemExit(f"bench/schedule.py: no built-in task {e.args[0]}") from None
    cache_root = tempfile.mkdtemp(prefix="bench-schedule-")
    builds = kernel_eval.default_parallel_compiles(a.device, kernel_eval.EvalConfig())
    print(f"{len(task_list)} task(s), G={G} x T={T}, {builds} builds at once, {os.cpu_count()} CPUs, {a.device}")
    print("| scenario | schedule | harness calls | generation rounds | evaluation s | step s |\n"
          "|---|---|---:|---:|---:|---:|")
    zygotes = kernel_sandbox.Zygotes()
    judge = functools.partial(kernel_eval.evaluate_batch, device=a.device, time_candidate=False, sandbox=a.sandbox,
                              max_parallel_compiles=builds, cache_root=cache_root, zygotes=zygotes)
    spent = {}
    try:
        for repeat in range(a.repeats):
            for scenario in a.scenarios.split(","):
                plan = SCENARIOS[scenario]
                for overlap in (False, True):
                    clock = {}   # seconds and calls, as train.py counts them (train_log.timed)
                    evaluate = rollout.reusing_verdicts(train_log.timed(judge, clock, "evaluation"))
                    run = f"{repeat} {overlap} {time.time_ns()}"
                    script = {}
                    for task in task_list:
                        known = tagged(task.solution, "known")   # built once: later rows find it in the cache
                        codes = {"known": known, "none": None,
                                 "new1": tagged(task.solution, f"new1 {run}"), "new2": tagged(task.solution, f"new2 {run}")}
                        script.update({(task.task_id, k, turn): codes[kind]
                                       for k, turns in enumerate(plan) for turn, kind in enumerate(turns)})
                        evaluate([(task.reference_src, known)])   # the earlier step's verdict
                    clock.clear()
                    engine = ReplayEngine(script)
                    engine.generate = train_log.timed(engine.generate, clock, "generation")
                    config = rollout.RolloutConfig(n_trajectories=G, n_turns=T, max_new_tokens=100_000,
                                                   max_prompt_tokens=100_000, language=language,
                                                   overlap_turns=overlap)
                    t0 = time.monotonic()
                    samples, _ = rollout.rollout(task_list, engine, evaluate, config)
                    step = time.monotonic() - t0
                    statuses = {s.status for s in samples}
                    if statuses - {"correct", "format_error"}:
                        raise SystemExit(f"bench/schedule.py: unexpected verdicts {sorted(statuses)}: "
                                         f"{[s.message[:200] for s in samples if s.status not in ('correct', 'format_error')][:2]}")
                    name = "overlapped" if overlap else "turn by turn"
                    spent.setdefault((scenario, name), []).append(clock.get("evaluation", 0.0))
                    print(f"| {scenario} | {name} | {clock.get('evaluation_calls', 0)} | {clock['generation_calls']} "
                          f"| {clock.get('evaluation', 0.0):.1f} | {step:.1f} |", flush=True)
    finally:
        zygotes.close()
        shutil.rmtree(cache_root, ignore_errors=True)
    if a.repeats > 1:
        print("\nmedian evaluation s: " + ", ".join(f"{s}, {n}: {statistics.median(v):.1f}"
                                                  for (s, n), v in spent.items()))


if __name__ == "__main__":
    main()
