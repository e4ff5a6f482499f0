"""Tests for kernel_verdict: what a verdict is, with no process and no compile. The output comparison
against a naive allclose (chunked or not), the op check, the paired-timing verdict against liars,
stalls and a slowed reference, finite speedups, run limits, and error trimming. How kernel_eval
reaches these verdicts through real workers is tests/test_kernel_eval.py."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

import kernel_verdict as verdict
from kernel_eval import EvalConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_compare_outputs_agrees_with_naive_allclose():
    torch.manual_seed(0)
    tol = {"float32": (1e-2, 1e-2)}
    for trial in range(200):
        ref = torch.randn(50)
        noise = torch.randn(50) * 10 ** torch.empty(1).uniform_(-4, 0).item()
        cand = ref + noise
        naive = bool(((cand - ref).abs() <= 1e-2 + 1e-2 * ref.abs()).all())
        assert (verdict.compare_outputs([ref], [cand], tol) is None) == naive


def test_compare_outputs_chunked_equals_one_pass(monkeypatch):
    """Chunk by chunk (7 elements a step) gives the same verdict, counts and max diff as one pass,
    over dtypes, poison, infinities and references with NaNs."""
    torch.manual_seed(1)
    tol = EvalConfig().tolerances
    for trial in range(60):
        dtype = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.complex64][trial % 5]
        ref = torch.randn(5, 11).to(dtype)
        cand = (ref + torch.randn(5, 11).to(dtype) * 10 ** (-1 - trial % 3)).to(dtype)
        if trial % 4 == 1:
            cand.view(-1)[trial % 55] = float("nan")
        if trial % 6 == 2:
            ref.view(-1)[3] = float("inf")
            cand.view(-1)[3] = float("inf") if trial % 12 == 2 else 1.0
        one_pass = verdict.compare_outputs([ref], [cand], tol)
        monkeypatch.setattr(verdict, "COMPARE_CHUNK", 7)
        assert verdict.compare_outputs([ref], [cand], tol) == one_pass
        monkeypatch.setattr(verdict, "COMPARE_CHUNK", 1 << 24)
        if dtype == torch.float32 and "inf" not in str(ref.view(-1)[3].item()):
            naive = bool((((cand - ref).abs() <= 1e-2 + 1e-2 * ref.abs()) | ref.isnan()).all())
            assert (one_pass is None) == naive


def test_compare_outputs_rejects_poison_shape_dtype_and_count():
    tol = EvalConfig().tolerances
    ref = torch.randn(4, 8)
    poisoned = ref.clone()
    poisoned[2:] = float("nan")
    assert "NaN" in verdict.compare_outputs([ref], [poisoned], tol)
    huge = ref.clone()
    huge[0, 0] = 3.39e38  # what MALLOC_PERTURB_ leaves in unwritten fp32 memory
    assert "outside tolerance" in verdict.compare_outputs([ref], [huge], tol)
    inf = ref.clone()
    inf[1, 1] = float("inf")
    assert "Inf" in verdict.compare_outputs([ref], [inf], tol)
    assert "shape" in verdict.compare_outputs([ref], [ref.reshape(8, 4)], tol)
    assert "dtype" in verdict.compare_outputs([ref], [ref.half()], tol)
    assert "expected 1 output" in verdict.compare_outputs([ref], [ref, ref], tol)
    assert "tensor" in verdict.compare_outputs([ref], ["not a tensor"], tol)
    assert "dense" in verdict.compare_outputs([ref], [torch.empty(4, 8, device="meta")], tol)
    assert "dense" in verdict.compare_outputs([ref], [ref.to_sparse()], tol)
    assert verdict.compare_outputs([ref], [ref.clone()], tol) is None
    ints = torch.arange(10)
    assert verdict.compare_outputs([ints], [ints.clone()], tol) is None
    assert "differ" in verdict.compare_outputs([ints], [ints + (ints == 3)], tol)
    # a NaN the reference also has is not the candidate's fault
    with_nan = ref.clone()
    with_nan[0, 0] = float("nan")
    assert verdict.compare_outputs([with_nan], [with_nan.clone()], tol) is None


def test_flag_ops_allows_allocation_views_and_extension_ops_only():
    ops = ["aten::empty_like", "aten::add", "aten::relu_", "aten::copy_", "aten::view", "myext::fused",
           "aten::mm", "aten::contiguous", "aten::_to_copy", "aten::clamp"]
    assert verdict.flag_ops(ops) == ["aten::add", "aten::clamp", "aten::mm", "aten::relu_"]


def timed(claimed, true, overheads, calls=50):
    return [([claimed] * calls, calls * (true + o)) for o in overheads]


def test_paired_verdict_pays_what_the_parents_clock_confirms():
    cfg = EvalConfig()
    # overheads per call; their less-stalled half is 0.099, 0.100: loop overhead (the lower
    # median) 0.100, spread 0.001
    ref = timed(0.2, 0.2, [0.100, 0.101, 0.099, 0.100])
    honest = verdict.paired_verdict(ref, timed(0.1, 0.1, [0.100, 0.100, 0.101, 0.100]), cfg)
    assert honest["problem"] is None and honest["speedup"] == pytest.approx(2.0)
    # a clock divided by 1000 on a 0.2 ms kernel: the parent saw 0.2 ms/call more than claimed
    liar = verdict.paired_verdict(ref, timed(0.0002, 0.2, [0.1] * 4), cfg)
    assert liar["speedup"] == 0.0 and "cross-check failed: claimed" in liar["problem"]
    assert liar["parent_ms"] == pytest.approx(0.2, rel=1e-6)  # the parent's own estimate
    tiny = verdict.paired_verdict(ref, timed(5e-324, 0.2, [0.1] * 4), cfg)
    assert tiny["speedup"] == 0.0 and "cross-check failed" in tiny["problem"]
    still = verdict.paired_verdict(ref, timed(0.0, 0.2, [0.1] * 4), cfg)
    assert still["speedup"] == 0.0 and "non-positive" in still["problem"]
    # a skewed report (most calls tiny, the rest long enough that the total looks honest) is judged
    # by its median, the statistic that is paid
    skewed = [([1e-6] * 26 + [0.1 * 50 / 24] * 24, 50 * (0.1 + 0.1)) for _ in range(4)]
    skew = verdict.paired_verdict(ref, skewed, cfg)
    assert skew["speedup"] == 0.0 and "cross-check failed: claimed" in skew["problem"]
    # the boundary, by hand: parent's estimate <= (1 + rel) x claimed + noise x spread + abs
    allowed = cfg.cross_check_rel * 0.1 + cfg.cross_check_noise * 0.001 + cfg.cross_check_abs_ms
    inside = verdict.paired_verdict(ref, timed(0.1, 0.1 + allowed - 1e-4, [0.1] * 4), cfg)
    outside = verdict.paired_verdict(ref, timed(0.1, 0.1 + allowed + 1e-4, [0.1] * 4), cfg)
    assert inside["problem"] is None and "cross-check failed: claimed" in outside["problem"]
    # a kernel faster than the window resolves (0.003 ms/call here) is unconfirmable, whatever it claims
    fast = verdict.paired_verdict(ref, timed(0.0025, 0.0025, [0.1] * 4), cfg)
    assert fast["speedup"] == 0.0 and "faster than the harness's clock resolves" in fast["problem"]
    # the reference slowed beside the candidate (0.2 ms in its first block, 0.4 beside: work the
    # candidate left running) is paid at most ref_slowdown_max x its first block on GPU: 0.3 / 0.1
    slowed = [ref[0]] + timed(0.4, 0.4, [0.1] * 3)
    spill = verdict.paired_verdict(slowed, timed(0.1, 0.1, [0.1] * 4), cfg)
    assert spill["problem"] is None and spill["ref_ms"] == pytest.approx(cfg.ref_slowdown_max * 0.2)
    assert spill["speedup"] == pytest.approx(3.0) and "2x slower beside the candidate" in spill["note"]
    on_cpu = verdict.paired_verdict(slowed, timed(0.1, 0.1, [0.1] * 4), cfg, cpu=True)  # CPU time: not slowed by others
    assert on_cpu["problem"] is None and on_cpu["note"] is None and on_cpu["speedup"] == pytest.approx(4.0)
    # slower by less than the limit: paid as measured (the median of all the reference's times)
    mild = verdict.paired_verdict([ref[0]] + timed(0.28, 0.28, [0.1] * 3), timed(0.1, 0.1, [0.1] * 4), cfg)
    assert mild["note"] is None and mild["speedup"] == pytest.approx(2.8)
    # the CPU allowance is looser (abs per call): what fails on GPU can pass there
    cpu_case = timed(0.1, 0.1 + allowed + 0.005, [0.1] * 4)
    assert verdict.paired_verdict(ref, cpu_case, cfg)["problem"] and verdict.paired_verdict(ref, cpu_case, cfg, cpu=True)["problem"] is None


def test_paired_verdict_ignores_stalls_in_half_the_blocks_but_not_a_lie():
    """A stall (a descheduled worker, the parent's timing thread waiting for the GIL) only lengthens
    a block. On the H200, eval runs beside another harness judged honest 0.13-0.6 ms oracle kernels
    "faster than the clock resolves" or "claimed 0.21 ms but saw 0.70": one stalled block among four
    decided the median and the max - min spread."""
    cfg = EvalConfig()
    calls, stall = 150, 25.0   # a 25 ms stall in a 150-call block: +0.167 ms/call
    def blocks(claimed, true, stalled):
        return [([claimed] * calls, calls * (true + 0.05) + (stall if b in stalled else 0.0)) for b in range(4)]
    ref = blocks(0.15, 0.15, stalled={1})
    for cand_stalled in ({0}, {2, 3}):
        honest = verdict.paired_verdict(ref, blocks(0.13, 0.13, cand_stalled), cfg)
        assert honest["problem"] is None and honest["speedup"] == pytest.approx(0.15 / 0.13)
        assert honest["parent_ms"] == pytest.approx(0.13)
    # read by max - min (the rule before), the one stalled reference block made the window's
    # resolution coarser than the 0.13 ms kernel: "faster than the clock resolves"
    overheads = sorted(ms / calls - 0.15 for _, ms in ref)
    assert overheads[-1] - overheads[0] > 0.13
    # a clock divided by 3 is still refused, stalled or not: no block is shorter than the work in it
    for stalled in (set(), {0, 1}):
        liar = verdict.paired_verdict(ref, blocks(0.3 / 3, 0.3, stalled), cfg)
        assert liar["speedup"] == 0.0 and "cross-check failed: claimed" in liar["problem"]
        assert liar["parent_ms"] == pytest.approx(0.3)


def test_finite_speedup_refuses_claims_with_no_finite_ratio():
    import math
    assert verdict.finite_speedup(0.2, 0.1) == (2.0, None)
    # 5e-324 ms is positive and finite; 0.2 / 5e-324 overflows to inf (what rewards.kernel_score raised on)
    for claimed in (5e-324, 0.0, -1.0, float("nan"), float("inf"), float("-inf")):
        speedup, reason = verdict.finite_speedup(0.2, claimed)
        assert speedup == 0.0 and math.isfinite(speedup), claimed
        assert "cross-check" in reason and ("no finite speedup" in reason or "not a positive finite" in reason), reason
    assert verdict.finite_speedup(float("nan"), 1.0)[0] == 0.0 and "reference" in verdict.finite_speedup(float("nan"), 1.0)[1]


def test_run_limit_is_a_multiple_of_the_reference_plus_slack_under_the_fixed_ceiling():
    cfg = EvalConfig(run_timeout_multiple=10, run_timeout_io_multiple=3, run_timeout_slack_s=5)
    assert verdict.run_limit(cfg, (0.12, 0.0), 120.0) == (pytest.approx(6.2), "10 x the reference's 0.12 s + 5 s")
    # the data a check moves gets the io multiple, not the compute's
    assert verdict.run_limit(cfg, (0.12, 0.5), 120.0) == (
        pytest.approx(7.7), "10 x the reference's 0.12 s + 3 x its 0.5 s moving the data + 5 s")
    limit, how = verdict.run_limit(cfg, (30.0, 0.0), 120.0)  # 305 s derived: the ceiling
    assert limit == 120.0 and how.startswith("the fixed ceiling") and "30 s" in how
    limit, how = verdict.run_limit(cfg, None, 300.0)  # not measured: the ceiling
    assert limit == 300.0 and "unknown" in how


def test_trim_error_keeps_the_first_errors_and_drops_build_commands():
    dump = "\n".join(
        ["[1/2] c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=ext -O3 -c /root/.cache/build/abc/main.cpp -o main.o"]
        + ["FAILED: main.o", "/root/.cache/kernel_eval/build/abc123/main.cpp: In function 'at::Tensor f(at::Tensor)':",
           "/root/.cache/kernel_eval/build/abc123/main.cpp:7:5: error: 'foo' was not declared in this scope",
           "    7 |     foo(x);", "      |     ^~~"]
        + [f"note: candidate {i}" for i in range(300)]
        + ["ninja: build stopped: subcommand failed."])
    out = verdict.trim_error(dump, max_lines=12)
    assert "error: 'foo' was not declared in this scope" in out
    assert "c++ -MMD" not in out and "ninja: build stopped" not in out
    assert len(out.splitlines()) <= 12
    assert "/root/.cache" not in out  # build paths are noise for the model


def test_trim_error_drops_build_commands_whatever_their_length():
    """The H200's nvcc lines (include paths under a deep cache root) put " -c " past 700 characters, and torch
    prints ninja's first command on its "Error building extension" line: neither may crowd out the error."""
    include = "-I/tmp/pytest-of-root/pytest-1/test_cuda_undefined_names_are_0/cache/op_headers/" + "f" * 24
    nvcc = (f"/usr/local/cuda/bin/nvcc -MD -MF cuda.cuda.o.d -ccbin /opt/gcc/bin/gcc {include} "
            + "-isystem /opt/torch/.venv/lib/python3.12/site-packages/torch/include " * 6
            + "--compiler-options '-fPIC' -O3 -std=c++17 -c cuda.cu -o cuda.cuda.o")
    link = "c++ main.o cuda.cuda.o -shared -L/usr/local/cuda/lib64 -lcudart -o ext_first.so"
    dump = "\n".join([f"Error building extension 'ext_first': [1/3] {nvcc}", "FAILED: cuda.cuda.o", nvcc,
                      "cuda.cu(20): error: identifier \"kernel_eval_undeclared\" is undefined",
                      "      float v = in[i] * kernel_eval_undeclared;", "1 error detected in the compilation of \"cuda.cu\".",
                      link, "ninja: build stopped: subcommand failed."])
    assert len(nvcc) > 400
    out = verdict.trim_error(dump, max_lines=12, max_chars=600)
    assert out.splitlines()[0] == "Error building extension 'ext_first'"
    assert 'identifier "kernel_eval_undeclared" is undefined' in out
    assert "nvcc" not in out and "-shared" not in out


def test_trim_error_without_error_lines_keeps_the_tail():
    out = verdict.trim_error("\n".join(f"line {i}" for i in range(100)), max_lines=5)
    assert out.splitlines() == [f"line {i}" for i in range(95, 100)]
    assert len(verdict.trim_error("error " * 10000, max_chars=200)) <= 200


def test_imports_alone_with_the_gate_and_no_process_machinery(tmp_path):
    """Copied with kernel_gate.py (its one project import: the op list) and the gate's kernel_types.py
    into an empty folder, the verdict module imports with the standard library only: no torch until
    outputs are compared, no processes, no other module of the harness."""
    for name in ("kernel_verdict.py", "kernel_gate.py", "kernel_types.py"):
        shutil.copy(os.path.join(ROOT, name), tmp_path)
    code = ("import sys, kernel_verdict as v; "
            "assert not {'torch', 'subprocess', 'multiprocessing', 'kernel_sandbox', 'kernel_eval'} & set(sys.modules); "
            "print(v.flag_ops(['aten::empty_like', 'aten::add']), v.cut('abcdef', 5))")
    out = subprocess.run([sys.executable, "-S", "-E", "-c", code], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['aten::add'] ab..."


def test_block_calls_keep_a_small_tasks_count_and_time_a_slow_one_within_the_budget():
    # 100 trials over 4 blocks in a 1000 ms budget: 25 calls a block while they fit it, fewer when one
    # call is long (20 ms: 12 a block, 0.96 s a side), never none (a call longer than the budget)
    assert verdict.block_calls(100, 4, 1000.0, 0.5) == 25 == verdict.block_calls(100, 4, 1000.0, 10.0)
    assert verdict.block_calls(100, 4, 1000.0, 20.0) == 12 and 12 * 4 * 20.0 <= 1000.0
    assert verdict.block_calls(100, 4, 1000.0, 5000.0) == 1
    assert verdict.block_calls(100, 4, 1000.0, 0.0) == 25  # unmeasured: as asked


def test_paired_verdict_takes_the_overhead_out_per_request_when_the_candidate_has_fewer_calls():
    """A candidate slower than the reference has fewer calls a block (kernel_eval._paired_timing): a request's
    cost beyond its calls (10 ms a block here) is taken out once per block, not per call at the reference's
    count, so the honest slow kernel is confirmed and a lying one still refused."""
    cfg = EvalConfig()
    ref = [([0.1] * 50, 50 * 0.1 + o) for o in (10.0, 10.1, 9.9, 10.0)]
    honest = verdict.paired_verdict(ref, [([1.0] * 5, 5 * 1.0 + 10.0)] * 4, cfg)
    assert honest["problem"] is None and honest["parent_ms"] == pytest.approx(1.0)
    assert honest["speedup"] == pytest.approx(0.1)
    # read per call at the reference's count (10 ms / 50 calls), the same blocks saw 2.8 ms a call: refused
    assert (5 * 1.0 + 10.0) / 5 - 10.0 / 50 > (1 + cfg.cross_check_rel) * 1.0 + cfg.cross_check_noise * 0.1 / 50
    liar = verdict.paired_verdict(ref, [([0.1] * 5, 5 * 1.0 + 10.0)] * 4, cfg)
    assert liar["speedup"] == 0.0 and "cross-check failed: claimed" in liar["problem"]
    # the resolution is the overheads' spread per candidate call: 0.1 ms over 5 calls, by hand
    allowed = cfg.cross_check_rel * 1.0 + cfg.cross_check_noise * 0.1 / 5 + cfg.cross_check_abs_ms
    inside = verdict.paired_verdict(ref, [([1.0] * 5, 5 * (1.0 + allowed - 1e-4) + 10.0)] * 4, cfg)
    outside = verdict.paired_verdict(ref, [([1.0] * 5, 5 * (1.0 + allowed + 1e-4) + 10.0)] * 4, cfg)
    assert inside["problem"] is None and "cross-check failed: claimed" in outside["problem"]


def test_reference_seconds_scales_a_timing_request_with_fewer_calls_per_call():
    seconds = {("time", 40): (2.0, 0.0), ("warm", 1): (0.1, 0.0), ("warm", 4): (0.4, 0.0), "check": (1.0, 0.5)}
    assert verdict.reference_seconds(seconds, {"cmd": "time", "trials": 40}) == (2.0, 0.0)
    assert verdict.reference_seconds(seconds, {"cmd": "time", "trials": 10}) == (0.5, 0.0)
    assert verdict.reference_seconds(seconds, {"cmd": "warm", "calls": 2}) == (0.2, 0.0)  # from 4, the nearest larger
    assert verdict.reference_seconds(seconds, {"cmd": "time", "trials": 80}) is None  # more calls than the reference's
    assert verdict.reference_seconds(seconds, {"cmd": "warm", "calls": 8}) is None
    assert verdict.reference_seconds(seconds, {"cmd": "time_outputs"}) == (1.0, 0.5)
    assert verdict.reference_seconds(seconds, {"cmd": "time_prepare", "warmup": 3}) is None


def test_compile_record_keeps_a_known_early_verdict_rule_only():
    """A compile worker's build failure becomes a compile_error record; the early-verdict rule it names
    (kernel_early_verdict.early_verdict) is kept when it is one of the rules, dropped otherwise (a worker's word)."""
    built = {"builds": 1, "profile": {}}
    msg = {"ok": False, "kind": "build", "message": "cuda.cu(3): error: expected a \")\"", "early_verdict": "unbalanced"}
    record = verdict.compile_record(msg, built, 2000)
    assert record["status"] == "compile_error" and record["early_verdict"] == "unbalanced" and record["builds"] == 1
    assert "early_verdict" not in verdict.compile_record(dict(msg, early_verdict="correct"), built, 2000)
    assert "early_verdict" not in verdict.compile_record(dict(msg, early_verdict=None), built, 2000)
