import os, sys, statistics, runpy
sys.path.insert(0, '/work/main'); sys.path.insert(0, '/work/main/bench')
import kernel_eval as ke
orig = ke._paired_timing
CPU = int(os.environ.get("PIN_CPU", "0"))
def pinned(ref_ask, cand_ask, pids, *a, **k):
    for pid in pids().values():
        for p in [pid] + ke._descendants(pid):
            try:
                for tid in os.listdir(f"/proc/{p}/task"):
                    os.sched_setaffinity(int(tid), {CPU})
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                pass
    return orig(ref_ask, cand_ask, pids, *a, **k)
if os.environ.get("PIN", "1") == "1":
    ke._paired_timing = pinned
sys.argv = ["repeatability.py", "--device", "cpu", "--cache-root", "/tmp/rep_cache"] + sys.argv[1:]
runpy.run_path("/work/main/bench/repeatability.py", run_name="__main__")
