"""Where one rollout turn's evaluation goes: evaluate_batch as train.py calls it, on a batch shaped like
the learning demo's (examples/learning_run.sh): per task, a new correct kernel and a new kernel that
does not compile (examples/warm_start.py's `no_compile` variant: a declaration dropped, so an
undefined identifier), every source new to the cache, correctness only (train.py --no-time-kernels).

    python bench/turn.py --device cuda --turns 3
    python bench/turn.py --device cpu --turns 2          # C++ kernels
    python bench/turn.py --device cuda --broken python   # the broken ones fail before any build
    python bench/turn.py --device cuda --zygotes batch   # each turn starts its own zygotes (before train.py kept them)

Prints, per turn, the batch's wall seconds and, per kind of candidate, its status and the p50 of its
compile seconds and of its latency (compile start to verdict).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import kernel_eval  # noqa: E402
import kernel_sandbox  # noqa: E402
import tasks  # noqa: E402
from warm_start import DEFAULT_TASKS, drop_declaration  # noqa: E402

KINDS = ("correct", "no_compile")


def turn_batch(task_list: list, language: str, tag: str, broken: str) -> list:
    """(kind, reference, candidate) per task and kind; `tag` makes every source new to the cache.
    `broken`: "undefined" (a C++/CUDA compile error) or "python" (a syntax error: nothing is built)."""
    batch = []
    for task in task_list:
        solution = task.solutions[language].replace("import torch", f"import torch  # {tag}", 1)
        batch.append(("correct", task.reference_src, solution))
        bad = (drop_declaration(solution)[0] if broken == "undefined"
               else solution.replace("import torch", "import torch\nthis is not python", 1))
        batch.append(("no_compile", task.reference_src, bad))
    return batch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--tasks", default=DEFAULT_TASKS, help="built-in task ids without 'builtin/', comma-separated")
    p.add_argument("--max-parallel-compiles", type=int, default=None,
                   help="default: the harness's own count, which train.py passes on one rank")
    p.add_argument("--broken", default="undefined", choices=("undefined", "python"),
                   help="how the non-compiling kernels fail: an undefined identifier in the kernel, or Python syntax")
    p.add_argument("--sandbox", default="auto", choices=("auto", "require", "off"))
    p.add_argument("--cache-root", default=None, help="default: a fresh temp dir (cold builds)")
    p.add_argument("--zygotes", choices=("run", "batch"), default="run",
                   help="run: one Zygotes kept across the turns (as train.py does); batch: each turn starts its own")
    a = p.parse_args()
    by_id = {t.task_id: t for t in tasks.load_builtin(device=a.device)}   # the CPU sizes on cpu
    try:
        task_list = [by_id["builtin/" + t] for t in a.tasks.split(",")]
    except KeyError as e:
        raise SystemExit(f"bench/turn.py: no built-in task {e.args[0]}") from None
    language = "cpp" if a.device == "cpu" else "cuda"
    cache_root = a.cache_root or tempfile.mkdtemp(prefix="bench-turn-")
    builds = a.max_parallel_compiles or kernel_eval.default_parallel_compiles(a.device, kernel_eval.EvalConfig())
    print(f"{builds} builds at once, {os.cpu_count()} CPUs")
    print("| turn | wall s | kind | statuses | compile s p50 | latency s p50 |\n|---:|---:|---|---|---:|---:|")
    kept = kernel_sandbox.Zygotes() if a.zygotes == "run" else None
    try:
        for turn in range(1, a.turns + 1):
            batch = turn_batch(task_list, language, f"turn {turn} {time.time_ns()}", a.broken)
            t0 = time.monotonic()
            results = kernel_eval.evaluate_batch([(r, c) for _, r, c in batch], device=a.device, time_candidate=False,
                                                 sandbox=a.sandbox, max_parallel_compiles=builds,
                                                 cache_root=cache_root, zygotes=kept)
            wall = time.monotonic() - t0
            for kind in KINDS:
                mine = [res for (k, _, _), res in zip(batch, results) if k == kind]
                statuses = ", ".join(sorted({res.status for res in mine}))
                compile_s = statistics.median(res.seconds.get("compile", 0.0) for res in mine)
                latency_s = statistics.median(res.seconds.get("latency", 0.0) for res in mine)
                print(f"| {turn} | {wall:.1f} | {kind} | {statuses} | {compile_s:.1f} | {latency_s:.1f} |", flush=True)
    finally:
        if kept is not None:
            kept.close()


if __name__ == "__main__":
    main()
