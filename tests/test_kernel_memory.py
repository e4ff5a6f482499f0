"""Tests for kernel_memory: how many copies judging a task keeps (plan_copies, against the formulas of
its docstring), the memory budget's admission of jobs (never more than fits, a job too large runs
alone, idle sessions are evicted), and the tensor memory files (every dtype and value round trips,
a sealed file cannot be changed, a malformed one is refused). Judging under memory pressure end to
end is in test_kernel_eval.py."""
import json
import mmap
import os
import subprocess
import sys
import threading
import time

import pytest
import torch

import kernel_eval
import kernel_memory

MiB = 1 << 20


def test_plan_copies_keeps_every_copy_of_a_small_task_and_scales_a_large_one_down():
    cfg = kernel_eval.EvalConfig()
    capacity = {"device": 100 << 30, "host": 100 << 30}
    small_task = kernel_memory.Footprint(set_bytes=4 * MiB, out_bytes=4 * MiB, peak_bytes=4 * MiB)
    small = kernel_memory.plan_copies(small_task, cfg, capacity, cuda=True)
    assert (small["n_check"], small["n_time"], small["buffers"]) == (cfg.n_correct_trials, cfg.timing_input_sets,
                                                                      cfg.timing_buffers)
    # the ReLU of today's KernelBench: 6.4 GB in, 6.4 GB out
    relu = kernel_memory.Footprint(set_bytes=6_442_450_944, out_bytes=6_442_450_944, peak_bytes=6_442_450_944)
    big = kernel_memory.plan_copies(relu, cfg, capacity, cuda=True)
    assert (big["n_check"], big["n_time"], big["buffers"]) == (cfg.min_correct_trials, 1, 1)
    # the bytes, from the docstring's formulas: 100 GiB holds the outputs on the device
    s, o, ctx = relu.set_bytes, relu.out_bytes, cfg.context_bytes
    timing = 2 * s + o + cfg.l2_flush_bytes + o  # sets + buffers, the call, its last output
    assert not big["host_outputs"]
    assert big["session"] == {"device": 3 * o + timing + ctx, "host": 3 * s}
    # the candidate's host: its output file, one check trial's outputs at a time or the timed set's
    assert big["candidate"] == {"device": max(2 * s + 2 * o, timing), "host": o}
    # more memory keeps more trials (a quarter of the capacity for the kept sets), never more than asked
    roomy = kernel_memory.plan_copies(relu, cfg, {"device": 1 << 40, "host": 1 << 40}, cuda=True)
    assert roomy["n_check"] == cfg.n_correct_trials
    on_cpu = kernel_memory.plan_copies(relu, cfg, {"host": 100 << 30}, cuda=False)
    assert set(on_cpu["session"]) == {"host"} and on_cpu["session"]["host"] == 3 * o + (2 * s + 2 * o) + 3 * s
    assert not big["recompute"] and not on_cpu["recompute"]
    # recompute_outputs: the reference's outputs (held) are counted nowhere, on either kind of device
    cfg.recompute_outputs = True
    lean, lean_cpu = (kernel_memory.plan_copies(relu, cfg, c, cuda=cuda)
                      for c, cuda in ((capacity, True), ({"host": 100 << 30}, False)))
    assert lean["recompute"] and lean["session"]["device"] == big["session"]["device"] - 3 * o
    assert lean_cpu["recompute"] and lean_cpu["session"]["host"] == on_cpu["session"]["host"] - 3 * o


