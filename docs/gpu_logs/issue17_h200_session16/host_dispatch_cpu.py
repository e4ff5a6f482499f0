"""Run on the 2-core CPU box, not the H200: does a process's host dispatch speed differ from the next's,
and is that address-space randomization or the hash seed? One process times a few small torch ops
(host dispatch dominates) pinned to CPU 1: the median of 5 windows of 2000 calls, printed in ns.
host_dispatch_cpu.sh runs it in 8 fresh processes, plain and under `PYTHONHASHSEED=0 setarch -R`."""
import os, time, statistics, torch
os.sched_setaffinity(0, {1})
torch.set_num_threads(1)
x = torch.randn(16); w = torch.randn(16)
def call():  # a few small ops: host dispatch dominates
    y = torch.relu(x); y = y * w; y = torch.nn.functional.layer_norm(y, (16,)); return y.sum()
for _ in range(2000): call()
meds = []
for _ in range(5):
    ts = []
    for _ in range(2000):
        t0 = time.perf_counter_ns(); call(); ts.append(time.perf_counter_ns() - t0)
    meds.append(statistics.median(ts))
print(statistics.median(meds))
