"""kernel_eval: the reward harness. Compile a candidate kernel, run it isolated, check it, time it.

Everything the policy learns is what this file believes (Kevin-32B, KernelBench; Sakana's
AI CUDA Engineer and METR's o3 report show what a policy does with a harness that can be
fooled). The verdict for a candidate C against a reference R is

    correct  = for every trial t (>= 5, fresh inputs x_t from a secret seed):
               shape, dtype equal; no NaN/Inf where R has none; |C(x_t) - R(x_t)| <= atol + rtol|R(x_t)|
    speedup  = median_time(R) / median_time(C), R and C timed in turn in one window, if correct and
               the parent's own clock confirms the claimed times (paired_verdict), else 0

Usage
    python kernel_eval.py REF.py CANDIDATE.py --device cpu --json       # one verdict, exit 0
    evaluate(ref_src, cand_src, device="cuda")  /  evaluate_batch([(ref, cand), ...], device="cpu")

How one evaluation runs, and why
1. precheck (optional callable, e.g. rewards.check_format): a reason -> "format_error", no compile.
2. compile, in a fresh process (its own session; forked from a zygote that imported torch once per
   batch) that imports the candidate with `torch.utils.cpp_extension.load_inline` wrapped: the build
   directory is forced to cache_root/build/<sha256 of the call's sources, flags, torch, python,
   arch>, so two candidates that both name their extension `ext` never load each other's library
   and a repeated kernel is never rebuilt; C++ builds get `-O3` when they name no -O flag
   (load_inline alone builds at -O0), and, with `use_pch` on, torch's precompiled header when the
   flags are the defaults. TORCH_CUDA_ARCH_LIST is the device's own arch; CUDA is hidden from the
   compile worker. CUDA builds try the `cuda_header_tiers` first (default "slim": ATen's tensor
   class and lean copies of the headers of the ops the source names, instead of torch/extension.h,
   whose parsing is most of a build; ATen/cuda/CUDAContext.h cut to its device-property calls; the
   host unit's headers read from a precompiled header built once per cache, `host_pch`), then the
   source as written. Up to `max_parallel_compiles` builds run at once. Import errors that are
   not build errors are deferred to the run phase.
3. run. Each distinct reference in a batch gets one trusted reference session (a worker process
   running only the task's own code): it draws inputs from seeds only the parent knows (on the
   device when the task runs there: get_inputs under `with device`, on the CPU if that fails),
   shared by every candidate of that task in the batch, writes them to two memory files (memfd:
   correctness trials, timing sets) that the parent then seals read-only (F_SEAL_WRITE: no process,
   whatever its uid, can change them afterwards), keeps the reference outputs on the device, and
   is timed beside every candidate (4.). Each candidate
   runs in its own fresh worker, started (forked, like the reference's, from a run zygote that
   imported torch once per batch; its own CUDA context created, the op recorder's first use paid)
   while its kernel compiles. The candidate worker only ever receives inputs and
   writes outputs, as raw tensor bytes in a memory file of its own (no pickle; each call's outputs
   are written before the next call, so a buffer reused across calls is still checked per call);
   the parent seals that file and hands it to the reference session, which validates it and
   compares it with its own outputs on the device. Reference outputs never exist in a candidate's
   process, and no verdict is computed there. Outputs are poisoned where unwritten: on GPU, blocks
   of each output's size are filled with NaN and freed just before the call, so the caching
   allocator hands them to `torch.empty`; on CPU, MALLOC_PERTURB_ fills every fresh allocation with
   0x7f bytes (3.4e38 in fp32). Inputs are cloned per call and checked unchanged. During the check
   trials a TorchDispatchMode records the aten operators the forward runs (from Python or from
   inside the extension); a compute operator (mm, add, relu, conv, ...) makes the verdict
   "incorrect" however it was spelled. That recorder lives in the candidate's process, so it is
   defence in depth, not a boundary.
4. time, with the device to itself (checks share the device with each other, never with a timed
   run: _DeviceLock), the reference and the candidate in one window, on the same timing sets
   (`timing_input_sets` sets copied in turn into `timing_buffers` copies of the input buffers: where
   a tensor lands in device memory moved a kernel's time by up to ~18%, bench/placement.py, so a
   window averages over placements instead of carrying one), the same loop, the same flushes:
   both warm up (`gpu_warmup` calls, then rounds until `gpu_warmup_ms` have passed on the parent's
   clock: GPU clocks ramp up), then `timing_blocks` blocks a side in the order R C C R R C C R, each
   of at least trials / blocks calls and long enough (`gpu_block_ms`, sized on the reference) for
   the parent's clock to resolve a call; load, clock ramps and drift hit both sides. On GPU each
   call is preceded by an L2 flush and bracketed by CUDA events with a device-wide synchronize
   before the end event (side-stream work counts), so a short kernel's time is mostly the host's
   launch and synchronize: both timed workers move onto `timing_cpus` CPUs kept from the builds for
   their window (the speedups of identical kernels in a batch drew apart with the build load);
   on CPU each call is timed by the worker's CPU time (load does not
   inflate it; the parent reads the same clock of the worker's process tree). The timing sets reach
   the candidate only when timing starts, and its last output of each set is compared again, so
   caching outputs across calls fails. The parent times every block on its own clock; what the
   candidate's blocks took beyond its claimed times, per call, may exceed what the reference's
   took beyond its own (the loop's overhead) by rel x claimed + the window's resolution (the spread
   of the reference's overhead), no more, each side read from its less-stalled half of blocks (a
   descheduled process only lengthens a block); a kernel faster than that resolution is
   unconfirmable, and on GPU a reference slower beside the candidate than in its first block (work
   the candidate left queued) is paid at most `ref_slowdown_max` x that block (paired_verdict). A
   refused timing keeps "correct" but pays speedup 0.0, timing_ok False, candidate_ms the parent's
   estimate, and the message says why. Every speedup is finite (finite_speedup).
5. isolation: every worker runs under a small supervisor (a child subreaper) in its own session,
   which also stops it when the harness dies without cleaning up (the supervisor is reparented).
   Phase timeouts (compile, load, check, time) are enforced from the parent; on timeout, exit or
   crash the supervisor kills the worker's process group, then every orphan that was reparented to
   it (children that called setsid), and the parent finally sweeps /proc for processes carrying
   the evaluation's tag in their initial environment (a worker forked from a zygote has its tag
   written into that block in place, so its forks carry it too). stdout/stderr go to
   files; only a bounded tail is read. CPU workers get RLIMIT_AS; all workers get RLIMIT_FSIZE.
   Workers get an allowlisted environment (worker_env: compilers, torch, CUDA, kernel_eval's own),
   never the trainer's API keys; the supervisor's spec comes through a pipe, never argv (ps shows it).

Verdicts: format_error (precheck), compile_error (a compiler diagnostic, trimmed to its first
error lines), timeout (which phase), runtime_error (exception, crash signal, exit, malformed data
on the channel, resource limit), incorrect (wrong values/shape/dtype, NaN or Inf, inputs written,
a torch compute operator in forward, a wrong result from a timed call), correct, and
reference_error (the task's reference failed to load, run or give outputs: no verdict on the
candidate at all; never paid, and rollout drops the task). A timing
cross-check failure keeps "correct" (the outputs were right) but pays no speedup.

Shared state: torch keeps one precompiled header (.gch) per install; kernel_eval rebuilds it only
under an exclusive file lock and compiles under a shared one, and disables torch's habit of
deleting it on every build without use_pch. Compile results are cached per candidate hash
(a compiler diagnostic too, but not a killed compiler).

What this does not stop (the candidate runs with the harness's uid): reading or ptracing other
processes of that uid (the reference session's memory included), opening the timing inputs early
through /proc, writing files outside its scratch dir (e.g. into the build cache), a cache keyed on
sampled input values within the timing loop or any other way of skipping the work of timed calls
whose outputs are not compared (only each timing set's last output is; the timing loop runs in the
candidate's process, which can see which call that is), lower precision that stays within the tolerance, a
clock patched to under-report by less than the cross-check's allowance, or a timing loop patched to
skip its own flushes and refills (the overhead taken out is the reference's: a claim can be low by
that much), work left running on the GPU into the reference's blocks that slows them, paid up to
ref_slowdown_max, on CPU work handed to a process outside the worker's tree, and network access. Run
the harness as an unprivileged user in a container for a hard boundary.

Reading order: the configuration and the result; the verdict path (evaluate, evaluate_batch, and
per candidate _evaluate_one -> _run -> _paired_timing -> paired_verdict, compare_outputs); then
what it stands on: the parent side (reference sessions, workers, locks, compiles), helpers, the
framed channel, tensor memory files, process supervision, the zygotes, the worker side (what
runs in the candidate's and the reference's processes); the command line last.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import io
import json
import math
import os
import re
import secrets
import select
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

_perf_counter = time.perf_counter  # bound before any candidate code runs in a worker
_process_time = time.process_time  # CPU timing: this process's CPU time (all threads), not wall

STATUSES = ("format_error", "compile_error", "runtime_error", "timeout", "incorrect", "correct", "reference_error",
            "harness_error")
# reference_error: the task's reference failed to load, run or produce outputs. The task's fault,
# not the candidate's: a trainer drops the task's samples (rollout.py), eval.py reports the task.
# harness_error: no verdict: the harness could not give the candidate the memory its own judging
# needs (the task's copies do not fit the device even with nothing else on it). Neither the
# candidate's fault nor the task's: rollout leaves the sample out of training, eval.py counts it.
TAG_ENV = "KERNEL_EVAL_TAG"
POISON_MALLOC_PERTURB = "128"  # glibc fills fresh allocations with 128 ^ 0xff = 0x7f bytes

# The environment a worker gets: what the compilers, torch and CUDA need, and the harness's own
# variables; nothing else of the harness's (API keys and tokens of the trainer stay out of reach).
ENV_ALLOWED = frozenset("""PATH HOME USER LOGNAME LANG LANGUAGE TZ TMPDIR TMP TEMP LD_LIBRARY_PATH LIBRARY_PATH
CPATH C_INCLUDE_PATH CPLUS_INCLUDE_PATH PYTHONPATH VIRTUAL_ENV CC CXX CUDAHOSTCXX MAX_JOBS OMP_NUM_THREADS
MKL_NUM_THREADS XDG_CACHE_HOME""".split())
ENV_ALLOWED_PREFIXES = ("LC_", "CUDA_", "NVCC_", "NVIDIA_", "TORCH_", "TRITON_", "KERNEL_EVAL_")


def worker_env(extra: dict) -> dict:
    """The allowlisted part of this process's environment, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k in ENV_ALLOWED or k.startswith(ENV_ALLOWED_PREFIXES)}
    env.update(extra)
    return env


# aten ops a forward may run outside the extension: the `aten` column of the allowed rows of
# rewards.CALLS, the one table of what a candidate may call, which says why per row (compute
# happens in the kernel; allocation, views, transposes, copies, casts and sizes are glue). A copy,
# since kernel_eval does not import rewards; tests/test_rewards.py holds the two equal.
ALLOWED_ATEN_OPS = frozenset("""
empty empty_like empty_strided new_empty new_empty_strided new_zeros zeros zeros_like zero_ resize_
ones ones_like full full_like new_ones new_full fill_
view _unsafe_view reshape _reshape_alias view_as as_strided expand expand_as unsqueeze squeeze select
slice narrow detach alias split split_with_sizes unsafe_split chunk unbind flatten set_
t transpose permute
contiguous clone copy_
_to_copy to
_local_scalar_dense item is_nonzero is_same_size sym_size sym_stride sym_numel sym_storage_offset dim
size stride numel is_contiguous _has_compatible_shallow_copy_type
record_stream
""".split())


@dataclass
class EvalConfig:
    n_correct_trials: int = 5
    # a task too large to keep n_correct_trials input and output sets (plan_copies) keeps fewer, never
    # fewer than this: two trials on fresh inputs still catch a forward that replays an old output
    min_correct_trials: int = 2
    gpu_warmup: int = 10
    gpu_warmup_ms: float = 200.0  # and warm up for at least this long (clocks), outside the timed request
    gpu_trials: int = 100
    cpu_warmup: int = 1
    cpu_warmup_ms: float = 0.0
    cpu_trials: int = 5
    timing_input_sets: int = 2
    # copies of the input buffers the timed calls rotate through (each a place in memory), at most
    # timing_buffer_bytes of them in all; 1: one set of buffers, as KernelBench times
    timing_buffers: int = 4
    timing_buffer_bytes: int = 2 << 30
    # input sets at least this large are timed on one set in one buffer: rotation exists to keep a
    # small task's inputs out of the L2 cache and to average over placements; a set this many times
    # larger than L2 (50 MB on an H200) gains nothing from it and would only multiply the memory
    rotation_max_bytes: int = 256 << 20
    # memory-aware judging (plan_copies, MemoryBudget): the share of the device's free memory (of
    # the host's available memory on cpu, and for the input files on cuda) that the workers of a
    # batch may hold at once, after `context_bytes` for each live CUDA worker (its context and
    # allocator slack); None in memory_capacity_bytes: measured (device: the first worker's
    # cudaMemGetInfo; host: MemAvailable)
    memory_fraction: float = 0.85
    context_bytes: int = 1 << 30
    memory_capacity_bytes: int | None = None
    # (atol, rtol) per output dtype; KernelBench v0 and Kevin used 1e-2 in fp32.
    tolerances: dict = field(default_factory=lambda: {
        "float32": (1e-2, 1e-2), "float64": (1e-2, 1e-2), "float16": (1e-2, 1e-2),
        "bfloat16": (2e-2, 2e-2)})
    compile_timeout_s: float = 600.0
    load_timeout_s: float = 120.0  # boot + import (+ a lazy build not seen by the compile phase)
    check_timeout_s: float = 120.0
    time_timeout_s: float = 300.0
    cache_root: str = os.environ.get("KERNEL_EVAL_CACHE",
                                     os.path.join(os.path.expanduser("~"), ".cache", "kernel_eval"))
    scratch_root: str | None = None  # None: the system temp dir
    # None: default_parallel_compiles (every core on cpu; on cuda the CPUs not kept for timing / build_jobs)
    max_parallel_compiles: int | None = None
    # candidates whose worker may be alive at once (it boots while its kernel compiles or waits for
    # the device). None: two per parallel build on cuda, 1 on cpu (cores are shared)
    max_parallel_runs: int | None = None
    build_jobs: int = 2  # ninja jobs per build (MAX_JOBS); builds already run in parallel
    # fork workers from a process that imported torch (_Zygote) instead of spawning them: compile
    # workers, and run workers (the candidates' and the references')
    compile_zygote: bool = True
    run_zygote: bool = True
    compile_nice: int = 10  # builds yield the CPU to the run phase (file reads, copies, comparisons)
    default_cflags: tuple = ("-O3",)
    # torch's precompiled header is one file per torch install that any other load_inline user
    # deletes or rebuilds with other flags: turn on only where kernel_eval is the only builder
    use_pch: bool = False
    # header sets tried in order for CUDA builds before the source as written (HEADER_TIERS):
    # "slim" (ATen/core/Tensor.h plus the ops the source names), "light" (ATen/ATen.h); () = as written
    cuda_header_tiers: tuple = ("slim",)
    # the slim tier's host units read a precompiled header kept in cache_root (build_host_pch), built
    # from the first such build with the default flags; units with other flags parse the headers
    host_pch: bool = True
    cuda_arch: str | None = None  # None: the device's own, e.g. "9.0"
    op_check: bool = True
    time_candidate: bool = True
    cpu_threads: int | None = 1  # torch threads in CPU workers: C++ candidates are single-threaded,
    # and on a shared CI box several OpenMP threads per worker thrash; None: torch's default
    # CPU workers' RLIMIT_AS beyond what their task's planned copies take (plan_copies)
    cpu_memory_limit_gb: float = 16.0
    max_file_bytes: int = 256 << 20  # stdout + stderr kept per worker; a worker that writes more is killed
    max_build_file_bytes: int = 4 << 30  # compile workers write objects and torch's .gch header
    # a candidate's files (RLIMIT_FSIZE: its output memory files, its scratch): this, plus twice what
    # its task's reference outputs take (_ReferenceSession.output_limit)
    max_message_bytes: int = 1 << 30
    # paired timing (paired_verdict): blocks per side, each of >= trials / blocks calls and long
    # enough on the parent's clock (block_ms, from the reference's warm-up) to resolve a call
    timing_blocks: int = 4
    gpu_block_ms: float = 20.0
    cpu_block_ms: float = 50.0
    # cross-check, per call (paired_verdict): the parent's estimate <= (1 + rel) x claimed + noise x
    # (the spread of the reference blocks' less-stalled half of overheads) + abs, and > noise x spread + abs
    cross_check_rel: float = 0.5
    cross_check_noise: float = 1.0
    cross_check_abs_ms: float = 0.002
    cpu_cross_check_abs_ms: float = 0.02
    ref_slowdown_max: float = 1.5  # on GPU, the reference paid is at most this x its time in the window's first block
    # on GPU, CPUs kept for timing windows (the last this process may use): builds and checks run on
    # the others, and both timed workers move onto these for their window, so a timed call's launch
    # and synchronize never share a core with a compiler (PERFORMANCE.md: pair noise); 0: none kept.
    # Not used on cpu, nor when the process may use fewer than 4x this many CPUs.
    timing_cpus: int = 2
    l2_flush_bytes: int = 256 << 20
    message_chars: int = 1500
    keep_scratch: bool = False