def test_plan_copies_fits_kernelbench_l2norm_on_an_80_gb_card():
    # level1/39_L2Norm_: 8 GiB in, 8 GiB out, its forward's peak its output; an H100 batch's capacity:
    # 78 GiB free x memory_fraction, less a context for each of 14 candidate workers; host 128 GiB x 0.85
    cfg = kernel_eval.EvalConfig()
    gib = 1 << 30
    l2norm = kernel_memory.Footprint(set_bytes=8 * gib, out_bytes=8 * gib, peak_bytes=8 * gib)
    capacity = {"host": int(128 * gib * cfg.memory_fraction), "device": int(78 * gib * cfg.memory_fraction) - 14 * gib}
    plan = kernel_memory.plan_copies(l2norm, cfg, capacity, cuda=True)
    assert plan["host_outputs"] and (plan["n_check"], plan["n_time"], plan["buffers"]) == (2, 1, 1)
    # device: the reference's timing window (set, buffer, call) and its context; the candidate's the same
    # or its check (the input, two poisoned output blocks)
    assert plan["session"]["device"] == 24 * gib + cfg.l2_flush_bytes + cfg.context_bytes
    assert plan["candidate"]["device"] == 24 * gib + cfg.l2_flush_bytes
    # host: three input sets in files; the reference's outputs are not kept (computed again when judged);
    # the candidate's output file, one check trial's outputs or its last timed ones streamed there:
    # 32 GiB in all, twice the task's 8 GiB in and 8 GiB out
    assert plan["recompute"]
    assert plan["session"]["host"] == 24 * gib and plan["candidate"]["host"] == 8 * gib
    budget = kernel_memory.MemoryBudget(cfg, live_workers=14)
    budget.capacity = capacity
    assert budget.too_large(l2norm, cuda=True) == ""
    # the same task where it does not fit: one line, device and host apart, what there is, what to change
    budget.capacity = {"host": 64 * gib, "device": 40 * gib}
    why = budget.too_large(l2norm, cuda=True)
    assert why.startswith("judging this task needs 49.5 GiB device memory (have 40.0) and 32.0 GiB host memory "
                          "(have 64.0): ") and "memory_fraction" in why and "\n" not in why


class _FakeSession:
    def __init__(self, budget):
        self.budget, self.evictions = budget, 0

    def evict(self):
        self.evictions += 1
        self.budget.forget(self)


def test_memory_budget_never_admits_more_than_fits_and_runs_a_job_too_large_for_it_alone():
    budget = kernel_memory.MemoryBudget(kernel_eval.EvalConfig(memory_capacity_bytes=100), live_workers=0)
    budget.set_capacity(None)
    sessions = [_FakeSession(budget) for _ in range(4)]
    plans = [{"session": {"device": 30, "host": 0}, "candidate": {"device": 20, "host": 0}} for _ in range(3)]
    plans.append({"session": {"device": 150, "host": 0}, "candidate": {"device": 10, "host": 0}})  # fits nowhere
    peak, overlap_with_big, guard = [0], [False], threading.Lock()
    inside: dict = {}  # task -> its jobs inside

    def job(k):
        with budget.admit(sessions[k], plans[k]):
            with guard:
                inside[k] = inside.get(k, 0) + 1
                # a task's session counts once, each of its jobs' candidates once
                held = sum(plans[j]["session"]["device"] + n * plans[j]["candidate"]["device"]
                           for j, n in inside.items() if n)
                if 3 not in inside or not inside[3]:
                    peak[0] = max(peak[0], held)
                overlap_with_big[0] |= bool(inside.get(3)) and sum(inside.values()) > 1
            time.sleep(0.05)
            with guard:
                inside[k] -= 1

    threads = [threading.Thread(target=job, args=(k,)) for k in range(4) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert 0 < peak[0] <= 100
    assert not overlap_with_big[0]  # the task that fits nowhere ran alone
    assert sum(s.evictions for s in sessions) > 0  # idle sessions made room
    for session in sessions:
        budget.forget(session)
    assert budget.held == {"device": 0, "host": 0}


def test_default_parallel_compiles_leaves_the_timing_cpus_to_timing(monkeypatch):
    """On cpu every core builds; on cuda the builds (build_jobs each) fit in the CPUs not kept for
    timing windows, where any are kept, and there is always at least one."""
    for cpus in range(1, 33):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cpus: set(range(100, 100 + n)))
        for timing_cpus, build_jobs in ((2, 2), (0, 2), (1, 3), (2, 4)):
            cfg = kernel_eval.EvalConfig(timing_cpus=timing_cpus, build_jobs=build_jobs)
            assert kernel_memory.default_parallel_compiles("cpu", cfg) == cpus
            n = kernel_memory.default_parallel_compiles("cuda", cfg)
            kept = timing_cpus if timing_cpus and cpus >= 4 * timing_cpus else 0
            assert n >= 1 and (n == 1 or n * build_jobs <= cpus - kept), (cpus, timing_cpus, build_jobs, n)


# ----------------------------------------------------------------------------- tensor files

def tensor_file(sets) -> int:
    fd = kernel_memory.memfd("test")
    kernel_memory.write_tensor_sets(fd, sets)
    return fd


