"""Repeatability of kernel_eval's speedup: one honest kernel judged N times, every other time while
busy processes load the machine (paired timing: the reference is timed beside the candidate, so
load hits both sides; on CPU both are timed by their CPU time).

    python bench/repeatability.py --device cpu                   # 2-core CI box: 8 runs, 4 loaded; ~5 min
    python bench/repeatability.py --device cuda --busy 2         # H200 host
    taskset -c 0-1 python bench/repeatability.py --device cuda --busy 14 --busy-cores 2-15   # load kept off the harness's cores

The kernel is tests/adversarial/<cpp|cuda>/benign.py against tests/adversarial/reference.py. Each
run is a fresh evaluate() (a fresh batch: workers, reference session, timing window); builds come
from the cache after the first. Prints a markdown table: every run's speedup, and max/min over all
runs (goal <= 1.3 on the 2-core CPU). --blocks also prints each run's timing blocks as
paired_verdict saw them: per side and block, the calls, the worker's claimed ms per call, the
parent's ms per call, and their difference (the loop's overhead per call; the reference's is what
paired_verdict takes out of the candidate's blocks).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import kernel_eval  # noqa: E402

ADV = os.path.join(ROOT, "tests", "adversarial")


def cpu_list(text: str) -> set:
    """"2-15" or "0,2,4-7" -> the set of those CPU numbers (taskset's notation)."""
    cpus = set()
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def judged(ref: str, cand: str, device: str, busy: int, cfg: dict, busy_cores: set | None = None) -> kernel_eval.EvalResult:
    spin = f"import os; os.sched_setaffinity(0, {sorted(busy_cores)!r})\n" if busy_cores else ""
    procs = [subprocess.Popen([sys.executable, "-c", spin + "while True: pass"]) for _ in range(busy)]
    try:
        time.sleep(0.5 if busy else 0.0)
        return kernel_eval.evaluate(ref, cand, device=device, **cfg)
    finally:
        for p in procs:
            p.kill()
            p.wait()


def print_blocks(r: kernel_eval.EvalResult) -> None:
    """The result's timing window, per side and block: calls, the worker's mean claimed ms per call,
    the parent's ms per call, and their difference (the loop's overhead per call)."""
    for side, side_blocks in r.blocks.items():
        print(f"    {side:9s} (calls, claimed, parent, overhead ms/call): " + ", ".join(
            f"({calls}, {mean:.4f}, {parent:.4f}, {parent - mean:.4f})" for calls, _, mean, parent in side_blocks),
            flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--busy", type=int, default=2, help="busy processes during every other run")
    p.add_argument("--busy-cores", default="", help="CPUs the busy processes are confined to, e.g. 2-15 "
                   "(default: any; run the bench under `taskset -c 0-1` to keep the harness off them)")
    p.add_argument("--cache-root", default=None, help="default: a fresh temp dir (the first run builds)")
    p.add_argument("--block-ms", type=float, default=None,
                   help="kernel_eval's cpu_block_ms or gpu_block_ms: each timing block's least length (default: its own)")
    p.add_argument("--timing-blocks", type=int, default=None,
                   help="kernel_eval's timing_blocks: blocks a side in one window (default: its own)")
    p.add_argument("--no-run-zygote", action="store_true",
                   help="spawn the run workers instead of forking them from kernel_eval's run zygote")
    p.add_argument("--json-out", default=None)
    p.add_argument("--blocks", action="store_true", help="print every run's timing blocks")
    a = p.parse_args()
    kind = "cpp" if a.device == "cpu" else "cuda"
    with open(os.path.join(ADV, "reference.py")) as f:
        ref = f.read()
    with open(os.path.join(ADV, kind, "benign.py")) as f:
        cand = f.read()
    cfg = {"cache_root": a.cache_root or tempfile.mkdtemp(prefix="bench-repeat-")}
    if a.block_ms is not None:
        cfg["cpu_block_ms" if a.device == "cpu" else "gpu_block_ms"] = a.block_ms
    if a.timing_blocks is not None:
        cfg["timing_blocks"] = a.timing_blocks
    if a.no_run_zygote:
        cfg["run_zygote"] = False
    rows = []
    for i in range(a.runs):
        busy = a.busy if i % 2 else 0
        t0 = time.monotonic()
        r = judged(ref, cand, a.device, busy, cfg, cpu_list(a.busy_cores) if a.busy_cores else None)
        rows.append({"run": i + 1, "busy": busy, "status": r.status, "speedup": r.speedup, "timing_ok": r.timing_ok,
                     "ref_ms": r.ref_ms, "candidate_ms": r.candidate_ms, "seconds": time.monotonic() - t0,
                     "message": r.message})
        print(f"  run {i + 1}: busy {busy}: {r.status} {r.speedup:.3f}x (reference {r.ref_ms:.4g} ms, candidate "
              f"{r.candidate_ms:.4g} ms) in {rows[-1]['seconds']:.1f} s" + ("" if r.timing_ok else f"  {r.message!r}"),
              flush=True)
        if a.blocks:
            print_blocks(r)
    speedups = [row["speedup"] for row in rows]
    ratio = max(speedups) / min(speedups) if min(speedups) > 0 else float("inf")
    print(f"\n| {a.device}: {kind}/benign.py, {a.runs} runs | speedup |")
    print("|---|---|")
    for row in rows:
        print(f"| run {row['run']} ({'%d busy processes' % row['busy'] if row['busy'] else 'no load'}) | "
              f"{row['speedup']:.3f}x{'' if row['timing_ok'] else ' (refused)'} |")
    calm = [row["speedup"] for row in rows if not row["busy"]]
    loaded = [row["speedup"] for row in rows if row["busy"]]
    print(f"| median without / with load | {statistics.median(calm):.3f}x / "
          f"{statistics.median(loaded) if loaded else float('nan'):.3f}x |")
    print(f"| max / min over all runs | {ratio:.3f} (goal <= 1.3) |")
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"device": a.device, "rows": rows, "max_over_min": ratio}, f, indent=1)


if __name__ == "__main__":
    main()