@dataclass
class EvalResult:
    status: str
    compiled: bool = False
    correct: bool = False
    speedup: float = 0.0
    ref_ms: float = 0.0
    candidate_ms: float = 0.0
    message: str = ""
    timing_ok: bool = True
    claimed_ms: float = 0.0  # the candidate process's own median, before the cross-check
    wall_ms: float = 0.0  # the parent's clock over the timing request
    # the timing window as paired_verdict saw it, per side ("reference", "candidate") and block in
    # time order: [calls, median and mean claimed ms/call, parent's ms/call]; a diagnostic
    blocks: dict = field(default_factory=dict)
    ops: list = field(default_factory=list)  # aten compute ops seen in forward (when flagged)
    alone: bool = False  # judged again with the device to itself, after running out of memory beside others
    trials: int = 0  # correctness trials run (plan_copies: fewer than n_correct_trials for a large task)
    seconds: dict = field(default_factory=dict)  # per phase

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------- the verdict path
# evaluate_batch compiles every candidate, then judges each in its own fresh process: _evaluate_one ->
# _run (load, check against the reference session, time in one window with the reference) ->
# paired_verdict. What each step relies on (workers, channels, memory files, locks) comes after.

def evaluate(ref_src: str, candidate_src: str, *, device: str = "cuda", precheck=None, **cfg) -> EvalResult:
    """One verdict; see the module docstring for the phases."""
    return evaluate_batch([(ref_src, candidate_src)], device=device, precheck=precheck, **cfg)[0]


def evaluate_batch(pairs: list, *, device: str = "cuda", precheck=None, progress: bool = False, **cfg) -> list:
    """Verdicts for (reference_src, candidate_src) pairs: parallel compiles, checks sharing the
    device, one timed run on it at a time.

    Each candidate's worker process starts (imports torch, creates its CUDA context) while its
    kernel compiles; each distinct reference gets one trusted session for the whole batch."""
    config = cfg.pop("config", None) or EvalConfig(**cfg)
    _STOPPING.clear()  # an earlier batch of this process was interrupted; this one may start workers
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    unknown = [t for t in config.cuda_header_tiers if t not in HEADER_TIERS]
    if unknown or isinstance(config.cuda_header_tiers, str):
        raise ValueError(f"cuda_header_tiers must be a tuple of {HEADER_TIERS}, got {config.cuda_header_tiers!r}")
    batch_start = time.monotonic()
    arch = _device_arch(device, config)
    results: list = [None] * len(pairs)
    todo = []
    for i, (ref_src, cand_src) in enumerate(pairs):
        reason = precheck(cand_src) if precheck else None
        if reason:
            results[i] = EvalResult(status="format_error", message=_cut(str(reason), config.message_chars))
        else:
            todo.append(i)
    if not todo:
        return results
    n_compiles = config.max_parallel_compiles or default_parallel_compiles(device, config)
    compile_pool = ThreadPoolExecutor(max_workers=max(1, n_compiles))
    zygotes = _Zygotes()  # each starts with the first worker of its environment
    n_runs = config.max_parallel_runs or (1 if device == "cpu" else 2 * n_compiles)
    run_pool = ThreadPoolExecutor(max_workers=max(1, n_runs))
    sessions: dict = {}
    # the live CUDA workers the budget leaves room for: every run job's candidate, and a reference
    # session per distinct task, up to as many again
    budget = MemoryBudget(config, live_workers=n_runs + min(n_runs, len({pairs[i][0] for i in todo})))
    for i in todo:
        ref_src = pairs[i][0]
        if ref_src not in sessions:
            sessions[ref_src] = _ReferenceSession(ref_src, device, arch, config, users=0, zygotes=zygotes,
                                                  budget=budget)
        sessions[ref_src].users += 1
    finished = False
    try:
        compiles: dict = {}
        for i in todo:  # identical candidates share one compile
            src = pairs[i][1]
            if src not in compiles:
                compiles[src] = compile_pool.submit(_compile, src, device, arch, config, zygotes)
        _judge_all(pairs, todo, results, compiles, sessions, run_pool, device, arch, config, progress, batch_start,
                   zygotes, budget)
        finished = True
    finally:
        if not finished:  # Ctrl-C or an error here: stop every process now, wait for no phase
            _stop_everything(zygotes)
        run_pool.shutdown(wait=finished, cancel_futures=not finished)
        compile_pool.shutdown(wait=finished, cancel_futures=not finished)
        if finished:
            for session in sessions.values():
                session.close()
            zygotes.close()
    return results


def _judge_all(pairs, todo, results, compiles, sessions, run_pool, device, arch, config, progress, batch_start,
               zygotes, budget):
    """Run every candidate's job (spawn, wait for its compile, judge) on `run_pool`; fill `results`."""

    def judge(session, cand_src, compiling, alone: bool) -> EvalResult:
        """One attempt: the task's plan (its reference booted while the kernel compiles), the
        candidate's worker with limits from that plan, then the verdict inside a memory admission."""
        scratch, cand, plan, failure = _scratch(config, "kevalrun-"), None, None, None
        try:
            if not (compiling.done() and compiling.result()["status"] in ("compile_error", "timeout")):
                try:
                    plan = session.plan()  # a failed compile needs no reference
                    cand = _spawn("cand", cand_src, device, arch, config, scratch, zygotes, plan=plan)
                except _Failure as f:
                    failure = f
            record = compiling.result()
            return _evaluate_one(session, cand, device, config, record, plan, failure,
                                 lambda: budget.admit(session, plan, exclusive=alone))
        finally:
            if cand is not None:
                cand.stop()
            if not config.keep_scratch:
                shutil.rmtree(scratch, ignore_errors=True)

    def job(i):
        t0 = time.monotonic()
        ref_src, cand_src = pairs[i]
        session, compiling = sessions[ref_src], compiles[cand_src]
        try:
            res = judge(session, cand_src, compiling, alone=False)
            if res.status in ("runtime_error", "reference_error") and _capacity_failure(res.message):
                # out of memory beside the batch's other workers is the harness's doing: judge again
                # with the device to itself; what fails then is the candidate's (or the task's), unless
                # the harness's own copies of the task do not fit
                session.retry()
                res = judge(session, cand_src, compiling, alone=True)
                res.alone = True
                plan = (plan_copies(session.footprint, config, budget.capacity, cuda=device != "cpu")
                        if session.footprint is not None and budget.capacity else None)
                if (res.status == "runtime_error" and _capacity_failure(res.message) and plan
                        and any(plan["session"][k] + plan["candidate"][k] > budget.capacity[k] for k in plan["session"])):
                    res.status = "harness_error"
                    res.message = ("no verdict: judging this task needs more memory than there is "
                                   f"({_gib(plan['session'])} GiB for the reference's session and "
                                   f"{_gib(plan['candidate'])} GiB for the candidate, capacity "
                                   f"{_gib(budget.capacity)} GiB): " + res.message)
        finally:
            session.release()
        record = compiling.result()
        # latency: from this candidate's compile start (or its job's start, when cached) to verdict
        res.seconds["latency"] = time.monotonic() - record.get("started", t0)
        res.seconds["since_batch_start"] = time.monotonic() - batch_start
        return res

    futures = {run_pool.submit(job, i): i for i in todo}
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(futures), desc="kernel_eval")
    try:
        for fut in futures:
            results[futures[fut]] = fut.result()
            if bar:
                bar.update(1)
    finally:
        if bar:
            bar.close()


def _evaluate_one(session, cand, device, cfg, compile_record, plan, failure, admission) -> EvalResult:
    """The verdict of a compiled candidate: `failure` (its task's reference failed), or _run inside
    `admission()` (the memory budget's)."""
    result = EvalResult(status="runtime_error")
    result.seconds["compile"] = compile_record.get("seconds", 0.0)
    if not compile_record.get("cached"):
        for k, v in (compile_record.get("profile") or {}).items():
            result.seconds["compile." + k] = v
    if compile_record["status"] == "compile_error":
        result.status, result.message = "compile_error", "compilation failed:\n" + compile_record["message"]
        return result
    if compile_record["status"] == "timeout":
        result.status, result.message = "timeout", compile_record["message"]
        return result
    # cached records from before "builds" was kept count as built
    result.compiled = compile_record["status"] == "ok" and compile_record.get("builds", 1) > 0
    try:
        if failure:
            raise failure
        with admission():
            _run(session, cand, device, cfg, result, plan)
        result.compiled = True
        result.status = "correct" if result.correct else "incorrect"
        if result.correct and not result.message:
            result.message = "correct (not timed)"
    except _Failure as f:
        result.status, result.message, result.correct, result.speedup = f.status, f.message, False, 0.0
    if result.status != "correct":
        result.speedup, result.correct = 0.0, False
    result.message = _cut(result.message, cfg.message_chars)
    return result


def _run(session: _ReferenceSession, cand: Worker, device: str, cfg: EvalConfig, result: EvalResult,
         plan: dict) -> None:
    t0 = time.monotonic()
    boot, _ = _ask(cand, "candidate", "load", cfg.load_timeout_s, {})  # booted (usually long ago: with the compile)
    if isinstance(boot.get("boot_cpu_s"), (int, float)):
        result.seconds["boot_cpu"] = float(boot["boot_cpu_s"])
    _ask(cand, "candidate", "load", cfg.load_timeout_s, {"cmd": "load"})
    result.seconds["load"] = time.monotonic() - t0
    t_wait = time.monotonic()
    with _DeviceLock(cfg.cache_root, device, exclusive=False):  # correctness: checks share the device
        result.seconds["device_wait"] = time.monotonic() - t_wait
        t1 = time.monotonic()
        session.ready()
        result.seconds["reference"] = time.monotonic() - t1

        t2 = time.monotonic()
        _ask(cand, "candidate", "init", cfg.load_timeout_s, {"cmd": "init", "seed": session.init_seed}, session.init_bytes)
        check_limit = session.output_limit("check")
        out_fd = _memfd("kernel_eval-candidate-outputs")
        try:
            reply, _ = _ask(cand, "candidate", "check", cfg.check_timeout_s,
                            {"cmd": "run", "op_check": cfg.op_check, "poison_bytes": session.out_bytes["check"][0]},
                            fds=(session.files["check"], out_fd))
            _seal_output(out_fd, check_limit)
            ops, changed = reply.get("ops", []), reply.get("changed")
            if (not isinstance(ops, list) or not all(isinstance(o, str) for o in ops)
                    or not isinstance(changed, list) or len(changed) != len(session.out_bytes["check"])
                    or not all(isinstance(c, list) for c in changed)):
                raise _Failure("runtime_error", "candidate sent a malformed reply on the result channel")
            flagged = flag_ops(ops) if cfg.op_check else []
            if flagged:
                result.ops = flagged
                raise _Failure("incorrect", "forward ran torch compute operators instead of your kernel: "
                               + ", ".join(flagged[:8]) + ". Do the computation in the compiled extension.")
            result.trials = len(changed)
            reason = session.judge(out_fd, "check", check_limit)
        finally:
            os.close(out_fd)
        result.seconds["check"] = time.monotonic() - t2
        if reason:
            raise _Failure("incorrect", reason)
        for t, c in enumerate(changed):
            if c:
                raise _Failure("incorrect", f"trial {t + 1}: forward modified its input(s) {_cut(str(c), 40)} in place")
        result.correct = True
    if not cfg.time_candidate:
        return
    t_wait = time.monotonic()
    time_limit = session.output_limit("time")
    out_fd = _memfd("kernel_eval-candidate-timed-outputs")
    try:
        with _DeviceLock(cfg.cache_root, device, exclusive=True):  # timing: the device alone
            result.seconds["device_wait"] += time.monotonic() - t_wait
            t3 = time.monotonic()
            deadline = time.monotonic() + cfg.time_timeout_s
            ref_blocks, cand_blocks = _paired_timing(
                lambda msg, fds=(): session.ask_time(msg, fds, deadline),
                lambda msg, fds=(): _ask(cand, "candidate", "time", cfg.time_timeout_s, msg, fds=fds, deadline=deadline)[0],
                lambda: {"ref": session.worker.proc.pid, "cand": cand.proc.pid}, session.files["time"], device, cfg, deadline,
                plan["buffers"])
            _ask(cand, "candidate", "time", cfg.time_timeout_s, {"cmd": "time_outputs"}, fds=(out_fd,), deadline=deadline)
        _seal_output(out_fd, time_limit)
        with _DeviceLock(cfg.cache_root, device, exclusive=False):
            reason = session.judge(out_fd, "time", time_limit)
    finally:
        os.close(out_fd)
    result.seconds["time"] = time.monotonic() - t3
    if reason:
        result.correct = False
        raise _Failure("incorrect", f"a timed call gave a wrong result: {reason}")
    verdict = paired_verdict(ref_blocks, cand_blocks, cfg, cpu=device == "cpu")
    result.ref_ms, result.claimed_ms, result.speedup = verdict["ref_ms"], verdict["claimed_ms"], verdict["speedup"]
    result.wall_ms = sum(wall for _, wall in cand_blocks)
    result.blocks = {side: [[len(times), statistics.median(times), statistics.fmean(times), ms / len(times)]
                            for times, ms in side_blocks]
                     for side, side_blocks in (("reference", ref_blocks), ("candidate", cand_blocks))}
    if verdict["problem"]:
        result.timing_ok, result.speedup = False, 0.0
        result.candidate_ms = verdict["parent_ms"]
        result.message = verdict["problem"] + "; speedup not rewarded"
    else:
        result.candidate_ms = verdict["claimed_ms"]
        result.message = (f"correct; {result.ref_ms:.4g} ms reference vs {result.candidate_ms:.4g} ms "
                          f"candidate ({result.speedup:.3g}x), timed in turn in one window"
                          + (f" ({verdict['note']})" if verdict["note"] else ""))


def _paired_timing(ref_ask, cand_ask, pids, time_file: int, device: str, cfg: EvalConfig,
                   deadline: float, buffers: int) -> tuple:
    """(reference blocks, candidate blocks), each (claimed per-call times, the parent's ms), timed in
    one window in the order R C C R R C C R ... (linear drift cancels) on the same input sets, the
    same loop and the same flushes. `*_ask(msg, fds)` sends one request to that side's worker;
    `pids()`: each side's supervisor, whose process tree's CPU time is the parent's clock on CPU."""
    warmup, trials, warmup_ms = _timing_counts(device, cfg)
    for ask in (ref_ask, cand_ask):  # inputs onto the device and `warmup` calls, off the clock
        ask({"cmd": "time_prepare", "warmup": warmup, "l2_flush_bytes": cfg.l2_flush_bytes,
             "buffers": buffers, "buffer_bytes": cfg.timing_buffer_bytes,
             "cpus": _cpu_split(device == "cpu", cfg)[1]}, (time_file,))
    # GPU clocks ramp up over ~0.1 s: warm up both sides, in turn, until `warmup_ms` have passed on
    # this process's clock (a worker's own clock is the candidate's to patch)
    warm_start = time.monotonic()
    while (time.monotonic() - warm_start) * 1e3 < warmup_ms:
        ref_ask({"cmd": "warm", "calls": max(1, warmup)})
        cand_ask({"cmd": "warm", "calls": max(1, warmup)})
    # calls per block, doubled until one reference request lasts block_ms on this clock: the request's
    # own jitter is then small per call; sized on the reference alone (a candidate must not choose
    # its own resolution)
    block_ms, calls = (cfg.cpu_block_ms if device == "cpu" else cfg.gpu_block_ms), 1
    while True:
        t = time.monotonic()
        ref_ask({"cmd": "warm", "calls": calls})
        if (time.monotonic() - t) * 1e3 >= block_ms or time.monotonic() > deadline:
            break
        calls *= 2
    calls = max(calls, math.ceil(trials / cfg.timing_blocks))
    blocks = {"ref": [], "cand": []}
    trees = {side: _descendants(pid) for side, pid in pids().items()} if device == "cpu" else {}
    for b in range(2 * cfg.timing_blocks):
        side = "ref" if b % 4 in (0, 3) else "cand"
        t, cpu0 = time.monotonic(), _cpu_ms(trees.get(side, []))
        times = (ref_ask if side == "ref" else cand_ask)({"cmd": "time", "trials": calls}).get("times")
        wall = (time.monotonic() - t) * 1e3
        if trees:  # the CPU clock the worker times itself by, of its whole tree; a process that exits
            cpu1 = _cpu_ms(trees[side])  # takes its CPU time with it: counted as none (refused)
            wall = cpu1 - cpu0 if cpu1 is not None and cpu0 is not None else 0.0
        if (not isinstance(times, list) or len(times) != calls  # and no int that float() cannot hold
                or not all(isinstance(x, float) or type(x) is int and abs(x) < 1e300 for x in times)):
            raise _Failure("runtime_error", "candidate returned a malformed timing reply")
        blocks[side].append(([float(x) for x in times], wall))
        if time.monotonic() > deadline:
            raise _Failure("timeout", f"timing took longer than {cfg.time_timeout_s:.0f} s")
    return blocks["ref"], blocks["cand"]


