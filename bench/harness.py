"""Throughput and latency of kernel_eval against KernelBench-style evaluators, in one run.

Candidates: the built-in CUDA solutions plus variants of them (a comment inserted before the first
`__global__`, so each variant is a distinct source that must be rebuilt), all cold (a fresh cache).
  kernel_eval   evaluate_batch: parallel compiles in fresh processes, isolated runs, one timed at a time
  KernelBench   the fair baseline, KernelBench's scripts in shape (eval_from_generations): every
                candidate built in parallel on all cores first (its batch compile: a process pool,
                one build dir per candidate), then each evaluated in a fresh process of its own, one
                after another (5 correctness trials, CUDA-event timing; perf_counter on cpu)
  naive serial  in this process, one candidate after another: build, check, time
Then one kernel (>= 1 ms) is evaluated --stability-runs times (reference re-timed each run) and
the spread of its speedup is reported.

    python bench/harness.py --device cuda --n-candidates 32 --baseline-n 0 --stability-runs 0   # H200
    python bench/harness.py --device cpu --n-candidates 2 --baseline-n 1 --stability-runs 0     # smoke test, C++
    python bench/harness.py --device cuda --n-candidates 0 --baseline-n 0 \
        --stability-task builtin/level1/09_matmul \
        --stability-replace "M, K, N = 2000, 1040, 1030" "M, K, N = 4096, 4096, 4096"   # stability alone
(no built-in reference takes 1 ms on an H200: the matmul at 4096^3 makes both sides take longer)

Prints a markdown table (docs/PERFORMANCE.md is written from it): per column the unique candidates
a minute and the p50 latency (a candidate's compile start to its verdict), and with --json-out the
raw figures, each baseline candidate's row included (the pid that judged it). The goal (issue 40):
>= 3x the KernelBench-style baseline's unique candidates per minute, p50 latency <= 12 s for 32
cold candidates on the H200.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import kernel_build  # noqa: E402
import kernel_eval  # noqa: E402
import tasks  # noqa: E402
from repeatability import print_blocks  # noqa: E402  (bench/, this script's own directory)

KERNEL_MARK = {"cuda": "__global__", "cpp": "torch::Tensor"}


def spread(values: list) -> float:
    """(max - min) / median; nan when a value is 0 (a run that was not timed)."""
    return (max(values) - min(values)) / statistics.median(values) if min(values) > 0 else float("nan")


def make_candidates(task_list: list, language: str, n: int) -> list:
    """(task_id, reference_src, candidate_src) for n distinct candidates: solutions, then variants."""
    base = [(t.task_id, t.reference_src, t.solutions[language]) for t in task_list if language in t.solutions]
    if not base:
        raise SystemExit(f"no built-in {language} solutions under {ROOT}/tasks")
    out = []
    for k in range(n):
        task_id, ref, src = base[k % len(base)]
        if k >= len(base):  # a comment inside the kernel source: a new hash, a real rebuild
            mark = KERNEL_MARK[language]
            if mark not in src:
                raise SystemExit(f"{task_id}: no {mark!r} to mark a variant at")
            src = src.replace(mark, f"/* variant {k} */ {mark}", 1)
        out.append((task_id, ref, src))
    return out


def pair_disagreement(candidates: list, results: list, key: str = "candidate_ms") -> list:
    """For each variant (a later candidate of the same task: the same kernel, make_candidates):
    max/min of its `key` (the candidate's time, or the speedup paid: with the reference timed beside
    each, the two differ) and the first one's, both correct and timed. 1.0 is perfect agreement;
    in-batch timing noise."""
    first, ratios = {}, []
    for (task_id, _, _), b in zip(candidates, results):
        a = first.setdefault(task_id, b)
        pair = (getattr(a, key), getattr(b, key))
        if a is not b and a.status == b.status == "correct" and a.timing_ok and b.timing_ok and min(pair) > 0:
            ratios.append(max(pair) / min(pair))
    return ratios


def device_arch(device: str) -> str:
    """TORCH_CUDA_ARCH_LIST for the baseline's builds: EvalConfig's cuda_arch, else the device's own
    ("9.0" on an H200); "" on cpu."""
    if device == "cpu":
        return ""
    if kernel_eval.EvalConfig().cuda_arch:
        return kernel_eval.EvalConfig().cuda_arch
    import torch
    major, minor = torch.cuda.get_device_capability(torch.device(device).index or 0)
    return f"{major}.{minor}"


def _build_one(job: tuple) -> tuple:
    """One candidate built (and imported) in a pool process, in its own build dir: KernelBench's
    batch compile. Returns (wall-clock start, seconds); a failed build is found again by the
    evaluation."""
    src, build_dir, arch = job
    os.environ.update(TORCH_EXTENSIONS_DIR=build_dir, CUDA_VISIBLE_DEVICES="")  # ninja's own job count, as KernelBench
    if arch:
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    start, t0 = time.time(), time.monotonic()  # time.time: compared with the parent's clock
    try:
        exec(compile(src, "candidate.py", "exec"), types.ModuleType("cand_mod").__dict__)
    except Exception:  # noqa: BLE001 - a build error is the evaluation's verdict
        pass
    return start, time.monotonic() - t0


def judge_in_process(job: tuple) -> dict:
    """One candidate judged in the calling process, KernelBench's eval_kernel_against_ref in shape:
    load the reference and the candidate (load_inline builds it unless build_dir holds the build),
    5 seeded correctness trials, then both timed (CUDA events; perf_counter on cpu). Returns the
    row, with the pid of the process that judged it."""
    task_id, ref_src, cand_src, device, build_dir, arch, trials, warmup = job
    import torch
    os.environ["TORCH_EXTENSIONS_DIR"] = build_dir
    if arch:  # the flags the builds saw, so that load_inline finds them up to date
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    dev = torch.device(device)
    t0 = time.monotonic()
    status = "correct"
    try:
        ref_mod, cand_mod = types.ModuleType("ref_mod"), types.ModuleType("cand_mod")
        exec(compile(ref_src, "reference.py", "exec"), ref_mod.__dict__)
        exec(compile(cand_src, "candidate.py", "exec"), cand_mod.__dict__)  # builds or loads here
        compile_s = time.monotonic() - t0
        init = ref_mod.get_init_inputs()
        torch.manual_seed(0)
        ref_model = ref_mod.Model(*init).to(dev)
        torch.manual_seed(0)
        cand_model = cand_mod.ModelNew(*init).to(dev)
        with torch.no_grad():
            for seed in range(5):
                torch.manual_seed(seed)
                xs = [x.to(dev) if isinstance(x, torch.Tensor) else x for x in ref_mod.get_inputs()]
                if not torch.allclose(ref_model(*xs), cand_model(*xs), atol=1e-2, rtol=1e-2):
                    status = "incorrect"
            times = []
            for model in (ref_model, cand_model):
                for _ in range(warmup):
                    model(*xs)
                ts = []
                for _ in range(trials):
                    if dev.type == "cuda":
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record()
                        model(*xs)
                        end.record()
                        torch.cuda.synchronize()
                        ts.append(start.elapsed_time(end))
                    else:
                        s = time.perf_counter()
                        model(*xs)
                        ts.append((time.perf_counter() - s) * 1e3)
                times.append(statistics.median(ts))
    except Exception as e:  # noqa: BLE001 - the baseline records failures like KernelBench does
        status, compile_s, times = f"error: {type(e).__name__}", time.monotonic() - t0, [0.0, 0.0]
    return {"task": task_id, "status": status, "pid": os.getpid(), "seconds": time.monotonic() - t0,
            "compile_s": compile_s, "ref_ms": times[0], "candidate_ms": times[1]}


def kernelbench_style(candidates: list, device: str, build_root: str, trials: int, warmup: int,
                      timeout_s: float) -> tuple:
    """(rows, build wall s), KernelBench's eval_from_generations in shape: every candidate built at
    once on all cores (a spawn pool, one build dir each), then each judged one after another in a
    fresh spawned process of its own (a pool of one per candidate, as its scripts do on one GPU),
    which finds its build in its dir: no rebuild, whatever the extension's name. A row's latency_s
    runs from its build's start to its verdict; since_start_s from the phase's start."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    spawn = multiprocessing.get_context("spawn")
    arch = device_arch(device)
    dirs = [os.path.join(build_root, str(k)) for k in range(len(candidates))]
    phase_start, t0 = time.time(), time.monotonic()
    with ProcessPoolExecutor(max_workers=os.cpu_count(), mp_context=spawn) as pool:
        builds = list(pool.map(_build_one, [(c, d, arch) for (_, _, c), d in zip(candidates, dirs)]))
    build_s = time.monotonic() - t0
    print(f"  KernelBench-style: {len(candidates)} builds on {os.cpu_count()} cores in {build_s:.1f} s", flush=True)
    rows = []
    for (task_id, ref_src, cand_src), build_dir, (build_start, build_one_s) in zip(candidates, dirs, builds):
        job = (task_id, ref_src, cand_src, device, build_dir, arch, trials, warmup)
        t1 = time.monotonic()
        with spawn.Pool(1) as one:  # leaving the block terminates the process, a hung one included
            try:
                row = one.apply_async(judge_in_process, (job,)).get(timeout=timeout_s)
            except multiprocessing.TimeoutError:
                row = {"task": task_id, "status": "timeout", "pid": None, "seconds": timeout_s,
                       "compile_s": float("nan"), "ref_ms": 0.0, "candidate_ms": 0.0}
        verdict = time.time()
        row.update(build_s=build_one_s, process_s=time.monotonic() - t1, latency_s=verdict - build_start,
                   since_start_s=verdict - phase_start)
        rows.append(row)
        print(f"  evaluate {task_id}: {row['status']} in process {row['pid']}, {row['process_s']:.1f} s "
              f"(spawn to verdict; import/load {row['compile_s']:.1f} s)", flush=True)
    return rows, build_s


