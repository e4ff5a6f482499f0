"""Does another process's CUDA context creation and teardown slow a short kernel's timed calls?
One process times `relu(x) * 1.5 + x` (64 x 4096 fp32; ~0.05-0.2 ms a call, the host's launch and
synchronize mostly) in blocks of 64 calls, each call between two events after a synchronize, as
kernel_eval's timed loop does, on the last two CPUs (kernel_eval's kept timing CPUs). Meanwhile, on
the other 14 CPUs, 4 at a time: nothing (quiet), processes that import torch and create a CUDA
context then exit (churn), or the same processes with CUDA hidden (CPU load alone)."""
import os, statistics, subprocess, sys, time
import torch

CHILD = "import torch; torch.empty(1, device='cuda' if torch.cuda.is_available() else 'cpu'); import time; time.sleep(0.3)"


def blocks(seconds):
    x = torch.randn(64, 4096, device="cuda")
    meds, t_end = [], time.monotonic() + seconds
    while time.monotonic() < t_end:
        ts = []
        for _ in range(64):
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); torch.relu(x) * 1.5 + x; e.record(); torch.cuda.synchronize()
            ts.append(s.elapsed_time(e))
        meds.append(statistics.median(ts))
    return meds


def run(mode, seconds=10):
    n = os.cpu_count()
    procs = []
    env = dict(os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if mode == "cpu_only" else {}))
    if mode != "quiet":
        launcher = subprocess.Popen([sys.executable, "-c", f"""
import subprocess, sys, time, os
os.sched_setaffinity(0, set(range({n - 2})))
end = time.monotonic() + {seconds + 1}
live = []
while time.monotonic() < end:
    live = [p for p in live if p.poll() is None]
    while len(live) < 4:
        live.append(subprocess.Popen([sys.executable, "-c", {CHILD!r}]))
    time.sleep(0.02)
for p in live: p.wait()
"""], env=env)
        procs.append(launcher)
    time.sleep(1.0)
    meds = blocks(seconds - 1)
    for p in procs:
        p.wait()
    meds.sort()
    q = lambda f: meds[min(len(meds) - 1, int(f * len(meds)))]
    print(f"{mode:9s} blocks {len(meds):4d}  median {q(0.5)*1000:6.1f} us  p10 {q(0.1)*1000:6.1f}  p90 {q(0.9)*1000:6.1f}  "
          f"p99 {q(0.99)*1000:6.1f}  max {meds[-1]*1000:6.1f}  p90/p10 {q(0.9)/q(0.1):.3f}", flush=True)


if __name__ == "__main__":
    os.sched_setaffinity(0, {os.cpu_count() - 2, os.cpu_count() - 1})
    torch.empty(1, device="cuda")
    blocks(1.0)  # warm up
    for mode in ("quiet", "churn", "cpu_only", "quiet", "churn", "cpu_only"):
        run(mode)