def paired_verdict(ref_blocks: list, cand_blocks: list, cfg: EvalConfig, cpu: bool = False) -> dict:
    """The speedup from reference and candidate blocks timed in one window, each block (claimed
    per-call times, the parent's ms over the block: wall on GPU; on CPU the CPU time of the worker's
    process tree, the clock CPU workers time calls by, which load does not inflate): {"speedup",
    "ref_ms" (the reference's time paid), "claimed_ms", "parent_ms", "problem", "note"}. Per call
    (the same loop runs on both sides):

        speedup    = median(reference times) / median(candidate times)   (the reference's capped on GPU)
        overhead   = parent's ms / calls - mean(reference times), per reference block (refills,
                     flushes, syncs, the request: trusted, it runs the task's own code)
        parent_ms  = low(candidate blocks' parent's ms / calls) - low(overheads)
        resolution = noise x (low(overheads) - min(overheads)) + abs
        low        = the lower median (the 2nd smallest of 4 blocks)

    A stall (a worker or the parent's timing thread descheduled, another harness thread holding the
    GIL) only lengthens a block, so each side is read from its less-stalled half: up to half of
    either side's blocks may be stalled without changing the verdict. A lie is not a stall: a
    block's wall time is never less than the work the candidate did in it.
        paid iff parent_ms <= (1 + rel) x median(candidate times) + resolution   (else its clock lies)
             and parent_ms > resolution                      (else the parent cannot confirm it)

    On GPU the reference paid is at most ref_slowdown_max x the median of its first block, timed
    before any candidate block: GPU work the candidate left queued slows the reference beside it and
    would inflate the speedup. An honest kernel's window shows the same when a multi-op reference's
    host launch level switches mid-window (PERFORMANCE.md), so the excess is not paid rather than
    the whole speedup refused. On CPU the reference's CPU time is not slowed by other processes'
    work."""
    ref_times = [t for times, _ in ref_blocks for t in times]
    cand_times = [t for times, _ in cand_blocks for t in times]
    out = {"speedup": 0.0, "ref_ms": statistics.median(ref_times), "claimed_ms": 0.0, "parent_ms": 0.0,
           "problem": None, "note": None}
    if not cand_times or not all(math.isfinite(t) and t > 0 for t in cand_times):
        out["problem"] = "timing cross-check failed: the candidate's clock reported non-positive or non-finite times"
        return out
    overheads = [ms / len(times) - statistics.fmean(times) for times, ms in ref_blocks]
    claimed = out["claimed_ms"] = statistics.median(cand_times)
    overhead = statistics.median_low(overheads)
    parent = statistics.median_low([ms / len(times) for times, ms in cand_blocks]) - overhead
    out["parent_ms"] = max(parent, 0.0)
    resolution = cfg.cross_check_noise * (overhead - min(overheads)) + (
        cfg.cpu_cross_check_abs_ms if cpu else cfg.cross_check_abs_ms)
    if not parent <= (1 + cfg.cross_check_rel) * claimed + resolution:
        out["problem"] = (f"timing cross-check failed: claimed {claimed:.4g} ms/call but the harness's clock saw "
                          f"{parent:.4g} ms/call (the reference's loop overhead taken out)")
    elif not parent > resolution:
        out["problem"] = (f"timing cross-check failed: {claimed:.4g} ms/call is faster than the harness's clock "
                          f"resolves in this window ({resolution:.2g} ms/call): speedup unconfirmable")
    else:
        first = statistics.median(ref_blocks[0][0])  # timed before any candidate block
        if not cpu and out["ref_ms"] > cfg.ref_slowdown_max * first:
            out["note"] = (f"the reference ran {out['ref_ms'] / first:.3g}x slower beside the candidate than "
                           f"before it: paid against {cfg.ref_slowdown_max:g}x its time before it")
            out["ref_ms"] = cfg.ref_slowdown_max * first
        out["speedup"], out["problem"] = finite_speedup(out["ref_ms"], claimed)
    return out


def finite_speedup(ref_ms: float, candidate_ms: float) -> tuple:
    """(ref_ms / candidate_ms, None), or (0.0, reason) when either time or their ratio is not a
    positive finite number: a claimed 5e-324 ms is positive and finite, its speedup is not."""
    for who, ms in (("reference", ref_ms), ("candidate", candidate_ms)):
        if not (isinstance(ms, (int, float)) and math.isfinite(ms) and ms > 0):
            return 0.0, f"timing cross-check failed: the {who}'s time ({ms!r} ms) is not a positive finite number"
    ratio = ref_ms / candidate_ms
    if not math.isfinite(ratio):
        return 0.0, f"timing cross-check failed: a claimed {candidate_ms:.3g} ms/call gives no finite speedup"
    return ratio, None


def compare_outputs(ref: list, cand, tolerances: dict) -> str | None:
    """None if `cand` (CPU tensors) matches `ref` (tensors on any device; compared there), else a
    short reason."""
    import torch
    if not isinstance(cand, (list, tuple)) or len(cand) != len(ref):
        got = len(cand) if isinstance(cand, (list, tuple)) else type(cand).__name__
        return f"expected {len(ref)} output tensor(s), got {got}"
    for k, (r, c) in enumerate(zip(ref, cand)):
        name = f"output {k}" if len(ref) > 1 else "output"
        if not isinstance(c, torch.Tensor):
            return f"{name} is {type(c).__name__}, expected a tensor"
        if c.device.type != "cpu" or c.layout != torch.strided or type(c) is not torch.Tensor:
            return f"{name} is not a plain dense tensor"
        if tuple(c.shape) != tuple(r.shape):
            return f"{name} shape {tuple(c.shape)}, expected {tuple(r.shape)}"
        if c.dtype != r.dtype:
            return f"{name} dtype {str(c.dtype).replace('torch.', '')}, expected {str(r.dtype).replace('torch.', '')}"
        c = c.to(r.device)
        if not r.is_floating_point() and not r.is_complex():
            if not torch.equal(c, r):
                return f"{name}: {(c != r).sum().item()} of {r.numel()} values differ"
            continue
        reason = _compare_floats(r, c, name, tolerance_for(str(r.dtype).replace("torch.", ""), tolerances))
        if reason:
            return reason
    return None


COMPARE_CHUNK = 1 << 24  # elements per step: bounded temporaries, whatever the output's size


def _compare_floats(r, c, name: str, tol: tuple) -> str | None:
    """|c - r| <= atol + rtol |r| wherever r is finite, and c non-finite exactly where r is (same
    values); in float32 (float64 for float64), chunk by chunk."""
    import torch
    atol, rtol = tol
    if r.is_complex():
        r, c = torch.view_as_real(r), torch.view_as_real(c)
    work = torch.float64 if r.dtype == torch.float64 else torch.float32
    rf, cf = r.reshape(-1), c.reshape(-1)
    zero = torch.zeros((), dtype=torch.int64, device=r.device)
    extra, extra_nan, outside, nonfinite_differ = zero.clone(), zero.clone(), zero.clone(), zero.clone()
    max_diff = torch.zeros((), dtype=work, device=r.device)
    for i in range(0, rf.numel(), COMPARE_CHUNK):
        rr, cc = rf[i: i + COMPARE_CHUNK].to(work), cf[i: i + COMPARE_CHUNK].to(work)
        diff = (cc - rr).abs_()
        within = diff <= rr.abs().mul_(rtol).add_(atol)
        if bool(within.all()):
            continue  # the usual chunk: every value within tolerance (a NaN anywhere fails this)
        r_fin, c_fin = torch.isfinite(rr), torch.isfinite(cc)
        new_bad = r_fin & ~c_fin  # unwritten memory shows up as NaN (poison) here
        extra += new_bad.sum()
        extra_nan += (new_bad & torch.isnan(cc)).sum()
        r_bad = ~r_fin
        nonfinite_differ += (r_bad & (cc.nan_to_num() != rr.nan_to_num())).sum()
        bad = r_fin & c_fin & ~within
        outside += bad.sum()
        max_diff = torch.maximum(max_diff, torch.where(bad, diff, 0).max())
    n = r.numel()
    if extra.item():
        kind = "NaN" if extra_nan.item() else "Inf"
        return f"{name} has {kind} at {extra.item()} of {n} positions (unwritten memory?)"
    if nonfinite_differ.item():
        return f"{name}: non-finite values differ from the reference"
    if outside.item():
        return (f"{name}: {outside.item()} of {n} values outside tolerance "
                f"(atol={atol}, rtol={rtol}); max abs diff {max_diff.item():.4g}")
    return None


def tolerance_for(dtype_name: str, tolerances: dict) -> tuple:
    return tolerances.get(dtype_name, tolerances.get("float32", (1e-2, 1e-2)))


def flag_ops(ops: list) -> list:
    """The compute operators among recorded aten op names ('aten::add' etc.)."""
    flagged = []
    for op in ops:
        ns, _, base = op.partition("::")
        if ns == "aten" and base not in ALLOWED_ATEN_OPS and base.rstrip("_") not in ALLOWED_ATEN_OPS:
            flagged.append(op)
    return sorted(set(flagged))


class _Failure(Exception):
    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status, self.message = status, message


def _reference_failure(f: _Failure) -> _Failure:
    """The trusted reference failed (load, init, inputs, outputs, its timed calls): the task's
    fault, whatever the candidate is, so no candidate is judged (or paid 0) for it. Caveat: the
    candidate runs with the harness's uid and could kill the reference worker during timing; that
    buys it no reward (reference_error pays nothing) but does cancel its task's group."""
    if f.status == "reference_error":
        return f
    return _Failure("reference_error", f"the task's fault, not the candidate's: {f.message}")


# ----------------------------------------------------------------------------- parent side
# reference sessions, spawning and asking workers, paired timing's clock, device locks, compiles

@dataclass
class Footprint:
    """What judging one task takes, learned from its reference's first run (the probe, alone on
    the device): one input set, one output set, and the forward's peak allocation (its outputs and
    temporaries), in bytes."""
    set_bytes: int
    out_bytes: int
    peak_bytes: int


