"""What a CUDA compile error's verdict costs with a build that ends at its first failed unit
(kernel_build.BuildConfig.stop_at_first_failure) against torch's ninja run (the units left to finish, the
build as written's host unit after its .cu unit: the code before), through the harness's compile phase
(kernel_eval._compile, confined compile workers, compile only, so no GPU is needed). One task's CUDA
solution, each compile a new source (a comment in its CUDA string), the two sides alternating, each side
in a cache of its own with the host units' precompiled header built first:

  undefined name   examples/warm_start.py's drop_declaration (its name probe answered by one untimed compile)
  syntax error     `y4[i] = v +;` in the kernel (the slim tier fails, then the build as written)
  expected ]       `y4[i = v;`
  type error       `y4[i] = v + 1.0f;` (no operator+ for float4)
  builds           the solution itself (builds on the slim tier)

    python bench/fail_fast.py --task level1/01_relu --repeat 3

(--no-cublas on a box without cuBLAS's headers: the CPU box; it needs an empty c10/cuda/impl/cuda_cmake_macros.h
on CPATH there, outside the temp dir, as bench/compile_error.py's figures did).

Needs nvcc; on a CPU build of torch it gives the workers nvcc's toolkit as bench/compile_error.py does.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import kernel_build  # noqa: E402
import kernel_eval  # noqa: E402
import tasks  # noqa: E402
from compile_error import toolkit_for_cpu_torch  # noqa: E402
from warm_start import drop_declaration  # noqa: E402

SIDES = {"before": dict(stop_at_first_failure=False), "after": {}}


def kinds(solution: str, no_cublas: bool) -> dict:
    if no_cublas:  # ATen/cuda/CUDAContext.h needs cuBLAS's headers as written; c10's stream header does not
        solution = solution.replace("#include <ATen/cuda/CUDAContext.h>", "#include <c10/cuda/CUDAStream.h>").replace(
            "at::cuda::getCurrentCUDAStream", "c10::cuda::getCurrentCUDAStream")
    store = "y4[i] = v;"
    if store not in solution:
        raise SystemExit(f"bench/fail_fast.py: no {store!r} in this task's CUDA solution")
    return {"undefined name": drop_declaration(solution)[0],
            "syntax error": solution.replace(store, "y4[i] = v +;", 1),
            "expected ]": solution.replace(store, "y4[i = v;", 1),
            "type error": solution.replace(store, "y4[i] = v + 1.0f;", 1),
            "builds": solution}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="level1/01_relu", help="a built-in task id without 'builtin/'")
    p.add_argument("--repeat", type=int, default=3, help="compiles of each kind on each side, alternating")
    p.add_argument("--no-cublas", action="store_true", help="the solution with c10's stream header in place of "
                   "ATen/cuda/CUDAContext.h (a box without cuBLAS's headers)")
    p.add_argument("--arch", default=os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0"))
    a = p.parse_args()
    solution = {t.task_id: t for t in tasks.load_builtin()}["builtin/" + a.task].solutions["cuda"]
    root = tempfile.mkdtemp(prefix="bench-fail-fast-")
    try:
        toolkit_for_cpu_torch(root)
        cfgs = {side: kernel_eval.EvalConfig(cache_root=os.path.join(root, side),
                                             build=kernel_build.BuildConfig(**flags)) for side, flags in SIDES.items()}
        sources = kinds(solution, a.no_cublas)
        for side, cfg in cfgs.items():
            # its probe answered
            kernel_eval._compile(sources["undefined name"], kernel_eval.Context("cuda", a.arch, cfg))
            # the host units' precompiled header from that slim build's flags (kernel_build.warm_host_pch
            # builds it from a slim build that imports, which a box without CUDA's libraries has none of)
            header = kernel_build.write_host_header(cfg.cache_root)
            for ninja in glob.glob(os.path.join(cfg.cache_root, "**", "build", "*", "build.ninja"), recursive=True):
                if "op_headers" in open(ninja).read() and kernel_build.build_host_pch(header, os.path.dirname(ninja)):
                    break
            print(f"# {side}: host units' precompiled header {os.path.exists(header + '.gch')}", flush=True)
        seconds = {(kind, side): [] for kind in sources for side in SIDES}
        statuses = {(kind, side): set() for kind in sources for side in SIDES}
        for i in range(a.repeat):
            for kind, source in sources.items():
                for side in (("before", "after") if i % 2 == 0 else ("after", "before")):
                    new = source.replace("__global__", f"// bench {side} {i}\n__global__", 1)
                    t0 = time.monotonic()
                    record = kernel_eval._compile(new, kernel_eval.Context("cuda", a.arch, cfgs[side]))
                    seconds[kind, side].append(time.monotonic() - t0)
                    statuses[kind, side].add(f"{record['status']} ({record.get('builds')} builds)")
                    print(f"# {kind} {side} {i}: {seconds[kind, side][-1]:.1f} s {record['status']}", flush=True)

        def q(xs, f):
            return statistics.quantiles(xs, n=10)[8] if f == 0.9 and len(xs) > 1 else (
                max(xs) if f == 0.9 else statistics.median(xs))
        print("| kind | before p50 / p90 s | after p50 / p90 s | each run s (before; after) | statuses (before / after) |\n"
              "|---|---:|---:|---|---|")
        for kind in sources:
            b, f = seconds[kind, "before"], seconds[kind, "after"]
            print(f"| {kind} | {q(b, .5):.1f} / {q(b, .9):.1f} | **{q(f, .5):.1f}** / {q(f, .9):.1f} "
                  f"| {', '.join(f'{s:.1f}' for s in b)}; {', '.join(f'{s:.1f}' for s in f)} "
                  f"| {', '.join(sorted(statuses[kind, 'before']))} / {', '.join(sorted(statuses[kind, 'after']))} |")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
