"""Does where a tensor lands in GPU memory change a kernel's time? A diagnostic for kernel_eval's
timing noise (issue 17): on the H200 the reference's per-call time switched between levels 10-25%
apart, between windows and inside one, while the candidate timed beside it stayed within 2%.

For each built-in task named, its reference runs in the harness's own timing loop
(kernel_worker.TimingLoop: L2 flush, device-wide sync, CUDA events) on `--copies` copies of one
input set, each copy allocated after a spacer of random size (its own place in memory), in
`--rounds` round-robin rounds. If the time follows the copy (the same copy agrees with itself
across rounds, copies disagree), placement is the cause; if it follows the round, something in
time is. Then the same with one copy and a spacer allocated between rounds, which moves where the
reference's outputs land.

    python bench/placement.py --tasks level1/07_row_sum level1/08_max_over_dim      # H200, ~1 min
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import kernel_eval  # noqa: E402
import kernel_worker  # noqa: E402
import tasks  # noqa: E402
from harness import spread  # noqa: E402  (bench/, this script's own directory)


def main() -> None:
    import torch
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", nargs="+", default=["level1/07_row_sum", "level1/08_max_over_dim"])
    p.add_argument("--copies", type=int, default=6)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=64, help="timed calls per copy and round")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/placement.py needs a CUDA device")
    rng = random.Random(a.seed)
    dev = torch.device("cuda")
    builtin = {t.task_id: t for t in tasks.load_builtin(os.path.join(ROOT, "tasks"))}
    flush = torch.empty(kernel_eval.EvalConfig().l2_flush_bytes // 4, dtype=torch.float32, device=dev)
    spacers = []

    def spacer():  # a live allocation of 1-64 MiB: the next tensor lands somewhere else
        spacers.append(torch.empty(rng.randint(1 << 18, 1 << 24), device=dev))

    for task_id in a.tasks:
        task = builtin.get("builtin/" + task_id)
        if task is None:
            raise SystemExit(f"--tasks: no built-in task {task_id!r}")
        module = types.ModuleType("reference")
        exec(compile(task.reference_src, task_id, "exec"), module.__dict__)
        torch.manual_seed(a.seed)
        model = module.Model(*module.get_init_inputs()).to(dev)
        inputs = [x.to(dev) if isinstance(x, torch.Tensor) else x for x in module.get_inputs()]
        copies = []
        for _ in range(a.copies):
            spacer()
            copies.append([x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
        loops = [kernel_worker.TimingLoop(model, [c], flush, True, torch.cuda.synchronize) for c in copies]
        for loop in loops:
            loop.run(10)
        table = [[statistics.median(loop.run(a.calls)) * 1e3 for loop in loops] for _ in range(a.rounds)]
        print(f"\n{task_id}: median us per call, one input copy per column, one round per row")
        for r, row in enumerate(table):
            print(f"  round {r + 1}: " + "  ".join(f"{t:7.1f}" for t in row))
        by_copy = [statistics.median(col) for col in zip(*table)]
        by_round = [statistics.median(row) for row in table]
        within = max(spread(col) for col in zip(*table))
        print(f"  copies apart (median over rounds): {100 * spread(by_copy):.1f}%; rounds apart (median over copies): "
              f"{100 * spread(by_round):.1f}%; one copy across rounds, at most {100 * within:.1f}%")
        moved = []
        for _ in range(a.rounds * 2):
            spacer()
            moved.append(statistics.median(loops[0].run(a.calls)) * 1e3)
        print("  one copy, a spacer before each round (the outputs land elsewhere): "
              + "  ".join(f"{t:.1f}" for t in moved) + f"  ({100 * spread(moved):.1f}% apart)")
        del copies, loops
        spacers.clear()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
