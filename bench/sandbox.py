"""What kernel_boundary costs a candidate: the same worker started with and without it.

Two measures, sandbox "auto" (namespaces, uid 65534) and "off" taken in turn in one run:
  worker start   a candidate's run worker forked from the zygote, from the harness's request to the
                 worker's first message (booted: torch imported, the device ready); what the boundary
                 adds there (the parent's plan, the PID namespace, the mounts, the privilege drop) is
                 what every compile and run worker of a candidate pays
  evaluation     one candidate judged end to end (its build cached), p50 of `latency`

    python bench/sandbox.py --device cpu --starts 30 --evals 5
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import kernel_boundary  # noqa: E402
import kernel_eval  # noqa: E402
import kernel_sandbox  # noqa: E402

MODES = ("off", "auto")


def worker_start_seconds(device: str, arch: str, cfg: kernel_eval.EvalConfig, src: str, zygotes) -> float:
    """Seconds from asking for a candidate worker to its boot message."""
    scratch = tempfile.mkdtemp(prefix="bench-sandbox-", dir=cfg.scratch_root)
    try:
        t0 = time.perf_counter()
        worker = kernel_eval._spawn("cand", src, kernel_eval.Context(device, arch, cfg, zygotes), scratch)
        try:
            kernel_sandbox.ask(worker, "candidate", "load", cfg.load_timeout_s, {})  # its boot message
            return time.perf_counter() - t0
        finally:
            worker.stop()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--starts", type=int, default=30, help="worker starts per mode (after one warm-up each)")
    p.add_argument("--evals", type=int, default=5, help="evaluations per mode (0: none)")
    p.add_argument("--cache-root", default=None, help="default: a fresh temp dir")
    a = p.parse_args()
    problem = kernel_boundary.boundary_problem()
    if problem:
        raise SystemExit(f"bench/sandbox.py: no namespaces here: {problem}")
    cache_root = a.cache_root or tempfile.mkdtemp(prefix="bench-sandbox-cache-")
    language = "cpp" if a.device == "cpu" else "cuda"
    reference = open(os.path.join(ROOT, "tests", "adversarial", "reference.py")).read()
    candidate = open(os.path.join(ROOT, "tests", "adversarial", language, "benign.py")).read()
    cfgs = {m: kernel_eval.EvalConfig(cache_root=cache_root, sandbox=m) for m in MODES}
    arch = kernel_sandbox.device_arch(a.device, cfgs["off"].cuda_arch)

    starts = {m: [] for m in MODES}
    zygotes = kernel_sandbox.Zygotes()
    try:
        for m in MODES:  # the zygote's own start, off the clock
            worker_start_seconds(a.device, arch, cfgs[m], candidate, zygotes)
        for _ in range(a.starts):
            for m in MODES:
                starts[m].append(worker_start_seconds(a.device, arch, cfgs[m], candidate, zygotes))
    finally:
        zygotes.close()
    print(f"worker start ({a.device}, forked from the zygote, {a.starts} each, in turn):")
    for m in MODES:
        xs = sorted(starts[m])
        print(f"  sandbox {m:4s}  p50 {statistics.median(xs) * 1e3:7.1f} ms  min {xs[0] * 1e3:7.1f} ms  "
              f"p90 {xs[int(0.9 * (len(xs) - 1))] * 1e3:7.1f} ms")
    extra = statistics.median(starts["auto"]) - statistics.median(starts["off"])
    print(f"  the boundary adds {extra * 1e3:.1f} ms to a worker's start (p50 difference)")

    if a.evals:
        latency = {m: [] for m in MODES}
        for m in MODES:  # builds (one per mode: a confined candidate builds in a directory of its own)
            r = kernel_eval.evaluate(reference, candidate, device=a.device, config=cfgs[m])
            assert r.status == "correct", (m, r.status, r.message)
        for _ in range(a.evals):
            for m in MODES:
                r = kernel_eval.evaluate(reference, candidate, device=a.device, config=cfgs[m])
                assert r.status == "correct" and r.boundary == ("namespaces" if m == "auto" else "process"), r
                latency[m].append(r.seconds["latency"])
        print(f"evaluation (build cached, {a.evals} each, in turn): " + ", ".join(
            f"sandbox {m} p50 {statistics.median(latency[m]):.2f} s" for m in MODES))


if __name__ == "__main__":
    main()
