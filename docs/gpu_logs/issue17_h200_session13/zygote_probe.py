"""Does a run worker forked from the run zygote boot on CUDA? One candidate worker, forked, then
its boot report: torch already imported, and the CPU seconds its boot took (a spawned one's beside it)."""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.getcwd())
import kernel_eval as ke  # noqa: E402

cfg = ke.EvalConfig(cache_root=tempfile.mkdtemp())
src = "import torch\nclass ModelNew(torch.nn.Module):\n    pass\n"
for zygotes in (ke._Zygotes(), None):
    t0 = time.monotonic()
    worker = ke._spawn("cand", src, "cuda", "9.0", cfg, tempfile.mkdtemp(), zygotes)
    boot, _ = ke._ask(worker, "candidate", "load", 120, {})
    print(f"{'forked' if zygotes else 'spawned'}: {boot}, {time.monotonic() - t0:.1f} s wall"
          + (f", zygotes: {[z.out_of_service or 'serving' for z in zygotes.all()]}" if zygotes else ""), flush=True)
    worker.stop()
    if zygotes:
        zygotes.close()
