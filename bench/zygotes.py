"""What keeping the harness's zygotes across batches saves a batch, as train.py keeps them for a run.

A zygote is the process that imported torch once and forks the batch's workers (kernel_sandbox.Zygotes).
A batch that starts its own pays its start (the torch import) before its first worker; one that is
handed the caller's does not. One built-in task's solution, its build cached, judged alone in a batch
of its own, in turn: with the batch's own zygotes, then with zygotes kept across the batches;
correctness only (train.py --no-time-kernels). Prints each batch's wall seconds and the medians.

    python bench/zygotes.py --device cpu --evals 4
    python bench/zygotes.py --device cuda --evals 5
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

import kernel_eval  # noqa: E402
import kernel_sandbox  # noqa: E402
import tasks  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--task", default="level1/01_relu", help="a built-in task id without 'builtin/'")
    p.add_argument("--evals", type=int, default=4, help="batches per side")
    a = p.parse_args()
    by_id = {t.task_id: t for t in tasks.load_builtin(device=a.device)}   # the CPU sizes on cpu
    language = "cpp" if a.device == "cpu" else "cuda"
    task = by_id.get("builtin/" + a.task)
    if task is None or language not in task.solutions:
        raise SystemExit(f"bench/zygotes.py: no built-in {language} solution for {a.task}")
    pair = [(task.reference_src, task.solutions[language])]
    cache_root = tempfile.mkdtemp(prefix="bench-zygotes-")
    judge = dict(device=a.device, cache_root=cache_root, time_candidate=False)
    seconds = {"the batch's own": [], "kept across batches": []}
    print("| batch | zygotes | wall s | status |\n|---:|---|---:|---|")
    with kernel_sandbox.Zygotes() as kept:
        first = kernel_eval.evaluate_batch(pair, zygotes=kept, **judge)[0]  # the build, and the kept zygotes' start
        if first.status != "correct":
            raise SystemExit(f"bench/zygotes.py: the solution is {first.status}: {first.message}")
        for i in range(1, a.evals + 1):
            for side, zygotes in (("the batch's own", None), ("kept across batches", kept)):
                t0 = time.monotonic()
                result = kernel_eval.evaluate_batch(pair, zygotes=zygotes, **judge)[0]
                seconds[side].append(time.monotonic() - t0)
                print(f"| {i} | {side} | {seconds[side][-1]:.2f} | {result.status} |", flush=True)
    for side, values in seconds.items():
        print(f"{side}: median {statistics.median(values):.2f} s, min {min(values):.2f}, max {max(values):.2f}")


if __name__ == "__main__":
    main()
