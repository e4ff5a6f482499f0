"""kernel_memory: what a batch of kernel_eval's evaluations may hold (memory, CPUs), and how tensors
travel between its processes.

Judging a task keeps copies of it: the input sets of the correctness trials and of the timing window
(in memory files), the reference outputs, the timed calls' rotating input buffers, each candidate's
output file. The task's first run, alone on the device (the probe), measures its Footprint;
plan_copies sizes its copies to the memory there is (a large task keeps fewer trials and no rotation:
the reasons for copies fade with size); MemoryBudget admits a job only when its bytes fit beside those
of the jobs and reference sessions already admitted, evicts idle sessions to make room, and runs a job
that fits nowhere alone. A failure that running out of memory explains (capacity_failure) is judged
again with the device to itself (kernel_eval._judge_all). On GPU the last CPUs are kept for timing
windows, the builds and checks run on the others (cpu_split, default_parallel_compiles).

Tensors travel in memory files (memfd), never through a pipe or a pickle: raw bytes at aligned
offsets and a JSON index (TensorFileWriter, write_tensor_sets), read in place and validated
(read_tensor_sets). The parent seals a file (F_SEAL_WRITE: seal) once its writer is done, so that no
holder can change it afterwards: the init inputs and the input sets the reference writes, each
output file a candidate writes.

`cfg` is kernel_eval.EvalConfig, read by attribute (n_correct_trials, min_correct_trials,
timing_input_sets, timing_buffers, timing_buffer_bytes, rotation_max_bytes, l2_flush_bytes,
memory_fraction, context_bytes, memory_capacity_bytes, recompute_outputs, timing_cpus, build_jobs). Standard library
only (torch is imported inside the tensor-file functions, which run where torch is loaded).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import threading
import dataclasses
from dataclasses import dataclass

from kernel_sandbox import atomic_write, read_json, write_all
from kernel_verdict import Failure


@dataclass
class Footprint:
    """What judging one task takes, learned from its reference's first run (the probe, alone on
    the device): one input set, one output set, and the forward's peak allocation (its outputs and
    temporaries), in bytes."""
    set_bytes: int
    out_bytes: int
    peak_bytes: int

    @classmethod
    def read(cls, path: str) -> Footprint | None:
        """The footprint `write` cached in `path`, or None (missing or malformed)."""
        known = read_json(path)
        fields = {"set_bytes", "out_bytes", "peak_bytes"}
        if isinstance(known, dict) and set(known) == fields and all(isinstance(v, int) for v in known.values()):
            return cls(**known)
        return None

    def write(self, path: str) -> None:
        atomic_write(path, json.dumps(dataclasses.asdict(self)))


COMPARE_WORKSPACE_BYTES = 1 << 30  # kernel_verdict's comparison: a few temporaries of COMPARE_CHUNK values


def plan_copies(fp: Footprint, cfg, capacity: dict, cuda: bool) -> dict:
    """How many copies judging this task keeps, where, and the bytes its workers then hold.

    Copies exist for reasons that fade with size: several correctness trials catch a forward that
    replays an old output (two do that; more only sample more values, and a large output is many
    values already); several timing sets and buffers keep a small task's inputs out of L2 and
    average over placements (useless for a set far larger than L2). So a task keeps
    n_correct_trials trials while they take at most a quarter of the memory there is (never fewer
    than min_correct_trials), and rotates timing sets and buffers only below rotation_max_bytes.

    A worker's device bytes are the most it holds at once (its allocator keeps its largest phase; the
    reference's worker empties its cache after generating and after a timing window). Per pool
    ("device": the GPU on cuda; "host": memory files and the reference's outputs when they wait
    there, and everything on cpu), with held = (n_check + n_time) x out:
        timing window = (n_time + buffers) x set + peak + n_time x out + L2 flush   (either side: the sets,
                        the refilled buffers, the call, each set's last output; host_outputs: none kept there)
        check         = 2 x set + max(2 x out, peak)    (pristine and cloned inputs, poisoned output
                        blocks the forward then takes); host_inputs: set + max(2 x out, peak)
        session       = held + max(set + peak, timing window, compare workspace)   on the device,
                        + context_bytes on cuda (a resident session's worker; MemoryBudget keeps
                        room for the candidates' workers, which boot before they are admitted)
                        (n_check + n_time) x set (input files)                     on the host
        candidate     = max(check, timing window) on the device, n_time x out on the host (its output
                        file: one check trial's outputs at a time, each judged before the next trial, or
                        the timed sets' last outputs)
    host_outputs: where the reference's outputs on the device would not let the task fit the device alone,
    the candidate checks its inputs unchanged against the file, not a device copy, the window times one
    input set (outputs this large are far beyond any cache, so rotating sets buys nothing) and the
    candidate's last timed outputs stream to its file as they are made; the reference keeps no
    outputs at all ("recompute", held = 0): judging a candidate computes them again from the sealed
    input file, a set at a time, and compares chunk by chunk on the device (a forward and one set's
    transfer per set judged). cfg.recompute_outputs True recomputes for every task."""
    s, o, p = fp.set_bytes, fp.out_bytes, max(fp.peak_bytes, fp.out_bytes)
    flush = cfg.l2_flush_bytes if cuda else 0
    rotate = s < cfg.rotation_max_bytes
    n_time = cfg.timing_input_sets if rotate else 1
    buffers = 1
    if rotate:
        buffers = max(1, min(cfg.timing_buffers, cfg.timing_buffer_bytes // s if s else cfg.timing_buffers))
    keep = min(capacity.values()) // 4
    n_check = max(cfg.min_correct_trials, min(cfg.n_correct_trials, keep // max(1, s + o)))
    held = (n_check + n_time) * o
    forced = bool(cfg.recompute_outputs)

    def window(n_time: int, outputs_kept: bool) -> tuple:
        """(timing window, the session's work): n_time sets, each set's last output kept there or not."""
        timing = (n_time + buffers) * s + p + flush + (n_time * o if outputs_kept else 0)
        return timing, max(s + p, timing, COMPARE_WORKSPACE_BYTES if cuda else 0)

    timing, work = window(n_time, outputs_kept=True)
    if not cuda:  # one pool: the workers' tensors live beside the memory files; pristine inputs are the file's
        session = {"host": (0 if forced else held) + work + (n_check + n_time) * s}
        candidate = {"host": max(s + p, timing) + n_time * o}
        return {"n_check": n_check, "n_time": n_time, "buffers": buffers, "host_outputs": False,
                "recompute": forced, "session": session, "candidate": candidate}
    check = 2 * s + max(2 * o, p)
    host_outputs = held + work + max(check, timing) > capacity.get("device", 0)
    if host_outputs:
        check, n_time = s + max(2 * o, p), 1
        timing, work = window(n_time, outputs_kept=False)
    recompute = host_outputs or forced
    session = {"device": work + (0 if recompute else held) + cfg.context_bytes,
               "host": (n_check + n_time) * s}
    candidate = {"device": max(check, timing), "host": n_time * o}
    return {"n_check": n_check, "n_time": n_time, "buffers": buffers, "host_outputs": host_outputs,
            "recompute": recompute, "session": session, "candidate": candidate}


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
        """live_workers: the candidate workers that may hold a CUDA context at once (a session's is in its plan)."""
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

    def too_large(self, fp: Footprint | None, cuda: bool) -> str:
        """Why a task of footprint `fp` cannot be judged even alone, or "" when it can (or is unmeasured):
        one line, device and host memory apart (what judging needs, what the batch has), and what to change."""
        plan = plan_copies(fp, self.cfg, self.capacity, cuda) if fp is not None and self.capacity else None
        if not plan:
            return ""
        need = {k: plan["session"].get(k, 0) + plan["candidate"].get(k, 0) for k in self.capacity}
        if all(need[k] <= self.capacity[k] for k in need):
            return ""
        names = {"device": "device memory", "host": "host memory"}
        parts = [f"{need[k] / (1 << 30):.1f} GiB {names[k]} (have {self.capacity[k] / (1 << 30):.1f})"
                 for k in ("device", "host") if k in need]
        return (f"judging this task needs {' and '.join(parts)}: its reference's session "
                f"{gib_per_pool(plan['session'])} and the candidate {gib_per_pool(plan['candidate'])} GiB, "
                f"{plan['n_check']} check trial(s) of {fp.set_bytes / (1 << 30):.2g} GiB in and "
                f"{fp.out_bytes / (1 << 30):.2g} GiB out; to fit: a larger memory_fraction (now "
                f"{self.cfg.memory_fraction:g}), fewer parallel runs (each keeps {self.cfg.context_bytes / (1 << 30):g} "
                "GiB of device memory for its context), or a smaller task")

    def forget(self, session) -> None:
        """The session's worker stopped: its bytes are free."""
        with self.cond:
            for k, v in self.resident.pop(session, {}).items():
                self.held[k] -= v
            self.cond.notify_all()


def gib_per_pool(pools: dict) -> str:
    """"device 24.0 + host 48.0" (the pools a plan names, device first)."""
    return " + ".join(f"{k} {pools[k] / (1 << 30):.1f}" for k in ("device", "host") if k in pools)


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


# ----------------------------------------------------------------------------- CPUs

def cpu_split(cpu: bool, cfg) -> tuple:
    """(CPUs for builds and checks, CPUs kept for timing windows: the last timing_cpus this process
    may use, both timed workers on them), or (None, None): no split (cpu, none kept, or fewer than
    4 x timing_cpus CPUs: builds keep at least three quarters of them)."""
    allowed = sorted(os.sched_getaffinity(0))
    if cpu or cfg.timing_cpus <= 0 or len(allowed) < 4 * cfg.timing_cpus:
        return None, None
    return allowed[:-cfg.timing_cpus], allowed[-cfg.timing_cpus:]


def default_parallel_compiles(device: str, cfg) -> int:
    """Builds at once when max_parallel_compiles is None: on cpu every core (one C++ unit per build); on
    cuda the CPUs not kept for timing windows / build_jobs (a .cu unit and a host unit side by side). More
    builds at once finish a batch sooner and each candidate later; rollout waits for a harness call's whole
    batch."""
    build_cpus, _ = cpu_split(device == "cpu", cfg)
    cores = len(build_cpus) if build_cpus else len(os.sched_getaffinity(0))
    return cores if device == "cpu" else max(1, cores // max(1, cfg.build_jobs))


# ----------------------------------------------------------------------------- tensor files
# Bulk tensors (hundreds of MB per call on real tasks) go through memory files, not the pipe: raw
# bytes at 64-byte aligned offsets, then a JSON index, its length and a magic tag. Readers view the
# bytes in place (no copy, no pickle) after validating every offset, size and dtype: a candidate
# writes its own output file and may put anything in it. The same format carries the init inputs.

TENSOR_FILE_MAGIC = b"KEVALTS1"
TENSOR_FILE_DTYPES = ("float32", "float64", "float16", "bfloat16", "complex64", "complex128",
                      "int8", "int16", "int32", "int64", "uint8", "bool")
TENSOR_FILE_ALIGN = 64
TRUSTED_FILE_MAX_BYTES = 1 << 46  # input files: written by the reference session, sealed by the parent


class TensorFileWriter:
    """Writes sets of values to an empty file, one set at a time, in the layout read_tensor_sets
    reads: tensors, and beside them numbers, strings, None and lists or tuples of these (`add`
    raises TypeError on anything else). Device tensors go through a small pinned buffer: a pageable
    device-to-host copy into fresh memory is several times slower."""

    STAGING_BYTES = 64 << 20

    def __init__(self, fd: int):
        self.fd, self.pos, self.index, self.staging = fd, 0, [], None

    def add(self, values: list) -> None:
        import torch
        entries = []
        for v in values:
            if not isinstance(v, torch.Tensor):
                entries.append({"value": _encode(v)})
                continue
            dtype = str(v.dtype).replace("torch.", "")
            if dtype not in TENSOR_FILE_DTYPES or v.layout != torch.strided:
                raise TypeError(f"a {dtype} tensor ({v.layout}) cannot travel in a tensor file")
            t = v.detach()
            t = t.contiguous() if t.device.type == "cuda" else t.to("cpu").contiguous()
            pad = -self.pos % TENSOR_FILE_ALIGN
            write_all(self.fd, bytes(pad))
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
                        write_all(self.fd, self.staging[:n].numpy())
                else:
                    write_all(self.fd, flat.numpy())
            entries.append({"dtype": dtype, "shape": list(t.shape),
                            "offset": self.pos, "nbytes": nbytes})
            self.pos += nbytes
        self.index.append(entries)

    def close(self) -> None:
        footer = json.dumps({"sets": self.index}).encode()
        write_all(self.fd, footer + len(footer).to_bytes(8, "little") + TENSOR_FILE_MAGIC)
        self.staging = None


def _encode(value):
    """A value beside the tensors, as the index holds it: JSON, a tuple marked (code may tell it from a list)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_encode(v) for v in value]
        return {"tuple": items} if isinstance(value, tuple) else items
    raise TypeError(f"a {type(value).__name__} cannot travel in a tensor file (tensors can, and beside them "
                    "numbers, strings, None and lists or tuples of these)")


def _decode(value):
    if isinstance(value, dict):
        if set(value) != {"tuple"} or not isinstance(value["tuple"], list):
            raise ValueError("bad value entry")
        return tuple(_decode(v) for v in value["tuple"])
    return [_decode(v) for v in value] if isinstance(value, list) else value


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
                values.append(_decode(e["value"]))
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


def memfd(name: str) -> int:
    return os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)


def seal(fd: int) -> None:
    """Make a memory file immutable for every holder; fails (EBUSY) while anyone maps it writable."""
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)


def seal_output(fd: int, max_bytes: int) -> None:
    """Seal a candidate's output file, which must hold at most max_bytes; else the candidate's runtime_error."""
    try:
        seal(fd)
    except OSError as e:
        raise Failure("runtime_error", "candidate kept its output file mapped writable") from e
    size = os.fstat(fd).st_size
    if size > max_bytes:
        raise Failure("runtime_error", f"candidate wrote {size} bytes of outputs (limit {max_bytes})")
