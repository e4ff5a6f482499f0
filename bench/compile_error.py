"""What a CUDA compile error costs with and without its name probe's answer (kernel_build.py, "name
probes"). Per built-in task, its CUDA solution's `no_compile` variant (examples/warm_start.py: a
declaration dropped, so an undefined identifier), built through kernel_build's load_inline in this
process, in a fresh cache:

  first   the slim tier fails, then the source as written fails: no answer yet, a probe is asked for
  probe   the probe compiled as the harness compiles one (its load_inline source, here in-process)
  again   a new source with the same names (a comment added): the slim tier alone, then the answer

    python bench/compile_error.py --tasks level1/01_relu,level1/07_row_sum

Needs nvcc; with a CPU build of torch set CUDA_HOME (default: nvcc's) and put cuBLAS, cuSPARSE and
cuSOLVER headers on CPATH (docs/PERFORMANCE.md says how it ran on the CPU box). Compiles only.
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
sys.path.insert(0, os.path.join(ROOT, "examples"))

import kernel_build  # noqa: E402
import tasks  # noqa: E402
from warm_start import DEFAULT_TASKS, drop_declaration  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", default=DEFAULT_TASKS, help="built-in task ids without 'builtin/', comma-separated")
    p.add_argument("--arch", default=os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0"))
    a = p.parse_args()
    import torch.utils.cpp_extension as ce
    nvcc = shutil.which("nvcc")
    if not (ce.CUDA_HOME or os.environ.get("CUDA_HOME") or nvcc):
        raise SystemExit("bench/compile_error.py: no CUDA toolkit (nvcc not on PATH, CUDA_HOME unset)")
    ce.CUDA_HOME = ce.CUDA_HOME or os.environ.get("CUDA_HOME") or os.path.dirname(os.path.dirname(nvcc))
    os.environ["TORCH_CUDA_ARCH_LIST"] = a.arch
    by_id = {t.task_id: t for t in tasks.load_builtin()}
    try:
        solutions = [(t, by_id["builtin/" + t].solutions["cuda"]) for t in a.tasks.split(",")]
    except KeyError as e:
        raise SystemExit(f"bench/compile_error.py: no built-in CUDA solution for {e.args[0]}") from None
    cache = tempfile.mkdtemp(prefix="bench-compile-")
    state = kernel_build.patch_load_inline(cache, a.arch, kernel_build.BuildConfig(), fast_load=False)

    def built(source: str, name: str) -> tuple:
        """(seconds, whether it failed) of one load_inline import of `source`, as a new worker's."""
        state.update(build_error=None, name_probes=None)
        ce.JIT_EXTENSION_VERSIONER = type(ce.JIT_EXTENSION_VERSIONER)()
        t0 = time.monotonic()
        try:
            exec(compile(source, name, "exec"), {"__name__": name})
            return time.monotonic() - t0, False
        except (RuntimeError, ImportError, OSError):
            return time.monotonic() - t0, True

    def harness_compile(source: str) -> dict:
        seconds, failed = built(source, "probe.py")
        harness_compile.seconds = seconds
        return {"status": "compile_error", "undefined_names": kernel_build.undefined_names(state["build_error"] or "")
                } if failed else {"status": "ok"}

    print("| task | undefined names | first s (slim + as written) | probe s | again s (slim) | answer |\n"
          "|---|---|---:|---:|---:|---|", flush=True)
    for task, solution in solutions:
        broken = drop_declaration(solution)[0]
        first, failed = built(broken, "first.py")
        request, error = state.get("name_probes"), state["build_error"]
        if not failed or not request:
            names = kernel_build.undefined_names(error or "")
            why = ("answered before (an earlier row's probe)" if failed and names
                   else f"not probed: {(error or 'built').strip().splitlines()[-1][:80]}")
            print(f"| {task} | {', '.join(names or ['-'])} | {first:.1f} | - | - | {why} |", flush=True)
            continue
        harness_compile.seconds = 0.0
        kernel_build.answer_name_probes(request, cache, harness_compile)
        answer = kernel_build.read_name_probe(cache, kernel_build.name_probe_source(
            request["directives"], request["namespaces"], request["names"]))
        again, _ = built(broken.replace("__global__", "// a new source\n__global__", 1), "again.py")
        print(f"| {task} | {', '.join(request['names'])} | {first:.1f} | {harness_compile.seconds:.1f} | "
              f"{again:.1f} | {answer} |", flush=True)


if __name__ == "__main__":
    main()
