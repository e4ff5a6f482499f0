"""kernel_eval: the reward's verdict. Compile a candidate kernel, run it isolated, check it, time it.

For a candidate C against a reference R (Kevin-32B, KernelBench):
    correct = on every trial (fresh inputs x_t from seeds only the parent knows): shapes and dtypes equal,
              no NaN/Inf where R has none, |C(x_t) - R(x_t)| <= atol + rtol |R(x_t)|, inputs unchanged,
              no torch compute operator in C's forward
    speedup = median_time(R) / median_time(C), timed in turn in one window, if correct and the parent's
              own clock confirms the claimed times (kernel_verdict.paired_verdict), else 0

    python kernel_eval.py REF.py CANDIDATE.py --device cpu --json
    evaluate(ref_src, cand_src, device="cuda")  /  evaluate_batch([(ref, cand), ...], device="cpu")

The file reads in the order a candidate runs: evaluate_batch (precheck -> format_error), the compile (a
worker imports the candidate, whose load_inline builds it; cached per source), the reference session (one
trusted worker per task writes sealed inputs, keeps its outputs or, for a task whose outputs would
not fit the device, computes them again when judging), the check (the candidate's worker runs a trial
at a time, each trial's outputs compared by the reference's worker before the next runs), the timing
(blocks R C C R ... with the device alone), the verdict. What decides is kernel_verdict.py (statuses,
EvalResult, comparison, op check, run limits); the reference's side, kernel_reference.py; what runs inside
a worker, kernel_worker.py; processes, confinement, locks, kernel_sandbox.py behind kernel_boundary.py;
memory and tensor files, kernel_memory.py; builds, kernel_build.py with kernel_early_verdict.py (optional).
Statuses: format_error, compile_error, timeout, runtime_error, incorrect, correct, reference_error (the
task's own reference failed: no verdict), harness_error (the task does not fit even alone: no verdict).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import re
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import kernel_boundary
import kernel_sandbox as sandbox
from kernel_reference import ReferenceSession
from kernel_memory import MemoryBudget, capacity_failure, cpu_split, default_parallel_compiles, memfd, seal_output
from kernel_verdict import (EvalResult, Failure, block_calls, cacheable, compile_record, cut, flag_ops,
                            reference_seconds, run_limit, timing_verdict)

try:  # per-hash build directories and -O3 (fairness), header tiers and precompiled headers (speed)
    import kernel_build
except ModuleNotFoundError as e:  # judged with plain load_inline (the compile)
    if e.name != "kernel_build":
        raise
    kernel_build = None

# what the sandbox runs for every process it starts (`python ENTRY --_worker ...`)
ENTRY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_worker.py")

@dataclass
class EvalConfig:
    """What defines a verdict (trials, tolerances, timing, limits), then how fast a batch goes."""
    n_correct_trials: int = 5
    min_correct_trials: int = 2  # what a large task keeps at least (plan_copies)
    tolerances: dict = field(default_factory=lambda: {  # (atol, rtol) per output dtype; KernelBench v0, Kevin: 1e-2
        "float32": (1e-2, 1e-2), "float64": (1e-2, 1e-2), "float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2)})
    op_check: bool = True  # a torch compute operator in forward -> incorrect (flag_ops)
    time_candidate: bool = True
    gpu_warmup: int = 10
    gpu_warmup_ms: float = 200.0  # and warm up for at least this long on the parent's clock (GPU clocks ramp up)
    gpu_trials: int = 100
    cpu_warmup: int = 1
    cpu_warmup_ms: float = 0.0
    cpu_trials: int = 5
    timing_input_sets: int = 2
    # copies of the input buffers timed calls rotate through (where a tensor lands moves its time); 1: KernelBench's
    timing_buffers: int = 4
    timing_buffer_bytes: int = 2 << 30
    rotation_max_bytes: int = 256 << 20  # input sets this large: one set, one buffer (far larger than L2)
    # paired timing: blocks per side and their length (_paired_timing), the cross-check's terms (paired_verdict)
    timing_blocks: int = 4
    # a side's timed calls, in ms of the reference's wall: a slow task gets fewer than *_trials calls (block_calls)
    gpu_time_budget_ms: float = 1000.0
    cpu_time_budget_ms: float = 10000.0
    gpu_block_ms: float = 20.0
    cpu_block_ms: float = 50.0
    cross_check_rel: float = 0.5
    cross_check_noise: float = 1.0
    cross_check_abs_ms: float = 0.002
    cpu_cross_check_abs_ms: float = 0.02
    ref_slowdown_max: float = 1.5  # on GPU, the reference paid is at most this x its time in the first block
    l2_flush_bytes: int = 256 << 20
    timing_cpus: int = 2  # on GPU, CPUs kept for timing windows (kernel_memory.cpu_split); 0: none
    compile_timeout_s: float = 600.0
    load_timeout_s: float = 120.0  # boot + import (+ a lazy build not seen by the compile phase)
    check_timeout_s: float = 120.0  # the ceiling of a candidate's check request (run_limit)
    time_timeout_s: float = 300.0  # the ceiling of a candidate's timing window, and of each of its requests
    # a candidate's request gets multiple x the reference's compute seconds for it, io multiple x its seconds moving
    # data, + slack, under the ceilings above (run_limit). Generous: a correct kernel is paid however slow (a naive
    # one 10-20x slower than cuBLAS); the slack covers a first call's lazy loads and setup (the reference is warm).
    run_timeout_multiple: float = 30.0
    run_timeout_io_multiple: float = 3.0
    run_timeout_slack_s: float = 5.0
    # the share of the device's free memory (the host's on cpu) a batch's workers may hold after context_bytes
    # per CUDA worker (kernel_memory); memory_capacity_bytes None: measured
    memory_fraction: float = 0.85
    context_bytes: int = 1 << 30
    memory_capacity_bytes: int | None = None
    # the reference's outputs computed again from the sealed inputs when a candidate's are judged, never kept
    # (host memory: the input files alone); False: only where keeping them would not fit the device (plan_copies)
    recompute_outputs: bool = False
    cpu_memory_limit_gb: float = 16.0  # CPU workers' RLIMIT_AS beyond their task's planned copies
    max_file_bytes: int = 256 << 20  # stdout + stderr kept per worker; a worker that writes more is killed
    max_build_file_bytes: int = 4 << 30  # compile workers write objects and precompiled headers
    max_message_bytes: int = 1 << 30  # a candidate's files (RLIMIT_FSIZE), plus twice its task's outputs
    message_chars: int = 1500
    cpu_threads: int | None = 1  # torch threads in CPU workers (C++ candidates are single-threaded)
    cuda_arch: str | None = None  # None: the device's own, e.g. "9.0"
    cache_root: str = os.environ.get("KERNEL_EVAL_CACHE",
                                     os.path.join(os.path.expanduser("~"), ".cache", "kernel_eval"))
    scratch_root: str | None = None  # None: the system temp dir
    keep_scratch: bool = False
    # how fast a batch goes (no verdict depends on these)
    build: object = None  # kernel_build.BuildConfig (None: its defaults; unused without kernel_build.py)
    max_parallel_compiles: int | None = None  # None: default_parallel_compiles
    # candidates whose worker may be alive at once; None: two per parallel build on cuda, 1 on cpu
    max_parallel_runs: int | None = None
    build_jobs: int = 2  # ninja jobs per build (MAX_JOBS); builds already run in parallel
    compile_nice: int = 10  # builds yield the CPU to the run phase
    compile_zygote: bool = True  # fork compile workers from a zygote that imported torch once
    run_zygote: bool = True  # and run workers (the candidates' and the references')
    sandbox: str = "auto"  # what candidates' workers run behind (kernel_boundary.boundary_for, SANDBOX_MODES)


@dataclass
class Context:
    """What every phase of a batch reads: the device ("cpu", "cuda", "cuda:N"), its arch ("" on cpu), the config,
    and the zygotes workers fork from (None: none)."""
    device: str
    arch: str
    cfg: EvalConfig
    zygotes: sandbox.Zygotes | None = None


# ----------------------------------------------------------------------------- the verdict path

def evaluate(ref_src: str, candidate_src: str, *, device: str = "cuda", precheck=None, **cfg) -> EvalResult:
    """One verdict; see the module docstring for the phases."""
    return evaluate_batch([(ref_src, candidate_src)], device=device, precheck=precheck, **cfg)[0]


def evaluate_batch(pairs: list, *, device: str = "cuda", precheck=None, progress: bool = False,
                   zygotes: sandbox.Zygotes | None = None, **cfg) -> list:
    """Verdicts for (reference_src, candidate_src) pairs: parallel compiles, checks sharing the device, one timed
    run at a time; one reference session per task. `zygotes`: the caller's, kept across batches; None: its own."""
    config = cfg.pop("config", None) or EvalConfig(**cfg)
    sandbox.resume()  # an earlier batch of this process was interrupted; this one may start workers
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    boundary = kernel_boundary.boundary_for(config.sandbox, gpu=device != "cpu")  # or BoundaryUnavailable
    batch_start = time.monotonic()
    arch = sandbox.device_arch(device, config.cuda_arch)
    results: list = [None] * len(pairs)
    todo = []
    for i, (ref_src, cand_src) in enumerate(pairs):
        reason = precheck(cand_src) if precheck else None
        if reason:
            results[i] = EvalResult(status="format_error", message=cut(str(reason), config.message_chars),
                                    boundary=boundary)
        else:
            todo.append(i)
    if not todo:
        return results
    n_compiles = config.max_parallel_compiles or default_parallel_compiles(device, config)
    compile_pool = ThreadPoolExecutor(max_workers=max(1, n_compiles))
    owned = zygotes is None
    zygotes = sandbox.Zygotes() if owned else zygotes  # each starts with the first worker of its environment
    zygotes.drop_out_of_service()  # a kept zygote that failed in an earlier batch: a fresh one in this
    n_runs = config.max_parallel_runs or (1 if device == "cpu" else 2 * n_compiles)
    run_pool = ThreadPoolExecutor(max_workers=max(1, n_runs))
    ctx = Context(device, arch, config, zygotes)
    sessions: dict = {}
    # room for a CUDA context per run job's candidate (booted before admission; a session's is in its plan)
    budget = MemoryBudget(config, live_workers=n_runs)
    for i in todo:
        ref_src = pairs[i][0]
        if ref_src not in sessions:
            sessions[ref_src] = reference_session(ref_src, ctx, users=0, budget=budget)
        sessions[ref_src].users += 1
    finished = False
    try:
        compiles: dict = {}
        if device != "cpu" and _reads_host_pch(config) and _confined(ctx):  # candidates may only read it
            compile_pool.submit(kernel_build.warm_host_pch, config.cache_root,  # first: the batch's builds use it
                                lambda src: _compile(src, ctx, writes_host_pch=True))
        for i in todo:  # identical candidates share one compile
            src = pairs[i][1]
            if src not in compiles:
                compiles[src] = compile_pool.submit(_compile, src, ctx)
        _judge_all(pairs, todo, results, compiles, sessions, run_pool, ctx, progress, batch_start, budget)
        finished = True
    finally:
        if not finished:  # Ctrl-C or an error here: stop every process now, wait for no phase
            sandbox.stop_everything(zygotes)
        run_pool.shutdown(wait=finished, cancel_futures=not finished)
        compile_pool.shutdown(wait=finished, cancel_futures=not finished)
        if finished:
            for session in sessions.values():
                session.close()
        if owned or not finished:  # a caller's zygotes serve its next batch, unless this one was stopped
            zygotes.close()
    for result in results:
        result.boundary = boundary
    return results