def plan_copies(fp: Footprint, cfg: EvalConfig, capacity: dict, cuda: bool) -> dict:
    """How many copies judging this task keeps, and the bytes its workers then hold.

    Copies exist for reasons that fade with size: several correctness trials catch a forward that
    replays an old output (two do that; more only sample more values, and a large output is many
    values already); several timing sets and buffers keep a small task's inputs out of L2 and
    average over placements (useless for a set far larger than L2). So a task keeps
    n_correct_trials trials while they take at most a quarter of the memory there is (never fewer
    than min_correct_trials), and rotates timing sets and buffers only below rotation_max_bytes.

    Bytes, per pool ("device": the GPU on cuda; "host": input and output memory files, and
    everything on cpu):
        timing state = (n_time + buffers) x set + peak + n_time x out + L2 flush    (either side)
        session      = (n_check + n_time) x out + timing state    on the device (reference outputs)
                       (n_check + n_time) x set                   on the host (input files)
        candidate    = max(2 x set + 2 x out + peak, timing state) on the device (a check call:
                       pristine and cloned inputs, poisoned output blocks, the forward)
                       max(n_check, n_time) x out                 on the host (its output file)"""
    s, o, p = fp.set_bytes, fp.out_bytes, max(fp.peak_bytes, fp.out_bytes)
    rotate = s < cfg.rotation_max_bytes
    n_time = cfg.timing_input_sets if rotate else 1
    buffers = max(1, min(cfg.timing_buffers, cfg.timing_buffer_bytes // s if s else cfg.timing_buffers)) if rotate else 1
    keep = min(capacity.values()) // 4
    n_check = max(cfg.min_correct_trials, min(cfg.n_correct_trials, keep // max(1, s + o)))
    timing = (n_time + buffers) * s + p + n_time * o + (cfg.l2_flush_bytes if cuda else 0)
    session = {"device": (n_check + n_time) * o + timing, "host": (n_check + n_time) * s}
    candidate = {"device": max(2 * s + 2 * o + p, timing), "host": max(n_check, n_time) * o}
    if not cuda:  # one pool: the workers' tensors live beside the memory files
        session = {"host": session["device"] + session["host"]}
        candidate = {"host": candidate["device"] + candidate["host"]}
    return {"n_check": n_check, "n_time": n_time, "buffers": buffers, "session": session, "candidate": candidate}


class MemoryBudget:
    """The memory the workers of one batch may hold at once, per pool (see plan_copies): a job is
    admitted when its candidate's bytes, and its reference session's if that is not resident yet,
    fit beside what the admitted jobs and resident sessions hold. A session stays resident between
    its candidates (its outputs are the comparison); when a job does not fit, sessions with no
    admitted job are evicted (their worker stopped; the next job regenerates on the same seeds). A
    job that fits nowhere runs once nothing else is admitted (alone), and an exclusive job (a
    probe, a retry after running out of memory) waits for that and evicts every other session.
    Capacity is set once per batch from the first measurement (set_capacity)."""

    def __init__(self, cfg: EvalConfig, live_workers: int):
        self.cfg, self.live_workers = cfg, live_workers
        self.capacity: dict | None = None
        self.cond = threading.Condition()
        self.held = {"device": 0, "host": 0}
        self.resident: dict = {}  # session -> its reserved bytes
        self.jobs: dict = {}  # session -> its admitted jobs
        self.exclusive_waiting = 0
        self.exclusive_running = False

    def set_capacity(self, device_free: int | None) -> None:
        """From the first worker's report (cuda: cudaMemGetInfo's free bytes) and MemAvailable."""
        with self.cond:
            if self.capacity is not None:
                return
            cfg = self.cfg
            host = _mem_available()
            if cfg.memory_capacity_bytes is not None:
                self.capacity = {"device": cfg.memory_capacity_bytes, "host": cfg.memory_capacity_bytes}
                return
            self.capacity = {"host": int(host * cfg.memory_fraction)}
            if device_free is not None:
                self.capacity["device"] = max(
                    0, int(device_free * cfg.memory_fraction) - self.live_workers * cfg.context_bytes)
            else:
                self.capacity["device"] = self.capacity["host"]

    def _fits(self, need: dict) -> bool:
        return all(self.held[k] + need.get(k, 0) <= self.capacity[k] for k in self.capacity)

    def _idle(self, keep) -> list:
        return [s for s in self.resident if s is not keep and not self.jobs.get(s)]

    @contextlib.contextmanager
    def admit(self, session, plan: dict | None, exclusive: bool = False):
        """Hold the job's bytes (plan["candidate"], and plan["session"] unless resident) while inside;
        `exclusive`: with no other job admitted and no other session resident."""
        need = dict(plan["candidate"]) if plan else {}
        admitted = False
        with self.cond:
            self.exclusive_waiting += exclusive
        try:
            while True:
                with self.cond:
                    mine = dict(need)
                    reserve = plan is not None and session not in self.resident
                    if reserve:
                        for k, v in plan["session"].items():
                            mine[k] = mine.get(k, 0) + v
                    alone = not any(self.jobs.values()) and not self.exclusive_running
                    victims = self._idle(session)
                    if exclusive:
                        ok = alone and not victims
                    else:
                        ok = (not self.exclusive_waiting and not self.exclusive_running
                              and (self._fits(mine) or alone and not victims))
                    if ok:
                        if reserve:
                            self.resident[session] = dict(plan["session"])
                        for k, v in mine.items():
                            self.held[k] = self.held.get(k, 0) + v
                        self.jobs[session] = self.jobs.get(session, 0) + 1
                        if exclusive:
                            self.exclusive_waiting -= 1
                            self.exclusive_running = True
                        admitted = True
                        break
                    if exclusive and not alone or not exclusive and (self.exclusive_waiting or self.exclusive_running):
                        victims = []  # wait for the jobs to end first (an exclusive job goes first)
                    if not victims:
                        self.cond.wait(timeout=1.0)
                        continue
                for victim in victims:  # outside the condition: a session's stop takes its own lock
                    victim.evict()
            yield
        finally:
            with self.cond:
                if admitted:
                    self.jobs[session] -= 1
                    for k, v in need.items():
                        self.held[k] -= v
                    if exclusive:
                        self.exclusive_running = False
                elif exclusive:
                    self.exclusive_waiting -= 1
                self.cond.notify_all()

    def forget(self, session) -> None:
        """The session's worker stopped: its bytes are free."""
        with self.cond:
            for k, v in self.resident.pop(session, {}).items():
                self.held[k] -= v
            self.cond.notify_all()


def _gib(pools: dict) -> str:
    return "/".join(f"{v / (1 << 30):.1f}" for v in pools.values())


def _mem_available() -> int:
    """The host's MemAvailable, in bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


CAPACITY_FAILURE = re.compile(r"out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation|"
                              r"Cannot allocate memory|MemoryError|std::bad_alloc|cudaErrorDevicesUnavailable|"
                              r"busy or unavailable|killed by SIGKILL", re.IGNORECASE)


def _capacity_failure(message: str) -> bool:
    """A failure that running out of memory (or of CUDA contexts) explains: retried alone."""
    return bool(CAPACITY_FAILURE.search(message or ""))


class _ReferenceSession:
    """The trusted side of every evaluation of one reference within a batch: one worker that holds
    the reference model, draws the batch's inputs from seeds only the parent knows (shared by all
    candidates of the task, so a group is judged on the same inputs), writes them to two sealed
    memory files (correctness trials, timing sets), keeps the reference outputs on the device, is
    timed beside each candidate (_paired_timing), and compares candidates' outputs with its own. Reference outputs never
    leave this process. A worker that dies (say on a candidate's malformed output file) is started
    again on the same seeds; a reference that fails on its own fails every candidate of the task.

    Locks: `lock` serialises requests; callers that need the device take the device lock first."""

    def __init__(self, ref_src: str, device: str, arch: str, cfg: EvalConfig, users: int,
                 zygotes: _Zygotes | None = None, budget: MemoryBudget | None = None):
        self.ref_src, self.device, self.arch, self.cfg, self.zygotes = ref_src, device, arch, cfg, zygotes
        self.budget = budget or MemoryBudget(cfg, live_workers=2)
        self.users = users
        self.lock = threading.Lock()
        self.seeds = {"check": [secrets.randbits(62) for _ in range(cfg.n_correct_trials)],
                      "time": [secrets.randbits(62) for _ in range(cfg.timing_input_sets)]}
        self.init_seed = secrets.randbits(31)
        self.worker = self.scratch = None
        self.files = {}  # part -> sealed memory file of input sets
        self.generated = False
        self.failure: _Failure | None = None
        self.init_bytes = b""
        self.out_bytes = {}  # part -> per input set, the byte size of each reference output
        import torch
        self.footprint_path = os.path.join(cfg.cache_root, "footprints", source_hash(
            "footprint", ref_src, device == "cpu", arch, torch.__version__)[:32] + ".json")
        known = _read_json(self.footprint_path)
        self.footprint = Footprint(**known) if isinstance(known, dict) and set(known) == {
            "set_bytes", "out_bytes", "peak_bytes"} and all(isinstance(v, int) for v in known.values()) else None

    def boot(self) -> None:
        """Start the worker, load and build the reference model (no device lock needed)."""
        with self.lock:
            self._boot()

    def _boot(self) -> None:
        if self.failure or self.worker is not None:
            return
        cfg = self.cfg
        self.scratch = _scratch(cfg, "kevalref-")
        self.worker = _spawn("ref", self.ref_src, self.device, self.arch, cfg, self.scratch, self.zygotes)
        try:
            ready, _ = _ask(self.worker, "reference", "load", cfg.load_timeout_s, {})
            free = ready.get("device_free")
            self.budget.set_capacity(free if isinstance(free, int) else None)
            _ask(self.worker, "reference", "load", cfg.load_timeout_s, {"cmd": "load"})
            _, self.init_bytes = _ask(self.worker, "reference", "init", cfg.load_timeout_s,
                                      {"cmd": "init", "seed": self.init_seed})
        except _Failure as f:
            self.failure = _reference_failure(f)
            self._stop()

    def plan(self) -> dict:
        """plan_copies for this task; the first time the task is seen, its reference runs once
        alone on the device to measure it (the probe), and the footprint is cached on disk."""
        with self.lock:
            self._boot()
            if self.failure:
                raise self.failure
        if self.footprint is None:
            with self.budget.admit(self, None, exclusive=True), self.lock:
                self._probe()
        return plan_copies(self.footprint, self.cfg, self.budget.capacity, cuda=self.device != "cpu")

    def _probe(self) -> None:
        if self.footprint is not None:
            return
        self._boot()
        if self.failure:
            raise self.failure
        try:
            reply, _ = _ask(self.worker, "reference", "check", self.cfg.check_timeout_s,
                            {"cmd": "probe", "seed": secrets.randbits(62)})
        except _Failure as f:
            self.failure = _reference_failure(f)
            self._stop()
            raise self.failure from None
        self.footprint = Footprint(*(int(reply[k]) for k in ("set_bytes", "out_bytes", "peak_bytes")))
        _atomic_write_json(self.footprint_path, dataclasses.asdict(self.footprint))

    def ready(self) -> None:
        """Inputs written and sealed, reference outputs held. Hold the device lock (shared) and an
        admission of the memory budget."""
        with self.lock:
            self._ready()

    def _ready(self) -> None:
        self._boot()
        if self.failure:
            raise self.failure
        if not self.generated:
            cfg = self.cfg
            self._probe()
            plan = plan_copies(self.footprint, cfg, self.budget.capacity, cuda=self.device != "cpu")
            try:
                self.files = {part: _memfd(f"kernel_eval-{part}-inputs") for part in ("check", "time")}
                seeds = {"check": self.seeds["check"][:plan["n_check"]], "time": self.seeds["time"][:plan["n_time"]]}
                reply, _ = _ask(self.worker, "reference", "check", cfg.check_timeout_s,
                                {"cmd": "gen", "seeds": seeds}, fds=(self.files["check"], self.files["time"]))
                for fd in self.files.values():
                    _seal(fd)
                self.out_bytes = reply["out_bytes"]
                self.generated = True
            except _Failure as f:
                self.failure = _reference_failure(f)
                self._stop()
                raise self.failure from None

    def evict(self) -> None:
        """Stop the worker to free its memory (no job of this task is admitted); the next job
        starts it again and regenerates on the same seeds."""
        with self.lock:
            self._stop()

    def retry(self) -> None:
        """Forget a failure that running out of memory beside other workers explains."""
        with self.lock:
            if self.failure and _capacity_failure(self.failure.message):
                self.failure = None
                self._stop()

    def ask_time(self, msg: dict, fds: tuple = (), deadline: float | None = None) -> dict:
        """One timing request (time_prepare, warm, time) to the reference worker; a failure fails
        every candidate of the task. Hold the device lock (exclusive)."""
        with self.lock:
            self._ready()  # a judge may have stopped the worker since: back on the same seeds
            try:
                return _ask(self.worker, "reference", "time", self.cfg.time_timeout_s, msg, fds=fds, deadline=deadline)[0]
            except _Failure as f:
                self.failure = _reference_failure(f)
                self._stop()
                raise self.failure from None

    def output_limit(self, part: str) -> int:
        """Bytes a candidate's output file may hold: what the reference's outputs take, twice, with
        room for the file's own overhead."""
        total = sum(sum(sizes) for sizes in self.out_bytes[part])
        return 2 * total + (16 << 20)

    def judge(self, out_fd: int, part: str, max_bytes: int) -> str | None:
        """The first difference between the candidate's output file and the reference outputs, or
        None. An unreadable file, or one that kills this worker, is the candidate's runtime_error."""
        cfg = self.cfg
        with self.lock:
            if self.failure or not self.generated:
                raise _Failure("runtime_error", "internal: the reference session is not ready")
            try:
                reply, _ = _ask(self.worker, "reference", "judge", cfg.check_timeout_s,
                                {"cmd": "judge", "part": part, "max_bytes": max_bytes,
                                 "tolerances": cfg.tolerances}, fds=(out_fd,))
            except _Failure as f:
                self._stop()  # the next candidate gets a fresh worker on the same seeds
                self.generated = False
                raise _Failure("runtime_error", "the candidate's outputs could not be compared (they "
                               f"stopped the harness's reader: {_cut(f.message, 200)})") from None
            if reply.get("unreadable"):
                raise _Failure("runtime_error", f"candidate returned unreadable outputs: {reply['unreadable']}")
            return reply.get("reason")

    def _stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            self.worker = None
        self.generated = False
        self.budget.forget(self)
        for fd in self.files.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.files = {}
        if self.scratch and not self.cfg.keep_scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
        self.scratch = None

    def release(self) -> None:
        """One candidate of this reference is done; the last one stops the worker."""
        with self.lock:
            self.users -= 1
            if self.users <= 0:
                self._stop()

    def close(self) -> None:
        with self.lock:
            self._stop()


def _spawn(mode: str, src: str, device: str, arch: str, cfg: EvalConfig, scratch: str,
           zygotes: _Zygotes | None = None, plan: dict | None = None) -> Worker:
    """A reference or candidate worker, forked from the run zygote when cfg.run_zygote. Limits
    follow the task: a candidate's files may hold twice its task's outputs beyond
    max_message_bytes, its address space (cpu) twice its plan's bytes beyond cpu_memory_limit_gb;
    the reference (the task's own code, trusted) writes the input files and is not limited."""
    import resource
    path = os.path.join(scratch, mode, f"{mode}.py")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write(src)
    if mode == "ref":
        fsize, as_bytes = resource.RLIM_INFINITY, 0
    else:
        task_bytes = sum(plan["candidate"].values()) + sum(plan["session"].values()) if plan else 0
        fsize = cfg.max_message_bytes + 2 * (plan["candidate"]["host"] if plan else 0)
        as_bytes = int(cfg.cpu_memory_limit_gb * (1 << 30)) + 2 * task_bytes
    worker = Worker(mode, _worker_args(path, device, cfg, arch), os.path.dirname(path),
                    _build_env(device, arch, cfg, compiling=False), cfg, cpu=device == "cpu",
                    zygotes=zygotes if cfg.run_zygote else None, fsize=fsize, as_bytes=as_bytes)
    # replies are small (tensors go through memory files); the trusted reference also sends init inputs
    worker.channel.max_bytes = 1 << 30 if mode == "ref" else 16 << 20
    return worker


def _ask(worker: Worker, who: str, phase: str, timeout_s: float, msg: dict, payload: bytes = b"",
         deadline: float | None = None, fds: tuple = ()) -> tuple:
    """Send a command (and file descriptors), wait for the reply with the same nonce; failures
    become _Failure. With an empty `msg`, wait for the worker's next message (its boot)."""
    deadline = deadline or time.monotonic() + timeout_s
    nonce = secrets.token_hex(8)
    try:
        if msg:
            if fds:
                worker.send_fds(list(fds))
            worker.channel.send(dict(msg, nonce=nonce, fds=len(fds)), payload, deadline)
        while True:
            reply, data = worker.channel.recv(deadline)
            if "error" in reply:
                raise _Failure("runtime_error", f"{who} failed during {phase}: {reply['error']}")
            if not msg or reply.get("nonce") == nonce:
                return reply, data
    except ChannelTimeout as e:
        raise _Failure("timeout", f"{who} timed out during {phase} (limit {timeout_s:.0f} s)") from e
    except ChannelError as e:
        if str(e) != "closed":
            raise _Failure("runtime_error", f"{who} wrote malformed data on the result channel during {phase} ({e})") from e
        raise _Failure("runtime_error", f"{who} {worker.death_reason(phase)}") from e


def _cpu_split(cpu: bool, cfg: EvalConfig) -> tuple:
    """(CPUs for builds and checks, CPUs for timing windows), or (None, None): no split (cpu, none
    kept, or fewer than 4 x timing_cpus CPUs: builds keep at least three quarters of them)."""
    allowed = sorted(os.sched_getaffinity(0))
    if cpu or cfg.timing_cpus <= 0 or len(allowed) < 4 * cfg.timing_cpus:
        return None, None
    return allowed[:-cfg.timing_cpus], allowed[-cfg.timing_cpus:]


def default_parallel_compiles(device: str, cfg: EvalConfig) -> int:
    """Builds at once when max_parallel_compiles is None. On cpu every core (one C++ unit per build).
    On cuda the CPUs not kept for timing windows / build_jobs (7 on a 16-core H200): a build is a
    .cu unit and a host unit side by side. With run workers forked from a zygote (they no longer
    import torch on a build's core), 7 builds finished a 32-candidate batch in 86-89 s against
    115-117 s at 4, while one candidate's p50 latency went from 15 s to 23-25 s (PERFORMANCE.md);
    rollout waits for a turn's whole batch, so the batch's time is the one that counts."""
    build_cpus, _ = _cpu_split(device == "cpu", cfg)
    cores = len(build_cpus) if build_cpus else len(os.sched_getaffinity(0))
    return cores if device == "cpu" else max(1, cores // max(1, cfg.build_jobs))


def _timing_counts(device: str, cfg: EvalConfig) -> tuple:
    """(warm-up calls, timed calls, least warm-up ms)"""
    return ((cfg.cpu_warmup, cfg.cpu_trials, cfg.cpu_warmup_ms) if device == "cpu"
            else (cfg.gpu_warmup, cfg.gpu_trials, cfg.gpu_warmup_ms))


def _cpu_ms(pids: list) -> float | None:
    """CPU time (all threads) of the processes, summed; None if one has exited."""
    try:  # clock id of a process's CPU clock: MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
        return sum(time.clock_gettime(((~pid) << 3) | 2) for pid in pids) * 1e3
    except OSError:
        return None


def _seal_output(fd: int, max_bytes: int) -> None:
    try:
        _seal(fd)
    except OSError as e:
        raise _Failure("runtime_error", "candidate kept its output file mapped writable") from e
    size = os.fstat(fd).st_size
    if size > max_bytes:
        raise _Failure("runtime_error", f"candidate wrote {size} bytes of outputs (limit {max_bytes})")


def _compile(candidate_src: str, device: str, arch: str, cfg: EvalConfig,
             zygotes: _Zygotes | None = None) -> dict:
    """{"status": "ok" | "compile_error" | "timeout" | "deferred", "message", "seconds"}"""
    import torch
    key = source_hash("compile", candidate_src, device == "cpu", arch, torch.__version__,
                      list(cfg.default_cflags), cfg.use_pch, list(cfg.cuda_header_tiers), cfg.host_pch)
    record_path = os.path.join(cfg.cache_root, "compiled", key[:32] + ".json")
    cached = _read_json(record_path)
    if cached and cached.get("status") in ("ok", "compile_error"):
        return dict(cached, seconds=0.0, cached=True, started=time.monotonic())
    t0 = time.monotonic()
    scratch = _scratch(cfg, "kevalbuild-")
    src_path = os.path.join(scratch, "candidate.py")
    with open(src_path, "w") as f:
        f.write(candidate_src)
    worker = Worker("compile", _worker_args(src_path, device, cfg, arch), os.path.join(scratch, "w"),
                    _build_env(device, arch, cfg, compiling=True), cfg, cpu=device == "cpu",
                    fsize=cfg.max_build_file_bytes, nice=cfg.compile_nice,
                    zygotes=zygotes if cfg.compile_zygote else None)
    try:
        msg, _ = worker.channel.recv(time.monotonic() + cfg.compile_timeout_s)
        if msg.get("ok"):
            # which header tier the last CUDA build used (None: as written, or no CUDA build); the
            # worker's profile (import torch, load_inline's builds, the rest) is diagnostics only
            profile = msg.get("profile") if isinstance(msg.get("profile"), dict) else {}
            record = {"status": "ok", "message": "", "header_tier": msg.get("header_tier"),
                      "builds": int(msg.get("builds") or 0),  # 0: nothing was compiled (e.g. an empty file)
                      "torch_preloaded": msg.get("torch_preloaded") is True,
                      "profile": {k: float(v) for k, v in profile.items() if isinstance(v, (int, float))}}
        elif msg.get("kind") == "build":
            record = {"status": "compile_error", "message": _cut(str(msg.get("message", "")), cfg.message_chars)}
        else:
            record = {"status": "deferred", "message": str(msg.get("message", ""))}
    except ChannelTimeout:
        record = {"status": "timeout", "message": f"compile timed out after {cfg.compile_timeout_s:.0f} s"}
    except ChannelError:
        record = {"status": "deferred", "message": worker.death_reason("compile")}
    finally:
        worker.stop()
        if not cfg.keep_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    # a compiler diagnostic is a property of the source; a killed compiler or a full disk is not
    deterministic = record["status"] == "ok" or (
        record["status"] == "compile_error" and "error:" in record["message"]
        and not re.search(r"Killed|internal compiler error|No space left|\.gch|signal", record["message"]))
    if deterministic:
        _atomic_write_json(record_path, record)
    return dict(record, seconds=time.monotonic() - t0, cached=False, started=t0)



_device_locks: dict = {}
_device_locks_guard = threading.Lock()


class _DeviceLock:
    """Device work across threads and processes (an flock on a file per device): a timed run holds
    the device alone (exclusive); correctness checks share it with each other, never with a timed
    run. A thread waiting for the exclusive lock holds `gate`, so new checks queue behind it."""

    def __init__(self, cache_root: str, device: str, exclusive: bool = True):
        with _device_locks_guard:
            self.gate = _device_locks.setdefault(device, threading.Lock())
        os.makedirs(os.path.join(cache_root, "locks"), exist_ok=True)
        name = "cpu" if device == "cpu" else "cuda" + _visible_device(device)
        self.path = os.path.join(cache_root, "locks", f"device-{name}.lock")
        self.exclusive = exclusive

    def __enter__(self):
        self.file = open(self.path, "w")  # its own open file: flock locks of two opens conflict
        with self.gate:
            if self.exclusive:
                fcntl.flock(self.file, fcntl.LOCK_EX)
        if not self.exclusive:
            fcntl.flock(self.file, fcntl.LOCK_SH)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def _atomic_write_text(path: str, text: str) -> None:
    """Written whole (replace), so a concurrent reader never sees half of it."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _atomic_write_json(path: str, obj) -> None:
    _atomic_write_text(path, json.dumps(obj))


def _read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _device_arch(device: str, cfg: EvalConfig) -> str:
    if device == "cpu":
        return ""
    if cfg.cuda_arch:
        return cfg.cuda_arch
    import torch
    idx = torch.device(device).index or 0
    major, minor = torch.cuda.get_device_capability(idx)
    return f"{major}.{minor}"


def _visible_device(device: str) -> str:
    import torch
    idx = torch.device(device).index or 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        return ids[idx] if idx < len(ids) else str(idx)
    return str(idx)


def _worker_args(src_path: str, device: str, cfg: EvalConfig, arch: str) -> list:
    args = ["--source", src_path, "--device", "cuda" if device != "cpu" else "cpu",
            "--cache-root", cfg.cache_root, "--arch", arch,
            "--cflags", json.dumps(list(cfg.default_cflags)), "--use-pch", str(int(cfg.use_pch)),
            "--cuda-header-tiers", ",".join(cfg.cuda_header_tiers), "--host-pch", str(int(cfg.host_pch))]
    if cfg.cpu_threads and device == "cpu":
        args += ["--threads", str(cfg.cpu_threads)]
    return args


def _build_env(device: str, arch: str, cfg: EvalConfig, compiling: bool) -> dict:
    env = {"MAX_JOBS": str(cfg.build_jobs), "TORCH_EXTENSIONS_DIR": os.path.join(cfg.cache_root, "build")}
    if device == "cpu" or compiling:
        env["CUDA_VISIBLE_DEVICES"] = ""
        # tensors up to 32 MiB (glibc's most) from the heap, and up to 256 MiB of freed heap kept: else
        # a call's large tensors are fresh pages, and its CPU time page faults that vary with the load
        env.update(MALLOC_MMAP_THRESHOLD_=str(32 << 20), MALLOC_TRIM_THRESHOLD_=str(256 << 20))
    else:
        env["CUDA_VISIBLE_DEVICES"] = _visible_device(device)
    if arch:
        env["TORCH_CUDA_ARCH_LIST"] = arch
    return env


def _scratch(cfg: EvalConfig, prefix: str) -> str:
    root = cfg.scratch_root or tempfile.gettempdir()
    os.makedirs(root, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=root)


# ----------------------------------------------------------------------------- pure helpers

def source_hash(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\0")
    return h.hexdigest()


_ERROR_LINE = re.compile(r"(error|Error|ERROR|undefined reference|fatal)")


def trim_error(text: str, max_lines: int = 12, max_chars: int = 1500) -> str:
    """The first useful lines of a compiler/traceback dump, for the model's feedback."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    lines = [re.sub(r"/\S*/(build|torch_extensions|kevalrun-[^/]*)/\S*?/", "", ln) for ln in lines]
    lines = [ln for ln in lines if not ln.startswith(("ninja: build stopped", "[", "FAILED:"))
             and "c++ -MMD" not in ln and "nvcc --generate" not in ln and " -c " not in ln[:200]]
    picked, seen = [], set()
    for i, ln in enumerate(lines):
        if _ERROR_LINE.search(ln):
            for j in range(max(0, i - 1), min(len(lines), i + 3)):
                if j not in seen:
                    seen.add(j)
                    picked.append(lines[j])
        if len(picked) >= max_lines:
            break
    if not picked:
        picked = lines[-max_lines:]
    out = "\n".join(picked[:max_lines])
    return out if len(out) <= max_chars else out[: max_chars - 3] + "..."


# a compiler's position in a generated source: gcc "/x/main.cpp:12:5:", nvcc "/x/cuda.cu(12):"
# (load_inline's generated files only: a line of torch's headers is never the candidate's)
_DIAGNOSTIC_AT = re.compile(r"(/[^\s:()]+/(main\.cpp|cuda\.cu))(?::(\d+)(?::(\d+))?|\((\d+)\))")


def point_at_source(diagnostics: str, py_src: str) -> str:
    """Compiler diagnostics with positions in load_inline's generated files (main.cpp, cuda.cu:
    headers, then the C++/CUDA strings, then bindings) rewritten to the candidate's .py lines:
    "main.cpp:12:5: error" -> "line 40 (main.cpp:12:5): error". A generated line is found in the
    .py by its text and its neighbours (a string literal is copied verbatim); a line not found
    (a string built at run time, the harness's own headers) keeps the generated file's name."""
    py = [ln.rstrip() for ln in py_src.splitlines()]
    cache: dict = {}

    def where(path: str, name: str, line: int, col: str | None) -> str:
        if path not in cache:
            try:
                with open(path, errors="replace") as f:
                    cache[path] = [ln.rstrip() for ln in f.read().splitlines()]
            except OSError:
                cache[path] = None
        generated, at = cache[path], f"{name}:{line}" + (f":{col}" if col else "")
        if not generated or not 0 < line <= len(generated) or not generated[line - 1].strip():
            return at
        best, best_score, tie = None, -1, False
        for k, text in enumerate(py):
            if text != generated[line - 1]:
                continue
            score = sum(1 for d in range(-3, 4) if 0 <= k + d < len(py) and 0 < line + d <= len(generated)
                        and py[k + d] == generated[line - 1 + d])
            best, best_score, tie = (k, score, False) if score > best_score else (best, best_score, tie or score == best_score)
        return at if best is None or tie else f"line {best + 1} ({at})"

    moved = {}  # generated line -> .py line, for gcc's quoted source lines ("    4 |   return y;")

    def rewrite(m: re.Match) -> str:
        line = int(m.group(3) or m.group(5))
        at = where(m.group(1), m.group(2), line, m.group(4))
        if at.startswith("line "):
            moved[line] = int(at.split()[1])
        return at

    def quoted(m: re.Match) -> str:
        line = int(m.group(2))
        return f"{m.group(1)}{moved[line]:>{len(m.group(2))}} |" if line in moved else m.group(0)

    out = [_DIAGNOSTIC_AT.sub(rewrite, ln) if "/" in ln else ln for ln in diagnostics.splitlines()]
    return "\n".join(re.sub(r"^(\s*)(\d+) \|", quoted, ln) for ln in out)


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


# ----------------------------------------------------------------------------- framed channel

class ChannelError(RuntimeError):
    pass


class ChannelTimeout(ChannelError):
    pass


def _tensors_to_bytes(obj) -> bytes:
    import torch
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _bytes_to_tensors(data: bytes):
    import torch
    return torch.load(io.BytesIO(data), weights_only=True)


HEADER_MAX_BYTES = 16 << 20


class Channel:
    """JSON header line, then `nbytes` raw bytes; parent side with deadlines and size limits."""

    def __init__(self, read_fd: int, write_fd: int, max_bytes: int):
        self.read_fd, self.write_fd, self.max_bytes = read_fd, write_fd, max_bytes
        self.buf = bytearray()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)

    def _fill(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ChannelTimeout("deadline")
        ready, _, _ = select.select([self.read_fd], [], [], left)
        if not ready:
            raise ChannelTimeout("deadline")
        try:
            chunk = os.read(self.read_fd, 1 << 20)
        except BlockingIOError:
            return
        if not chunk:
            raise ChannelError("closed")
        self.buf += chunk

    def recv(self, deadline: float) -> tuple:
        while b"\n" not in self.buf:
            # a timing reply's header holds one float per call: tens of thousands for a microsecond kernel
            if len(self.buf) > HEADER_MAX_BYTES:
                raise ChannelError("malformed header")
            self._fill(deadline)
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        try:
            msg = json.loads(line)
        except ValueError as e:
            raise ChannelError(f"malformed header: {_cut(repr(line), 60)}") from e
        if not isinstance(msg, dict):
            raise ChannelError("malformed header")
        n = msg.get("nbytes", 0)
        if not isinstance(n, int) or n < 0 or n > self.max_bytes:
            raise ChannelError(f"payload of {n} bytes refused")
        while len(self.buf) < n:
            self._fill(deadline)
        payload = bytes(self.buf[:n])
        del self.buf[:n]
        return msg, payload

    def send(self, msg: dict, payload: bytes = b"", deadline: float | None = None) -> None:
        data = json.dumps(dict(msg, nbytes=len(payload))).encode() + b"\n" + payload
        view, sent = memoryview(data), 0
        while sent < len(data):
            left = (deadline or time.monotonic() + 60) - time.monotonic()
            if left <= 0:
                raise ChannelTimeout("deadline")
            _, ready, _ = select.select([], [self.write_fd], [], left)
            if not ready:
                raise ChannelTimeout("deadline")
            try:
                sent += os.write(self.write_fd, view[sent: sent + (1 << 20)])
            except BlockingIOError:
                continue
            except BrokenPipeError as e:
                raise ChannelError("closed") from e


# ----------------------------------------------------------------------------- tensor files
# Bulk tensors (inputs, reference and candidate outputs: hundreds of MB per call on real tasks) do
# not go through the pipe. They go through memory files (memfd): raw tensor bytes at 64-byte
# aligned offsets, then a JSON index, its length and a magic tag. Readers map the file and view the
# bytes in place (no copy, no pickle), and validate every offset, size and dtype first: a candidate
# writes its own output file and may put anything in it. Input files are sealed read-only
# (F_SEAL_WRITE) by the parent once written, so one copy serves every candidate of a task and no
# candidate can change what a later one is given. Files are handed to workers over a Unix socket.

TENSOR_FILE_MAGIC = b"KEVALTS1"
TENSOR_FILE_DTYPES = ("float32", "float64", "float16", "bfloat16", "complex64", "complex128",
                      "int8", "int16", "int32", "int64", "uint8", "bool")
TENSOR_FILE_ALIGN = 64
TRUSTED_FILE_MAX_BYTES = 1 << 46  # input files: written by the reference session, sealed by the parent


def _write_all(fd: int, data) -> None:
    view, sent = memoryview(data).cast("B"), 0
    while sent < len(view):
        sent += os.write(fd, view[sent: sent + (1 << 30)])


class TensorFileWriter:
    """Writes sets of tensors (or JSON values such as ints) to an empty file, one set at a time, in
    the layout read_tensor_sets reads. Device tensors go through a small pinned buffer: a pageable
    device-to-host copy into fresh memory is several times slower."""

    STAGING_BYTES = 64 << 20

    def __init__(self, fd: int):
        self.fd, self.pos, self.index, self.staging = fd, 0, [], None

    def add(self, values: list) -> None:
        import torch
        entries = []
        for v in values:
            if not isinstance(v, torch.Tensor):
                json.dumps(v)  # a value the index cannot hold fails here, loudly
                entries.append({"value": v})
                continue
            t = v.detach()
            t = t.contiguous() if t.device.type == "cuda" else t.to("cpu").contiguous()
            pad = -self.pos % TENSOR_FILE_ALIGN
            _write_all(self.fd, bytes(pad))
            self.pos += pad
            nbytes = t.nbytes
            if nbytes:
                flat = t.reshape(-1).view(torch.uint8)
                if t.device.type == "cuda":
                    if self.staging is None:
                        self.staging = torch.empty(self.STAGING_BYTES, dtype=torch.uint8, pin_memory=True)
                    for i in range(0, nbytes, self.STAGING_BYTES):
                        n = min(self.STAGING_BYTES, nbytes - i)
                        self.staging[:n].copy_(flat[i: i + n])
                        _write_all(self.fd, self.staging[:n].numpy())
                else:
                    _write_all(self.fd, flat.numpy())
            entries.append({"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
                            "offset": self.pos, "nbytes": nbytes})
            self.pos += nbytes
        self.index.append(entries)

    def close(self) -> None:
        footer = json.dumps({"sets": self.index}).encode()
        _write_all(self.fd, footer + len(footer).to_bytes(8, "little") + TENSOR_FILE_MAGIC)
        self.staging = None


def write_tensor_sets(fd: int, sets: list) -> None:
    """Write lists of tensors (or JSON values) to an empty file, streaming."""
    writer = TensorFileWriter(fd)
    for values in sets:
        writer.add(values)
    writer.close()


def read_tensor_sets(fd: int, max_bytes: int) -> list:
    """The sets a tensor file holds, as CPU tensors viewing the mapped file (read-only: copy to
    write). Raises ValueError on anything malformed."""
    import mmap
    import warnings
    import torch
    size = os.fstat(fd).st_size
    if size < 16 or size > max_bytes:
        raise ValueError(f"tensor file of {size} bytes (limit {max_bytes})")
    # MAP_POPULATE: fault the pages in at once (one syscall) rather than one by one on first touch
    mapped = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=mmap.PROT_READ)
    if mapped[size - 8:] != TENSOR_FILE_MAGIC:
        raise ValueError("not a tensor file")
    n = int.from_bytes(mapped[size - 16: size - 8], "little")
    data_end = size - 16 - n
    if not 0 < n <= min(size - 16, 1 << 26):
        raise ValueError("bad index length")
    try:
        index = json.loads(mapped[data_end: size - 16])
    except ValueError as e:
        raise ValueError("unreadable index") from e
    sets = index.get("sets") if isinstance(index, dict) else None
    if not isinstance(sets, list) or not all(isinstance(s, list) for s in sets):
        raise ValueError("bad index")
    out = []
    for entries in sets:
        values = []
        for e in entries:
            if not isinstance(e, dict):
                raise ValueError("bad index entry")
            if "value" in e:
                values.append(e["value"])
                continue
            dtype, shape, offset, nbytes = e.get("dtype"), e.get("shape"), e.get("offset"), e.get("nbytes")
            if (dtype not in TENSOR_FILE_DTYPES or not isinstance(shape, list) or len(shape) > 16
                    or not all(isinstance(d, int) and 0 <= d < 1 << 40 for d in shape)
                    or not isinstance(offset, int) or not isinstance(nbytes, int)
                    or offset < 0 or offset % TENSOR_FILE_ALIGN or offset + nbytes > data_end):
                raise ValueError("bad tensor entry")
            dt = getattr(torch, dtype)
            if nbytes != math.prod(shape) * dt.itemsize:
                raise ValueError("tensor size does not match its shape")
            if nbytes == 0:
                values.append(torch.empty(shape, dtype=dt))
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "non-writable buffer": readers copy before writing
                flat = torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes, offset=offset)
            values.append(flat.view(dt).view(shape))
        out.append(values)
    return out


def _memfd(name: str) -> int:
    return os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)


def _seal(fd: int) -> None:
    """Make a memory file immutable for every holder; fails (EBUSY) while anyone maps it writable."""
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)


def _child_send(fd: int, msg: dict, payload: bytes = b"") -> None:
    _write_all(fd, json.dumps(dict(msg, nbytes=len(payload))).encode() + b"\n" + payload)


def _child_recv(f) -> tuple:
    line = f.readline()
    if not line:
        raise EOFError("parent closed the channel")
    msg = json.loads(line)
    payload = f.read(msg.get("nbytes", 0))
    return msg, payload


# ----------------------------------------------------------------------------- processes

def _kill_tree_by_tag(tag: str) -> int:
    """SIGKILL every process whose initial environment carries the tag; returns how many."""
    needle = f"{TAG_ENV}={tag}".encode()
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
    return killed


def _parent_map() -> dict:
    """pid -> its children's pids, from /proc."""
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError):
            with open(f"/proc/{entry}/stat") as f:
                parents.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    return parents


