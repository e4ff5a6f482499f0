"""Where a cached C++ verdict of a built-in task goes, through the kernel_eval CLI on the CPU.

    python bench/cpu_verdict.py --tasks level1/01_relu,level2/06_bias_tanh_multiply --runs 3

Runs `python kernel_eval.py tasks/<task>/reference.py tasks/<task>/solution_cpp.py --device cpu
--json` (the CLI judges the reference at its `# cpu:` sizes), `--runs` times with timing and as
many with `--no-time`, in turn, after one untimed run that fills the build cache. Prints, per task
and mode, the medians of: the command's wall seconds; `start` = wall - the JSON's latency (the
interpreter, imports, the batch's setup before its first phase); the JSON's phases (load: the
candidate's worker's import; reference: the reference worker's start, its run and the inputs;
check; time); and the reference's and candidate's ms a call. With --root (one or more checkouts), each run
judges the task with each checkout's kernel_eval.py in turn: a side-by-side comparison in one run.
The last line counts the tasks whose timed verdict's median wall is within --goal seconds.

    python bench/cpu_verdict.py --tasks level1/04_log_softmax --runs 3 --root /tmp/before --root .
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLUMNS = ("task", "checkout", "mode", "wall s", "start s", "latency s", "load s", "reference s", "check s", "time s",
           "ref ms", "cand ms", "status")


def verdict(task: str, timed: bool, cache_root: str | None, root: str = ROOT) -> tuple[float, dict]:
    folder = os.path.join(ROOT, "tasks", task)
    cmd = [sys.executable, os.path.join(root, "kernel_eval.py"), os.path.join(folder, "reference.py"),
           os.path.join(folder, "solution_cpp.py"), "--device", "cpu", "--json"]
    cmd += [] if timed else ["--no-time"]
    cmd += ["--cache-root", cache_root] if cache_root else []
    t = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - t
    if proc.returncode != 0:
        raise SystemExit(f"bench/cpu_verdict.py: {task}: kernel_eval.py exited {proc.returncode}: "
                         f"{proc.stderr.strip().splitlines()[-1:]}")
    return wall, json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", default="level1/01_relu", help="comma-separated built-in tasks, e.g. level1/01_relu")
    p.add_argument("--runs", type=int, default=3, help="verdicts per task and mode")
    p.add_argument("--cache-root", default=None, help="kernel_eval's build cache (default: its own)")
    p.add_argument("--root", action="append", default=None,
                   help="a checkout whose kernel_eval.py judges (repeat it: side by side; default: this one)")
    p.add_argument("--goal", type=float, default=3.0, help="seconds a cached timed verdict should take at most")
    args = p.parse_args()
    roots = [os.path.abspath(r) for r in (args.root or [ROOT])]
    if args.runs < 1:
        raise SystemExit(f"bench/cpu_verdict.py: --runs {args.runs}: must be at least 1")
    for root in roots:
        if not os.path.isfile(os.path.join(root, "kernel_eval.py")):
            raise SystemExit(f"bench/cpu_verdict.py: --root {root}: no kernel_eval.py there")
    task_ids = args.tasks.split(",")
    for task in task_ids:
        if not os.path.isfile(os.path.join(ROOT, "tasks", task, "solution_cpp.py")):
            raise SystemExit(f"bench/cpu_verdict.py: no built-in cpp solution for {task}")
    print(" | ".join(COLUMNS))
    within = {root: 0 for root in roots}
    for task in task_ids:
        for root in roots:  # fills the build cache (each checkout's build options may key it apart): rows are cached
            verdict(task, False, args.cache_root, root)
        runs = {(root, mode): [] for root in roots for mode in ("timed", "no-time")}
        for _ in range(args.runs):
            for root, mode in runs:
                runs[root, mode].append(verdict(task, mode == "timed", args.cache_root, root))
        for (root, mode), rows in runs.items():
            def med(get):
                return statistics.median(get(wall, v) for wall, v in rows)
            if mode == "timed" and med(lambda w, v: w) <= args.goal:
                within[root] += 1
            cells = [task, root, mode, f"{med(lambda w, v: w):.2f}", f"{med(lambda w, v: w - v['seconds']['latency']):.2f}",
                     f"{med(lambda w, v: v['seconds']['latency']):.2f}"]
            cells += [f"{med(lambda w, v, k=k: v['seconds'].get(k, 0.0)):.2f}" for k in ("load", "reference", "check", "time")]
            cells += [f"{med(lambda w, v: v['ref_ms']):.3f}", f"{med(lambda w, v: v['candidate_ms']):.3f}",
                      ",".join(sorted({v["status"] for _, v in rows}))]
            print(" | ".join(cells), flush=True)
    print("timed verdicts within {:.1f} s: {}".format(
        args.goal, ", ".join(f"{root}: {k}/{len(task_ids)}" for root, k in within.items())))


if __name__ == "__main__":
    main()
