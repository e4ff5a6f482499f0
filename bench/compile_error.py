"""What a CUDA compile error costs with and without name probes (kernel_build.py, "name probes"),
through the harness's compile phase (kernel_eval's confined compile workers, as evaluate runs them;
compile only, so no GPU is needed). Per built-in task, its CUDA solution's `no_compile` variant
(examples/warm_start.py: a declaration dropped, so an undefined identifier), each row in fresh caches:

  no probes   the slim tier fails, then the source as written fails (kernel_eval without probes)
  first       the slim tier fails, the worker waits while the name probe is compiled, then reads
              its answer ("undeclared": the slim tier's diagnostics, no build as written)
  again       a new source with the same names (a comment added): the slim tier, then the answer

    python bench/compile_error.py --tasks level1/01_relu,level1/07_row_sum

Needs nvcc. With a CPU build of torch (no CUDA_HOME of its own), the workers get nvcc's toolkit
through a sitecustomize.py this script writes; put cuBLAS, cuSPARSE and cuSOLVER headers on CPATH,
outside the temp dir, which the workers' view hides (docs/PERFORMANCE.md says how it ran on the CPU box).
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

import kernel_eval  # noqa: E402
import tasks  # noqa: E402
from warm_start import DEFAULT_TASKS, drop_declaration  # noqa: E402

SITECUSTOMIZE = """import os
import torch.utils.cpp_extension as ce
ce.CUDA_HOME = ce.CUDA_HOME or os.environ["CUDA_HOME"]  # a CPU build of torch: nvcc's toolkit (bench only)
"""


def toolkit_for_cpu_torch(root: str) -> None:
    """Workers of a CPU build of torch see no CUDA_HOME: give them nvcc's through a sitecustomize.py
    on PYTHONPATH (kernel_boundary binds this process's sys.path into their view, read-only)."""
    import torch
    if torch.cuda._is_compiled():
        return
    nvcc = shutil.which("nvcc")
    home = os.environ.get("CUDA_HOME") or (nvcc and os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    if not home:
        raise SystemExit("bench/compile_error.py: no CUDA toolkit (nvcc not on PATH, CUDA_HOME unset)")
    site = os.path.join(root, "site")
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE)
    os.environ["CUDA_HOME"] = home
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")]))
    sys.path.append(site)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", default=DEFAULT_TASKS, help="built-in task ids without 'builtin/', comma-separated")
    p.add_argument("--arch", default=os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0"))
    a = p.parse_args()
    by_id = {t.task_id: t for t in tasks.load_builtin()}
    try:
        solutions = [(t, by_id["builtin/" + t].solutions["cuda"]) for t in a.tasks.split(",")]
    except KeyError as e:
        raise SystemExit(f"bench/compile_error.py: no built-in CUDA solution for {e.args[0]}") from None
    root = tempfile.mkdtemp(prefix="bench-compile-")
    try:
        toolkit_for_cpu_torch(root)
        print("| task | undefined names | no probes s (slim + as written) | first s (slim + probe) "
              "| again s (slim) | answer |\n|---|---|---:|---:|---:|---|", flush=True)
        for task, solution in solutions:
            broken = drop_declaration(solution)[0]
            plain = kernel_eval.EvalConfig(cache_root=os.path.join(root, task.replace("/", "_"), "plain"))
            probed = kernel_eval.EvalConfig(cache_root=os.path.join(root, task.replace("/", "_"), "probed"))

            def timed(source: str, cfg: kernel_eval.EvalConfig, probes: bool) -> tuple:
                t0 = time.monotonic()
                record = kernel_eval._compile(source, "cuda", a.arch, cfg, probes=probes)
                return time.monotonic() - t0, record

            without, record = timed(broken, plain, probes=False)
            first, record_first = timed(broken, probed, probes=True)
            again, record_again = timed(broken.replace("__global__", "// a new source\n__global__", 1), probed, True)
            statuses = {record["status"], record_first["status"], record_again["status"]}
            names = record_first.get("undefined_names") or []
            probes = os.path.join(probed.cache_root, "name_probes")
            answers = sorted(open(os.path.join(probes, f)).read() for f in os.listdir(probes)
                             if not f.endswith(".lock")) if os.path.isdir(probes) else []
            answer = ", ".join(answers) or "not probed"
            if statuses != {"compile_error"}:
                answer += f" (statuses {sorted(statuses)}: {record_first['message'][:80]!r})"
            print(f"| {task} | {', '.join(names) or '-'} | {without:.1f} | {first:.1f} | {again:.1f} | {answer} |",
                  flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
