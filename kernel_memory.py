"""kernel_memory: how a batch of kernel_eval's evaluations fits in memory.

Judging a task keeps copies of it: the input sets of the correctness trials and of the timing window
(in memory files), the reference outputs, the timed calls' rotating input buffers, each candidate's
output file. The task's first run, alone on the device (the probe), measures its Footprint;
plan_copies sizes its copies to the memory there is (a large task keeps fewer trials and no rotation:
the reasons for copies fade with size); MemoryBudget admits a job only when its bytes fit beside those
of the jobs and reference sessions already admitted, evicts idle sessions to make room, and runs a job
that fits nowhere alone. A failure that running out of memory explains (capacity_failure) is judged
again with the device to itself (kernel_eval._judge_all).

`cfg` is kernel_eval.EvalConfig, read by attribute (n_correct_trials, min_correct_trials,
timing_input_sets, timing_buffers, timing_buffer_bytes, rotation_max_bytes, l2_flush_bytes,
memory_fraction, context_bytes, memory_capacity_bytes). Standard library only.
"""
from __future__ import annotations

import contextlib
import os
import re
import threading
from dataclasses import dataclass


@dataclass
class Footprint:
    """What judging one task takes, learned from its reference's first run (the probe, alone on
    the device): one input set, one output set, and the forward's peak allocation (its outputs and
    temporaries), in bytes."""
    set_bytes: int
    out_bytes: int
    peak_bytes: int


def plan_copies(fp: Footprint, cfg, capacity: dict, cuda: bool) -> dict:
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

    def __init__(self, cfg, live_workers: int):
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


def gib_per_pool(pools: dict) -> str:
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


def capacity_failure(message: str) -> bool:
    """A failure that running out of memory (or of CUDA contexts) explains: retried alone."""
    return bool(CAPACITY_FAILURE.search(message or ""))
