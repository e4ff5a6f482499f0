"""Tests for kernel_memory: how many copies judging a task keeps (plan_copies, against the formulas of
its docstring) and the memory budget's admission of jobs (never more than fits, a job too large runs
alone, idle sessions are evicted). Judging under memory pressure end to end is in test_kernel_eval.py."""
import threading
import time

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
    # the bytes, from the docstring's formulas: timing state (1 + 1) x set + peak + out + flush
    timing = 2 * relu.set_bytes + 2 * relu.out_bytes + cfg.l2_flush_bytes
    assert big["session"] == {"device": 3 * relu.out_bytes + timing, "host": 3 * relu.set_bytes}
    assert big["candidate"] == {"device": max(5 * relu.set_bytes, timing), "host": 2 * relu.out_bytes}
    # more memory keeps more trials (a quarter of the capacity for the kept sets), never more than asked
    roomy = kernel_memory.plan_copies(relu, cfg, {"device": 1 << 40, "host": 1 << 40}, cuda=True)
    assert roomy["n_check"] == cfg.n_correct_trials
    on_cpu = kernel_memory.plan_copies(relu, cfg, {"host": 100 << 30}, cuda=False)
    assert set(on_cpu["session"]) == {"host"} and on_cpu["session"]["host"] == 3 * relu.out_bytes + (
        2 * relu.set_bytes + 2 * relu.out_bytes) + 3 * relu.set_bytes


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
