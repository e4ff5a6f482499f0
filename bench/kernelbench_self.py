"""Every task of a KernelBench checkout judged against itself: does the harness fit the real benchmark?

Each task's reference is also the candidate (the same source, `ModelNew = Model` appended), judged by
`kernel_eval.evaluate_batch` with the op check off. Identical code must come out `correct` at a
speedup near 1.0; anything else is the harness's doing (its memory use, its timing) or a task that
cannot run on the device at all (named in the table with its reason). Tasks are judged in batches,
and each batch's verdicts are appended to --out (one JSON line a task), so an interrupted run, or one
split over several calls, resumes where it stopped. With timing on, a task whose record is correct but
untimed (an earlier `--no-time` run) is judged again; its new line supersedes the old one.

    python bench/kernelbench_self.py --kernelbench PATH/TO/KernelBench --levels 1 2 3 --device cuda \
        --out runs/kb_self.jsonl                     # H200: chunk it with --limit, rerun to resume
    python bench/kernelbench_self.py --kernelbench tests/fixtures/kernelbench --levels 1 2 3 \
        --device cpu --out /tmp/kb_self.jsonl        # CPU: the small fixture checkout (CI runs this)
    python bench/kernelbench_self.py --out runs/kb_self.jsonl --report-only   # the table again

Prints a markdown table: verdicts by status, the speedups' spread and share within [0.9, 1.1], and
every task that is not `correct` or not within that range, with the first line of its message.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import checkpoint  # noqa: E402
import kernel_eval  # noqa: E402
import tasks  # noqa: E402

NEAR = (0.9, 1.1)  # identical code: a speedup outside this is timing noise or the harness's bias


def self_candidate(reference_src: str) -> str:
    """The reference itself, under the name the harness loads."""
    return reference_src + "\n\nModelNew = Model\n"


def read_records(path: str) -> dict:
    """task_id -> record, from the JSON lines written so far (a torn last line is ignored)."""
    records = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                records[record["task_id"]] = record
    return records


def untimed(record: dict) -> bool:
    """A correct verdict of a `--no-time` run: no reference time (a timed one whose speedup the
    cross-check could not confirm has one, and is not judged again)."""
    return record["status"] == "correct" and not record["ref_ms"] > 0


def report(records: list) -> str:
    """The markdown table of a run's records."""
    n = len(records)
    if not n:
        return "no records"
    counts: dict = {}
    for r in records:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    lines = [f"{n} tasks judged against themselves", "", "| status | tasks |", "|---|---:|"]
    lines += [f"| {status} | {k} |" for status, k in sorted(counts.items(), key=lambda kv: -kv[1])]
    speedups = [r["speedup"] for r in records if r["status"] == "correct" and r["speedup"] > 0]
    if speedups:
        near = sum(NEAR[0] <= s <= NEAR[1] for s in speedups)
        lines += ["", f"speedups of {len(speedups)} timed correct tasks: median {statistics.median(speedups):.3f}, "
                      f"min {min(speedups):.3f}, max {max(speedups):.3f}; within [{NEAR[0]}, {NEAR[1]}]: "
                      f"{near} ({100 * near / len(speedups):.1f}%)"]
    alone = sum(bool(r.get("alone")) for r in records)
    lines += ["", f"judged again alone after running out of memory beside others: {alone}"]
    odd = [r for r in records if r["status"] != "correct" or not NEAR[0] <= r["speedup"] <= NEAR[1]]
    if odd:
        lines += ["", "| task | status | speedup | message |", "|---|---|---:|---|"]
        for r in sorted(odd, key=lambda r: r["task_id"]):
            first = (r["message"].strip().splitlines() or [""])[0][:160].replace("|", "/")
            lines.append(f"| {r['task_id']} | {r['status']} | {r['speedup']:.3f} | {first} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--kernelbench", help="a KernelBench checkout (its root or its KernelBench/ folder)")
    p.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--device", default="cuda", help="cpu, cuda or cuda:N")
    p.add_argument("--out", required=True, help="JSON lines, one per task; an existing file is resumed")
    p.add_argument("--batch", type=int, default=20, help="tasks per evaluate_batch call")
    p.add_argument("--limit", type=int, default=None, help="judge at most this many new tasks, then stop")
    p.add_argument("--only", nargs="+", default=None, metavar="TEXT",
                   help="judge only the tasks whose id contains one of these texts")
    p.add_argument("--trials", type=int, default=20, help="timed calls per side (kernel_eval's gpu_trials / cpu_trials)")
    p.add_argument("--no-time", action="store_true", help="correctness only")
    p.add_argument("--cache-root", default=None, help="kernel_eval's cache (default: its own)")
    p.add_argument("--report-only", action="store_true", help="print the table of --out and stop")
    a = p.parse_args(argv)
    done = read_records(a.out)
    if a.report_only:
        print(report(list(done.values())))
        return 0
    if not a.kernelbench:
        p.error("--kernelbench is required unless --report-only")
    if a.batch < 1:
        p.error(f"--batch {a.batch}: must be at least 1")
    try:
        task_list = tasks.load_kernelbench(a.kernelbench, levels=tuple(a.levels))
    except tasks.TaskError as e:
        raise SystemExit(f"kernelbench_self.py: {e}") from None
    device = kernel_eval.resolve_device(a.device, "kernelbench_self.py")
    todo = [t for t in task_list if (t.task_id not in done or not a.no_time and untimed(done[t.task_id]))
            and (a.only is None or any(text in t.task_id for text in a.only))][: a.limit]
    print(f"{len(task_list)} tasks, {len(done)} already judged in {a.out}, judging {len(todo)}", file=sys.stderr)
    cfg = {"op_check": False, "time_candidate": not a.no_time,
           ("cpu_trials" if device == "cpu" else "gpu_trials"): a.trials}
    if a.cache_root:
        cfg["cache_root"] = a.cache_root
    t0 = time.monotonic()
    for start in range(0, len(todo), a.batch):
        chunk = todo[start: start + a.batch]
        pairs = [(t.reference_src, self_candidate(t.reference_src)) for t in chunk]
        results = kernel_eval.evaluate_batch(pairs, device=device, progress=True, **cfg)
        records = [{"task_id": t.task_id, "status": r.status, "speedup": r.speedup, "ref_ms": r.ref_ms,
                    "candidate_ms": r.candidate_ms, "alone": r.alone, "message": r.message,
                    "seconds": {k: round(v, 3) for k, v in r.seconds.items()}} for t, r in zip(chunk, results)]
        # one line a task, on disk before the next batch starts
        checkpoint.append_synced(a.out, "".join(json.dumps(record) + "\n" for record in records))
        print(f"{start + len(chunk)}/{len(todo)} judged, {time.monotonic() - t0:.0f} s", file=sys.stderr)
    print(report(list(read_records(a.out).values())))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        kernel_eval.interrupted("kernelbench_self.py")
