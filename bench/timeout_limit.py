"""What a hung candidate costs a batch: the check limit kernel_eval derives from the reference (run_limit).

Per built-in task, two candidates judged in one batch, correctness only: one whose forward never returns,
and an honest one (the reference's own forward, so its check moves the same data as any correct kernel;
op_check off). Prints the reference's check split into its forwards and its seconds moving the data,
the limit the hung candidate got and what it cost, and the honest candidate's check seconds (what the
limit must stay above). The demo's tasks take 50-100M floats an input set: drawing and moving them is
most of a check.

    python bench/timeout_limit.py --device cuda
    python bench/timeout_limit.py --device cpu --tasks level1/01_relu
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import kernel_eval  # noqa: E402
import tasks  # noqa: E402

HUNG = """
import time
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, *args):
        while True:
            time.sleep(1.0)
"""


def honest(reference_src: str) -> str:
    return reference_src + "\n\nModelNew = Model\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--tasks", default="level1/01_relu,level1/03_silu,level1/07_row_sum,level1/08_max_over_dim",
                   help="built-in task ids without 'builtin/', comma-separated (default: the learning demo's)")
    a = p.parse_args()
    by_id = {t.task_id: t for t in tasks.load_builtin()}
    missing = [t for t in a.tasks.split(",") if "builtin/" + t not in by_id]
    if missing:
        raise SystemExit(f"bench/timeout_limit.py: no built-in task {', '.join(missing)}")
    print("| task | limit (how) | hung candidate cost s | honest check s |\n|---|---|---:|---:|")
    for task_id in a.tasks.split(","):
        ref = by_id["builtin/" + task_id].reference_src
        hung, fine = kernel_eval.evaluate_batch([(ref, HUNG), (ref, honest(ref))], device=a.device,
                                                cache_root=tempfile.mkdtemp(prefix="bench-timeout-"),
                                                time_candidate=False, op_check=False)
        if hung.status != "timeout" or fine.status != "correct":
            raise SystemExit(f"bench/timeout_limit.py: {task_id}: hung {hung.status} ({hung.message}), "
                             f"honest {fine.status} ({fine.message})")
        limit = re.search(r"\(limit (.*)\)$", hung.message).group(1)
        print(f"| {task_id} | {limit} | {hung.timeout_seconds:.1f} | {fine.seconds['check']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
