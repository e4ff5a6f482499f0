"""kernel_reference: the reference session, the trusted half of every verdict (kernel_eval's third phase).

One worker per task runs the task's own Model (kernel_worker, mode "ref"). It draws every input from seeds
only the parent knows, writes them to memory files sealed before any candidate reads them, and keeps its
outputs in its own process; for a task whose outputs would not fit the device (kernel_memory.plan_copies),
it computes them again from the sealed inputs when it judges. A candidate's outputs of one check trial t
reach it in a file of the candidate's own, sealed by the parent; it answers with the first difference:

    judge(C, t) = the first output i where not |C_i(x_t) - R_i(x_t)| <= atol + rtol |R_i(x_t)|, or None
                  (kernel_verdict.compare_outputs: shapes, dtypes, NaN/Inf first)

The candidate never sees the reference's outputs, never writes where the reference reads, and cannot change
its outputs once handed over. The session also measures what a candidate's requests may cost (run_limit's
seconds) and the task's footprint (plan_copies' bytes, cached per reference source), and restarts its
worker on the same seeds when a candidate's outputs stopped it or the memory budget evicted it.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import threading
import time
from typing import Callable

import kernel_sandbox as sandbox
from kernel_memory import Footprint, MemoryBudget, capacity_failure, memfd, plan_copies, seal
from kernel_verdict import Failure, cut, request_key


class ReferenceSession:
    """The parent's side of one task's trusted reference worker (kernel_worker): every candidate of the task is
    judged on the same inputs, from seeds only the parent knows; its outputs never leave its process. A worker
    that dies is started again on the same seeds; a reference that fails on its own fails every candidate of the
    task (reference_error). `lock` serialises requests; callers take the device lock first."""

    def __init__(self, ref_src: str, ctx, users: int, spawn: Callable[[str], sandbox.Worker], footprint_key: str,
                 budget: MemoryBudget | None = None):
        """`ctx`: kernel_eval.Context (device, arch, cfg); `spawn(scratch)` starts the reference's worker there;
        `footprint_key`: what the task's footprint depends on (its source, device, torch), the cache's name for it."""
        self.ref_src, self.ctx, self.cfg, self.spawn = ref_src, ctx, ctx.cfg, spawn
        cfg = ctx.cfg
        self.budget = budget or MemoryBudget(cfg, live_workers=1)
        self.users, self.lock = users, threading.Lock()
        self.seeds = {"check": [secrets.randbits(62) for _ in range(cfg.n_correct_trials)],
                      "time": [secrets.randbits(62) for _ in range(cfg.timing_input_sets)]}
        self.init_seed = secrets.randbits(31)
        self.worker = self.scratch = self.failure = None
        self.files = {}  # sealed memory files: "init" (the model's constructor arguments), "check", "time"
        self.generated = False
        self.host_outputs = self.recompute = False  # plan_copies' (set by _ready)
        # per request, for run_limit: (seconds of compute, seconds moving data); "check" on the worker's clock,
        # scaled to the bytes a candidate's check moves; timing requests (request_key) on the parent's
        self.seconds: dict = {}
        self.out_bytes = {}  # part -> per input set, the byte size of each reference output
        self.gen_check_s = 0.0
        self.footprint_path = os.path.join(cfg.cache_root, "footprints", footprint_key[:32] + ".json")
        self.footprint = Footprint.read(self.footprint_path)

    def _call(self, phase: str, timeout_s: float, msg: dict, fds: tuple = (), deadline: float | None = None) -> tuple:
        """A request to the worker; its failure is the task's (reference_error), and stops the worker."""
        try:
            return sandbox.ask(self.worker, "reference", phase, timeout_s, msg, fds=fds, deadline=deadline)
        except Failure as f:
            raise self._task_failure(f.message) from None

    def _task_failure(self, message: str) -> Failure:
        """The reference failed on its own: the task's failure (every candidate's), its worker stopped."""
        self.failure = Failure("reference_error", f"the task's fault, not the candidate's: {message}")
        self._stop()
        return self.failure

    def _boot(self) -> None:
        """Start the worker, load and build the reference model (no device lock needed)."""
        if self.failure or self.worker is not None:
            return
        cfg = self.cfg
        self.scratch = sandbox.scratch_dir(cfg.scratch_root, "kevalref-")
        self.worker = self.spawn(self.scratch)
        with contextlib.suppress(Failure):  # kept in self.failure
            ready, _ = self._call("load", cfg.load_timeout_s, {})
            free = ready.get("device_free")
            self.budget.set_capacity(free if isinstance(free, int) else None)
            self._call("load", cfg.load_timeout_s, {"cmd": "load"})
            self.files["init"] = memfd("kernel_eval-init-inputs")  # the reference writes it, every candidate reads it
            self._call("init", cfg.load_timeout_s, {"cmd": "init", "seed": self.init_seed}, fds=(self.files["init"],))
            seal(self.files["init"])

    def plan(self) -> dict:
        """plan_copies for this task; a task seen for the first time is measured alone (the probe, cached)."""
        with self.lock:
            self._boot()
            if self.failure:
                raise self.failure
        if self.footprint is None:
            with self.budget.admit(self, None, exclusive=True), self.lock:
                self._probe()
        return plan_copies(self.footprint, self.cfg, self.budget.capacity, cuda=self.ctx.device != "cpu")

    def _probe(self) -> None:
        if self.footprint is not None:
            return
        self._boot()
        if self.failure:
            raise self.failure
        reply, _ = self._call("check", self.cfg.check_timeout_s, {"cmd": "probe", "seed": secrets.randbits(62)})
        self.footprint = Footprint(*(int(reply[k]) for k in ("set_bytes", "out_bytes", "peak_bytes")))
        self.footprint.write(self.footprint_path)

    def ready(self, parts=("init", "check")) -> dict:
        """Inputs written and sealed, reference outputs held (hold the device lock and a memory admission).
        Duplicates of the sealed files of `parts`, the caller's to close (this worker may be stopped meanwhile)."""
        with self.lock:
            self._ready()
            return {part: os.dup(self.files[part]) for part in parts}

    def _ready(self) -> None:
        self._boot()
        if self.failure:
            raise self.failure
        if self.generated:
            return
        self._probe()
        plan = plan_copies(self.footprint, self.cfg, self.budget.capacity, cuda=self.ctx.device != "cpu")
        inputs = {part: memfd(f"kernel_eval-{part}-inputs") for part in ("check", "time")}
        self.files.update(inputs)
        seeds = {"check": self.seeds["check"][:plan["n_check"]], "time": self.seeds["time"][:plan["n_time"]]}
        self.host_outputs, self.recompute = plan["host_outputs"], plan["recompute"]
        # a first forward off the clock, so that gen is timed warm (run_limit)
        self._call("check", self.cfg.check_timeout_s, {"cmd": "rehearse", "seed": secrets.randbits(62)})
        reply, _ = self._call("check", self.cfg.check_timeout_s, {"cmd": "gen", "seeds": seeds,
                                                                  "keep_outputs": not self.recompute},
                              fds=(inputs["check"], inputs["time"]))
        # the reference drew and wrote the inputs; a candidate's check reads them and writes its outputs
        cost = reply["check_cost"]
        moved = cost["in_bytes"] + sum(map(sum, reply["out_bytes"]["check"]))
        per_byte_scale = moved / cost["in_bytes"] if cost["in_bytes"] else 1.0
        self.seconds["check"] = (cost["forward_s"], cost["rest_s"] * per_byte_scale)
        self.gen_check_s = cost["forward_s"] + cost["rest_s"]  # what recomputing the check sets' outputs repeats
        for fd in inputs.values():
            seal(fd)
        self.out_bytes, self.generated = reply["out_bytes"], True

    def close(self) -> None:
        """Stop the worker (the batch is done, or evict: its memory is wanted; a next job restarts it)."""
        with self.lock:
            self._stop()

    evict = close  # MemoryBudget's name for it

    def retry(self) -> None:
        """Forget a failure that running out of memory beside other workers explains."""
        with self.lock:
            if self.failure and capacity_failure(self.failure.message):
                self.failure = None
                self._stop()

    def ask_time(self, msg: dict, fds: tuple = (), deadline: float | None = None) -> dict:
        """One timing request to the reference worker (hold the device lock, exclusive)."""
        with self.lock:
            self._ready()  # a judge may have stopped the worker since: back on the same seeds
            t = time.monotonic()
            reply = self._call("time", self.cfg.time_timeout_s, msg, fds, deadline)[0]
            self.seconds[request_key(msg)] = (time.monotonic() - t, 0.0)
            return reply

    def output_limit(self, part: str, trial: int | None = None) -> int:
        """Bytes a candidate's output file may hold: twice the reference's outputs (of every set of `part`, or of
        one check trial), plus room for the file's own."""
        sets = self.out_bytes[part] if trial is None else [self.out_bytes[part][trial]]
        return 2 * sum(sum(sizes) for sizes in sets) + (16 << 20)

    def judge(self, out_fd: int, part: str, max_bytes: int, trial: int | None = None) -> str | None:
        """The first difference between the candidate's outputs and the reference's, or None (with
        self.recompute, the reference's outputs computed again from the sealed inputs of `part`): of every input
        set of `part`, or of one check `trial`."""
        cfg = self.cfg
        with self.lock:
            self._ready()  # another candidate's outputs may have stopped it since: back on the same seeds
            inputs = (self.files[part],) if self.recompute else ()
            # the reference's own forwards, when recomputed, are not the candidate's to pay for in time
            limit_s = cfg.check_timeout_s + (cfg.run_timeout_multiple * self.gen_check_s if self.recompute else 0.0)
            try:
                reply, _ = sandbox.ask(self.worker, "reference", "judge", limit_s,
                                       {"cmd": "judge", "part": part, "trial": trial, "max_bytes": max_bytes,
                                        "tolerances": cfg.tolerances}, fds=(out_fd, *inputs))
            except Failure as f:
                self._stop()  # the next candidate gets a fresh worker on the same seeds
                raise Failure("runtime_error", "the candidate's outputs could not be compared (they "
                              f"stopped the harness's reader: {cut(f.message, 200)})") from None
            if reply.get("reference_failed"):  # its forward, computing its outputs again
                raise self._task_failure(str(reply["reference_failed"]))
            if reply.get("unreadable"):
                raise Failure("runtime_error", f"candidate returned unreadable outputs: {reply['unreadable']}")
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
