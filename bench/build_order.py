"""What the order of a build as written's two units costs (kernel_build.BuildConfig.device_unit_first).

A load_inline build has a host unit (main.cpp: as written, all of torch/extension.h and pybind11) and
a .cu unit; torch's ninja runs them side by side and lets one finish after the other failed. After the
slim header tier failed in its .cu unit alone, kernel_build can start the build as written's host unit
only once its .cu unit built: a compile error there then ends the build at once, and a source that
builds as written compiles its units one after the other. Per built-in task, through the harness's
compile phase (kernel_eval's confined compile workers, compile only; each compile in fresh caches):

  type error        its CUDA solution with a float4 type error in the kernel (`v + 1.0f`): the slim
                    tier fails in its .cu unit, then the build as written fails there too
  builds as written its CUDA solution calling at::globalContext() (ATen/Context.h, which the slim tier
                    leaves out): the slim tier fails in its .cu unit, then the build as written builds

Each row alternates the two orders --repeat times and prints every time.

    python bench/build_order.py --tasks level1/01_relu --repeat 2

Needs nvcc; on a CPU build of torch it gives the workers nvcc's toolkit as bench/compile_error.py does.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import kernel_build  # noqa: E402
import kernel_eval  # noqa: E402
import tasks  # noqa: E402
from compile_error import toolkit_for_cpu_torch  # noqa: E402


def type_error(solution: str) -> str:
    """The solution with a float4 store of `v + 1.0f` (no operator+ for float4): a .cu-only error."""
    broken = solution.replace("y4[i] = v;", "y4[i] = v + 1.0f;", 1)
    if broken == solution:
        raise ValueError("no float4 store `y4[i] = v;` in this solution")
    return broken


def as_written_only(solution: str) -> str:
    """The solution asking at::globalContext() in its host function: declared by the full headers only."""
    anchor = "x = x.contiguous();"
    if anchor not in solution:
        raise ValueError(f"no {anchor!r} in this solution")
    return solution.replace(anchor, "(void)at::globalContext().deterministicAlgorithms();\n    " + anchor, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", default="level1/01_relu", help="built-in task ids without 'builtin/', "
                   "comma-separated (each needs a float4 store `y4[i] = v;`)")
    p.add_argument("--repeat", type=int, default=2, help="times each order is measured, alternating")
    p.add_argument("--arch", default=os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0"))
    a = p.parse_args()
    by_id = {t.task_id: t for t in tasks.load_builtin()}
    root = tempfile.mkdtemp(prefix="bench-build-order-")
    try:
        toolkit_for_cpu_torch(root)
        print("| task | source | units side by side s | .cu unit first s | statuses (side by side / .cu first) |\n"
              "|---|---|---:|---:|---|", flush=True)
        for task in a.tasks.split(","):
            solution = by_id["builtin/" + task].solutions["cuda"]
            for label, source in (("type error", type_error(solution)),
                                  ("builds as written", as_written_only(solution))):
                seconds, statuses = {True: [], False: []}, {True: set(), False: set()}
                for i in range(a.repeat):
                    for first in ((False, True) if i % 2 == 0 else (True, False)):
                        cfg = kernel_eval.EvalConfig(
                            cache_root=os.path.join(root, f"{task.replace('/', '_')}-{label[:4]}-{first}-{i}"),
                            build=kernel_build.BuildConfig(device_unit_first=first))
                        t0 = time.monotonic()
                        record = kernel_eval._compile(source, kernel_eval.Context("cuda", a.arch, cfg),
                                                      probes=False)
                        seconds[first].append(time.monotonic() - t0)
                        statuses[first].add(f"{record['status']} ({record.get('builds')} builds)")
                print(f"| {task} | {label} | {' / '.join(f'{s:.1f}' for s in seconds[False])} "
                      f"| {' / '.join(f'{s:.1f}' for s in seconds[True])} "
                      f"| {', '.join(sorted(statuses[False]))} / {', '.join(sorted(statuses[True]))} |", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
