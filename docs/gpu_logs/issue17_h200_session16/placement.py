"""Is a window's level a matter of where the buffers lie, or of when? For each of the 8 built-in tasks
that bench/harness.py pairs, one process times the reference in 24 windows (4 blocks x 25 calls, 4
rotated input copies, CUDA events per call, pinned to the last CPU, as process_floor.py). Windows
alternate: even ones reuse the same input copies; odd ones first allocate fresh copies behind a spacer
of random size (new addresses). If placement sets the level, the fresh windows spread wider."""
import os, random, statistics, sys, torch
sys.path.insert(0, os.getcwd())
import tasks  # noqa: E402
os.sched_setaffinity(0, {os.cpu_count() - 1})
random.seed(0)
med = statistics.median
for t in [t for t in tasks.load_builtin("tasks") if "cuda" in t.solutions][:8]:
    mod = {}; exec(compile(t.reference_src, "reference.py", "exec"), mod)
    torch.manual_seed(0)
    model = mod["Model"](*mod["get_init_inputs"]()).cuda()
    torch.manual_seed(0)
    base = [x.cuda() if isinstance(x, torch.Tensor) else x for x in mod["get_inputs"]()]
    def fresh():
        spacer = torch.empty(random.randint(1, 64) * 2**20 + random.randint(0, 4095) * 256, dtype=torch.uint8, device="cuda")
        return spacer, [[x.clone() if isinstance(x, torch.Tensor) else x for x in base] for _ in range(4)]
    keep = [fresh()]
    same_sets = keep[0][1]
    def window(sets):
        ts = []
        for k in range(100):
            torch.cuda.synchronize()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record(); model(*sets[k % 4]); e.record(); torch.cuda.synchronize()
            ts.append(s.elapsed_time(e))
        return med(ts)
    same, moved = [], []
    with torch.no_grad():
        for _ in range(200): model(*same_sets[0])
        for w in range(24):
            if w % 2 == 0:
                same.append(window(same_sets))
            else:
                keep.append(fresh()); moved.append(window(keep[-1][1]))
    print(f"{t.task_id:36s} same buffers max/min {max(same)/min(same):.3f} (median {med(same):.4f} ms) | "
          f"fresh buffers max/min {max(moved)/min(moved):.3f} (median {med(moved):.4f} ms)", flush=True)