def naive_serial(candidates: list, device: str, build_root: str, trials: int, warmup: int) -> list:
    """Everything in this process, one candidate after another, one build dir: a variant of an
    earlier candidate (same extension name, new source) is rebuilt under a new name."""
    rows = []
    for task_id, ref_src, cand_src in candidates:
        rows.append(judge_in_process((task_id, ref_src, cand_src, device, build_root, "", trials, warmup)))
        print(f"  naive {task_id}: {rows[-1]['status']} in {rows[-1]['seconds']:.1f} s "
              f"(import/build {rows[-1]['compile_s']:.1f} s)", flush=True)
    return rows


def percentile(values: list, q: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = (len(values) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--n-candidates", type=int, default=32)
    p.add_argument("--baseline-n", type=int, default=3, help="candidates for the naive baseline (each ~50 s cold on H200)")
    p.add_argument("--kernelbench-n", type=int, default=None,
                   help="candidates for the KernelBench-style baseline (default: --n-candidates)")
    p.add_argument("--kernelbench-timeout", type=float, default=300.0,
                   help="seconds the KernelBench-style baseline gives one candidate's evaluation process")
    p.add_argument("--tasks", default=None,
                   help="built-in task ids the candidates come from, comma-separated, e.g. builtin/level1/01_relu "
                        "(default: all; with fewer tasks than candidates, the rest are variants)")
    p.add_argument("--stability-runs", type=int, default=5)
    p.add_argument("--stability-task", default=None,
                   help="a built-in task id whose solution is re-evaluated (default: the batch's slowest correct kernel)")
    p.add_argument("--stability-replace", nargs=2, metavar=("OLD", "NEW"), default=None,
                   help="edit the stability task's reference source first, e.g. its sizes, so that both sides take >= 1 ms")
    p.add_argument("--trials", type=int, default=None, help="timed calls per candidate (default: kernel_eval's)")
    p.add_argument("--max-parallel-compiles", type=int, default=None, help="default: kernel_eval's")
    p.add_argument("--max-parallel-runs", type=int, default=None, help="default: kernel_eval's")
    p.add_argument("--cache-root", default=None, help="default: a fresh temp dir (cold builds)")
    p.add_argument("--header-tiers", default=None,
                   help="kernel_build's cuda_header_tiers, comma-separated ('' = the source as written; default: kernel_build's)")
    p.add_argument("--no-host-pch", action="store_true", help="kernel_build's host_pch off (host units parse their headers)")
    p.add_argument("--no-compile-zygote", action="store_true",
                   help="spawn each compile worker (it imports torch itself) instead of forking it from one zygote")
    p.add_argument("--no-run-zygote", action="store_true",
                   help="spawn each candidate's and reference's run worker instead of forking it from one zygote")
    p.add_argument("--gpu-warmup-ms", type=float, default=None, help="kernel_eval's gpu_warmup_ms (default: its own)")
    p.add_argument("--timing-blocks", type=int, default=None, help="kernel_eval's timing_blocks per side (default: its own)")
    p.add_argument("--timing-buffers", type=int, default=None, help="kernel_eval's timing_buffers (default: its own)")
    p.add_argument("--timing-cpus", type=int, default=None, help="kernel_eval's timing_cpus (default: its own)")
    p.add_argument("--blocks", action="store_true", help="print each stability run's timing blocks")
    p.add_argument("--sandbox", choices=("auto", "require", "off"), default="auto",
                   help="kernel_eval's sandbox: candidates behind namespaces and uid 65534 (default: auto)")
    p.add_argument("--json-out", default=None)
    a = p.parse_args()
    language = "cpp" if a.device == "cpu" else "cuda"
    cfg = kernel_eval.EvalConfig()
    trials = a.trials or (cfg.cpu_trials if a.device == "cpu" else cfg.gpu_trials)
    warmup = cfg.cpu_warmup if a.device == "cpu" else cfg.gpu_warmup
    cache_root = a.cache_root or tempfile.mkdtemp(prefix="bench-kernel-eval-")
    builtin = tasks.load_builtin(os.path.join(ROOT, "tasks"), device=a.device)   # the CPU sizes on cpu
    chosen_tasks = builtin
    if a.tasks:
        wanted = [t for t in a.tasks.split(",") if t]
        unknown = sorted(set(wanted) - {t.task_id for t in builtin})
        if unknown:
            p.error(f"--tasks: no built-in task {', '.join(unknown)}")
        chosen_tasks = [t for t in builtin if t.task_id in wanted]
    pool = make_candidates(chosen_tasks, language, max(a.n_candidates, a.baseline_n, 1))
    candidates = pool[: a.n_candidates]
    over = {"cache_root": cache_root, "max_parallel_compiles": a.max_parallel_compiles,
            "max_parallel_runs": a.max_parallel_runs, "compile_zygote": not a.no_compile_zygote,
            "run_zygote": not a.no_run_zygote, "sandbox": a.sandbox}
    if a.gpu_warmup_ms is not None:
        over["gpu_warmup_ms"] = a.gpu_warmup_ms
    if a.timing_blocks is not None:
        over["timing_blocks"] = a.timing_blocks
    if a.timing_buffers is not None:
        over["timing_buffers"] = a.timing_buffers
    if a.timing_cpus is not None:
        over["timing_cpus"] = a.timing_cpus
    build = {}
    if a.header_tiers is not None:
        build["cuda_header_tiers"] = tuple(t for t in a.header_tiers.split(",") if t)
    if a.no_host_pch:
        build["host_pch"] = False
    over["build"] = kernel_build.BuildConfig(**build)
    over["cpu_trials" if a.device == "cpu" else "gpu_trials"] = trials

    results, wall, own, to_verdict, compile_s, phases, pairs, speedup_pairs = [], float("nan"), [], [], [], {}, [], []
    if candidates:
        print(f"kernel_eval: {len(candidates)} distinct {language} candidates on {a.device}, cache {cache_root}", flush=True)
        t0 = time.monotonic()
        results = kernel_eval.evaluate_batch([(r, c) for _, r, c in candidates], device=a.device, progress=True, **over)
        wall = time.monotonic() - t0
        # latency: one candidate's compile start to its verdict (waits for the device included)
        own = [r.seconds.get("latency", 0.0) for r in results]
        to_verdict = [r.seconds.get("since_batch_start", 0.0) for r in results]
        # compile.*: the compile worker's own split (import torch, load_inline's builds, the rest);
        # boot_cpu: the candidate's run worker's CPU seconds until it was ready (CPU, not wall)
        phases = {k: percentile([r.seconds.get(k, 0.0) for r in results], 0.5)
                  for k in ("compile", "compile.torch", "compile.build", "compile.rest", "boot_cpu", "load", "device_wait",
                            "reference", "check", "time")}
        compile_s = [r.seconds.get("compile", 0.0) for r in results]
        # kernel_eval's figures now, before the slow baseline: a run cut short still reports them
        print(f"kernel_eval: {sum(r.status == 'correct' for r in results)}/{len(results)} correct, wall {wall:.1f} s, "
              f"{len(results) / wall * 60:.2f} candidates/min, p50 latency {percentile(own, 0.5):.1f} s, "
              f"p90 {percentile(own, 0.9):.1f} s, p50 batch start to verdict {percentile(to_verdict, 0.5):.1f} s", flush=True)
        print("  p50 per phase (s): " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()), flush=True)
        pairs = pair_disagreement(candidates, results)
        speedup_pairs = pair_disagreement(candidates, results, key="speedup")
        if pairs:
            print(f"  in-batch noise: {len(pairs)} pairs of identical kernels, candidate times apart by "
                  f"median {percentile(pairs, 0.5):.3f}x, max {max(pairs):.3f}x; speedups by median "
                  f"{percentile(speedup_pairs, 0.5):.3f}x, max {max(speedup_pairs):.3f}x", flush=True)
        for (task_id, _, _), r in zip(candidates, results):
            print(f"  {task_id:42s} {r.status:8s} {r.speedup:6.3f}x timing_ok={r.timing_ok} "
                  + " ".join(f"{k}={v:.1f}" for k, v in r.seconds.items())
                  + ("" if r.status == "correct" else f"  {r.message[:200]!r}"), flush=True)
    n_correct = sum(r.status == "correct" for r in results)

    base_rows, base_wall = [], 0.0
    if a.baseline_n > 0:
        print(f"naive serial baseline: {a.baseline_n} candidates", flush=True)
        t1 = time.monotonic()
        base_rows = naive_serial(pool[: a.baseline_n], a.device, tempfile.mkdtemp(prefix="bench-naive-"), trials, warmup)
        base_wall = time.monotonic() - t1

    kb_n = a.n_candidates if a.kernelbench_n is None else a.kernelbench_n
    kb_rows, kb_wall, kb_build = [], 0.0, 0.0
    if kb_n > 0:
        print(f"KernelBench-style baseline: {kb_n} candidates", flush=True)
        t2 = time.monotonic()
        kb_rows, kb_build = kernelbench_style(pool[:kb_n], a.device, tempfile.mkdtemp(prefix="bench-kb-"), trials, warmup,
                                              a.kernelbench_timeout)
        kb_wall = time.monotonic() - t2

    stability = {}
    chosen = None
    if a.stability_task:  # a named built-in solution: no batch needed
        chosen = next((c for c in make_candidates(builtin, language, len(builtin)) if c[0] == a.stability_task), None)
        if chosen is None:
            raise SystemExit(f"--stability-task: no built-in {language} solution {a.stability_task!r}")
    else:  # the slowest correct candidate of the batch, preferring kernels >= 1 ms
        timed = [(r.candidate_ms, i) for i, r in enumerate(results) if r.status == "correct" and r.timing_ok]
        long_enough = [(ms, i) for ms, i in timed if ms >= 1.0] or timed
        if long_enough:
            chosen = candidates[max(long_enough)[1]]
    if a.stability_runs > 0 and chosen:
        task_id, ref, cand = chosen
        if a.stability_replace:
            old_text, new_text = a.stability_replace
            if old_text not in ref:
                raise SystemExit(f"--stability-replace: {old_text!r} is not in {task_id}'s reference")
            ref = ref.replace(old_text, new_text)
            task_id += f" ({new_text})"
        speedups, times, ref_times = [], [], []
        for _ in range(a.stability_runs):  # a fresh batch each: the reference is timed beside it again
            r = kernel_eval.evaluate(ref, cand, device=a.device, **over)
            speedups.append(r.speedup)
            times.append(r.candidate_ms)
            ref_times.append(r.ref_ms)
            print(f"  stability {task_id}: {r.status} speedup {r.speedup:.4f} (reference {r.ref_ms:.4g} ms, "
                  f"candidate {r.candidate_ms:.4g} ms)", flush=True)
            if a.blocks:
                print_blocks(r)
        stability = {"task": task_id, "candidate_ms": statistics.median(times), "speedups": speedups,
                     "spread": spread(speedups), "reference_ms": ref_times, "candidate_ms_runs": times,
                     "candidate_spread": spread(times), "reference_spread": spread(ref_times)}

    n = len(candidates)
    fig = {
        "device": a.device, "n_candidates": n, "n_correct": n_correct, "wall_s": wall,
        "per_min": n / wall * 60 if n else float("nan"), "p50_latency_s": percentile(own, 0.5),
        "p90_latency_s": percentile(own, 0.9), "p50_to_verdict_s": percentile(to_verdict, 0.5),
        "p50_compile_s": percentile(compile_s, 0.5), "p50_phase_s": phases,
        "baseline_n": len(base_rows), "baseline_wall_s": base_wall,
        "baseline_per_min": len(base_rows) / base_wall * 60 if base_wall else float("nan"),
        "baseline_p50_latency_s": percentile([r["seconds"] for r in base_rows], 0.5),
        "baseline_p90_latency_s": percentile([r["seconds"] for r in base_rows], 0.9),
        "baseline_p50_compile_s": percentile([r["compile_s"] for r in base_rows], 0.5),
        "baseline_correct": sum(r["status"] == "correct" for r in base_rows),
        "kernelbench_n": len(kb_rows), "kernelbench_wall_s": kb_wall, "kernelbench_build_s": kb_build,
        "kernelbench_per_min": len(kb_rows) / kb_wall * 60 if kb_wall else float("nan"),
        "kernelbench_correct": sum(r["status"] == "correct" for r in kb_rows),
        "kernelbench_p50_latency_s": percentile([r["latency_s"] for r in kb_rows], 0.5),
        "kernelbench_p90_latency_s": percentile([r["latency_s"] for r in kb_rows], 0.9),
        "kernelbench_p50_to_verdict_s": percentile([r["since_start_s"] for r in kb_rows], 0.5),
        "kernelbench_p50_compile_s": percentile([r["build_s"] for r in kb_rows], 0.5),
        "kernelbench_p50_process_s": percentile([r["process_s"] for r in kb_rows], 0.5),
        "kernelbench_processes": len({r["pid"] for r in kb_rows if r["pid"] is not None}),
        "pid": os.getpid(), "kernelbench_rows": kb_rows, "baseline_rows": base_rows,
        "stability": stability, "pair_ratios": pairs, "speedup_pair_ratios": speedup_pairs,
        "candidates": [{"task": t, "status": r.status, "speedup": r.speedup, "timing_ok": r.timing_ok,
                        "ref_ms": r.ref_ms, "candidate_ms": r.candidate_ms, "blocks": r.blocks, "seconds": r.seconds}
                       for (t, _, _), r in zip(candidates, results)],
    }
    ratio = fig["per_min"] / fig["baseline_per_min"] if base_rows and n else float("nan")
    kb_ratio = fig["per_min"] / fig["kernelbench_per_min"] if kb_rows and n else float("nan")
    print()
    tiers = ",".join(over["build"].cuda_header_tiers) or "as written"
    workers = (f"compile workers {'spawned' if a.no_compile_zygote else 'forked'}, "
               f"run workers {'spawned' if a.no_run_zygote else 'forked'}, "
               f"boundary {results[0].boundary if results else '-'}")
    print(f"| {a.device} ({f'headers: {tiers}, ' if language == 'cuda' else ''}{workers}) "
          "| kernel_eval | KernelBench-style (parallel builds, then a fresh process per candidate) | naive serial |")
    print("|---|---|---|---|")
    print(f"| candidates (distinct, cold) | {n} | {fig['kernelbench_n']} | {fig['baseline_n']} |")
    print(f"| correct | {n_correct}/{n} | {fig['kernelbench_correct']}/{fig['kernelbench_n']} | "
          f"{fig['baseline_correct']}/{fig['baseline_n']} |")
    print(f"| wall time (s) | {wall:.1f} | {kb_wall:.1f} (builds {kb_build:.1f}) | {base_wall:.1f} |")
    print(f"| unique candidates / minute | {fig['per_min']:.2f} | {fig['kernelbench_per_min']:.2f} | "
          f"{fig['baseline_per_min']:.2f} |")
    print(f"| kernel_eval's throughput over it | | {kb_ratio:.2f}x | {ratio:.2f}x |")
    print(f"| p50 latency, one candidate's compile start to verdict (s) | {fig['p50_latency_s']:.1f} | "
          f"{fig['kernelbench_p50_latency_s']:.1f} | {fig['baseline_p50_latency_s']:.1f} |")
    print(f"| p90 latency (s) | {fig['p90_latency_s']:.1f} | {fig['kernelbench_p90_latency_s']:.1f} | "
          f"{fig['baseline_p90_latency_s']:.1f} |")
    print(f"| p50 compile (s) | {fig['p50_compile_s']:.1f} | {fig['kernelbench_p50_compile_s']:.1f} | "
          f"{fig['baseline_p50_compile_s']:.1f} |")
    print(f"| p50 batch start to verdict (s) | {fig['p50_to_verdict_s']:.1f} | {fig['kernelbench_p50_to_verdict_s']:.1f} | |")
    print(f"| p50 evaluation process, spawn to verdict (s) | | {fig['kernelbench_p50_process_s']:.1f} | |")
    print(f"| processes that judged the candidates | | {fig['kernelbench_processes']} | "
          f"{'1 (this one)' if base_rows else ''} |")
    if pairs:
        print(f"| identical kernels' times apart, median / max of {len(pairs)} pairs | "
              f"{percentile(pairs, 0.5):.3f}x / {max(pairs):.3f}x | | |")
        print(f"| identical kernels' speedups apart, median / max of {len(speedup_pairs)} pairs | "
              f"{percentile(speedup_pairs, 0.5):.3f}x / {max(speedup_pairs):.3f}x | | |")
    print("| p50 per phase (s) | " + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()) + " | | |")
    print(f"\nthroughput ratio kernel_eval / KernelBench-style: {kb_ratio:.2f}x (goal >= 3); "
          f"/ naive serial: {ratio:.2f}x")
    if stability:
        print(f"stability: {stability['task']} ({stability['candidate_ms']:.3g} ms), speedup over "
              f"{len(stability['speedups'])} runs: {', '.join(f'{s:.4f}' for s in stability['speedups'])}; "
              f"spread (max-min)/median = {100 * stability['spread']:.2f}% (goal <= 3% on kernels >= 1 ms); "
              f"spread of the candidate's time {100 * stability['candidate_spread']:.2f}%, of the reference's "
              f"{100 * stability['reference_spread']:.2f}% (median {statistics.median(stability['reference_ms']):.3g} ms)")
    if a.json_out:
        tmp = a.json_out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(dict(fig, ratio=ratio, kernelbench_ratio=kb_ratio), f, indent=1)
        os.replace(tmp, a.json_out)


if __name__ == "__main__":
    main()