def _judge_all(pairs, todo, results, compiles, sessions, run_pool, ctx, progress, batch_start, budget):
    """Run every candidate's job (spawn, wait for its compile, judge) on `run_pool`; fill `results`."""
    device, config = ctx.device, ctx.cfg

    def judge(session, cand_src, compiling, alone: bool) -> EvalResult:
        """One attempt: the task's plan, the candidate's worker with limits from it, the verdict."""
        scratch, cand, plan, failure = sandbox.scratch_dir(config.scratch_root, "kevalrun-"), None, None, None
        try:
            if not (compiling.done() and compiling.result()["status"] in ("compile_error", "timeout")):
                try:
                    plan = session.plan()  # a failed compile needs no reference
                    cand = _spawn("cand", cand_src, ctx, scratch, plan=plan)
                except Failure as f:
                    failure = f
            record = compiling.result()
            return _evaluate_one(session, cand, ctx, record, plan, failure,
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
            if res.status in ("runtime_error", "reference_error") and capacity_failure(res.message):
                # out of memory beside other workers is the harness's doing: judged again alone
                session.retry()
                res = judge(session, cand_src, compiling, alone=True)
                res.alone = True
                too_large = budget.too_large(session.footprint, cuda=device != "cpu")
                if res.status == "runtime_error" and capacity_failure(res.message) and too_large:
                    res.status, res.message = "harness_error", f"no verdict: {too_large}: {res.message}"
        finally:
            session.release()
        # latency: from this candidate's compile start (or its job's start, when cached) to verdict
        res.seconds["latency"] = time.monotonic() - compiling.result().get("started", t0)
        res.seconds["since_batch_start"] = time.monotonic() - batch_start
        return res

    futures = {run_pool.submit(job, i): i for i in todo}
    shown = __import__("tqdm").tqdm(total=len(futures), desc="kernel_eval") if progress else contextlib.nullcontext()
    with shown as bar:
        for fut in futures:
            results[futures[fut]] = fut.result()
            if bar:
                bar.update(1)


def _evaluate_one(session, cand, ctx, compile_record, plan, failure, admission) -> EvalResult:
    """The verdict of a compiled candidate: `failure` (its task's reference failed), or _run inside `admission()`."""
    cfg = ctx.cfg
    result = EvalResult(status="runtime_error")
    result.seconds["compile"] = compile_record.get("seconds", 0.0)
    result.build_reused = bool(compile_record.get("cached"))
    if not compile_record.get("cached"):
        for k, v in (compile_record.get("profile") or {}).items():
            result.seconds["compile." + k] = v
    if compile_record["status"] == "compile_error":
        result.status, result.message = "compile_error", "compilation failed:\n" + compile_record["message"]
        result.early_verdict = str(compile_record.get("early_verdict") or "")
        return result
    if compile_record["status"] == "timeout":
        result.status, result.message = "timeout", compile_record["message"]
        result.timeout_seconds = compile_record.get("seconds", 0.0)
        return result
    # cached records from before "builds" was kept count as built
    result.compiled = compile_record["status"] == "ok" and compile_record.get("builds", 1) > 0
    try:
        if failure:
            raise failure
        with admission():
            _run(session, cand, ctx, result, plan)
        result.compiled = True
        result.status = "correct" if result.correct else "incorrect"
        if result.correct and not result.message:
            result.message = "correct (not timed)"
    except Failure as f:
        result.status, result.message, result.correct, result.speedup = f.status, f.message, False, 0.0
        if f.status == "timeout":
            result.timeout_seconds = f.waited_s
    if result.status != "correct":
        result.speedup, result.correct = 0.0, False
    result.message = cut(result.message, cfg.message_chars)
    return result


# ----------------------------------------------------------------------------- the compile

def _compile(candidate_src: str, ctx: Context, writes_host_pch: bool = False, probes: bool = True) -> dict:
    """{"status": "ok" | "compile_error" | "timeout" | "deferred", "message", "seconds"}. `writes_host_pch`: the
    harness's own source (kernel_build.warm_host_pch). `probes`: a build that failed on undefined names may ask
    once for their name probe (kernel_build.py), compiled while its worker waits."""
    cfg = ctx.cfg
    key = _compile_key(candidate_src, ctx)
    record_path = os.path.join(cfg.cache_root, "compiled", key[:32] + ".json")
    cached = sandbox.read_json(record_path)
    if cached and cached.get("status") in ("ok", "compile_error"):
        return dict(cached, seconds=0.0, cached=True, started=time.monotonic())
    t0 = time.monotonic()
    scratch = sandbox.scratch_dir(cfg.scratch_root, "kevalbuild-")
    src_path = os.path.join(scratch, "candidate.py")
    with open(src_path, "w") as f:
        f.write(candidate_src)
    workdir = os.path.join(scratch, "w")
    job = dict(_job(src_path, ctx), name_probes=probes)
    worker = _start_worker("compile", job, workdir, ctx, compiling=True, fsize=cfg.max_build_file_bytes,
                           nice=cfg.compile_nice, zygotes=ctx.zygotes if cfg.compile_zygote else None,
                           confine=_confinement(ctx, src_path, workdir, candidate_src, compiling=True,
                                                writes_host_pch=writes_host_pch))
    try:
        deadline = time.monotonic() + cfg.compile_timeout_s
        msg, _ = worker.channel.recv(deadline)
        probe_s = None
        if msg.get("kind") == "name_probe" and probes:  # one probe a worker: a second request is "deferred"
            started = time.monotonic()
            if isinstance(msg.get("name_probe"), dict):
                kernel_build.answer_name_probes(msg["name_probe"], cfg.cache_root,
                                                lambda src: _compile(src, ctx, probes=False))
            probe_s = time.monotonic() - started
            deadline += probe_s  # the probe's compile is not the candidate's
            worker.channel.send({"cmd": "probed"}, deadline=deadline)
            msg, _ = worker.channel.recv(deadline)
        # where a compile's time went (seconds: torch's import, its builds, the rest; "probe": the probe's wait)
        profile = msg.get("profile") if isinstance(msg.get("profile"), dict) else {}
        profile = {k: float(v) for k, v in profile.items() if isinstance(v, (int, float))}
        if probe_s is not None:
            profile["probe"] = probe_s
        # builds: 0 nothing was compiled (e.g. an empty file), 2 a failed header tier, then as written
        built = {"builds": int(msg.get("builds") or 0), "profile": profile}
        record = compile_record(msg, built, cfg.message_chars)
    except sandbox.ChannelTimeout:
        record = {"status": "timeout", "message": f"compile timed out after {cfg.compile_timeout_s:.0f} s"}
    except sandbox.ChannelError:
        record = {"status": "deferred", "message": sandbox.death_reason(worker, "compile")}
    finally:
        worker.stop()
        if not cfg.keep_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    if cacheable(record):
        sandbox.atomic_write(record_path, json.dumps(record))
    return dict(record, seconds=time.monotonic() - t0, cached=False, started=t0)


def _compile_key(candidate_src: str, ctx: Context) -> str:
    """A compile's cache key: what its build depends on, and where it goes (confined: its own, _confinement)."""
    return sandbox.source_hash("compile", candidate_src, ctx.device == "cpu", ctx.arch, _torch_version(),
                               _build_options(ctx.cfg), _confined(ctx))


def _torch_version() -> str:
    """torch's version from its installed metadata: the harness's process need not import torch (its workers do)."""
    import importlib.metadata
    return importlib.metadata.version("torch")


def _build_options(cfg: EvalConfig) -> dict | None:
    """kernel_build.BuildConfig's fields as the workers get them (None without kernel_build.py)."""
    return dataclasses.asdict(cfg.build or kernel_build.BuildConfig()) if kernel_build else None


def _reads_host_pch(cfg: EvalConfig) -> bool:
    """CUDA builds read the host units' precompiled header from the cache (kernel_build.BuildConfig.host_pch)."""
    options = _build_options(cfg)
    return bool(options and options["host_pch"] and options["cuda_header_tiers"])


# ----------------------------------------------------------------------------- the reference session

def reference_session(ref_src: str, ctx: Context, users: int, budget: MemoryBudget | None = None) -> ReferenceSession:
    """A task's trusted reference worker (kernel_reference), started as the harness starts every worker."""
    key = sandbox.source_hash("footprint", ref_src, ctx.device == "cpu", ctx.arch, _torch_version())
    return ReferenceSession(ref_src, ctx, users, spawn=lambda scratch: _spawn("ref", ref_src, ctx, scratch),
                            footprint_key=key, budget=budget)


# ----------------------------------------------------------------------------- the check

def _run(session: ReferenceSession, cand: sandbox.Worker, ctx: Context, result: EvalResult, plan: dict) -> None:
    """Load the candidate and check it (the device shared), then, if cfg.time_candidate, time it (the device alone)."""
    cfg = ctx.cfg
    t0 = time.monotonic()
    boot, _ = sandbox.ask(cand, "candidate", "load", cfg.load_timeout_s, {})  # booted (usually with the compile)
    if isinstance(boot.get("boot_cpu_s"), (int, float)):
        result.seconds["boot_cpu"] = float(boot["boot_cpu_s"])
    sandbox.ask(cand, "candidate", "load", cfg.load_timeout_s, {"cmd": "load"})
    result.seconds["load"] = time.monotonic() - t0
    t_wait = time.monotonic()
    with sandbox.device_lock(cfg.cache_root, ctx.device, exclusive=False):  # correctness: checks share the device
        result.seconds["device_wait"] = time.monotonic() - t_wait
        t1 = time.monotonic()
        inputs = session.ready()
        result.seconds["reference"] = time.monotonic() - t1
        t2 = time.monotonic()
        try:
            sandbox.ask(cand, "candidate", "init", cfg.load_timeout_s, {"cmd": "init", "seed": session.init_seed},
                        fds=(inputs["init"],))
            changed, reason = _check(session, cand, cfg, inputs["check"], result)
        finally:
            for fd in inputs.values():
                os.close(fd)
        result.seconds["check"] = time.monotonic() - t2
        if reason:
            raise Failure("incorrect", reason)
        for t, c in enumerate(changed):
            if c:
                raise Failure("incorrect", f"trial {t + 1}: forward modified its input(s) {cut(str(c), 40)} in place")
        result.correct = True
    if not cfg.time_candidate:
        return
    ref_blocks, cand_blocks = _time(session, cand, ctx, result, plan)
    timing_verdict(result, ref_blocks, cand_blocks, cfg, cpu=ctx.device == "cpu")


def _check(session: ReferenceSession, cand: sandbox.Worker, cfg: EvalConfig, check_fd: int,
           result: EvalResult) -> tuple:
    """The check on the sealed inputs, a trial at a time, each trial's outputs judged by the session before the
    next runs (one trial's outputs in host memory): (inputs changed per trial, first difference or None). The
    trials share one time limit, the candidate's calls only on its clock."""
    limit_s, limit_note = run_limit(cfg, session.seconds.get("check"), cfg.check_timeout_s)
    changed, used_s = [], 0.0
    for trial in range(len(session.out_bytes["check"])):
        out_fd = memfd("kernel_eval-candidate-outputs")
        try:
            t = time.monotonic()
            try:
                reply, _ = sandbox.ask(cand, "candidate", "check", limit_s,
                                       {"cmd": "run", "trial": trial, "op_check": cfg.op_check,
                                        "poison_bytes": session.out_bytes["check"][trial],
                                        "host_inputs": session.host_outputs},
                                       deadline=t + max(limit_s - used_s, 0.0), fds=(check_fd, out_fd),
                                       limit_note=limit_note)
            except Failure as f:
                f.waited_s += used_s  # a timeout: the check's whole time on the candidate's clock
                raise
            used_s += time.monotonic() - t
            check_limit = session.output_limit("check", trial)
            seal_output(out_fd, check_limit)
            ops, trial_changed = reply.get("ops", []), reply.get("changed")
            if (not isinstance(ops, list) or not all(isinstance(o, str) for o in ops)
                    or not isinstance(trial_changed, list) or not all(isinstance(i, int) for i in trial_changed)):
                raise Failure("runtime_error", "candidate sent a malformed reply on the result channel")
            flagged = flag_ops(ops) if cfg.op_check else []
            if flagged:
                result.ops = flagged
                raise Failure("incorrect", "forward ran torch compute operators instead of your kernel: "
                              + ", ".join(flagged[:8]) + ". Do the computation in the compiled extension.")
            changed.append(trial_changed)
            result.trials = len(changed)
            reason = session.judge(out_fd, "check", check_limit, trial=trial)
        finally:
            os.close(out_fd)
        if reason:
            return changed, reason
    return changed, None


# ----------------------------------------------------------------------------- the timing

def _time(session: ReferenceSession, cand: sandbox.Worker, ctx: Context, result: EvalResult, plan: dict) -> tuple:
    """The paired timing window, then the timed sets' last outputs judged: (reference blocks, candidate blocks)."""
    cfg = ctx.cfg
    t_wait = time.monotonic()
    time_limit = session.output_limit("time")
    out_fd, time_fd = memfd("kernel_eval-candidate-timed-outputs"), None
    try:
        with sandbox.device_lock(cfg.cache_root, ctx.device, exclusive=True):  # timing: the device alone
            result.seconds["device_wait"] += time.monotonic() - t_wait
            t3 = time.monotonic()
            deadline = time.monotonic() + cfg.time_timeout_s
            time_fd = session.ready(("time",))["time"]

            def cand_ask(msg, fds=()):
                """Within run_limit of the reference's same request (asked first) and the window's deadline. The
                candidate's window is given its output file (with host_outputs its kept outputs stream there)."""
                if msg["cmd"] == "time_prepare":
                    fds = (*fds, out_fd)
                limit_s, note = run_limit(cfg, reference_seconds(session.seconds, msg), cfg.time_timeout_s)
                left = deadline - time.monotonic()
                if left < limit_s:
                    limit_s, note = max(left, 0.0), f"what was left of the timing window's {cfg.time_timeout_s:g} s"
                return sandbox.ask(cand, "candidate", "time", limit_s, msg, fds=fds,
                                   deadline=time.monotonic() + limit_s, limit_note=note)[0]

            ref_blocks, cand_blocks = _paired_timing(
                lambda msg, fds=(): session.ask_time(msg, fds, deadline), cand_ask,
                lambda: {"ref": session.worker.proc.pid, "cand": cand.proc.pid}, time_fd, ctx,
                deadline, plan["buffers"], plan["host_outputs"])
            cand_ask({"cmd": "time_outputs"})
            session.ask_time({"cmd": "time_release"}, (), deadline)  # its window's tensors: freed for the next job
        seal_output(out_fd, time_limit)
        with sandbox.device_lock(cfg.cache_root, ctx.device, exclusive=False):
            reason = session.judge(out_fd, "time", time_limit)
    finally:
        for fd in (out_fd, time_fd):
            if fd is not None:
                os.close(fd)
    result.seconds["time"] = time.monotonic() - t3
    if reason:
        result.correct = False
        raise Failure("incorrect", f"a timed call gave a wrong result: {reason}")
    return ref_blocks, cand_blocks


def _paired_timing(ref_ask, cand_ask, pids, time_file: int, ctx: Context, deadline: float, buffers: int,
                   host_outputs: bool = False) -> tuple:
    """(reference blocks, candidate blocks), each (claimed per-call times, the parent's ms), timed in one window
    in the order R C C R R C C R ... (linear drift cancels) on the same inputs, loop and flushes. `*_ask(msg,
    fds)`: a request to that side; `pids()`: each side's supervisor, whose tree's CPU time is the parent's clock
    on CPU. Calls per block, per side: enough for block_ms of that side, at least block_calls within the time
    budget; a candidate's at most the reference's (a slower candidate's blocks last as long as the reference's)."""
    device, cfg = ctx.device, ctx.cfg
    warmup, trials, warmup_ms = ((cfg.cpu_warmup, cfg.cpu_trials, cfg.cpu_warmup_ms) if device == "cpu"
                                 else (cfg.gpu_warmup, cfg.gpu_trials, cfg.gpu_warmup_ms))
    for ask in (ref_ask, cand_ask):  # inputs onto the device and `warmup` calls, off the clock
        ask({"cmd": "time_prepare", "warmup": warmup, "l2_flush_bytes": cfg.l2_flush_bytes,
             "buffers": buffers, "buffer_bytes": cfg.timing_buffer_bytes, "host_outputs": host_outputs,
             "cpus": cpu_split(device == "cpu", cfg)[1]}, (time_file,))
    # GPU clocks ramp up: both sides in turn until `warmup_ms` on this process's clock (not a worker's)
    warm_start = time.monotonic()
    while (time.monotonic() - warm_start) * 1e3 < warmup_ms:
        ref_ask({"cmd": "warm", "calls": max(1, warmup)})
        cand_ask({"cmd": "warm", "calls": max(1, warmup)})
    # each side's time a call, from one request doubled until it lasts half of block_ms (the candidate's up to the
    # reference's count); a block then holds enough calls for block_ms of it: a slower candidate fewer than the
    # reference (its blocks as long, not its slowdown times as long), never more
    block_ms = cfg.cpu_block_ms if device == "cpu" else cfg.gpu_block_ms
    budget_ms = cfg.cpu_time_budget_ms if device == "cpu" else cfg.gpu_time_budget_ms

    def block_length(ask, most: int | None = None) -> tuple:
        """(calls a block, the last probe's count) for the side `ask` asks."""
        calls = 1
        while True:
            t = time.monotonic()
            ask({"cmd": "warm", "calls": calls})
            per_call_ms = (time.monotonic() - t) * 1e3 / calls
            if per_call_ms * calls >= block_ms / 2 or time.monotonic() > deadline or calls == most:
                break
            calls *= 2
        wanted = max(math.ceil(block_ms / max(per_call_ms, 1e-6)),
                     block_calls(trials, cfg.timing_blocks, budget_ms, per_call_ms))
        return wanted, calls

    ref_calls, probed = block_length(ref_ask)
    calls = {"ref": ref_calls, "cand": min(ref_calls, block_length(cand_ask, probed)[0])}
    blocks = {"ref": [], "cand": []}
    trees = {side: sandbox.descendants(pid) for side, pid in pids().items()} if device == "cpu" else {}
    for b in range(2 * cfg.timing_blocks):
        side = "ref" if b % 4 in (0, 3) else "cand"
        t, cpu0 = time.monotonic(), sandbox.cpu_ms(trees.get(side, []))
        last = b >= 2 * cfg.timing_blocks - 2  # each side's last block: its outputs are kept (checked again)
        ask = ref_ask if side == "ref" else cand_ask
        times = ask({"cmd": "time", "trials": calls[side], "keep": last}).get("times")
        wall = (time.monotonic() - t) * 1e3
        if trees:  # the CPU clock the worker times itself by, of its whole tree; a process that exits
            cpu1 = sandbox.cpu_ms(trees[side])  # takes its CPU time with it: counted as none (refused)
            wall = cpu1 - cpu0 if cpu1 is not None and cpu0 is not None else 0.0
        if (not isinstance(times, list) or len(times) != calls[side]  # and no int that float() cannot hold
                or not all(isinstance(x, float) or type(x) is int and abs(x) < 1e300 for x in times)):
            raise Failure("runtime_error", "candidate returned a malformed timing reply")
        blocks[side].append(([float(x) for x in times], wall))
        if time.monotonic() > deadline:
            raise Failure("timeout", f"timing took longer than {cfg.time_timeout_s:.0f} s",
                          waited_s=cfg.time_timeout_s)
    return blocks["ref"], blocks["cand"]


# ----------------------------------------------------------------------------- the workers it drives

def _start_worker(mode: str, job: dict, scratch: str, ctx: Context, *, compiling: bool,
                  fsize: int, as_bytes: int | None = None, nice: int = 0, zygotes=None,
                  confine: dict | None = None) -> sandbox.Worker:
    """`python kernel_worker.py --_worker MODE --job JOB` (or a zygote's fork), behind `confine`; as_bytes None:
    cpu_memory_limit_gb (cpu only)."""
    cfg, cpu = ctx.cfg, ctx.device == "cpu"
    as_bytes = (int(cfg.cpu_memory_limit_gb * (1 << 30)) if as_bytes is None else as_bytes) if cpu else 0
    env = sandbox.worker_environment(ctx.device, ctx.arch, cfg.cache_root, cfg.build_jobs, compiling)
    try:
        return sandbox.Worker(mode, ["--job", json.dumps(job)], scratch, env,
                              entry=ENTRY, fsize=fsize, output_bytes=cfg.max_file_bytes,
                              message_bytes=16 << 20, as_bytes=as_bytes, nice=nice,  # tensors travel in files
                              cpus=cpu_split(cpu, cfg)[0], zygotes=zygotes,  # off the CPUs kept for timing
                              confine=confine)
    except sandbox.Interrupted as e:
        raise Failure("runtime_error", str(e)) from None


def _spawn(mode: str, src: str, ctx: Context, scratch: str, plan: dict | None = None) -> sandbox.Worker:
    """A reference or candidate worker. A candidate's files may hold twice its task's outputs beyond max_message_bytes,
    its address space (cpu) twice its plan's bytes beyond cpu_memory_limit_gb; the reference is not limited."""
    import resource
    cfg = ctx.cfg
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
    confine = None if mode == "ref" else _confinement(ctx, path, os.path.dirname(path), src, False)
    return _start_worker(mode, _job(path, ctx), os.path.dirname(path), ctx, compiling=False, fsize=fsize,
                         as_bytes=as_bytes, zygotes=ctx.zygotes if cfg.run_zygote else None,
                         confine=confine)


def _confined(ctx: Context) -> bool:
    return kernel_boundary.boundary_for(ctx.cfg.sandbox, gpu=ctx.device != "cpu") == "namespaces"


def _confinement(ctx: Context, src_path: str, workdir: str, candidate_src: str, compiling: bool,
                 writes_host_pch: bool = False) -> dict | None:
    """A candidate worker's boundary (kernel_boundary.candidate_confinement; None: unconfined); its build directories
    are writable only while it compiles (or without kernel_build.py), the host header and probes' answers bound."""
    cfg, device = ctx.cfg, ctx.device
    if not _confined(ctx):
        return None
    own = os.path.join(cfg.cache_root, "candidates", _compile_key(candidate_src, ctx)[:32])
    binds = []
    if kernel_build is not None and device != "cpu" and compiling:  # the name probes' answers (the harness writes them)
        probes_dir = os.path.join(cfg.cache_root, "name_probes")
        os.makedirs(probes_dir, exist_ok=True)
        binds.append((probes_dir, probes_dir, False))
    if _reads_host_pch(cfg):  # patch_load_inline writes it if missing
        # the header, written here: its directory is read-only there (warm_host_pch aside)
        host_header = kernel_build.write_host_header(cfg.cache_root)
        binds.append((os.path.dirname(host_header), os.path.dirname(host_header), writes_host_pch))
    return kernel_boundary.candidate_confinement(cfg.cache_root, cfg.scratch_root, src_path, workdir, own,
                                                 writable=compiling or kernel_build is None, binds=binds)


def _job(src_path: str, ctx: Context) -> dict:
    """What a worker is told on its command line (nothing secret: ps shows it)."""
    device, arch, cfg = ctx.device, ctx.arch, ctx.cfg
    return {"source": src_path, "device": "cpu" if device == "cpu" else "cuda", "cache_root": cfg.cache_root,
            "arch": arch, "build": _build_options(cfg), "threads": cfg.cpu_threads if device == "cpu" else None}


# ----------------------------------------------------------------------------- command line

def resolve_device(device: str | None, prog: str) -> str:
    """--device as given, checked, or (None) cuda when torch sees one, else cpu, said on stderr.
    A user's mistake is one line that names it and what to do (SystemExit), never a traceback. An explicit
    cpu imports no torch here: the harness's process needs none, its workers import their own."""
    if device == "cpu":
        return device
    import torch
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        why = "torch sees a CUDA device" if device == "cuda" else "torch sees no CUDA device"
        print(f"{prog}: --device not given: using {device} ({why})", file=sys.stderr)
    if not re.fullmatch(r"cpu|cuda(:\d+)?", device):
        raise SystemExit(f"{prog}: --device {device}: expected cpu, cuda or cuda:N")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            build = (f"torch {torch.__version__} was built without CUDA" if torch.version.cuda is None
                     else "no GPU is visible")
            raise SystemExit(f"{prog}: --device {device}: torch sees no CUDA device ({build}); use --device cpu")
        index = int(device.split(":")[1]) if ":" in device else 0
        if index >= torch.cuda.device_count():
            raise SystemExit(f"{prog}: --device {device}: torch sees {torch.cuda.device_count()} CUDA device(s)")
        from torch.utils.cpp_extension import CUDA_HOME
        if CUDA_HOME is None:
            raise SystemExit(f"{prog}: --device {device}: no CUDA toolkit (nvcc) to build kernels with; "
                             "install one or set CUDA_HOME")
    return device


def _usage_error(message: str):
    print(f"kernel_eval.py: {message}", file=sys.stderr)
    raise SystemExit(2)


def _read_source(path: str) -> str:
    """A reference or candidate file's text, or one line and exit 2."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        _usage_error(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})")
    except OSError as e:  # "is a directory", "no such file or directory", ...
        _usage_error(f"{path}: {e.strerror.lower()}")


def main(argv=None) -> int:
    """One verdict, printed; exit 0 on every verdict (the status says how the candidate did), 2 on a
    usage error (a file that cannot be read, --trials below 1), 1 on a device that cannot be used or
    --sandbox require without namespaces, 130 when interrupted."""
    p = argparse.ArgumentParser(description="Evaluate a candidate kernel against a KernelBench-format reference.",
                                epilog="Exit code 0 on every verdict (read the status); builds are cached in "
                                       "--cache-root (default $KERNEL_EVAL_CACHE or ~/.cache/kernel_eval).")
    p.add_argument("reference")
    p.add_argument("candidate")
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when torch sees one, else cpu)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--trials", type=int, default=None, help="timed calls (default: 100 on cuda, 5 on cpu)")
    p.add_argument("--no-time", action="store_true", help="check correctness only")
    p.add_argument("--cache-root", default=None,
                   help="build cache (default: $KERNEL_EVAL_CACHE or ~/.cache/kernel_eval)")
    p.add_argument("--sandbox", choices=kernel_boundary.SANDBOX_MODES, default="auto",
                   help="the candidate's processes behind namespaces and uid 65534: auto (where they work, "
                        "else a warning), require (refuse without them), off (default: auto)")
    a = p.parse_args(argv)
    srcs = [_read_source(a.reference), _read_source(a.candidate)]
    if a.trials is not None and a.trials < 1:
        _usage_error(f"--trials {a.trials}: must be at least 1")
    device = resolve_device(a.device, "kernel_eval.py")
    try:  # a built-in reference's `# cpu:` sizes on the CPU, as the trainer judges it
        import tasks
    except ModuleNotFoundError as e:  # the harness's files alone: the reference as it is
        if e.name != "tasks":
            raise
        tasks = None
    if tasks is not None:
        try:
            srcs[0] = tasks.sized_for(srcs[0], device, a.reference)
        except tasks.TaskError as e:
            _usage_error(str(e))
    cfg = {"time_candidate": not a.no_time, "sandbox": a.sandbox}
    if a.cache_root:
        cfg["cache_root"] = a.cache_root
    if a.trials:
        cfg["cpu_trials" if device == "cpu" else "gpu_trials"] = a.trials
    try:
        result = evaluate(srcs[0], srcs[1], device=device, **cfg)
    except kernel_boundary.BoundaryUnavailable as e:
        print(f"kernel_eval.py: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(result.to_dict()))
    else:
        print(f"status: {result.status}  compiled: {result.compiled}  correct: {result.correct}  "
              f"speedup: {result.speedup:.3f}  ref_ms: {result.ref_ms:.4g}  candidate_ms: {result.candidate_ms:.4g}  "
              f"boundary: {result.boundary}")
        print(result.message)
    return 0


def interrupted(prog: str) -> None:
    """Ctrl-C: one line and exit 130 at once (evaluate_batch stopped every worker; os._exit joins no thread)."""
    print(f"{prog}: interrupted; every worker and build of the evaluation was stopped", file=sys.stderr)
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(130)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        interrupted("kernel_eval.py")
