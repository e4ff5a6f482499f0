"""The pair-noise floor of plain CUDA-event timing, no harness: how far apart are one kernel's
times in two fresh processes, against two windows of one process? For each of the 8 built-in
tasks that bench/harness.py pairs, N fresh processes (argv[1], default 5; at least 3) each time
the task's reference forward (pinned to the last CPU, as kernel_eval's timed calls; 4 rotated
copies of one input set; 200 ms of warm-up; then two windows of 4 blocks x 25 calls, CUDA events
around each call). An identical pair as the harness judges it is emulated: one reference process
timed in two windows, each beside a candidate in its own fresh process: speedups R(p0,w1)/C(p1)
and R(p0,w2)/C(p2), then (p3, p4), (p5, p6), ... as N allows. Pair k of every task makes one
emulated batch of 8 pairs, as bench/harness.py's in-batch noise."""
import json, os, statistics, subprocess, sys

CHILD = r"""
import json, os, sys, time, statistics, types, torch
os.sched_setaffinity(0, {os.cpu_count() - 1})
src = sys.stdin.read()
mod = types.ModuleType("ref"); exec(compile(src, "reference.py", "exec"), mod.__dict__)
torch.manual_seed(0)
model = mod.Model(*mod.get_init_inputs()).cuda()
torch.manual_seed(0)
base = [x.cuda() if isinstance(x, torch.Tensor) else x for x in mod.get_inputs()]
sets = [[x.clone() if isinstance(x, torch.Tensor) else x for x in base] for _ in range(4)]
def window():
    ts = []
    for b in range(4):
        for k in range(25):
            xs = sets[k % 4]
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); model(*xs); e.record(); torch.cuda.synchronize()
            ts.append(s.elapsed_time(e))
    return statistics.median(ts)
with torch.no_grad():
    end = time.monotonic() + 0.2
    while time.monotonic() < end:
        model(*sets[0]); torch.cuda.synchronize()
    w1 = window(); time.sleep(0.2); w2 = window()
print(json.dumps([w1, w2]))
"""

sys.path.insert(0, os.getcwd())
import tasks  # noqa: E402

n_proc = int(sys.argv[1]) if len(sys.argv) > 1 else 5
if n_proc < 3:
    raise SystemExit(f"process_floor.py: a pair needs a reference process and two candidate processes (got {n_proc})")
pairable = [t for t in tasks.load_builtin("tasks") if "cuda" in t.solutions][:8]
within, across, pair_one, pair_all, per_task_pairs = [], [], [], [], []
for t in pairable:
    runs = [json.loads(subprocess.run([sys.executable, "-c", CHILD], input=t.reference_src, text=True,
                                      capture_output=True, check=True).stdout) for _ in range(n_proc)]
    w1 = [r[0] for r in runs]
    within += [max(r) / min(r) for r in runs]
    across.append(max(w1) / min(w1))
    ref = runs[0]
    ratios = []
    for a, b in [(k, k + 1) for k in range(1, n_proc - 1, 2)]:
        s1, s2 = ref[0] / w1[a], ref[1] / w1[b]
        ratios.append(max(s1, s2) / min(s1, s2))
    pair_one.append(ratios[0]); pair_all += ratios; per_task_pairs.append(ratios)
    print(f"{t.task_id:40s} process medians (ms) " + " ".join(f"{x:.4f}" for x in w1)
          + f"  | windows of p0 {ref[0]:.4f} {ref[1]:.4f}  | pairs " + " ".join(f"{r:.3f}" for r in ratios), flush=True)
med = statistics.median
print(f"two windows of one process, max/min: median {med(within):.3f}, max {max(within):.3f} ({len(within)} processes)")
print(f"{n_proc} fresh processes, max/min of their medians: median {med(across):.3f}, max {max(across):.3f} (8 tasks)")
print(f"emulated identical pairs' speedups apart: one per task median {med(pair_one):.3f} max {max(pair_one):.3f}; "
      f"all {len(pair_all)} median {med(pair_all):.3f} max {max(pair_all):.3f}")
for k, batch in enumerate(zip(*per_task_pairs)):
    print(f"emulated batch {k + 1} (pair {k + 1} of each task): median {med(batch):.3f}, max {max(batch):.3f}")
