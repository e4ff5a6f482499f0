"""Peak host memory of the harness while it judges one large task (its reference against itself).

The harness's host memory is every process of its tree (this one, the supervisors, zygotes, the
reference's and the candidate's workers) and the memory files between them. Polled from /proc every
--interval seconds: the sum over the tree of each process's proportional anonymous and file-backed
pages (smaps_rollup's Pss_Anon + Pss_File: a page shared by n processes counts 1/n in each), plus
every memory file (memfd) held open or mapped by any of them, counted once (its allocated blocks).
Device memory (cuda) is torch's and the driver's, not counted here. Run it alone on the machine: a
poll sees what the tree holds, not what others hold.

    python bench/host_memory.py --reference /work/shared/kernelbench/KernelBench/level1/39_L2Norm_.py \
        --device cuda                                  # the real task: 8 GiB in, 8 GiB out
    python bench/host_memory.py --l2norm-rows 2048 --device cpu   # CPU box: the same task, scaled
    python bench/host_memory.py ... --root /tmp/before             # another checkout's harness, side by side

Prints one table row: the task's input and output GiB, the verdict, seconds, and the peak GiB
(processes, memory files, total) with the phase-free peak total over inputs + outputs.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time

L2NORM = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x / torch.norm(x, p=2, dim=1, keepdim=True)

def get_inputs():
    return [torch.rand({rows}, {dim})]

def get_init_inputs():
    return []
"""
GiB = 1 << 30


def tree(root: int) -> list:
    """root and its descendants (from /proc's parent links)."""
    kids: dict = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += kids.get(pid, [])
    return out


def sample(root: int) -> tuple:
    """(bytes of the tree's processes, bytes of the memory files they hold or map)."""
    procs, files = 0, {}
    for pid in tree(root):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    key, _, rest = line.partition(":")
                    if key in ("Pss_Anon", "Pss_File"):
                        procs += int(rest.split()[0]) * 1024
            paths = [f"/proc/{pid}/fd/{fd}" for fd in os.listdir(f"/proc/{pid}/fd")]
            with open(f"/proc/{pid}/maps") as f:
                paths += [f"/proc/{pid}/map_files/{line.split()[0]}" for line in f if "/memfd:" in line]
        except OSError:  # the process ended meanwhile
            continue
        for path in paths:
            try:
                if os.readlink(path).startswith("/memfd:"):
                    st = os.stat(path)
                    files[(st.st_dev, st.st_ino)] = st.st_blocks * 512
            except OSError:
                continue
    return procs, sum(files.values())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reference", help="a KernelBench-format task file (default: the built-in L2Norm, scaled)")
    p.add_argument("--l2norm-rows", type=int, default=2048, help="rows of the built-in L2Norm task")
    p.add_argument("--l2norm-dim", type=int, default=65536, help="columns of the built-in L2Norm task")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-time", action="store_true", help="correctness only")
    p.add_argument("--trials", type=int, default=None, help="timed calls (kernel_eval's cpu_trials / gpu_trials)")
    p.add_argument("--interval", type=float, default=0.05, help="seconds between polls")
    p.add_argument("--root", default=None, help="the checkout whose harness runs (default: this one)")
    p.add_argument("--cache-root", default=None, help="a fresh, empty one (default: a new temp dir)")
    p.add_argument("--recompute-outputs", action="store_true",
                   help="kernel_eval's recompute_outputs: the reference's outputs computed when judged, for any task")
    a = p.parse_args(argv)
    root = a.root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, root)
    import kernel_eval
    if a.reference:
        with open(a.reference) as f:
            ref = f.read()
        name = os.path.basename(a.reference)
    else:
        ref, name = L2NORM.format(rows=a.l2norm_rows, dim=a.l2norm_dim), f"L2Norm {a.l2norm_rows}x{a.l2norm_dim}"
    cfg = {"op_check": False, "time_candidate": not a.no_time}
    if a.recompute_outputs:  # a checkout older than the option has no such field
        cfg["recompute_outputs"] = True
    if a.trials:
        cfg["cpu_trials" if a.device == "cpu" else "gpu_trials"] = a.trials
    cache_root = cfg["cache_root"] = a.cache_root or tempfile.mkdtemp(prefix="host_memory-")
    peak = {"procs": 0, "files": 0, "total": 0}
    done = threading.Event()

    def poll():
        while not done.is_set():
            procs, files = sample(os.getpid())
            peak.update(procs=max(peak["procs"], procs), files=max(peak["files"], files),
                        total=max(peak["total"], procs + files))
            time.sleep(a.interval)

    base = sum(sample(os.getpid()))
    poller = threading.Thread(target=poll, daemon=True)
    t0 = time.monotonic()
    poller.start()
    result = kernel_eval.evaluate(ref, ref + "\n\nModelNew = Model\n", device=a.device, **cfg)
    done.set()
    poller.join()
    seconds = time.monotonic() - t0
    import json  # the task's sizes: the footprint its probe measured (the only one in a fresh cache)
    [fp] = [json.load(open(os.path.join(dirpath, f))) for dirpath, _, names in os.walk(cache_root)
            if dirpath.endswith("footprints") for f in names]
    in_bytes, out_bytes = fp["set_bytes"], fp["out_bytes"]
    print("| task | device | harness | reference outputs | in GiB | out GiB | status | s | peak processes GiB "
          "| peak memory files GiB | peak total GiB | total / (in + out) |")
    print("|---|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|")
    kept = "recomputed (forced)" if a.recompute_outputs else "as planned"
    print(f"| {name} | {a.device} | {root} | {kept} | {in_bytes / GiB:.2f} | {out_bytes / GiB:.2f} | "
          f"{result.status} | {seconds:.0f} | {peak['procs'] / GiB:.2f} | {peak['files'] / GiB:.2f} | "
          f"{peak['total'] / GiB:.2f} | {peak['total'] / (in_bytes + out_bytes):.2f} |")
    print(f"(before judging, this process alone: {base / GiB:.2f} GiB; {result.message.splitlines()[0][:160]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