def test_tensor_files_round_trip_every_dtype_and_value():
    sets = [[torch.randn(3, 5), torch.randn(4, dtype=torch.float64), 7, 2.5, True, None, "x", [3, (1, 2)], (4, [5])],
            [torch.randn(2, 3).to(torch.bfloat16), torch.tensor([True, False, True]), torch.tensor(3.5),
             torch.empty(0, 4), torch.arange(6, dtype=torch.int64).view(2, 3)[:, 1:],  # a non-contiguous view
             torch.randn(2, 2, dtype=torch.complex64), torch.randint(-5, 5, (3,), dtype=torch.int8)]]
    fd = tensor_file(sets)
    back = kernel_memory.read_tensor_sets(fd, 1 << 30)
    os.close(fd)
    assert len(back) == 2 and [len(s) for s in back] == [9, 7]
    for want, got in zip(sets[0] + sets[1], back[0] + back[1]):
        if isinstance(want, torch.Tensor):
            assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want.contiguous())
        else:  # a tuple stays a tuple, a list a list, at every depth
            assert got == want and repr(got) == repr(want)


@pytest.mark.parametrize("value", [{"a": 1}, [torch.ones(2)], object(), torch.ones(2, dtype=torch.uint16),
                                   torch.ones(2).to_sparse()])
def test_a_value_a_tensor_file_cannot_hold_is_refused_when_written(value):
    fd = kernel_memory.memfd("test")
    with pytest.raises(TypeError, match="cannot travel in a tensor file"):
        kernel_memory.write_tensor_sets(fd, [[torch.ones(3), value]])
    os.close(fd)


def test_sealed_tensor_file_cannot_be_changed_by_any_holder():
    fd = tensor_file([[torch.ones(1000)]])
    other = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)  # what another process of this uid could open
    kernel_memory.seal(fd)
    for holder in (fd, other):
        with pytest.raises(PermissionError):
            os.pwrite(holder, b"x" * 8, 0)
        with pytest.raises(PermissionError):
            os.ftruncate(holder, 0)
        with pytest.raises(PermissionError):
            mmap.mmap(holder, 0, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    assert torch.equal(kernel_memory.read_tensor_sets(other, 1 << 20)[0][0], torch.ones(1000))
    os.close(other)
    os.close(fd)


def test_a_file_mapped_writable_cannot_be_sealed():
    fd = tensor_file([[torch.ones(10)]])
    live = mmap.mmap(fd, 0)  # a candidate that keeps a writable mapping could rewrite it after the check
    with pytest.raises(OSError):
        kernel_memory.seal(fd)
    live.close()
    kernel_memory.seal(fd)
    os.close(fd)


@pytest.mark.parametrize("damage", ["truncated", "magic", "offset", "size", "dtype", "index", "huge", "value"])
def test_malformed_tensor_files_are_refused(damage):
    fd = tensor_file([[torch.arange(16, dtype=torch.float32).view(4, 4)]])
    data = bytearray(os.pread(fd, 1 << 20, 0))
    os.close(fd)
    n = int.from_bytes(data[-16:-8], "little")
    index = json.loads(data[-16 - n: -16])
    entry = index["sets"][0][0]
    if damage == "truncated":
        data = data[:-3]
    elif damage == "magic":
        data[-1:] = b"X"
    elif damage == "offset":
        entry["offset"] = len(data) * 4
    elif damage == "size":
        entry["nbytes"] = 8
    elif damage == "dtype":
        entry["dtype"] = "object"
    elif damage == "index":
        index = {"sets": "nope"}
    elif damage == "huge":
        entry["shape"] = [1 << 41, 4]
    elif damage == "value":
        index["sets"][0].append({"value": {"dict": 1}})  # only a tuple is marked
    if damage in ("offset", "size", "dtype", "index", "huge", "value"):
        footer = json.dumps(index).encode()
        data = data[: -16 - n] + footer + len(footer).to_bytes(8, "little") + kernel_memory.TENSOR_FILE_MAGIC
    fd = kernel_memory.memfd("damaged")
    os.write(fd, bytes(data))
    with pytest.raises(ValueError):
        kernel_memory.read_tensor_sets(fd, 1 << 20)
    os.close(fd)


def test_memory_imports_only_the_standard_library():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import sys; sys.path.insert(0, %r); import kernel_memory; "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))" % root)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