def _children_of(pid: int) -> list:
    return _parent_map().get(pid, [])


def _descendants(pid: int) -> list:
    parents, tree, todo = _parent_map(), [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        tree, todo = tree + kids, todo + kids
    return tree


def _reap_children() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _worker_argv(spec: dict) -> list:
    cmd_fd, reply_fd, sock_fd = spec["fds"]
    return (["--_worker", spec["mode"], "--cmd-fd", str(cmd_fd), "--reply-fd", str(reply_fd),
             "--fd-sock", str(sock_fd)] + spec["args"])


class _PidWatch:
    """Waits for a process through a pidfd: a child of ours (reap: its exit status is collected),
    or a supervisor forked by a zygote (not ours to reap; its exit reads as 0, and the
    worker's own exit code is in the supervisor's code file either way)."""

    def __init__(self, pid: int, reap: bool):
        self.pid, self.reap, self.returncode = pid, reap, None
        self.fd = os.pidfd_open(pid)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self.fd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            code = 0
            if self.reap:
                try:
                    code = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
                except ChildProcessError:  # reaped by a waitpid(-1) sweep
                    code = -signal.SIGKILL
            self.returncode = code
            os.close(self.fd)
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None


def _fork_worker(spec: dict, out_w: int, err_w: int, limits) -> _PidWatch:
    """The worker as a fork of this (zygote-forked, torch already imported) supervisor: the same
    process an exec of `kernel_eval.py --_worker` would be, minus the interpreter start and
    `import torch`."""
    pid = os.fork()
    if pid == 0:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the supervisor's handler is not ours
            _set_process_name(f"keval-{spec['mode']}")
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            keep = {0, 1, 2, *spec["fds"]}
            for fd in [int(x) for x in os.listdir("/proc/self/fd")]:  # what exec's close_fds does
                if fd not in keep:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            limits()
            os.environ.clear()  # putenv: the compiler processes it starts get this environment
            os.environ.update(spec["env"])
            sys.argv = [os.path.abspath(__file__)] + _worker_argv(spec)
            _worker_main(sys.argv[1:])
        except BaseException:  # noqa: BLE001 - whatever happened, this process ends here
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(1)
    return _PidWatch(pid, reap=True)


def _supervise(spec: dict, forked: bool = False) -> int:
    """Child subreaper: run the worker, then kill it and every orphan reparented to us.
    `forked`: we are a fork of a zygote, and so is the worker (no exec)."""
    _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER

    def limits():
        import resource
        os.setpgid(0, 0)
        if spec.get("as_bytes"):
            resource.setrlimit(resource.RLIMIT_AS, (spec["as_bytes"], spec["as_bytes"]))
        resource.setrlimit(resource.RLIMIT_FSIZE, (spec["fsize"], spec["fsize"]))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if spec.get("nice"):
            os.nice(spec["nice"])
        if spec.get("cpus"):  # inherited by the compilers a build starts
            os.sched_setaffinity(0, spec["cpus"])

    stop = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    if forked:
        worker = _fork_worker(spec, out_w, err_w, limits)
    else:
        worker = subprocess.Popen([sys.executable, os.path.abspath(__file__)] + _worker_argv(spec),
                                  stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w,
                                  pass_fds=tuple(spec["fds"]), env=spec["env"], preexec_fn=limits)
    for fd in spec["fds"] + [out_w, err_w]:
        os.close(fd)
    # stdout and stderr through pipes: kept up to a limit, and a worker that floods them is killed
    # (RLIMIT_FSIZE cannot do this: it would also cap the memory files that carry tensors)
    flooded = threading.Event()
    written = [0]
    guard = threading.Lock()

    def drain(fd: int, path: str) -> None:
        with open(path, "wb") as f:
            while chunk := os.read(fd, 1 << 16):
                with guard:
                    keep = chunk[: max(0, spec["output_bytes"] - written[0])]
                    written[0] += len(chunk)
                if keep:
                    f.write(keep)
                    f.flush()
                if len(keep) < len(chunk) and not flooded.is_set():
                    flooded.set()
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(worker.pid, signal.SIGKILL)
        os.close(fd)

    drains = [threading.Thread(target=drain, args=(out_r, spec["stdout"]), daemon=True),
              threading.Thread(target=drain, args=(err_r, spec["stderr"]), daemon=True)]
    for t in drains:
        t.start()
    code = None
    # the harness may die without stopping us (killed, or its own crash): then we are reparented,
    # and a hung worker must not keep the device forever
    while code is None and not stop["flag"] and os.getppid() == spec["parent"]:
        try:
            code = worker.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            continue
    try:
        os.killpg(worker.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    quiet = 0
    while quiet < 3:  # orphans that called setsid are reparented to us: kill until none are left
        kids = _children_of(os.getpid())
        for pid in kids:
            for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                try:
                    kill()
                except (ProcessLookupError, PermissionError):
                    pass
        _reap_children()
        quiet = quiet + 1 if not kids else 0
        time.sleep(0.02)
    if code is None:
        code = worker.returncode if worker.returncode is not None else -signal.SIGKILL
    for t in drains:  # every writer is dead now: the pipes end
        t.join(timeout=2)
    with open(spec["code_file"], "w") as f:
        f.write(f"{code}\n{'flooded' if flooded.is_set() else ''}")
    return 0


# Every worker alive in this process, so that an interrupted batch (Ctrl-C) can stop them all at
# once: _stop_everything. Registration and _STOPPING are under one lock, so a worker that starts
# while a batch is being stopped stops itself instead of outliving it.
_LIVE_WORKERS: set = set()
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()


def _stop_everything(zygotes: "_Zygotes | None") -> None:
    """An evaluation was interrupted (Ctrl-C, or an exception in the parent): stop every worker,
    build and reference session now, without waiting for their phases. The supervisors kill their
    worker's process group and its orphans on SIGTERM; a sweep by tag then kills whatever is left
    (the supervisors themselves, a compiler a build started)."""
    with _LIVE_LOCK:
        _STOPPING.set()
        workers = list(_LIVE_WORKERS)
    for w in workers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(w.proc.pid, signal.SIGTERM)
    zygote_list = zygotes.all() if zygotes is not None else []
    for zygote in zygote_list:
        if zygote.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                zygote.proc.kill()
    time.sleep(0.2)  # the supervisors' own clean-up, which also reaps their orphans
    tags = [w.tag for w in workers] + [z.tag for z in zygote_list]
    for _ in range(2):  # a process forked during the first sweep carries the tag too
        for tag in tags:
            _kill_tree_by_tag(tag)


class Worker:
    """A worker process under its supervisor, with a framed channel to it."""

    def __init__(self, mode: str, args: list, scratch: str, env_extra: dict, cfg: EvalConfig, cpu: bool,
                 fsize: int | None = None, nice: int = 0, zygotes: _Zygotes | None = None,
                 as_bytes: int | None = None):
        os.makedirs(scratch, exist_ok=True)
        self.scratch, self.tag = scratch, secrets.token_hex(8)
        cmd_r, cmd_w = os.pipe()
        rep_r, rep_w = os.pipe()
        # file descriptors (memory files of tensors) travel over a socket, next to the command pipe
        self.fd_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.fd_sock.settimeout(30)
        env = worker_env(dict(env_extra, PYTHONDONTWRITEBYTECODE="1", MALLOC_PERTURB_=POISON_MALLOC_PERTURB))
        env[TAG_ENV] = self.tag  # the zygote that forks this worker was started with env less the tag
        self.stdout, self.stderr = os.path.join(scratch, "stdout"), os.path.join(scratch, "stderr")
        self.code_file = os.path.join(scratch, "exit_code")
        self.output_bytes = cfg.max_file_bytes
        spec = {"mode": mode, "args": args, "env": env, "fds": [cmd_r, rep_w, child_sock.fileno()],
                "stdout": self.stdout, "stderr": self.stderr, "code_file": self.code_file,
                "fsize": fsize or cfg.max_message_bytes, "output_bytes": cfg.max_file_bytes, "nice": nice,
                "parent": os.getpid(),
                "as_bytes": (int(cfg.cpu_memory_limit_gb * (1 << 30)) if as_bytes is None else as_bytes) if cpu else 0,
                "cpus": _cpu_split(cpu, cfg)[0]}  # off the CPUs kept for timing windows
        self.proc = zygotes.fork(spec) if zygotes else None  # None: no zygote, or it is out of service
        if self.proc is None:  # the spec (it holds the environment) through a pipe: argv is public (ps)
            self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--_supervise"],
                                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         pass_fds=(cmd_r, rep_w, child_sock.fileno()), start_new_session=True, env=env)
            with contextlib.suppress(BrokenPipeError), self.proc.stdin:  # died first: death_reason says how
                self.proc.stdin.write(json.dumps(spec).encode())
        os.close(cmd_r)
        os.close(rep_w)
        child_sock.close()
        self.channel = Channel(rep_r, cmd_w, cfg.max_message_bytes)
        self.fds = (rep_r, cmd_w)
        with _LIVE_LOCK:
            stopping = _STOPPING.is_set()
            if not stopping:
                _LIVE_WORKERS.add(self)
        if stopping:  # the batch was interrupted while this worker started
            self.stop()
            raise _Failure("runtime_error", "the evaluation was interrupted")

    def exit_record(self) -> tuple:
        """(exit code or None, whether the supervisor killed it for flooding its output)."""
        try:
            with open(self.code_file) as f:
                words = f.read().split()
        except OSError:
            return None, False
        try:
            code = int(words[0])
        except (ValueError, IndexError):
            code = None
        return code, "flooded" in words

    def stop(self) -> None:
        with _LIVE_LOCK:
            _LIVE_WORKERS.discard(self)
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        _kill_tree_by_tag(self.tag)
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = ()
        self.fd_sock.close()

    def send_fds(self, fds: list) -> None:
        try:
            socket.send_fds(self.fd_sock, [b"f"], fds)
        except OSError as e:  # includes a timeout: a worker that stopped reading
            raise ChannelError("closed") from e

    def tail(self, n: int = 2000) -> str:
        parts = []
        for path in (self.stderr, self.stdout):
            try:
                with open(path, "rb") as f:
                    f.seek(0, os.SEEK_END)
                    size = f.tell()
                    f.seek(max(0, size - n))
                    parts.append(f.read().decode(errors="replace"))
            except OSError:
                continue
        return "\n".join(p for p in parts if p.strip())

    def death_reason(self, phase: str) -> str:
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        code, flooded = self.exit_record()
        if flooded:
            how = f"wrote more than {self.output_bytes >> 20} MiB to stdout/stderr and was killed"
        elif code is None:
            how = "closed its channel"
        elif code < 0:
            how = f"was killed by {signal.Signals(-code).name}" if -code in signal.Signals._value2member_map_ else f"died (signal {-code})"
        else:
            how = f"exited with code {code}"
        tail = trim_error(self.tail(), max_lines=6, max_chars=600)
        return f"process {how} during {phase}" + (f":\n{tail}" if tail else "")


# ----------------------------------------------------------------------------- zygotes

def _retag_initial_environment(tag: str) -> None:
    """Write `tag` over this process's KERNEL_EVAL_TAG value in its initial environment block, in
    place (setproctitle rewrites argv the same way). /proc/<pid>/environ shows that block, so a
    process forked from the zygote, and every fork of it, would otherwise carry the zygote's tag,
    out of reach of its own evaluation's sweep (_kill_tree_by_tag)."""
    import ctypes
    with open("/proc/self/stat") as f:
        env_start = int(f.read().rsplit(")", 1)[1].split()[47])  # field 50, env_start (fields from 3)
    with open("/proc/self/environ", "rb") as f:
        block = f.read()
    prefix = f"{TAG_ENV}=".encode()
    offset = 0
    for entry in block.split(b"\0"):
        if entry.startswith(prefix):
            break
        offset += len(entry) + 1
    else:
        raise RuntimeError(f"{TAG_ENV} is not in the initial environment")
    if len(entry) != len(prefix) + len(tag):
        raise RuntimeError(f"{TAG_ENV} has {len(entry) - len(prefix)} characters, the new tag {len(tag)}")
    ctypes.memmove(env_start + offset + len(prefix), tag.encode(), len(tag))
    with open("/proc/self/environ", "rb") as f:
        if prefix + tag.encode() not in f.read().split(b"\0"):
            raise RuntimeError("the environment block did not take the new tag")


def _prctl(option: int, value) -> None:
    __import__("ctypes").CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _set_process_name(name: str) -> None:
    """The name ps and /proc/<pid>/comm show (15 bytes): a forked process keeps its zygote's
    command line, so this is how a reader (bench/cpu_by_process.py) tells a forked worker's role."""
    _prctl(15, name.encode()[:15])  # PR_SET_NAME


def _zygote_main(sock_fd: int, harness_pid: int) -> None:
    """Import torch once, then fork a supervisor (which forks its worker) per request."""
    import gc
    import torch
    __import__("torch.utils._python_dispatch")  # run workers' op recorder
    cuda_visible = os.environ.get("CUDA_VISIBLE_DEVICES") != ""
    if not cuda_visible:  # its import asks CUDA for devices, after which no fork of ours could use CUDA
        __import__("torch.utils.cpp_extension")
    sock = socket.socket(fileno=sock_fd)
    why = ""
    if cuda_visible:  # can a fork of this process use CUDA? (torch marks a fork after a driver call)
        probe = os.fork()
        if probe == 0:
            os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
        if os.waitstatus_to_exitcode(os.waitpid(probe, 0)[1]) != 0:
            why = "torch called the CUDA driver at import: forked workers could not use CUDA"
    try:  # the sweep by tag must work for forked workers, or the harness spawns them itself
        own = os.environ[TAG_ENV]
        _retag_initial_environment(secrets.token_hex(len(own) // 2))
        _retag_initial_environment(own)
    except (OSError, RuntimeError, KeyError, ValueError, IndexError) as e:
        why = why or f"cannot retag forked processes: {e}"
    gc.freeze()  # forked children touch fewer shared pages (reference counts aside)
    sock.send(json.dumps({"ok": not why, "why": why}).encode())
    zygote_pid = os.getpid()
    while not why and os.getppid() == harness_pid:  # the harness died: so do we, and our supervisors
        _reap_children()
        if not select.select([sock], [], [], 0.2)[0]:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 8)
        except OSError:
            break
        if not data:
            break
        spec = json.loads(data)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                sock.close()
                _set_process_name("keval-super")
                spec["fds"], spec["parent"] = fds, zygote_pid
                _retag_initial_environment(spec["env"][TAG_ENV])
                os.setsid()
                code = _supervise(spec, forked=True)
            except BaseException:  # noqa: BLE001 - a forked child never returns into this loop
                traceback.print_exc()
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())
    os._exit(0)


class _Zygote:
    """A process that has imported torch once, under one worker environment, and forks workers
    (each under its supervisor) on request, for one batch. A spawned worker spends its first
    seconds on `import torch` (3.6-3.8 s of a 17 s compile; 6 CPU s of a run worker's boot on the
    H200: PERFORMANCE.md), on a core the builds need. A forked one is the same isolation: its own
    session, subreaper supervisor, process group, limits, environment and tag (rewritten in place:
    _retag_initial_environment). Its environment is the zygote's, which is the one a spawned worker
    of its role would get, so what glibc and torch read at start (MALLOC_PERTURB_'s poison, the
    heap thresholds, CUDA_VISIBLE_DEVICES) is the same. The zygote never creates a CUDA context:
    each run worker creates its own after the fork. A fork inherits the zygote's memory, which holds
    nothing secret: the allowlisted environment and the requests it served (argv, environment and
    file descriptors of each worker); the input seeds reach the reference's worker over its channel,
    after its fork. The candidate's code still runs only in a forked worker, never in the zygote
    (which a candidate can still ptrace or kill, as any process of its uid: see "What this does
    not stop"). When the zygote cannot serve (it died, say killed by a
    candidate), `fork` returns None and the harness spawns workers itself; a supervisor the dying
    zygote had already forked sees it has been reparented and stops its worker."""

    def __init__(self, env: dict):
        self.env = env  # without the tag, which is each worker's own
        self.lock = threading.Lock()
        self.proc = self.sock = None
        self.tag = secrets.token_hex(8)
        self.out_of_service = ""

    def _start(self) -> None:
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(120)
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--_zygote", str(child.fileno()), str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(child.fileno(),), start_new_session=True, env=dict(self.env, **{TAG_ENV: self.tag}))
        child.close()
        ready = json.loads(self.sock.recv(1 << 16) or b'{"why": "it exited while starting"}')
        if not ready.get("ok"):
            raise RuntimeError(ready.get("why", "it did not start"))

    def fork(self, spec: dict) -> _PidWatch | None:
        """Fork a supervisor and its worker for `spec` (the fds travel with the request)."""
        with self.lock:
            if self.out_of_service:
                return None
            try:
                if self.proc is None:
                    self._start()
                socket.send_fds(self.sock, [json.dumps(spec).encode()], spec["fds"])
                reply = json.loads(self.sock.recv(1 << 16) or b"{}")
                return _PidWatch(int(reply["pid"]), reap=False)
            except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
                self.out_of_service = f"zygote out of service: {e!r}"
                self._stop()
                return None

    def _stop(self) -> None:
        if self.sock is not None:
            self.sock.close()  # the zygote reads the end of its socket and exits
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            _kill_tree_by_tag(self.tag)  # a fork that had not retagged itself yet

    def close(self) -> None:
        with self.lock:
            self._stop()
            self.out_of_service = self.out_of_service or "closed"


class _Zygotes:
    """One _Zygote per distinct worker environment, started by the first worker that needs it: on
    cuda one for compile workers (CUDA hidden) and one for run workers; on cpu both roles have the
    same environment and share one."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_env: dict = {}

    def fork(self, spec: dict) -> _PidWatch | None:
        env = {k: v for k, v in spec["env"].items() if k != TAG_ENV}
        key = json.dumps(env, sort_keys=True)
        with self.lock:
            if key not in self.by_env:
                self.by_env[key] = _Zygote(env)
            zygote = self.by_env[key]
        return zygote.fork(spec)

    def all(self) -> list:
        with self.lock:
            return list(self.by_env.values())

    def close(self) -> None:
        for zygote in self.all():
            zygote.close()


# ----------------------------------------------------------------------------- worker side

def _patch_cpp_extension(cache_root: str, arch: str, default_cflags: list, use_pch: bool, fast_load: bool,
                         cuda_header_tiers: tuple = (), host_pch: bool = False) -> dict:
    """Force load_inline/load into per-hash build dirs; inject -O3 and the precompiled headers."""
    import inspect
    import torch
    import torch.utils.cpp_extension as ce

    state = {"builds": 0, "build_error": None, "header_tier": None, "build_s": 0.0}
    base_key = (torch.__version__, sys.version_info[:2], arch)
    host_header = write_host_header(cache_root, torch.__version__) if host_pch and cuda_header_tiers else None
    inline, load = ce.load_inline, ce.load

    def fix_flags(args: dict, cuda: bool) -> None:
        flags = list(args.get("extra_cflags") or [])
        if not any(f.startswith("-O") for f in flags):
            flags = list(default_cflags) + flags
        args["extra_cflags"] = flags
        if cuda:
            cflags = list(args.get("extra_cuda_cflags") or [])
            if not any(f.startswith("-O") for f in cflags):
                cflags = ["-O3"] + cflags
            args["extra_cuda_cflags"] = cflags

    def run(fn, args):
        t0 = _perf_counter()
        try:
            return fn(**args)
        except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
            state["build_error"] = f"{e}\n{getattr(e, 'output', '') or ''}"
            raise
        finally:
            state["build_s"] += _perf_counter() - t0

    def patched_inline(*a, **kw):
        args = inspect.signature(inline).bind(*a, **kw).arguments
        cuda = bool(args.get("cuda_sources"))
        fix_flags(args, cuda)
        if (cuda and cuda_header_tiers and not args.get("no_implicit_headers")
                and "no_implicit_headers" in inspect.signature(inline).parameters):
            # no_implicit_headers: load_inline would put torch/types.h (autograd, library) at the top
            # of every .cu unit and torch/extension.h (all of torch's C++ API) in the host unit
            for tier in cuda_header_tiers:
                try:
                    tier_args = header_tier_args(args, tier)
                    module = build(tier_args, cuda, remember_failure=True)
                    state["header_tier"] = tier
                    if (tier == "slim" and host_header and not fast_load
                            and list(args["extra_cflags"]) == list(default_cflags)):
                        build_host_pch(host_header, tier_args["build_directory"])
                    return module
                except (RuntimeError, subprocess.CalledProcessError, OSError, ImportError):
                    state["build_error"] = None  # a heavier tier may still build it: fall back
        return build(args, cuda)

    def header_tier_args(args: dict, tier: str) -> dict:
        def sources(key):
            value = args.get(key) or []
            return [value] if isinstance(value, str) else list(value)
        cpp = [s.replace(FULL_HEADER, "").replace(TYPES_HEADER, "") for s in sources("cpp_sources")]
        cu = [s.replace(FULL_HEADER, "").replace(TYPES_HEADER, "") for s in sources("cuda_sources")]
        include_paths = list(args.get("extra_include_paths") or [])
        if tier == "slim":
            ops_dir = os.path.join(ce.include_paths()[0], "ATen", "ops")
            host_ops, device_ops = op_names(cpp, ops_dir), op_names(cu, ops_dir)
            # first in the unit, so that g++ may use its precompiled form (build_host_pch)
            host_headers = f'#include "{host_header}"\n' if host_header else SLIM_HOST_HEADERS
            host = host_headers + ops_includes(host_ops) + TORCH_ALIASES
            device = SLIM_CUDA_HEADERS + ops_includes(device_ops)
            cu = [s.replace(CUDA_CONTEXT_HEADER, SLIM_CUDA_CONTEXT) for s in cu]
            # lean copies of those ops' headers, first on the include path (-I precedes -isystem)
            include_paths = [write_lean_op_headers(sorted(set(host_ops + device_ops)), ops_dir,
                                                   os.path.join(cache_root, "op_headers"))] + include_paths
        elif tier == "light":
            host, device = FULL_HEADER + "\n", LIGHT_CUDA_HEADERS  # torch/extension.h has the aliases
        else:
            raise ValueError(f"unknown CUDA header tier {tier!r} (known: {', '.join(HEADER_TIERS)})")
        return dict(args, no_implicit_headers=True, cpp_sources=[host] + cpp,
                    cuda_sources=[device + TORCH_ALIASES] + cu, extra_include_paths=include_paths)

    def build(args, cuda, remember_failure=False):
        pch = (use_pch and not cuda and "use_pch" in inspect.signature(inline).parameters
               and list(args["extra_cflags"]) == list(default_cflags) and not args.get("extra_include_paths"))
        args["use_pch"] = bool(pch)
        key = source_hash(base_key, sorted((k, v) for k, v in args.items() if k not in ("build_directory", "verbose")))
        args["build_directory"] = os.path.join(cache_root, "build", key[:32])
        os.makedirs(args["build_directory"], exist_ok=True)
        built = os.path.join(args["build_directory"], args["name"] + ".so")
        failed_marker = os.path.join(args["build_directory"], "FAILED")
        if remember_failure and os.path.exists(failed_marker):
            raise RuntimeError("this build failed before")
        if fast_load and os.path.exists(built):
            # the compile phase built exactly these sources here: import, skip ninja and the .gch check
            return ce._import_module_from_library(args["name"], args["build_directory"], args.get("is_python_module", True))
        state["builds"] += 1
        lock = None
        if pch:
            # torch keeps one .gch next to its own headers, for every user of this torch install:
            # (re)build it holding an exclusive lock, then compile holding a shared one so that no
            # kernel_eval process rewrites it while a build reads it.
            lock = open(os.path.join(PCH_LOCK_DIR or tempfile.gettempdir(), "kernel_eval-pch-"
                                     + source_hash(os.path.dirname(torch.__file__))[:16] + ".lock"), "a")
            fcntl.flock(lock, fcntl.LOCK_EX)
            run(ce._check_and_build_extension_h_precompiler_headers,
                {"extra_cflags": args["extra_cflags"], "extra_include_paths": args.get("extra_include_paths")})
            fcntl.flock(lock, fcntl.LOCK_SH)
        # torch's own lock in a build dir is a file that a killed build leaves behind, and every later
        # build of that dir then waits forever; an flock dies with its holder, so hold one instead and
        # clear a baton left by a build that no longer runs.
        dir_lock = open(os.path.join(args["build_directory"], ".kernel_eval.lock"), "a")
        try:
            fcntl.flock(dir_lock, fcntl.LOCK_EX)
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(args["build_directory"], "lock"))
            return run(inline, args)
        except (RuntimeError, subprocess.CalledProcessError, OSError, ImportError):
            if remember_failure:
                open(failed_marker, "w").close()
            raise
        finally:
            dir_lock.close()
            if lock is not None:
                lock.close()

    def patched_load(*a, **kw):
        args = inspect.signature(load).bind(*a, **kw).arguments
        sources = args["sources"] if isinstance(args["sources"], list) else [args["sources"]]
        cuda = any(s.endswith((".cu", ".cuh")) for s in sources)
        fix_flags(args, cuda)
        contents = []
        for s in sources:
            with open(s, "rb") as f:
                contents.append(hashlib.sha256(f.read()).hexdigest())
        key = source_hash(base_key, contents, sorted((k, v) for k, v in args.items()
                                                     if k not in ("build_directory", "verbose", "sources")))
        args["build_directory"] = os.path.join(cache_root, "build", key[:32])
        os.makedirs(args["build_directory"], exist_ok=True)
        state["builds"] += 1
        return run(load, args)

    ce.load_inline, ce.load = patched_inline, patched_load
    # load_inline(use_pch=False) deletes torch's shared .gch, which concurrent builds are using
    ce.remove_extension_h_precompiler_headers = lambda: None
    return state


PCH_LOCK_DIR = None  # None: the system temp dir (the lock must be shared by every kernel_eval user)
FULL_HEADER = "#include <torch/extension.h>"
TYPES_HEADER = "#include <torch/types.h>"
# Most of a CUDA build is parsing torch's headers (three times in a .cu unit: nvcc's device and
# host passes, then the host compiler). torch/extension.h brings all of torch's C++ API (nn, optim,
# autograd, jit) and pybind11; a kernel's wrapper needs at::Tensor, a few factory functions,
# AT_DISPATCH, TORCH_CHECK and the current stream. DESIGN.md: 49-51 s for the full header, 16-18 s
# with slim ones. A tier a unit does not build under falls back to the next, then to the source as
# written, so a lighter tier costs a failed attempt but never a verdict.
HEADER_TIERS = ("slim", "light")
# slim: the tensor class, dispatch macros and CUDA stream/guard headers, plus ATen/ops/<name>.h for
# every torch::name( / at::name( the unit calls (op_names), lean (LEAN_OP_DROPPED); tensor
# operators (+, *) and torch::nn are not in it.
SLIM_CUDA_HEADERS = """#include <cuda.h>
#include <cuda_runtime.h>
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <c10/core/DeviceGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>
"""
# Every ATen/ops/<name>.h opens with these includes, which its inline wrappers do not use;
# ATen/DeviceGuard.h alone pulls in IValue. Measured with nvcc 13.0 on a .cu unit of
# ATen/core/Tensor.h, the slim set and one op (bench: docs/PERFORMANCE.md): 16.7 s with them,
# 10.3 s without. A source that needed them falls back to the source as written.
LEAN_OP_DROPPED = frozenset({"#include <ATen/Context.h>", "#include <ATen/DeviceGuard.h>",
                             "#include <ATen/TensorUtils.h>", "#include <ATen/TracerMode.h>"})
# the host unit only binds the functions: pybind11 with torch's Tensor caster and
# torch::wrap_pybind_function (which load_inline's generated bindings call)
SLIM_HOST_HEADERS = """#include <torch/csrc/Exceptions.h>
#include <ATen/core/Tensor.h>
"""
# A slim .cu unit gets this for ATen/cuda/CUDAContext.h: its device-property calls and AT_CUDA_CHECK
# without cuBLAS, cuSPARSE, cuSOLVER and ATen/Context.h (at::cuda:: already names c10::cuda's streams
# and guards). About a fifth of a .cu unit's build (PERFORMANCE.md); a source that needs the rest
# falls back to the next tier.
CUDA_CONTEXT_HEADER = "#include <ATen/cuda/CUDAContext.h>"
SLIM_CUDA_CONTEXT = """#include <c10/cuda/CUDAFunctions.h>
#include <c10/core/Allocator.h>
namespace at::cuda {
TORCH_CUDA_CPP_API cudaDeviceProp* getCurrentDeviceProperties();
TORCH_CUDA_CPP_API int warp_size();
TORCH_CUDA_CPP_API cudaDeviceProp* getDeviceProperties(c10::DeviceIndex device);
TORCH_CUDA_CPP_API c10::Allocator* getCUDADeviceAllocator();
}
#ifndef AT_CUDA_CHECK
#define AT_CUDA_CHECK(EXPR) C10_CUDA_CHECK(EXPR)
#endif
"""
# light: all of ATen (every operator) in the .cu unit, torch/extension.h in the host unit
LIGHT_CUDA_HEADERS = """#include <cuda.h>
#include <cuda_runtime.h>
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
"""
# the torch:: names torch/types.h would give a unit
TORCH_ALIASES = """namespace torch {
using namespace at;
using Dtype = at::ScalarType;
constexpr auto kUInt8 = at::kByte;
constexpr auto kInt8 = at::kChar;
constexpr auto kInt16 = at::kShort;
constexpr auto kInt32 = at::kInt;
constexpr auto kInt64 = at::kLong;
constexpr auto kFloat16 = at::kHalf;
constexpr auto kFloat32 = at::kFloat;
constexpr auto kFloat64 = at::kDouble;
}
"""


def op_names(sources: list, ops_dir: str) -> list:
    """The ATen operators the sources call as torch::name( or at::name( that have a header ATen/ops/<name>.h."""
    names = sorted({m for src in sources for m in re.findall(r"\b(?:torch|at)::(\w+)\s*\(", src)})
    return [n for n in names if re.fullmatch(r"[a-z_][a-z0-9_]*", n) and os.path.exists(os.path.join(ops_dir, n + ".h"))]


def ops_includes(names: list) -> str:
    return "".join(f"#include <ATen/ops/{n}.h>\n" for n in names)


def write_lean_op_headers(names: list, ops_dir: str, root: str) -> str:
    """An include dir holding ATen/ops/<name>.h for `names`: torch's headers without LEAN_OP_DROPPED.
    Keyed by the torch headers and the names, so every build of one source sees the same files
    (and a header another candidate's source needed can never change this one's build)."""
    texts = {}
    for n in names:
        with open(os.path.join(ops_dir, n + ".h")) as f:
            texts[n] = "".join(line for line in f if line.strip() not in LEAN_OP_DROPPED)
    include_dir = os.path.join(root, source_hash(sorted(texts.items()))[:24])
    target = os.path.join(include_dir, "ATen", "ops")
    os.makedirs(target, exist_ok=True)
    for n, text in texts.items():
        path = os.path.join(target, n + ".h")
        if not os.path.exists(path):
            _atomic_write_text(path, text)
    return include_dir


def write_host_header(cache_root: str, torch_version: str) -> str:
    """SLIM_HOST_HEADERS as a file of their own under cache_root, which the slim tier's host units
    include first: g++ then reads its precompiled form (<file>.gch, build_host_pch) where one is valid
    for the unit's flags, and parses the headers where none is (same unit either way)."""
    path = os.path.join(cache_root, "host_pch", source_hash(SLIM_HOST_HEADERS, torch_version)[:24],
                        "kernel_eval_host.h")
    if not os.path.exists(path):
        _atomic_write_text(path, SLIM_HOST_HEADERS)
    return path


def build_host_pch(header: str, build_dir: str, timeout_s: float = 300.0) -> bool:
    """Precompile `header` once per cache with the host flags of a build that used it: torch's own
    (read from that build's build.ninja, so they match whatever this torch writes) less the extension's
    name and -I paths, which g++ does not require to match. Parsing pybind11 and ATen's tensor is
    about 3 of a host unit's 8 s (PERFORMANCE.md). Returns whether a new one was written; a failed or
    concurrent attempt leaves none, and the units parse the headers as before."""
    gch = header + ".gch"
    try:
        with open(os.path.join(build_dir, "build.ninja")) as f:
            ninja = f.read()
    except OSError:
        return False
    variables = dict(re.findall(r"^(cxx|cflags|post_cflags) = (.*)$", ninja, re.M))
    if os.path.exists(gch) or "cxx" not in variables or "cflags" not in variables:
        return False
    flags = [f for f in shlex.split(variables["cflags"] + " " + variables.get("post_cflags", ""))
             if not f.startswith(("-DTORCH_EXTENSION_NAME=", "-I"))]
    with open(header + ".lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # another build is writing it
        if os.path.exists(gch):
            return False
        tmp = f"{gch}.{os.getpid()}.tmp"
        try:
            done = subprocess.run(shlex.split(variables["cxx"]) + ["-x", "c++-header", header, "-o", tmp] + flags,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout_s)
            if done.returncode == 0:
                os.replace(tmp, gch)
                return True
        except (OSError, subprocess.TimeoutExpired):
            pass
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        return False


def _import_source(path: str, module_name: str):
    import importlib.util
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def describe_exception(exc: BaseException, path: str, max_lines: int = 6, max_chars: int = 800) -> str:
    """A failure of the code in `path` as the policy (and a user) can act on it: the line of that
    file where it happened and the exception, without the harness's frames or caret lines:
    "line 12: SyntaxError: invalid syntax: def forward(self x):", "line 30: NameError: ..."."""
    if isinstance(exc, SyntaxError) and exc.filename == path:
        text = (exc.text or "").strip()
        return f"line {exc.lineno}: {type(exc).__name__}: {exc.msg}" + (f": {_cut(text, 200)}" if text else "")
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == path:
            line = lineno  # the innermost frame in the code's own file
    lines = [ln.rstrip() for ln in str(exc).splitlines() if ln.strip()]
    head = (f"line {line}: " if line else "") + type(exc).__name__
    text = head + (f": {lines[0]}" if lines else "")
    if len(lines) > 1:  # e.g. a build error raised at load: its first error lines
        text += "\n" + trim_error("\n".join(lines[1:]), max_lines=max_lines)
    return _cut(text, max_chars)


def _as_list(out) -> list:
    import torch
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return list(out)
    return [out]


def _tensor_bytes(values: list) -> int:
    import torch
    return sum(v.nbytes for v in values if isinstance(v, torch.Tensor))


def _to_cpu(outs: list) -> list:
    import torch
    return [o.detach().to("cpu") if isinstance(o, torch.Tensor) else o for o in outs]


def _worker_compile(a) -> None:
    t0 = _perf_counter()
    preloaded = "torch" in sys.modules  # forked by a zygote
    import torch
    t_torch = _perf_counter() - t0  # timed apart from the build (diagnostics: the record's profile)
    del torch
    state = _patch_cpp_extension(a.cache_root, a.arch, json.loads(a.cflags), a.use_pch, fast_load=False,
                                 cuda_header_tiers=tuple(t for t in a.cuda_header_tiers.split(",") if t),
                                 host_pch=bool(a.host_pch))
    try:
        _import_source(a.source, "candidate_module")
        total = _perf_counter() - t0
        _child_send(a.reply_fd, {"ok": True, "builds": state["builds"], "header_tier": state["header_tier"],
                                 "torch_preloaded": preloaded,
                                 "profile": {"torch": t_torch, "build": state["build_s"],
                                             "rest": total - t_torch - state["build_s"]}})
    except BaseException:  # noqa: BLE001 - any failure of candidate code is a verdict
        if state["build_error"] is not None:
            with open(a.source) as f:
                diagnostics = point_at_source(state["build_error"], f.read())
            _child_send(a.reply_fd, {"ok": False, "kind": "build", "message": trim_error(diagnostics)})
        else:
            _child_send(a.reply_fd, {"ok": False, "kind": "import",
                                     "message": trim_error(traceback.format_exc())})


def _worker_serve(a) -> None:
    """Reference or candidate worker: boot, then answer load / init / gen / run / time / judge."""
    preloaded = "torch" in sys.modules  # forked by a zygote
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    cuda = a.device == "cuda"
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if a.threads:
        torch.set_num_threads(int(a.threads))
    if cuda:
        torch.cuda.set_device(dev)
        torch.empty(1, device=dev)  # create the context now: this boot overlaps the compile
    cmd_in = os.fdopen(a.cmd_fd, "rb")
    fd_sock = socket.socket(fileno=a.fd_sock)
    reply = a.reply_fd
    _patch_cpp_extension(a.cache_root, a.arch, json.loads(a.cflags), a.use_pch, fast_load=True,
                         cuda_header_tiers=tuple(t for t in a.cuda_header_tiers.split(",") if t),
                         host_pch=bool(a.host_pch))

    class OpRecorder(TorchDispatchMode):
        """The aten operators run while it is entered. Not wrapped to skip Dynamo: torch wraps a
        mode's __torch_dispatch__ in torch._disable_dynamo unless told otherwise, and that wrapper's
        first call imports torch._dynamo, sympy and triton (~900 modules: 1.3 CPU s on the 2-core
        box, 5-6 of the ~12 CPU s a candidate worker's boot takes on the H200; PERFORMANCE.md)."""
        @classmethod
        def _should_skip_dynamo(cls):
            return False

        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(func._schema.name)
            return func(*args, **(kwargs or {}))

    def to_dev(xs):
        return [x.to(dev) if isinstance(x, torch.Tensor) else x for x in xs]

    def draw_inputs(seed):
        """The task's get_inputs under `seed`, drawn on the device when it runs there (CPU random
        number generation was most of a large task's setup); on the CPU if that fails."""
        torch.manual_seed(seed)
        if cuda:
            try:
                with dev:
                    return list(module.get_inputs())
            except Exception:  # noqa: BLE001 - e.g. numpy in get_inputs: draw as written instead
                torch.manual_seed(seed)
        return list(module.get_inputs())

    def error(phase, exc_text):
        _child_send(reply, {"error": trim_error(exc_text, max_lines=10), "phase": phase})

    def receive_fds(n):
        _, fds, _, _ = socket.recv_fds(fd_sock, 16, n)
        if len(fds) != n:
            raise RuntimeError(f"expected {n} file descriptors, got {len(fds)}")
        return fds

    if a.mode == "cand":  # a dispatch mode's first use loads what dispatch needs: during boot
        with OpRecorder():
            torch.ones(1, device=dev).add(1)
    # the boot's CPU time (a fork's starts at zero) and the device's free memory (the budget's
    # capacity) are reported before any candidate code is loaded
    _child_send(reply, {"ready": True, "torch_preloaded": preloaded, "boot_cpu_s": time.process_time(),
                        "device_free": torch.cuda.mem_get_info(dev)[0] if cuda else None})
    module, model, flush, timing, ref_outs = None, None, None, None, {}
    home_cpus = os.sched_getaffinity(0)
    while True:
        try:
            msg, payload = _child_recv(cmd_in)
        except EOFError:
            return
        nonce, cmd = msg.get("nonce"), msg.get("cmd")
        fds = receive_fds(msg["fds"]) if msg.get("fds") else []
        try:
            if cmd not in ("time_prepare", "warm", "time"):   # a timing window's CPUs are for timing only
                os.sched_setaffinity(0, home_cpus)
            if cmd == "load":
                wanted = "Model" if a.mode == "ref" else "ModelNew"
                try:
                    module = _import_source(a.source, "reference_module" if a.mode == "ref" else "candidate_module")
                except BaseException as e:  # noqa: BLE001 - a failed import is a verdict: say where
                    _child_send(reply, {"error": describe_exception(e, a.source), "phase": "load"})
                    continue
                cls = getattr(module, wanted, None)
                if not isinstance(cls, type):
                    _child_send(reply, {"error": f"the code defines no class {wanted}", "phase": "load"})
                    continue
                _child_send(reply, {"nonce": nonce})
            elif cmd == "init":
                init = module.get_init_inputs() if a.mode == "ref" else _bytes_to_tensors(payload)
                torch.manual_seed(msg["seed"])
                model = cls(*init).to(dev)
                _child_send(reply, {"nonce": nonce}, _tensors_to_bytes(_to_cpu(list(init))) if a.mode == "ref" else b"")
            elif cmd == "probe" and a.mode == "ref":
                # the task's footprint (plan_copies), alone on the device: one input set, its outputs,
                # the forward's peak allocation; everything freed after
                xs = to_dev(draw_inputs(msg["seed"]))
                base = torch.cuda.memory_allocated(dev) if cuda else 0
                if cuda:
                    torch.cuda.reset_peak_memory_stats(dev)
                with torch.no_grad():
                    outs = _as_list(model(*xs))
                peak = torch.cuda.max_memory_allocated(dev) - base if cuda else 0
                sizes = {"set_bytes": _tensor_bytes(xs), "out_bytes": _tensor_bytes(outs)}
                del xs, outs
                if cuda:
                    torch.cuda.empty_cache()
                _child_send(reply, {"nonce": nonce, "peak_bytes": max(peak, sizes["out_bytes"]), **sizes})
            elif cmd == "gen" and a.mode == "ref":
                # inputs from the parent's secret seeds go to the two input files, one set at a time (a
                # large task's sets are never all on the device at once); outputs stay here
                for fd, part in zip(fds, ("check", "time")):
                    writer, ref_outs[part] = TensorFileWriter(fd), []
                    for seed in msg["seeds"][part]:
                        xs = draw_inputs(seed)
                        with torch.no_grad():
                            ref_outs[part].append([o.detach().clone() if isinstance(o, torch.Tensor) else o
                                                   for o in _as_list(model(*to_dev(xs)))])
                        writer.add(xs)
                        del xs
                    writer.close()
                out_bytes = {part: [[o.nbytes for o in outs if isinstance(o, torch.Tensor)] for outs in sets]
                             for part, sets in ref_outs.items()}
                _child_send(reply, {"nonce": nonce, "out_bytes": out_bytes})
            elif cmd == "judge" and a.mode == "ref":
                expected = ref_outs[msg["part"]]
                try:
                    cand = read_tensor_sets(fds[0], msg["max_bytes"])
                except ValueError as e:  # the candidate wrote this file: its failure, not ours
                    _child_send(reply, {"nonce": nonce, "unreadable": str(e)})
                    continue
                if len(cand) != len(expected):
                    reason = f"expected {len(expected)} output sets, got {len(cand)}"
                else:
                    reason = None
                    for t, (r, c) in enumerate(zip(expected, cand)):
                        reason = compare_outputs(r, c, msg["tolerances"])
                        if reason:
                            reason = (f"trial {t + 1}/{len(expected)}: " if msg["part"] == "check" else "") + reason
                            break
                _child_send(reply, {"nonce": nonce, "reason": reason})
            elif cmd == "run":
                sets = read_tensor_sets(fds[0], TRUSTED_FILE_MAX_BYTES)
                poison_bytes = msg.get("poison_bytes", [])
                outputs, changed, ops = TensorFileWriter(fds[1]), [], set()
                for xs in sets:
                    pristine = to_dev(xs)
                    call = [x.clone() if isinstance(x, torch.Tensor) else x for x in pristine]
                    if cuda:  # hand NaN-filled blocks of each output's size to the next torch.empty
                        blocks = [torch.full(((n + 3) // 4,), float("nan"), device=dev) for n in poison_bytes for _ in range(2)]
                        del blocks
                    recorder = OpRecorder() if msg.get("op_check") else None
                    with torch.no_grad():
                        if recorder is not None:
                            with recorder:
                                out = _as_list(model(*call))
                            ops |= recorder.ops
                        else:
                            out = _as_list(model(*call))
                    changed.append([i for i, (p, c) in enumerate(zip(pristine, call))
                                    if isinstance(p, torch.Tensor) and not torch.equal(p, c)])
                    outputs.add(out)  # now: a buffer the next call reuses is still checked per call
                outputs.close()
                _child_send(reply, {"nonce": nonce, "changed": changed, "ops": sorted(ops)})
            elif cmd == "time_prepare":  # inputs onto the device and warm-up, outside the parent's clock
                if msg.get("cpus"):
                    os.sched_setaffinity(0, msg["cpus"])
                sets = [to_dev(xs) for xs in read_tensor_sets(fds[0], TRUSTED_FILE_MAX_BYTES)]
                if cuda and flush is None:
                    flush = torch.empty(msg["l2_flush_bytes"] // 4, dtype=torch.float32, device=dev)
                timing = _TimingLoop(model, sets, flush, cuda, sync, msg["buffers"], msg["buffer_bytes"])
                timing.run(msg["warmup"])
                _child_send(reply, {"nonce": nonce})
            elif cmd == "warm":  # more warm-up, for as long as the parent's clock says
                timing.run(msg["calls"])
                _child_send(reply, {"nonce": nonce})
            elif cmd == "time":  # only this request is on the parent's clock
                _child_send(reply, {"nonce": nonce, "times": timing.run(msg["trials"])})
            elif cmd == "time_outputs":  # each input set's last timed output, to be checked again
                write_tensor_sets(fds[0], timing.last)
                _child_send(reply, {"nonce": nonce})
            else:
                error(cmd or "?", f"unknown command {cmd!r}")
        except BaseException as e:  # noqa: BLE001 - candidate failures become a runtime_error verdict
            _child_send(reply, {"error": describe_exception(e, a.source), "phase": cmd or "?"})
            if cuda:
                return  # CUDA errors are sticky: nothing after this can be trusted
        finally:
            for fd in fds:  # closed once, after the reply: the parent seals output files then
                os.close(fd)


class _TimingLoop:
    """Calls on `buffers` copies of the input buffers (fewer if they would pass `buffer_bytes`),
    refilled from alternating input sets; `run` returns per-call times (ms) and keeps each set's last
    output. Call k takes set k mod sets into copy (k div sets) mod copies: every copy holds each set in
    turn. On GPU each call is preceded by an L2 flush and ends with a device-wide sync before the end
    event, so work left on other streams is counted."""

    def __init__(self, model, sets: list, flush, cuda: bool, sync, buffers: int = 1, buffer_bytes: int = 0):
        import torch
        self.model, self.sets, self.flush, self.cuda, self.sync = model, sets, flush, cuda, sync
        size = sum(x.numel() * x.element_size() for x in sets[0] if isinstance(x, torch.Tensor))
        copies = max(1, min(buffers, buffer_bytes // size if size else buffers))
        self.bufs = [[x.clone() if isinstance(x, torch.Tensor) else x for x in sets[0]] for _ in range(copies)]
        self.last = [None] * len(sets)
        self.calls = 0

    def run(self, n: int) -> list:
        import torch
        times = []
        with torch.no_grad():
            for k in range(n):
                i = self.calls % len(self.sets)
                bufs = self.bufs[self.calls // len(self.sets) % len(self.bufs)]
                self.calls += 1
                for b, s in zip(bufs, self.sets[i]):
                    if isinstance(b, torch.Tensor):
                        b.copy_(s)
                if self.cuda:
                    self.flush.zero_()
                    self.sync()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    out = self.model(*bufs)
                    self.sync()  # device-wide: work left on side streams is counted
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end))
                else:  # CPU time: preemption by other processes (load) is not the kernel's cost
                    t0 = _process_time()
                    out = self.model(*bufs)
                    times.append((_process_time() - t0) * 1e3)
                if n - k <= len(self.sets):  # a run's last call of each set: a clone per call is overhead
                    self.last[i] = [o.clone() if isinstance(o, torch.Tensor) else o for o in _as_list(out)]
            self.sync()
        return times


def _worker_main(argv: list) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--_worker", dest="mode", required=True)
    p.add_argument("--cmd-fd", type=int, required=True)
    p.add_argument("--reply-fd", type=int, required=True)
    p.add_argument("--fd-sock", type=int, default=-1)
    p.add_argument("--source", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--cache-root", required=True)
    p.add_argument("--arch", default="")
    p.add_argument("--cflags", default='["-O3"]')
    p.add_argument("--use-pch", type=int, default=1)
    p.add_argument("--threads", default="")
    p.add_argument("--cuda-header-tiers", default="")
    p.add_argument("--host-pch", type=int, default=0)
    a = p.parse_args(argv)
    a.use_pch = bool(a.use_pch)
    if a.mode == "compile":
        _worker_compile(a)
    else:
        _worker_serve(a)
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: candidate atexit hooks and threads do not matter


# ----------------------------------------------------------------------------- command line

def resolve_device(device: str | None, prog: str) -> str:
    """--device as given, checked, or (None) cuda when torch sees one, else cpu, said on stderr.
    A user's mistake is one line that names it and what to do (SystemExit), never a traceback."""
    import torch
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        why = "torch sees a CUDA device" if device == "cuda" else "torch sees no CUDA device"
        print(f"{prog}: --device not given: using {device} ({why})", file=sys.stderr)
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise SystemExit(f"{prog}: --device {device}: expected cpu, cuda or cuda:N")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            build = f"torch {torch.__version__} was built without CUDA" if torch.version.cuda is None else "no GPU is visible"
            raise SystemExit(f"{prog}: --device {device}: torch sees no CUDA device ({build}); use --device cpu")
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise SystemExit(f"{prog}: --device {device}: torch sees {torch.cuda.device_count()} CUDA device(s)")
        from torch.utils.cpp_extension import CUDA_HOME
        if CUDA_HOME is None:
            raise SystemExit(f"{prog}: --device {device}: no CUDA toolkit (nvcc) to build kernels with; "
                             "install one or set CUDA_HOME")
    return device


def main(argv=None) -> int:
    """One verdict, printed; exit 0 on every verdict (the status says how the candidate did), 1 on a
    usage error, 130 when interrupted."""
    p = argparse.ArgumentParser(description="Evaluate a candidate kernel against a KernelBench-format reference.",
                                epilog="Exit code 0 on every verdict (read the status); builds are cached in "
                                       "--cache-root (default $KERNEL_EVAL_CACHE or ~/.cache/kernel_eval).")
    p.add_argument("reference")
    p.add_argument("candidate")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when torch sees one, else cpu)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--trials", type=int, default=None, help="timed calls (default: 100 on cuda, 5 on cpu)")
    p.add_argument("--no-time", action="store_true", help="check correctness only")
    p.add_argument("--cache-root", default=None)
    a = p.parse_args(argv)
    srcs = []
    for path in (a.reference, a.candidate):
        if not os.path.isfile(path):
            p.error(f"no such file: {path}")
        with open(path) as f:
            srcs.append(f.read())
    if a.trials is not None and a.trials < 1:
        raise SystemExit(f"kernel_eval.py: --trials {a.trials}: must be at least 1")
    device = resolve_device(a.device, "kernel_eval.py")
    cfg = {"time_candidate": not a.no_time}
    if a.cache_root:
        cfg["cache_root"] = a.cache_root
    if a.trials:
        cfg["cpu_trials" if device == "cpu" else "gpu_trials"] = a.trials
    result = evaluate(srcs[0], srcs[1], device=device, **cfg)
    if a.json:
        print(json.dumps(result.to_dict()))
    else:
        print(f"status: {result.status}  compiled: {result.compiled}  correct: {result.correct}  "
              f"speedup: {result.speedup:.3f}  ref_ms: {result.ref_ms:.4g}  candidate_ms: {result.candidate_ms:.4g}")
        print(result.message)
    return 0


def interrupted(prog: str) -> None:
    """Ctrl-C: one line and exit 130 at once. evaluate_batch has stopped every worker and build;
    os._exit skips joining the batch's threads, which would wait for phases nobody needs now."""
    print(f"{prog}: interrupted; every worker and build of the evaluation was stopped", file=sys.stderr)
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(130)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--_supervise":
        sys.exit(_supervise(json.load(sys.stdin)))
    if len(sys.argv) > 3 and sys.argv[1] == "--_zygote":
        _zygote_main(int(sys.argv[2]), int(sys.argv[3]))
    if len(sys.argv) > 2 and sys.argv[1] == "--_worker":
        _worker_main(sys.argv[1:])
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        interrupted("kernel_eval.py")
