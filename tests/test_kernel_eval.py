"""Tests for kernel_eval: pure helpers (no compile), then the adversarial suite and the built-in
benign set on CPU (slow: one shared C++ build), then the CUDA versions (gpu).

Each adversarial candidate states its expected verdict in its first line, `# expect: STATUS`, where
STATUS is an EvalResult status, or `timing_rejected` (correct but the timing cross-check refuses the
speedup) or `no_speedup` (correct, and not measured faster than the reference)."""
import contextlib
import glob
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time

import pytest
import torch

import kernel_eval as ke

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ADV = os.path.join(HERE, "adversarial")
REFERENCE = open(os.path.join(ADV, "reference.py")).read()
# short phase limits: the hang cases wait for them; loads stay generous for a busy 2-core box
FAST = dict(cpu_trials=5, cpu_warmup=1, load_timeout_s=120, check_timeout_s=25, time_timeout_s=60,
            max_file_bytes=16 << 20, max_parallel_runs=2)


def expectation(path: str) -> str:
    with open(path) as f:
        first = f.readline()
    assert first.startswith("# expect: "), f"{path}: first line must be '# expect: STATUS'"
    return first.split(":", 1)[1].strip()


def cases(kind: str) -> dict:
    return {os.path.basename(p)[:-3]: p for p in sorted(glob.glob(os.path.join(ADV, kind, "*.py")))}


def check_expectation(name: str, expect: str, result: ke.EvalResult, cfg: ke.EvalConfig) -> None:
    info = f"{name}: {result.status} {result.message!r}"
    assert len(result.message) <= cfg.message_chars, info
    if expect == "timing_rejected":
        assert result.status == "correct" and not result.timing_ok and result.speedup == 0.0, info
        assert "cross-check" in result.message, info
    elif expect == "no_speedup":
        assert result.status == "correct" and result.speedup < 1.0, info
    else:
        assert result.status == expect, info
        assert result.correct == (expect == "correct"), info
        if expect == "correct":
            assert result.timing_ok and result.speedup > 0 and result.candidate_ms > 0, info
        else:
            assert result.speedup == 0.0, info


def leftover_processes(marker: bytes) -> list:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


# ----------------------------------------------------------------------------- pure helpers

def test_trim_error_keeps_the_first_errors_and_drops_build_commands():
    dump = "\n".join(
        ["[1/2] c++ -MMD -MF main.o.d -DTORCH_EXTENSION_NAME=ext -O3 -c /root/.cache/build/abc/main.cpp -o main.o"]
        + ["FAILED: main.o", "/root/.cache/kernel_eval/build/abc123/main.cpp: In function 'at::Tensor f(at::Tensor)':",
           "/root/.cache/kernel_eval/build/abc123/main.cpp:7:5: error: 'foo' was not declared in this scope",
           "    7 |     foo(x);", "      |     ^~~"]
        + [f"note: candidate {i}" for i in range(300)]
        + ["ninja: build stopped: subcommand failed."])
    out = ke.trim_error(dump, max_lines=12)
    assert "error: 'foo' was not declared in this scope" in out
    assert "c++ -MMD" not in out and "ninja: build stopped" not in out
    assert len(out.splitlines()) <= 12
    assert "/root/.cache" not in out  # build paths are noise for the model


def test_trim_error_without_error_lines_keeps_the_tail():
    out = ke.trim_error("\n".join(f"line {i}" for i in range(100)), max_lines=5)
    assert out.splitlines() == [f"line {i}" for i in range(95, 100)]
    assert len(ke.trim_error("error " * 10000, max_chars=200)) <= 200


def test_source_hash_is_stable_and_separates_inputs():
    assert ke.source_hash("a", [1, 2]) == ke.source_hash("a", [1, 2])
    assert ke.source_hash("a", [1, 2]) != ke.source_hash("a", [2, 1])
    assert ke.source_hash("ab", "c") != ke.source_hash("a", "bc")


def test_compare_outputs_agrees_with_naive_allclose():
    torch.manual_seed(0)
    tol = {"float32": (1e-2, 1e-2)}
    for trial in range(200):
        ref = torch.randn(50)
        noise = torch.randn(50) * 10 ** torch.empty(1).uniform_(-4, 0).item()
        cand = ref + noise
        naive = bool(((cand - ref).abs() <= 1e-2 + 1e-2 * ref.abs()).all())
        assert (ke.compare_outputs([ref], [cand], tol) is None) == naive


def test_compare_outputs_chunked_equals_one_pass(monkeypatch):
    """Chunk by chunk (7 elements a step) gives the same verdict, counts and max diff as one pass,
    over dtypes, poison, infinities and references with NaNs."""
    torch.manual_seed(1)
    tol = ke.EvalConfig().tolerances
    for trial in range(60):
        dtype = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.complex64][trial % 5]
        ref = torch.randn(5, 11).to(dtype)
        cand = (ref + torch.randn(5, 11).to(dtype) * 10 ** (-1 - trial % 3)).to(dtype)
        if trial % 4 == 1:
            cand.view(-1)[trial % 55] = float("nan")
        if trial % 6 == 2:
            ref.view(-1)[3] = float("inf")
            cand.view(-1)[3] = float("inf") if trial % 12 == 2 else 1.0
        one_pass = ke.compare_outputs([ref], [cand], tol)
        monkeypatch.setattr(ke, "COMPARE_CHUNK", 7)
        assert ke.compare_outputs([ref], [cand], tol) == one_pass
        monkeypatch.setattr(ke, "COMPARE_CHUNK", 1 << 24)
        if dtype == torch.float32 and "inf" not in str(ref.view(-1)[3].item()):
            naive = bool((((cand - ref).abs() <= 1e-2 + 1e-2 * ref.abs()) | ref.isnan()).all())
            assert (one_pass is None) == naive


def test_compare_outputs_rejects_poison_shape_dtype_and_count():
    tol = ke.EvalConfig().tolerances
    ref = torch.randn(4, 8)
    poisoned = ref.clone()
    poisoned[2:] = float("nan")
    assert "NaN" in ke.compare_outputs([ref], [poisoned], tol)
    huge = ref.clone()
    huge[0, 0] = 3.39e38  # what MALLOC_PERTURB_ leaves in unwritten fp32 memory
    assert "outside tolerance" in ke.compare_outputs([ref], [huge], tol)
    inf = ref.clone()
    inf[1, 1] = float("inf")
    assert "Inf" in ke.compare_outputs([ref], [inf], tol)
    assert "shape" in ke.compare_outputs([ref], [ref.reshape(8, 4)], tol)
    assert "dtype" in ke.compare_outputs([ref], [ref.half()], tol)
    assert "expected 1 output" in ke.compare_outputs([ref], [ref, ref], tol)
    assert "tensor" in ke.compare_outputs([ref], ["not a tensor"], tol)
    assert "dense" in ke.compare_outputs([ref], [torch.empty(4, 8, device="meta")], tol)
    assert "dense" in ke.compare_outputs([ref], [ref.to_sparse()], tol)
    assert ke.compare_outputs([ref], [ref.clone()], tol) is None
    ints = torch.arange(10)
    assert ke.compare_outputs([ints], [ints.clone()], tol) is None
    assert "differ" in ke.compare_outputs([ints], [ints + (ints == 3)], tol)
    # a NaN the reference also has is not the candidate's fault
    with_nan = ref.clone()
    with_nan[0, 0] = float("nan")
    assert ke.compare_outputs([with_nan], [with_nan.clone()], tol) is None


def test_flag_ops_allows_allocation_views_and_extension_ops_only():
    ops = ["aten::empty_like", "aten::add", "aten::relu_", "aten::copy_", "aten::view", "myext::fused",
           "aten::mm", "aten::contiguous", "aten::_to_copy", "aten::clamp"]
    assert ke.flag_ops(ops) == ["aten::add", "aten::clamp", "aten::mm", "aten::relu_"]


def timed(claimed, true, overheads, calls=50):
    return [([claimed] * calls, calls * (true + o)) for o in overheads]


def test_paired_verdict_pays_what_the_parents_clock_confirms():
    cfg = ke.EvalConfig()
    # overheads per call; their less-stalled half is 0.099, 0.100: loop overhead (the lower
    # median) 0.100, spread 0.001
    ref = timed(0.2, 0.2, [0.100, 0.101, 0.099, 0.100])
    honest = ke.paired_verdict(ref, timed(0.1, 0.1, [0.100, 0.100, 0.101, 0.100]), cfg)
    assert honest["problem"] is None and honest["speedup"] == pytest.approx(2.0)
    # a clock divided by 1000 on a 0.2 ms kernel: the parent saw 0.2 ms/call more than claimed
    liar = ke.paired_verdict(ref, timed(0.0002, 0.2, [0.1] * 4), cfg)
    assert liar["speedup"] == 0.0 and "cross-check failed: claimed" in liar["problem"]
    assert liar["parent_ms"] == pytest.approx(0.2, rel=1e-6)  # the parent's own estimate
    tiny = ke.paired_verdict(ref, timed(5e-324, 0.2, [0.1] * 4), cfg)
    assert tiny["speedup"] == 0.0 and "cross-check failed" in tiny["problem"]
    still = ke.paired_verdict(ref, timed(0.0, 0.2, [0.1] * 4), cfg)
    assert still["speedup"] == 0.0 and "non-positive" in still["problem"]
    # a skewed report (most calls tiny, the rest long enough that the total looks honest) is judged
    # by its median, the statistic that is paid
    skewed = [([1e-6] * 26 + [0.1 * 50 / 24] * 24, 50 * (0.1 + 0.1)) for _ in range(4)]
    skew = ke.paired_verdict(ref, skewed, cfg)
    assert skew["speedup"] == 0.0 and "cross-check failed: claimed" in skew["problem"]
    # the boundary, by hand: parent's estimate <= (1 + rel) x claimed + noise x spread + abs
    allowed = cfg.cross_check_rel * 0.1 + cfg.cross_check_noise * 0.001 + cfg.cross_check_abs_ms
    inside = ke.paired_verdict(ref, timed(0.1, 0.1 + allowed - 1e-4, [0.1] * 4), cfg)
    outside = ke.paired_verdict(ref, timed(0.1, 0.1 + allowed + 1e-4, [0.1] * 4), cfg)
    assert inside["problem"] is None and "cross-check failed: claimed" in outside["problem"]
    # a kernel faster than the window resolves (0.003 ms/call here) is unconfirmable, whatever it claims
    fast = ke.paired_verdict(ref, timed(0.0025, 0.0025, [0.1] * 4), cfg)
    assert fast["speedup"] == 0.0 and "faster than the harness's clock resolves" in fast["problem"]
    # the reference slowed beside the candidate (0.2 ms in its first block, 0.4 beside: work the
    # candidate left running) is paid at most ref_slowdown_max x its first block on GPU: 0.3 / 0.1
    slowed = [ref[0]] + timed(0.4, 0.4, [0.1] * 3)
    spill = ke.paired_verdict(slowed, timed(0.1, 0.1, [0.1] * 4), cfg)
    assert spill["problem"] is None and spill["ref_ms"] == pytest.approx(cfg.ref_slowdown_max * 0.2)
    assert spill["speedup"] == pytest.approx(3.0) and "2x slower beside the candidate" in spill["note"]
    on_cpu = ke.paired_verdict(slowed, timed(0.1, 0.1, [0.1] * 4), cfg, cpu=True)  # CPU time: not slowed by others
    assert on_cpu["problem"] is None and on_cpu["note"] is None and on_cpu["speedup"] == pytest.approx(4.0)
    # slower by less than the limit: paid as measured (the median of all the reference's times)
    mild = ke.paired_verdict([ref[0]] + timed(0.28, 0.28, [0.1] * 3), timed(0.1, 0.1, [0.1] * 4), cfg)
    assert mild["note"] is None and mild["speedup"] == pytest.approx(2.8)
    # the CPU allowance is looser (abs per call): what fails on GPU can pass there
    cpu_case = timed(0.1, 0.1 + allowed + 0.005, [0.1] * 4)
    assert ke.paired_verdict(ref, cpu_case, cfg)["problem"] and ke.paired_verdict(ref, cpu_case, cfg, cpu=True)["problem"] is None


def test_paired_verdict_ignores_stalls_in_half_the_blocks_but_not_a_lie():
    """A stall (a descheduled worker, the parent's timing thread waiting for the GIL) only lengthens
    a block. On the H200, eval runs beside another harness judged honest 0.13-0.6 ms oracle kernels
    "faster than the clock resolves" or "claimed 0.21 ms but saw 0.70": one stalled block among four
    decided the median and the max - min spread."""
    cfg = ke.EvalConfig()
    calls, stall = 150, 25.0   # a 25 ms stall in a 150-call block: +0.167 ms/call
    def blocks(claimed, true, stalled):
        return [([claimed] * calls, calls * (true + 0.05) + (stall if b in stalled else 0.0)) for b in range(4)]
    ref = blocks(0.15, 0.15, stalled={1})
    for cand_stalled in ({0}, {2, 3}):
        honest = ke.paired_verdict(ref, blocks(0.13, 0.13, cand_stalled), cfg)
        assert honest["problem"] is None and honest["speedup"] == pytest.approx(0.15 / 0.13)
        assert honest["parent_ms"] == pytest.approx(0.13)
    # read by max - min (the rule before), the one stalled reference block made the window's
    # resolution coarser than the 0.13 ms kernel: "faster than the clock resolves"
    overheads = sorted(ms / calls - 0.15 for _, ms in ref)
    assert overheads[-1] - overheads[0] > 0.13
    # a clock divided by 3 is still refused, stalled or not: no block is shorter than the work in it
    for stalled in (set(), {0, 1}):
        liar = ke.paired_verdict(ref, blocks(0.3 / 3, 0.3, stalled), cfg)
        assert liar["speedup"] == 0.0 and "cross-check failed: claimed" in liar["problem"]
        assert liar["parent_ms"] == pytest.approx(0.3)


def test_timing_loop_rotates_input_copies_each_holding_every_set():
    """Timed calls rotate through copies of the input buffers (each its own place in memory: on the
    H200 a kernel's time moved up to ~20% with where its input landed), each call sees exactly its
    set's values, and the copies stay within their byte budget."""
    sets = [[torch.full((4, 8), float(v)), 3] for v in range(2)]
    seen = []

    def model(x, n):
        seen.append((x.data_ptr(), float(x[0, 0]), n))
        return x * 2

    loop = ke._TimingLoop(model, sets, None, False, lambda: None, buffers=4, buffer_bytes=1 << 20)
    times = loop.run(16)
    assert len(times) == 16 and all(t >= 0 for t in times)
    assert [v for _, v, _ in seen] == [0.0, 1.0] * 8 and all(n == 3 for _, _, n in seen)
    by_copy = {}
    for ptr, v, _ in seen:
        by_copy.setdefault(ptr, set()).add(v)
    assert len(by_copy) == 4 and all(vs == {0.0, 1.0} for vs in by_copy.values())
    assert [float(o[0][0, 0]) for o in loop.last] == [0.0, 2.0]  # each set's last output
    # a budget of 2.5 copies' bytes holds 2 copies; none holds 1 (KernelBench's one set of buffers)
    one = 4 * 8 * 4
    assert len(ke._TimingLoop(model, sets, None, False, lambda: None, 4, int(2.5 * one)).bufs) == 2
    assert len(ke._TimingLoop(model, sets, None, False, lambda: None, 4, 0).bufs) == 1


def test_finite_speedup_refuses_claims_with_no_finite_ratio():
    import math
    assert ke.finite_speedup(0.2, 0.1) == (2.0, None)
    # 5e-324 ms is positive and finite; 0.2 / 5e-324 overflows to inf (what rewards.kernel_score raised on)
    for claimed in (5e-324, 0.0, -1.0, float("nan"), float("inf"), float("-inf")):
        speedup, reason = ke.finite_speedup(0.2, claimed)
        assert speedup == 0.0 and math.isfinite(speedup), claimed
        assert "cross-check" in reason and ("no finite speedup" in reason or "not a positive finite" in reason), reason
    assert ke.finite_speedup(float("nan"), 1.0)[0] == 0.0 and "reference" in ke.finite_speedup(float("nan"), 1.0)[1]


def test_channel_frames_deadlines_and_limits():
    r, w = os.pipe()
    r2, w2 = os.pipe()
    chan = ke.Channel(r, w2, max_bytes=1000)
    payload = ke._tensors_to_bytes([torch.arange(5)])
    ke._child_send(w, {"hello": 1}, b"")
    ke._child_send(w, {"data": 2}, b"x" * 10)
    msg, data = chan.recv(time.monotonic() + 5)
    assert msg["hello"] == 1 and data == b""
    msg, data = chan.recv(time.monotonic() + 5)
    assert msg["data"] == 2 and data == b"x" * 10
    with pytest.raises(ke.ChannelTimeout):
        chan.recv(time.monotonic() + 0.2)
    ke._child_send(w, {"big": 1}, b"y" * 5000)
    with pytest.raises(ke.ChannelError, match="refused"):
        chan.recv(time.monotonic() + 5)
    chan.send({"cmd": "x"}, payload, time.monotonic() + 5)
    with os.fdopen(r2, "rb") as f:
        msg, data = ke._child_recv(f)
    assert msg["cmd"] == "x" and torch.equal(ke._bytes_to_tensors(data)[0], torch.arange(5))
    os.write(w, b"not json\n")
    chan.buf.clear()
    with pytest.raises(ke.ChannelError, match="malformed"):
        chan.recv(time.monotonic() + 5)
    for fd in (r, w, w2):
        os.close(fd)


def _tensor_file(sets) -> int:
    fd = ke._memfd("test")
    ke.write_tensor_sets(fd, sets)
    return fd


def test_tensor_files_round_trip_every_dtype_and_value():
    sets = [[torch.randn(3, 5), torch.randn(4, dtype=torch.float64), 7, 2.5],
            [torch.randn(2, 3).to(torch.bfloat16), torch.tensor([True, False, True]), torch.tensor(3.5),
             torch.empty(0, 4), torch.arange(6, dtype=torch.int64).view(2, 3)[:, 1:],  # a non-contiguous view
             torch.randn(2, 2, dtype=torch.complex64), torch.randint(-5, 5, (3,), dtype=torch.int8)]]
    fd = _tensor_file(sets)
    back = ke.read_tensor_sets(fd, 1 << 30)
    os.close(fd)
    assert len(back) == 2 and [len(s) for s in back] == [4, 7]
    for want, got in zip(sets[0] + sets[1], back[0] + back[1]):
        if isinstance(want, torch.Tensor):
            assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want.contiguous())
        else:
            assert got == want


def test_sealed_tensor_file_cannot_be_changed_by_any_holder():
    import mmap
    fd = _tensor_file([[torch.ones(1000)]])
    other = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)  # what another process of this uid could open
    ke._seal(fd)
    for holder in (fd, other):
        with pytest.raises(PermissionError):
            os.pwrite(holder, b"x" * 8, 0)
        with pytest.raises(PermissionError):
            os.ftruncate(holder, 0)
        with pytest.raises(PermissionError):
            mmap.mmap(holder, 0, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    assert torch.equal(ke.read_tensor_sets(other, 1 << 20)[0][0], torch.ones(1000))
    os.close(other)
    os.close(fd)


def test_output_file_mapped_writable_cannot_be_sealed():
    import mmap
    fd = _tensor_file([[torch.ones(10)]])
    live = mmap.mmap(fd, 0)  # a candidate that keeps a writable mapping could rewrite it after the check
    with pytest.raises(ke._Failure, match="mapped writable"):
        ke._seal_output(fd, 1 << 20)
    live.close()
    ke._seal_output(fd, 1 << 20)
    os.close(fd)
    fd = _tensor_file([[torch.ones(10)]])
    with pytest.raises(ke._Failure, match="limit"):
        ke._seal_output(fd, 16)
    os.close(fd)


@pytest.mark.parametrize("damage", ["truncated", "magic", "offset", "size", "dtype", "index", "huge"])
def test_malformed_tensor_files_are_refused(damage):
    fd = _tensor_file([[torch.arange(16, dtype=torch.float32).view(4, 4)]])
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
    if damage in ("offset", "size", "dtype", "index", "huge"):
        footer = json.dumps(index).encode()
        data = data[: -16 - n] + footer + len(footer).to_bytes(8, "little") + ke.TENSOR_FILE_MAGIC
    fd = ke._memfd("damaged")
    os.write(fd, bytes(data))
    with pytest.raises(ValueError):
        ke.read_tensor_sets(fd, 1 << 20)
    os.close(fd)


def test_patched_load_inline_hashes_build_dirs_and_injects_flags(monkeypatch, tmp_path):
    import torch.utils.cpp_extension as ce
    import functools
    calls = []
    fake = functools.wraps(ce.load_inline)(lambda **kw: calls.append(kw) or kw["build_directory"])
    monkeypatch.setattr(ce, "load_inline", fake)  # keeps the real signature for the wrapper to bind
    monkeypatch.setattr(ce, "load", ce.load)
    monkeypatch.setattr(ce, "remove_extension_h_precompiler_headers", ce.remove_extension_h_precompiler_headers)
    monkeypatch.setattr(ce, "_check_and_build_extension_h_precompiler_headers", lambda *a, **k: None)
    monkeypatch.setattr(ke, "PCH_LOCK_DIR", str(tmp_path))
    ke._patch_cpp_extension(str(tmp_path), "", ["-O3"], use_pch=True, fast_load=False)
    dir_a = ce.load_inline("ext", "int a;", functions=["f"])
    dir_b = ce.load_inline("ext", "int b;", functions=["f"])
    open(os.path.join(dir_a, "lock"), "w").close()  # torch's baton, left by a killed build
    dir_a2 = ce.load_inline("ext", "int a;", functions=["f"])
    assert not os.path.exists(os.path.join(dir_a, "lock"))
    assert dir_a != dir_b and dir_a == dir_a2  # same name, different code: never the same library
    assert calls[0]["extra_cflags"] == ["-O3"] and calls[0]["use_pch"] is True
    ce.load_inline("ext", "int a;", extra_cflags=["-O1", "-march=native"])
    assert calls[-1]["extra_cflags"] == ["-O1", "-march=native"] and calls[-1]["use_pch"] is False
    ce.load_inline("ext", "int a;", cuda_sources="__global__ void k() {}")
    assert "-O3" in calls[-1]["extra_cuda_cflags"] and calls[-1]["use_pch"] is False


def test_cuda_header_tiers_rewrite_and_fall_back(monkeypatch, tmp_path):
    import functools
    import torch.utils.cpp_extension as ce
    calls = []

    def fake(**kw):
        calls.append(kw)
        unit = "".join(kw["cuda_sources"]) if kw.get("no_implicit_headers") else ""
        if "needs_aten" in unit and "ATen/ATen.h" not in unit or "needs_full_header" in unit:
            raise RuntimeError("error: 'torch::nn' has not been declared")
        return kw["build_directory"]

    monkeypatch.setattr(ce, "load_inline", functools.wraps(ce.load_inline)(fake))
    monkeypatch.setattr(ce, "load", ce.load)
    monkeypatch.setattr(ce, "remove_extension_h_precompiler_headers", ce.remove_extension_h_precompiler_headers)
    monkeypatch.setattr(ke, "PCH_LOCK_DIR", str(tmp_path))
    ke._patch_cpp_extension(str(tmp_path), "9.0", ["-O3"], use_pch=True, fast_load=False,
                            cuda_header_tiers=("slim", "light"))
    ce.load_inline("ext", "#include <torch/extension.h>\ntorch::Tensor f(torch::Tensor x);",
                   cuda_sources="#include <torch/extension.h>\n#include <ATen/cuda/CUDAContext.h>\n__global__ void k() {}\n"
                                "torch::Tensor f(torch::Tensor x) { auto y = torch::empty_like(x); return at::zeros_like(y); }")
    assert len(calls) == 1 and calls[0]["no_implicit_headers"]  # built on the slim tier
    cu, cpp = "".join(calls[0]["cuda_sources"]), "".join(calls[0]["cpp_sources"])
    assert "torch/extension.h" not in cu + cpp and "ATen/ATen.h" not in cu and "__global__ void k" in cu
    assert ke.CUDA_CONTEXT_HEADER not in cu and ke.SLIM_CUDA_CONTEXT in cu  # no cuBLAS/cuSPARSE headers
    # the ops the unit names, and only those, from a lean copy first on the include path
    assert "ATen/ops/empty_like.h" in cu and "ATen/ops/zeros_like.h" in cu and "ATen/ops/empty.h>" not in cu
    lean = calls[0]["extra_include_paths"][0]
    assert sorted(os.listdir(os.path.join(lean, "ATen", "ops"))) == ["empty_like.h", "zeros_like.h"]
    assert "torch/csrc/Exceptions.h" in cpp and "torch::Tensor f" in cpp and "using namespace at" in cpp
    ce.load_inline("ext", "", cuda_sources="// needs_aten")
    assert len(calls) == 3 and "ATen/ATen.h" in "".join(calls[2]["cuda_sources"])  # slim failed, light built
    light_host = "".join(calls[2]["cpp_sources"])  # torch/extension.h defines torch::kFloat32 itself
    assert "torch/extension.h" in light_host and "kFloat32" not in light_host
    assert os.path.exists(os.path.join(calls[1]["build_directory"], "FAILED"))
    ce.load_inline("ext", "", cuda_sources="#include <torch/extension.h>\n// needs_full_header")
    assert len(calls) == 6 and calls[5]["cuda_sources"] == "#include <torch/extension.h>\n// needs_full_header"
    assert not calls[5].get("no_implicit_headers")  # fell back to the call as written
    ce.load_inline("ext", "", cuda_sources="#include <torch/extension.h>\n// needs_full_header")
    assert len(calls) == 7  # the failed tiers are remembered, not retried
    with pytest.raises(ValueError, match="cuda_header_tiers"):
        ke.evaluate(REFERENCE, "x = 1", device="cpu", cache_root=str(tmp_path), cuda_header_tiers=("tiny",))


def test_slim_host_units_include_the_shared_header_first(monkeypatch, tmp_path):
    import functools
    import torch.utils.cpp_extension as ce
    calls = []
    monkeypatch.setattr(ce, "load_inline", functools.wraps(ce.load_inline)(lambda **kw: calls.append(kw) or kw["build_directory"]))
    monkeypatch.setattr(ce, "load", ce.load)
    monkeypatch.setattr(ce, "remove_extension_h_precompiler_headers", ce.remove_extension_h_precompiler_headers)
    ke._patch_cpp_extension(str(tmp_path), "9.0", ["-O3"], use_pch=False, fast_load=False,
                            cuda_header_tiers=("slim",), host_pch=True)
    for name in ("ext_a", "ext_b"):
        ce.load_inline(name, "torch::Tensor f(torch::Tensor x);", cuda_sources="__global__ void k() {}")
    first_lines = {"".join(c["cpp_sources"]).splitlines()[0] for c in calls}
    assert len(first_lines) == 1  # one header for every unit of this torch, so one precompiled form
    header = first_lines.pop().removeprefix('#include "').removesuffix('"')
    assert header.startswith(str(tmp_path)) and open(header).read() == ke.SLIM_HOST_HEADERS
    # no build.ninja in these fake builds: nothing to learn the flags from, so no precompiled header
    assert not os.path.exists(header + ".gch")


@pytest.mark.slow
def test_host_pch_is_built_from_the_units_flags_and_used_by_another_extension(tmp_path):
    """build_host_pch reads the flags torch wrote for a build and precompiles the header with them;
    a unit of another extension (another TORCH_EXTENSION_NAME, other -I paths) then reads it."""
    import shutil
    import sysconfig
    import torch.utils.cpp_extension as ce
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler")
    header = ke.write_host_header(str(tmp_path), torch.__version__)
    system = [f"-isystem {p}" for p in ce.include_paths()] + [f"-isystem {sysconfig.get_paths()['include']}"]
    build = tmp_path / "build_a"
    build.mkdir()

    def ninja(cflags: str) -> None:
        (build / "build.ninja").write_text(f"ninja_required_version = 1.3\ncxx = c++\n\ncflags = {cflags}\npost_cflags = \n")

    ninja("-DTORCH_EXTENSION_NAME=ext_a -DTORCH_API_INCLUDE_EXTENSION_H -I/no/such/dir -std=c++17 --no-such-flag "
          + " ".join(system))
    assert not ke.build_host_pch(header, str(build))  # the compiler refused: nothing written, nothing left
    assert sorted(os.listdir(os.path.dirname(header))) == ["kernel_eval_host.h", "kernel_eval_host.h.lock"]
    flags = "-DTORCH_API_INCLUDE_EXTENSION_H " + " ".join(system) + " -fPIC -std=c++17 -O3"
    ninja("-DTORCH_EXTENSION_NAME=ext_a -I/no/such/dir " + flags)
    assert ke.build_host_pch(header, str(build))
    assert not ke.build_host_pch(header, str(build))  # built once
    unit = tmp_path / "main.cpp"
    unit.write_text(f'#include "{header}"\n' + ke.TORCH_ALIASES + "torch::Tensor f(torch::Tensor x) { return x; }\n")
    done = subprocess.run(["c++", "-DTORCH_EXTENSION_NAME=ext_b", f"-I{tmp_path}", *shlex.split(flags),
                           "-Winvalid-pch", "-H", "-fsyntax-only", str(unit)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"! {header}.gch" in done.stderr.splitlines()  # g++ marks a precompiled header it used with "!"


def test_lean_op_headers_drop_only_the_unused_includes_and_compile(tmp_path):
    import shutil
    import torch.utils.cpp_extension as ce
    ops_dir = os.path.join(ce.include_paths()[0], "ATen", "ops")
    names = ke.op_names(["auto y = torch::empty_like(x); at::zeros({2}, x.options()); torch::nope(x); "
                         "torch::Tensor(x); at::matmul (x, x);"], ops_dir)
    assert names == ["empty_like", "matmul", "zeros"]  # no header for nope; Tensor is not an op
    include_dir = ke.write_lean_op_headers(names, ops_dir, str(tmp_path))
    assert ke.write_lean_op_headers(names, ops_dir, str(tmp_path)) == include_dir  # same names, same dir
    for n in names:
        with open(os.path.join(ops_dir, n + ".h")) as f:
            full = f.read().splitlines()
        with open(os.path.join(include_dir, "ATen", "ops", n + ".h")) as f:
            lean = f.read().splitlines()
        assert lean == [line for line in full if line.strip() not in ke.LEAN_OP_DROPPED]
        assert len(full) - len(lean) == len(ke.LEAN_OP_DROPPED)  # each dropped include was there
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler")
    # the wrappers still compile from the slim host headers alone (g++ parses them as the .cu unit would)
    src = tmp_path / "unit.cpp"
    src.write_text(ke.SLIM_HOST_HEADERS + ke.ops_includes(names) + ke.TORCH_ALIASES
                   + "torch::Tensor f(torch::Tensor x) { auto y = torch::empty_like(x);"
                   " return torch::matmul(y, torch::zeros({2, 2}, x.options())); }\n")
    flags = [f"-I{include_dir}"] + [f"-isystem{p}" for p in ce.include_paths()]
    import sysconfig
    flags.append(f"-isystem{sysconfig.get_paths()['include']}")
    done = subprocess.run(["c++", "-std=c++17", "-fsyntax-only", *flags, str(src)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]


def test_precheck_rejects_without_compiling(tmp_path):
    t0 = time.monotonic()
    result = ke.evaluate(REFERENCE, "print('no kernel')", device="cpu", cache_root=str(tmp_path),
                         precheck=lambda src: "no load_inline kernel found")
    assert result.status == "format_error" and "no load_inline" in result.message
    assert result.to_dict()["status"] == "format_error" and set(ke.STATUSES) >= {result.status}
    assert time.monotonic() - t0 < 5 and not os.path.exists(os.path.join(tmp_path, "compiled"))


def test_op_check_records_torch_ops_without_loading_dynamo_into_the_candidate(tmp_path):
    """A forward made of torch ops is caught by the op recorder, and the candidate's process has
    not had torch._dynamo loaded by the harness (its first import costs seconds of every boot)."""
    src = REFERENCE.replace("class Model(", "class ModelNew(") + (
        "\nimport sys\n_forward = ModelNew.forward\n"
        "def forward(self, x):\n"
        "    if 'torch._dynamo' in sys.modules:\n"
        "        raise RuntimeError('torch._dynamo was loaded')\n"
        "    return _forward(self, x)\n"
        "ModelNew.forward = forward\n")
    result = ke.evaluate(REFERENCE, src, device="cpu", cache_root=str(tmp_path), cpu_trials=2)
    assert result.status == "incorrect" and "torch compute operators" in result.message, result.message
    assert "aten::relu" in result.ops


def _reference_outputs(session, part: str) -> list:
    """What the reference session holds, recomputed here from the session's own seeds and files."""
    import types
    module = types.ModuleType("adversarial_reference")
    exec(compile(REFERENCE, "reference.py", "exec"), module.__dict__)
    torch.manual_seed(session.init_seed)
    model = module.Model(*module.get_init_inputs())
    with torch.no_grad():
        return [[model(*xs)] for xs in ke.read_tensor_sets(session.files[part], 1 << 30)]


def test_reference_session_judges_and_restarts_on_the_same_inputs(tmp_path):
    cfg = ke.EvalConfig(cache_root=str(tmp_path), cpu_trials=2)
    session = ke._ReferenceSession(REFERENCE, "cpu", "", cfg, users=1)
    session.boot()
    session.ready()
    assert session.out_bytes["check"][0] == [64 * 4096 * 4]
    inputs_before = ke.read_tensor_sets(session.files["check"], 1 << 30)
    right = _reference_outputs(session, "check")
    assert len(right) == cfg.n_correct_trials

    def judge(sets):
        fd = _tensor_file(sets)
        try:
            return session.judge(fd, "check", 1 << 30)
        finally:
            os.close(fd)

    assert judge(right) is None
    wrong = [[o.clone() for o in outs] for outs in right]
    wrong[3][0][0, 0] += 1.0
    assert judge(wrong).startswith("trial 4/5: output: 1 of")
    assert "expected 5 output sets" in judge(right[:4])
    fd = ke._memfd("garbage")
    os.write(fd, b"not a tensor file" * 10)
    with pytest.raises(ke._Failure, match="unreadable outputs"):
        session.judge(fd, "check", 1 << 30)
    os.close(fd)
    # the reference worker dies (say a candidate's file crashed it): that candidate's verdict is a
    # runtime_error, and the next one gets a fresh worker on the same secret seeds
    for pid in ke._children_of(session.worker.proc.pid):
        os.kill(pid, 9)
    with pytest.raises(ke._Failure, match="could not be compared"):
        judge(right)
    session.ready()
    inputs_after = ke.read_tensor_sets(session.files["check"], 1 << 30)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(inputs_before, inputs_after))
    assert judge(right) is None
    session.release()
    assert session.worker is None and session.files == {}


def test_workers_die_with_the_harness(tmp_path):
    """A harness killed without cleanup (kill -9, a crash) must not leave a hung worker behind."""
    marker = f"orphan-{os.getpid()}-{time.monotonic_ns()}"
    src = tmp_path / marker / "candidate.py"
    src.parent.mkdir()
    src.write_text("import time\ntime.sleep(1000)\n")
    helper = f"""
import os, sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(ke.__file__))!r})
import kernel_eval as ke
cfg = ke.EvalConfig(cache_root={str(tmp_path)!r})
ke.Worker("compile", ke._worker_args({str(src)!r}, "cpu", cfg, ""), {str(tmp_path / "w")!r},
          ke._build_env("cpu", "", cfg, compiling=True), cfg, cpu=True)
os._exit(0)  # no cleanup: the supervisor sees it has been reparented
"""
    subprocess.run([sys.executable, "-c", helper], check=True, timeout=120)
    try:
        deadline = time.monotonic() + 15
        while leftover_processes(marker.encode()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert leftover_processes(marker.encode()) == []
    finally:
        for pid in leftover_processes(marker.encode()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # a zombie has ended
    except OSError:
        return False


def wait_for_file(path, seconds: float = 60) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.path.exists(path) and open(path).read().endswith("\n"):
            return open(path).read()
        time.sleep(0.05)
    raise AssertionError(f"{path} was not written")


def test_compile_zygote_forks_workers_with_torch_loaded_and_their_own_tag(tmp_path):
    """A forked compile worker has torch already, carries its own evaluation's tag where the sweep
    looks (/proc/<pid>/environ: the zygote's block, rewritten in place) and in the environment its
    compiler processes inherit, and is gone when its compile returns."""
    report = tmp_path / "report"
    src = f"""
import os
initial = dict(e.split("=", 1) for e in open("/proc/self/environ").read().split("\\0") if "=" in e)
open({str(report)!r}, "w").write(f"{{os.getpid()}} {{initial['{ke.TAG_ENV}']}} {{os.environ['{ke.TAG_ENV}']}}\\n")
"""
    cfg = ke.EvalConfig(cache_root=str(tmp_path / "cache"))
    zygotes = ke._Zygotes()
    try:
        record = ke._compile(src, "cpu", "", cfg, zygotes)
        assert record["status"] == "ok" and record["torch_preloaded"], record
        [zygote] = zygotes.all()
        pid, initial_tag, env_tag = wait_for_file(report).split()
        assert initial_tag == env_tag != zygote.tag
        assert not process_alive(int(pid))
        assert zygote.proc.poll() is None  # still serving the batch
    finally:
        zygotes.close()
    assert zygote.proc.poll() is not None


def test_fork_only_escapee_of_a_forked_compile_worker_dies_with_its_evaluation(tmp_path):
    """The candidate kills its supervisor (no subreaper is left) and leaves a forked, never exec'd
    grandchild in its own session: only the sweep by tag can find it, and only if a fork carries
    its own evaluation's tag rather than the zygote's."""
    report = tmp_path / "escapee"
    src = f"""
import os, signal, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open({str(report)!r}, "w").write(f"{{os.getpid()}}\\n")
        time.sleep(600)
    os._exit(0)
os.kill(os.getppid(), signal.SIGKILL)
time.sleep(600)
"""
    cfg = ke.EvalConfig(cache_root=str(tmp_path / "cache"), compile_timeout_s=5)
    zygotes = ke._Zygotes()
    try:
        record = ke._compile(src, "cpu", "", cfg, zygotes)
        assert record["status"] == "timeout", record
        pid = int(wait_for_file(report))
        time.sleep(0.2)
        assert not process_alive(pid)  # killed by its own evaluation, while the zygote still runs
        assert zygotes.all()[0].proc.poll() is None
    finally:
        zygotes.close()


def test_compile_zygote_out_of_service_falls_back_to_spawned_workers(tmp_path):
    cfg = ke.EvalConfig(cache_root=str(tmp_path / "cache"))
    zygotes = ke._Zygotes()
    try:
        assert ke._compile("x = 1\n", "cpu", "", cfg, zygotes)["torch_preloaded"]
        [zygote] = zygotes.all()
        zygote.proc.kill()  # a candidate can do this: same uid
        zygote.proc.wait()
        record = ke._compile("x = 2\n", "cpu", "", cfg, zygotes)
        assert record["status"] == "ok" and not record["torch_preloaded"], record
        assert "out of service" in zygote.out_of_service
    finally:
        zygotes.close()


def test_forked_workers_die_with_the_harness(tmp_path):
    """Harness killed without cleanup: the zygote sees it has been reparented and exits, then each
    supervisor sees the same and stops its worker."""
    report = tmp_path / "report"
    src = tmp_path / "candidate.py"
    src.write_text(f"import os, time\nopen({str(report)!r}, 'w').write(f'{{os.getpid()}} {{os.getppid()}}\\n')\n"
                   "time.sleep(1000)\n")
    helper = f"""
import os, sys
sys.path.insert(0, {os.path.dirname(os.path.abspath(ke.__file__))!r})
import kernel_eval as ke
cfg = ke.EvalConfig(cache_root={str(tmp_path)!r})
zygotes = ke._Zygotes()
ke.Worker("compile", ke._worker_args({str(src)!r}, "cpu", cfg, ""), {str(tmp_path / "w")!r},
          ke._build_env("cpu", "", cfg, compiling=True), cfg, cpu=True, zygotes=zygotes)
print(zygotes.all()[0].proc.pid, flush=True)
import time
while not os.path.exists({str(report)!r}):
    time.sleep(0.05)
os._exit(0)  # no cleanup
"""
    out = subprocess.run([sys.executable, "-c", helper], check=True, timeout=120, capture_output=True, text=True)
    worker, supervisor = map(int, wait_for_file(report).split())
    pids = [int(out.stdout.split()[0]), supervisor, worker]
    try:
        deadline = time.monotonic() + 15
        while any(map(process_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(process_alive, pids))
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


def test_forked_run_workers_see_what_spawned_ones_see(tmp_path):
    """A candidate's run worker forked from the run zygote is the process a spawned one would be:
    the same environment (in os.environ and in /proc/self/environ, apart from its own tag) and the
    same heap poison (MALLOC_PERTURB_, read by glibc at process start: the zygote's start), and it
    names its role for ps. The reference's session is forked too."""
    report = tmp_path / "report"
    source = """
import os, sys, torch
mode = sys.argv[sys.argv.index("--_worker") + 1]
if mode == "cand":
    initial = sorted(e for e in open("/proc/self/environ").read().split("\\0") if e and not e.startswith(TAG + "="))
    env = sorted(f"{k}={v}" for k, v in os.environ.items() if k != TAG)
    fresh = torch.empty(1 << 16, dtype=torch.uint8)  # heap, not mmap: under the worker's mmap threshold
    poisoned = bool((fresh == 0x7f).all())
    comm = open("/proc/self/comm").read().strip()
    parent = open(f"/proc/{os.getppid()}/comm").read().strip()
    open(REPORT, "w").write(repr((initial, env, poisoned, comm, parent)))
class ModelNew(torch.nn.Module):
    def __init__(self, *init_inputs):
        super().__init__()

    def forward(self, x):
        return x
"""
    seen = {}
    for forked in (True, False):
        src = f"REPORT, TAG = {str(report) + '.' + str(forked)!r}, {ke.TAG_ENV!r}" + source
        [result] = ke.evaluate_batch([(REFERENCE, src)], device="cpu", cache_root=str(tmp_path / "cache"),
                                     run_zygote=forked, time_candidate=False)
        assert result.status == "incorrect", result.message  # it ran: ModelNew is not the reference
        seen[forked] = eval((tmp_path / f"report.{forked}").read_text())
    (initial_f, env_f, poisoned_f, comm_f, parent_f), (initial_s, env_s, poisoned_s, comm_s, _) = seen[True], seen[False]
    assert initial_f == initial_s and env_f == env_s
    assert initial_f == env_f  # nothing added or dropped after start
    assert poisoned_f and poisoned_s
    assert (comm_f, parent_f) == ("keval-cand", "keval-super")
    assert comm_s.startswith("python")


@pytest.mark.parametrize("cpus, device, timing_cpus, build_jobs, expected", [
    (16, "cuda", 2, 2, 7),   # the H200 machine: 14 CPUs for builds, a .cu and a host unit each
    (16, "cuda", 0, 2, 8),   # no CPUs kept for timing
    (6, "cuda", 2, 2, 3),    # too few CPUs to keep any (< 4 x timing_cpus): all of them
    (2, "cuda", 2, 4, 1),    # never none
    (16, "cpu", 2, 2, 16),   # one C++ unit per build, every core
])
def test_default_parallel_compiles_counts_the_cpus_builds_may_use(monkeypatch, cpus, device, timing_cpus,
                                                                  build_jobs, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(100, 100 + cpus)))
    cfg = ke.EvalConfig(timing_cpus=timing_cpus, build_jobs=build_jobs)
    assert ke.default_parallel_compiles(device, cfg) == expected


def test_device_lock_shares_checks_and_gives_timing_the_device_alone(tmp_path):
    import threading
    root, events, lock = str(tmp_path), [], threading.Lock()

    def hold(kind, exclusive, seconds, started=None):
        with ke._DeviceLock(root, "cpu", exclusive=exclusive):
            with lock:
                events.append(("in", kind, time.monotonic()))
            if started:
                started.set()
            time.sleep(seconds)
            with lock:
                events.append(("out", kind, time.monotonic()))

    first = threading.Event()
    threads = [threading.Thread(target=hold, args=("check1", False, 0.6, first))]
    threads[0].start()
    first.wait()
    threads.append(threading.Thread(target=hold, args=("check2", False, 0.6)))  # shares with check1
    threads[1].start()
    time.sleep(0.1)
    threads.append(threading.Thread(target=hold, args=("timing", True, 0.3)))  # waits for both checks
    threads[2].start()
    time.sleep(0.1)
    threads.append(threading.Thread(target=hold, args=("check3", False, 0.1)))  # queues behind the timing
    threads[3].start()
    for t in threads:
        t.join()
    at = {(e, k): t for e, k, t in events}
    assert at[("in", "check2")] < at[("out", "check1")]  # two checks at once
    assert at[("in", "timing")] >= max(at[("out", "check1")], at[("out", "check2")])
    assert at[("in", "check3")] >= at[("out", "timing")]  # did not overtake the waiting timing


# ----------------------------------------------------------------------------- CPU suite (slow)

@pytest.fixture(scope="module")
def cache_root():
    # KERNEL_EVAL_TEST_CACHE reuses builds across local runs; otherwise the session's cache
    # (tests/conftest.py), which CI starts empty and other modules' tests share
    return os.environ.get("KERNEL_EVAL_TEST_CACHE") or ke.EvalConfig().cache_root


CPP_CASES = cases("cpp")
# import_hang hangs in the compile phase too: run alone with a short compile limit; loaded_benign is
# judged while busy processes load the machine
SEPARATE = {"import_hang", "loaded_benign"}


@contextlib.contextmanager
def busy_processes(n: int = 2):
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        time.sleep(0.5)
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def judged_under_load(path: str, device: str, rounds: int = 3, **cfg) -> None:
    """An honest kernel judged beside two busy processes stays correct, and its median speedup over
    `rounds` fresh evaluations is confirmed and within 2x of the median of as many judged without
    them, taken in turn (calm, loaded, calm, ...). Medians, because one CPU verdict on the 2-core box
    is noisy with or without load: judged alone, the same kernel read 1.85x-3.34x over six fresh
    evaluations (its per-call CPU time switches between two levels ~2x apart for seconds at a time),
    and now and then a calm run's timing is refused (the reference's loop overhead moved between
    blocks more than the candidate's time: docs/PERFORMANCE.md). Load that broke the verdict in most
    runs still fails this."""
    assert expectation(path) == "correct"
    calm_src = open(os.path.join(os.path.dirname(path), "benign.py")).read()
    calm, loaded = [], []
    for _ in range(rounds):
        calm.append(ke.evaluate(REFERENCE, calm_src, device=device, **cfg))
        with busy_processes(2):
            loaded.append(ke.evaluate(REFERENCE, open(path).read(), device=device, **cfg))
    assert all(r.status == "correct" for r in calm + loaded), [(r.status, r.message) for r in calm + loaded]
    blocks = ke.EvalConfig(**cfg).timing_blocks
    # the window it reports is the one its times came from: a side's median over all its calls lies
    # within its blocks' medians
    for r in calm + loaded:
        for side, ms in (("reference", r.ref_ms), ("candidate", r.claimed_ms)):
            assert len(r.blocks[side]) == blocks, r.blocks
            medians = [median for _, median, _, _ in r.blocks[side]]
            assert min(medians) <= ms <= max(medians), (side, ms, r.blocks)
    calm_median, loaded_median = (statistics.median(r.speedup for r in rs) for rs in (calm, loaded))
    speedups = ([r.speedup for r in calm], [r.speedup for r in loaded], [r.message for r in loaded])
    assert calm_median > 0 and calm_median / 2 <= loaded_median <= calm_median * 2, speedups


@pytest.fixture(scope="module")
def cpp_results(cache_root):
    names = [n for n in CPP_CASES if n not in SEPARATE]
    pairs = [(REFERENCE, open(CPP_CASES[n]).read()) for n in names]
    results = ke.evaluate_batch(pairs, device="cpu", cache_root=cache_root, **FAST)
    return dict(zip(names, results))


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in CPP_CASES if n not in SEPARATE])
def test_adversarial_cpp(name, cpp_results):
    check_expectation(name, expectation(CPP_CASES[name]), cpp_results[name], ke.EvalConfig(**FAST))


@pytest.mark.slow
def test_honest_cpp_kernel_keeps_its_speedup_under_load(cpp_results, cache_root):
    judged_under_load(CPP_CASES["loaded_benign"], "cpu", cache_root=cache_root, **FAST)


@pytest.mark.slow
def test_warm_up_is_timed_by_the_parent_when_the_candidate_patches_its_clocks(cache_root, monkeypatch):
    """A candidate that freezes every clock in its process still gets a bounded warm-up (rounds of
    calls until the parent's clock says cpu_warmup_ms) and the verdict its case expects."""
    sent = []
    ask = ke._ask

    def counting(worker, who, phase, timeout_s, msg, *a, **kw):
        sent.append((who, msg.get("cmd")))
        return ask(worker, who, phase, timeout_s, msg, *a, **kw)

    monkeypatch.setattr(ke, "_ask", counting)
    path = CPP_CASES["patch_clock"]
    t0 = time.monotonic()
    result = ke.evaluate(REFERENCE, open(path).read(), device="cpu", cache_root=cache_root,
                         **dict(FAST, cpu_warmup_ms=300.0))
    check_expectation("patch_clock", expectation(path), result, ke.EvalConfig(**FAST))
    assert ("candidate", "warm") in sent and ("reference", "warm") in sent
    assert time.monotonic() - t0 < 150


@pytest.mark.slow
def test_adversarial_suite_is_complete():
    assert len(CPP_CASES) >= 20 and "benign" in CPP_CASES
    assert {expectation(p) for p in CPP_CASES.values()} >= {
        "correct", "incorrect", "runtime_error", "timeout", "timing_rejected"}


@pytest.mark.slow
def test_escaped_grandchild_is_killed(cpp_results):
    assert cpp_results["escaped_child"].status == "runtime_error"
    time.sleep(0.5)
    assert leftover_processes(b"keval-escapee") == []
    # No supervisor (and so no worker) left either. Only kernel_eval's own processes count:
    # earlier tests in the session (torch.multiprocessing in test_grpo) leave multiprocessing's
    # resource tracker as a child of this process for the whole run.
    assert [pid for pid in ke._children_of(os.getpid()) if _is_kernel_eval_process(pid)] == []


def _is_kernel_eval_process(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"kernel_eval.py" in f.read()
    except OSError:
        return False


@pytest.mark.slow
def test_one_reference_worker_serves_every_candidate_of_a_task(cpp_results, cache_root, tmp_path, monkeypatch):
    log = tmp_path / "reference_loads"
    monkeypatch.setenv("KERNEL_EVAL_TEST_REFERENCE_LOG", str(log))  # the harness's prefix: workers get it
    counting_ref = REFERENCE + '\nimport os\nopen(os.environ["KERNEL_EVAL_TEST_REFERENCE_LOG"], "a").write("load\\n")\n'
    benign = open(CPP_CASES["benign"]).read()
    variants = [benign, benign + "\n# another candidate\n", open(CPP_CASES["half_output"]).read()]
    results = ke.evaluate_batch([(counting_ref, c) for c in variants], device="cpu", cache_root=cache_root, **FAST)
    assert [r.status for r in results] == ["correct", "correct", "incorrect"], [r.message for r in results]
    assert log.read_text() == "load\n"  # one trusted reference process for the batch, not one per candidate


SECRET = "sk-keval-test-4f1c9e0b7d"
# a candidate that refuses to load where it can see the harness's secret: in its environment (as
# the process reads it, and as /proc shows its initial block) or in any process's command line
SECRET_PROBE = f"""
import os
_seen = [k for k, v in os.environ.items() if k == "OPENAI_API_KEY" or "{SECRET}" in v]
with open("/proc/self/environ", "rb") as _f:
    _seen += ["/proc/self/environ"] if b"{SECRET}" in _f.read() else []
for _pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{{_pid}}/cmdline", "rb") as _f:
            _seen += [f"/proc/{{_pid}}/cmdline"] if b"{SECRET}" in _f.read() else []
    except OSError:
        pass
if _seen:
    raise RuntimeError(f"the candidate sees the harness's secret: {{_seen}}")
"""


def judged_without_secrets(benign_src: str, device: str, monkeypatch, **cfg) -> ke.EvalResult:
    """The verdict of the probe + an honest kernel with OPENAI_API_KEY in the harness's environment,
    while this process watches every command line on the machine for the secret."""
    import threading
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    seen, done = [], threading.Event()

    def watch():
        while not done.is_set():
            seen.extend(p for p in leftover_processes(SECRET.encode()) if p != os.getpid())
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = ke.evaluate(REFERENCE, SECRET_PROBE + benign_src, device=device, **cfg)
    finally:
        done.set()
        watcher.join()
    assert seen == [], "a process of the evaluation carried the secret in its command line"
    return result


@pytest.mark.slow
def test_candidate_sees_no_secret_of_the_harness_and_still_builds(cache_root, monkeypatch):
    result = judged_without_secrets(open(CPP_CASES["benign"]).read(), "cpu", monkeypatch, cache_root=cache_root, **FAST)
    assert result.status == "correct", result.message
    # control: the probe does see a secret that the allowlist lets through
    monkeypatch.setattr(ke, "ENV_ALLOWED", ke.ENV_ALLOWED | {"OPENAI_API_KEY"})
    leaked = judged_without_secrets(open(CPP_CASES["benign"]).read(), "cpu", monkeypatch, cache_root=cache_root, **FAST)
    assert leaked.status == "runtime_error" and "sees the harness's secret" in leaked.message, leaked.message



def cpus_seen(path: str, device: str, log: str, **cfg) -> tuple:
    """Judge the kernel at `path` on `device`, its module recording the CPUs it may run on when
    imported (compile and run workers) and at every forward (checks and timed calls): (result,
    CPU sets seen at import, CPU sets seen in forward)."""
    src = open(path).read() + f"""
import os as _os
def _seen(where):
    with open({log!r}, "a") as _f:
        _f.write(where + " " + repr(sorted(_os.sched_getaffinity(0))) + "\\n")
_seen("import")
_forward = ModelNew.forward
def _recording_forward(self, *args):
    _seen("forward")
    return _forward(self, *args)
ModelNew.forward = _recording_forward
"""
    result = ke.evaluate(REFERENCE, src, device=device, **cfg)
    seen = {"import": set(), "forward": set()}
    with open(log) as f:
        for line in f:
            where, cpus = line.split(" ", 1)
            seen[where].add(tuple(json.loads(cpus)))
    return result, seen["import"], seen["forward"]


@pytest.mark.slow
def test_timing_cpus_are_not_kept_on_cpu(cache_root, tmp_path):
    """On cpu a worker times itself by its CPU time: no core is kept, every phase may use them all."""
    result, at_import, in_forward = cpus_seen(CPP_CASES["benign"], "cpu", str(tmp_path / "cpus.log"),
                                              cache_root=cache_root, timing_cpus=1, **FAST)
    assert result.status == "correct", result.message
    assert at_import == in_forward == {tuple(sorted(os.sched_getaffinity(0)))}


@pytest.mark.slow
def test_import_hang_times_out_in_compile(cpp_results, cache_root):
    t0 = time.monotonic()
    result = ke.evaluate(REFERENCE, open(CPP_CASES["import_hang"]).read(), device="cpu",
                         cache_root=cache_root, **dict(FAST, compile_timeout_s=20))
    check_expectation("import_hang", expectation(CPP_CASES["import_hang"]), result, ke.EvalConfig(**FAST))
    assert time.monotonic() - t0 < 120


@pytest.mark.slow
def test_repeated_candidate_is_not_rebuilt(cpp_results, cache_root):
    record = ke._compile(open(CPP_CASES["benign"]).read(), "cpu", "", ke.EvalConfig(cache_root=cache_root))
    assert record["status"] == "ok" and record["cached"] and record["seconds"] == 0.0


@pytest.mark.slow
def test_cli_prints_one_json_verdict(cpp_results, cache_root):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "kernel_eval.py"), os.path.join(ADV, "reference.py"),
                           CPP_CASES["partial_write"], "--device", "cpu", "--json", "--cache-root", cache_root],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdict = json.loads(proc.stdout.strip().splitlines()[-1])
    assert verdict["status"] == "incorrect" and verdict["speedup"] == 0.0 and verdict["compiled"]


@pytest.mark.slow
def test_builtin_solutions_are_accepted_on_cpu(cache_root):
    tasks = pytest.importorskip("tasks")
    builtin = [t for t in tasks.load_builtin(os.path.join(ROOT, "tasks")) if "cpp" in t.solutions]
    if not builtin:
        pytest.skip("no built-in tasks with a C++ solution yet")
    pairs = [(t.reference_src, t.solutions["cpp"]) for t in builtin]
    # real tasks: cheap trial counts (two input sets checked: most of a CPU candidate's time is its
    # reference's and its own outputs over tensors of up to 64M elements, per set), but the
    # default phase limits (references move large tensors)
    results = ke.evaluate_batch(pairs, device="cpu", cache_root=cache_root, cpu_trials=3, n_correct_trials=2,
                                max_parallel_runs=2)
    bad = {t.task_id: (r.status, r.message) for t, r in zip(builtin, results) if r.status != "correct"}
    assert not bad, bad


# ----------------------------------------------------------------------------- memory-aware judging

MiB = 1 << 20


def test_plan_copies_keeps_every_copy_of_a_small_task_and_scales_a_large_one_down():
    cfg = ke.EvalConfig()
    capacity = {"device": 100 << 30, "host": 100 << 30}
    small = ke.plan_copies(ke.Footprint(set_bytes=4 * MiB, out_bytes=4 * MiB, peak_bytes=4 * MiB), cfg, capacity, cuda=True)
    assert (small["n_check"], small["n_time"], small["buffers"]) == (cfg.n_correct_trials, cfg.timing_input_sets,
                                                                      cfg.timing_buffers)
    # the ReLU of today's KernelBench: 6.4 GB in, 6.4 GB out
    relu = ke.Footprint(set_bytes=6_442_450_944, out_bytes=6_442_450_944, peak_bytes=6_442_450_944)
    big = ke.plan_copies(relu, cfg, capacity, cuda=True)
    assert (big["n_check"], big["n_time"], big["buffers"]) == (cfg.min_correct_trials, 1, 1)
    # the bytes, from the docstring's formulas: timing state (1 + 1) x set + peak + out + flush
    timing = 2 * relu.set_bytes + 2 * relu.out_bytes + cfg.l2_flush_bytes
    assert big["session"] == {"device": 3 * relu.out_bytes + timing, "host": 3 * relu.set_bytes}
    assert big["candidate"] == {"device": max(5 * relu.set_bytes, timing), "host": 2 * relu.out_bytes}
    # more memory keeps more trials (a quarter of the capacity for the kept sets), never more than asked
    roomy = ke.plan_copies(relu, cfg, {"device": 1 << 40, "host": 1 << 40}, cuda=True)
    assert roomy["n_check"] == cfg.n_correct_trials
    on_cpu = ke.plan_copies(relu, cfg, {"host": 100 << 30}, cuda=False)
    assert set(on_cpu["session"]) == {"host"} and on_cpu["session"]["host"] == 3 * relu.out_bytes + (
        2 * relu.set_bytes + 2 * relu.out_bytes) + 3 * relu.set_bytes


class _FakeSession:
    def __init__(self, budget):
        self.budget, self.evictions = budget, 0

    def evict(self):
        self.evictions += 1
        self.budget.forget(self)


def test_memory_budget_never_admits_more_than_fits_and_runs_a_job_too_large_for_it_alone():
    import threading
    budget = ke.MemoryBudget(ke.EvalConfig(memory_capacity_bytes=100), live_workers=0)
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


def relu_task(elements: int) -> str:
    return f"""
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn({elements})]

def get_init_inputs():
    return []
"""


@pytest.mark.slow
def test_a_task_large_for_the_memory_is_judged_on_fewer_copies_and_a_batch_too_large_is_serialized(tmp_path):
    # 3 tasks of 256 MiB a tensor in a 2 GiB budget: each keeps 2 trials (not 5), none fits beside
    # another, and every one is judged correct with no failure charged to anyone
    cfg = dict(cache_root=str(tmp_path), memory_capacity_bytes=2 << 30, cpu_trials=2, max_parallel_runs=3,
               op_check=False, load_timeout_s=120, check_timeout_s=120, time_timeout_s=120)
    refs = [relu_task((64 << 20) + k) for k in range(3)]
    results = ke.evaluate_batch([(r, r + "\nModelNew = Model\n") for r in refs], device="cpu", **cfg)
    assert [r.status for r in results] == ["correct"] * 3, [r.message for r in results]
    assert [r.trials for r in results] == [2, 2, 2] and not any(r.alone for r in results)
    small = ke.evaluate(relu_task(1024), relu_task(1024) + "\nModelNew = Model\n", device="cpu", **cfg)
    assert small.status == "correct" and small.trials == ke.EvalConfig().n_correct_trials


HOG = relu_task(8 << 20) + """
class ModelNew(nn.Module):
    def forward(self, x):
        return torch.empty(1 << 40, dtype=torch.uint8)  # 1 TiB: more memory than any machine here
"""


@pytest.mark.slow
def test_out_of_memory_is_the_candidates_fault_when_the_harness_fits_and_harness_error_when_it_does_not(tmp_path):
    cfg = dict(cache_root=str(tmp_path), cpu_trials=2, op_check=False, load_timeout_s=120, check_timeout_s=120)
    ref = relu_task(8 << 20)
    own_fault = ke.evaluate(ref, HOG, device="cpu", **cfg)
    assert own_fault.status == "runtime_error" and own_fault.alone, own_fault.message
    assert "allocate" in own_fault.message
    # a memory budget smaller than the task's own copies: the harness cannot tell whose fault it is
    no_verdict = ke.evaluate(ref, HOG, device="cpu", memory_capacity_bytes=16 << 20, **cfg)
    assert no_verdict.status == "harness_error" and no_verdict.alone, no_verdict.message
    assert no_verdict.message.startswith("no verdict: judging this task needs more memory than there is")
    assert no_verdict.speedup == 0.0 and not no_verdict.correct


# ----------------------------------------------------------------------------- CUDA suite (gpu)

CUDA_CASES = cases("cuda")
CUDA_SEPARATE = {"loaded_benign"}


@pytest.fixture(scope="module")
def cuda_results(cache_root):
    names = [n for n in CUDA_CASES if n not in CUDA_SEPARATE]
    pairs = [(REFERENCE, open(CUDA_CASES[n]).read()) for n in names]
    results = ke.evaluate_batch(pairs, device="cuda", cache_root=cache_root,
                                check_timeout_s=30, load_timeout_s=180, gpu_trials=30)
    return dict(zip(names, results))


@pytest.mark.gpu
@pytest.mark.parametrize("name", [n for n in CUDA_CASES if n not in CUDA_SEPARATE])
def test_adversarial_cuda(name, cuda_results):
    check_expectation(name, expectation(CUDA_CASES[name]), cuda_results[name], ke.EvalConfig())


@pytest.mark.gpu
def test_honest_cuda_kernel_keeps_its_speedup_under_load(cuda_results, cache_root):
    judged_under_load(CUDA_CASES["loaded_benign"], "cuda", cache_root=cache_root,
                      check_timeout_s=30, load_timeout_s=180, gpu_trials=30)


@pytest.mark.gpu
def test_builtin_solutions_are_accepted_on_cuda(cache_root):
    tasks = pytest.importorskip("tasks")
    builtin = [t for t in tasks.load_builtin(os.path.join(ROOT, "tasks")) if "cuda" in t.solutions]
    pairs = [(t.reference_src, t.solutions["cuda"]) for t in builtin]
    results = ke.evaluate_batch(pairs, device="cuda", cache_root=cache_root, gpu_trials=30)
    bad = {t.task_id: (r.status, r.message) for t, r in zip(builtin, results) if r.status != "correct"}
    assert not bad, bad


@pytest.mark.gpu
def test_cuda_candidate_sees_no_secret_of_the_harness_and_still_builds(cache_root, monkeypatch):
    result = judged_without_secrets(open(CUDA_CASES["benign"]).read(), "cuda", monkeypatch, cache_root=cache_root)
    assert result.status == "correct", result.message



@pytest.mark.gpu
def test_cuda_timed_calls_run_on_the_kept_cpus_and_nothing_else_does(cache_root, tmp_path):
    """timing_cpus=1: the candidate's module is imported (compile and run workers) and checked on
    every CPU but the last, and its timed calls run on the last alone."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 4:
        pytest.skip("needs four CPUs (builds keep three quarters)")
    result, at_import, in_forward = cpus_seen(CUDA_CASES["benign"], "cuda", str(tmp_path / "cpus.log"),
                                              cache_root=cache_root, timing_cpus=1, gpu_trials=30)
    assert result.status == "correct" and result.timing_ok, result.message
    assert at_import == {tuple(allowed[:-1])}
    assert in_forward == {tuple(allowed[:-1]), (allowed[-1],)}


@pytest.mark.gpu
def test_cuda_slim_tier_builds_cuda_context_users_and_precompiles_the_host_headers(tmp_path):
    """A source that includes ATen/cuda/CUDAContext.h and calls its device-property functions and
    AT_CUDA_CHECK builds on the slim tier (SLIM_CUDA_CONTEXT), and the host headers' precompiled form
    that its build leaves is valid for the flags torch gives a host unit on this machine."""
    src = open(CUDA_CASES["benign"]).read().replace('name="ext"', 'name="ext_context"')
    src = src.replace("#include <c10/cuda/CUDAStream.h>", "#include <ATen/cuda/CUDAContext.h>")
    src = src.replace("    auto y = torch::empty_like(xc);\n    launch(xc, y, scale, 0, xc.numel(), ",
                      "    TORCH_CHECK(at::cuda::getCurrentDeviceProperties()->multiProcessorCount > 0);\n"
                      "    TORCH_CHECK(at::cuda::warp_size() == 32);\n"
                      "    auto y = torch::empty_like(xc);\n    launch(xc, y, scale, 0, xc.numel(), ", 1)
    src = src.replace("    return y;\n}\n\n// partial", "    AT_CUDA_CHECK(cudaGetLastError());\n    return y;\n}\n\n// partial", 1)
    assert src.count("getCurrentDeviceProperties") == 1 and src.count("AT_CUDA_CHECK") == 1
    cache = str(tmp_path / "cache")
    result = ke.evaluate(REFERENCE, src, device="cuda", cache_root=cache, gpu_trials=30)
    assert result.status == "correct", result.message
    records = [json.load(open(p)) for p in glob.glob(os.path.join(cache, "compiled", "*.json"))]
    assert [r["header_tier"] for r in records] == ["slim"]
    [gch] = glob.glob(os.path.join(cache, "host_pch", "*", "kernel_eval_host.h.gch"))
    [build_dir] = [os.path.dirname(p) for p in glob.glob(os.path.join(cache, "build", "*", "build.ninja"))
                   if "ext_context" in open(p).read()]
    ninja = open(os.path.join(build_dir, "build.ninja")).read()
    cxx, cflags = (re.search(rf"^{v} = (.*)$", ninja, re.M).group(1) for v in ("cxx", "cflags"))
    done = subprocess.run([*shlex.split(cxx), *shlex.split(cflags), "-Winvalid-pch", "-H", "-fsyntax-only",
                           os.path.join(build_dir, "main.cpp")], capture_output=True, text=True)
    assert done.returncode == 0 and f"! {gch}" in done.stderr.splitlines(), done.stderr[-2000:]


BROKEN_CPP = """
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = '''
torch::Tensor f(torch::Tensor x) {
    return undefined_thing(x);
}
'''
ext = load_inline(name="ext", cpp_sources=source, functions=["f"])


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()

    def forward(self, x):
        return ext.f(x)
"""


@pytest.mark.slow
def test_compile_error_is_trimmed_and_cached(cache_root):
    result = ke.evaluate(REFERENCE, BROKEN_CPP, device="cpu", cache_root=cache_root, **FAST)
    assert result.status == "compile_error" and not result.compiled and result.speedup == 0.0
    assert "undefined_thing" in result.message and "was not declared" in result.message
    assert len(result.message.splitlines()) <= 14 and "c++ -MMD" not in result.message
    # gcc's position is rewritten to the line of the candidate's .py file that holds it
    assert "line 7 (main.cpp:" in result.message and "    7 |     return undefined_thing(x);" in result.message, result.message
    again = ke._compile(BROKEN_CPP, "cpu", "", ke.EvalConfig(cache_root=cache_root))
    assert again["status"] == "compile_error" and again["cached"]


def test_point_at_source_maps_generated_lines_to_the_candidates_file(tmp_path):
    build = tmp_path / "build" / "abc"
    build.mkdir(parents=True)
    (build / "main.cpp").write_text("#include <torch/extension.h>\ntorch::Tensor f(torch::Tensor x) {\n"
                                    "    return undefined_thing(x);\n}\n// bindings\n")
    py = 'import torch\nsrc = """\ntorch::Tensor f(torch::Tensor x) {\n    return undefined_thing(x);\n}\n"""\n'
    diag = (f"{build}/main.cpp:3:12: error: 'undefined_thing' was not declared in this scope\n"
            "    3 |     return undefined_thing(x);\n"
            f"{build}/main.cpp:1:10: fatal error: no such header\n"
            f"{build}/cuda.cu(7): error: identifier is undefined\n"
            "/usr/include/torch/x.h:3:1: note: a header's own line is left alone")
    out = ke.point_at_source(diag, py).splitlines()
    assert out[0] == "line 4 (main.cpp:3:12): error: 'undefined_thing' was not declared in this scope"
    assert out[1] == "    4 |     return undefined_thing(x);"  # gcc's quote of the line, renumbered
    assert out[2] == "main.cpp:1:10: fatal error: no such header"  # the harness's header: no .py line
    assert out[3] == "cuda.cu:7: error: identifier is undefined"  # no such generated file here
    assert out[4] == "/usr/include/torch/x.h:3:1: note: a header's own line is left alone"


def test_describe_exception_gives_the_line_in_the_code_and_no_harness_frames(tmp_path):
    path = tmp_path / "cand.py"
    path.write_text("import torch\n\ndef f():\n    return undefined_name\n\nf()\n")
    with pytest.raises(NameError) as info:
        exec(compile(path.read_text(), str(path), "exec"), {})
    assert ke.describe_exception(info.value, str(path)) == "line 4: NameError: name 'undefined_name' is not defined"
    path.write_text("class ModelNew:\n    def forward(self x):\n        pass\n")
    with pytest.raises(SyntaxError) as info:
        compile(path.read_text(), str(path), "exec")
    message = ke.describe_exception(info.value, str(path))
    assert message.startswith("line 2: SyntaxError: ") and message.endswith(": def forward(self x):")
    assert "^" not in message and "\n" not in message


PLAIN_CANDIDATE = ("import torch\n\nclass ModelNew(torch.nn.Module):\n    def __init__(self, scale):\n"
                   "        super().__init__()\n\n    def forward(self, x):\n        return x\n")


def test_load_errors_and_broken_references_get_their_own_exact_verdicts(tmp_path):
    # no compile: candidates without a kernel (no precheck here), references that are not tasks.
    # A broken reference is the task's fault: "reference_error", never the candidate's runtime_error.
    broken_forward = REFERENCE.replace("return torch.relu(x) * self.scale + x", "return x @ undefined_matrix")
    pairs = [
        (REFERENCE, "import torch\n\nclass ModelNew(torch.nn.Module:\n    pass\n"),  # syntax error, line 3
        (REFERENCE, ""),  # empty file
        (REFERENCE, "import torch\n\nclass Model(torch.nn.Module):\n    pass\n"),  # no ModelNew
        (REFERENCE, "import torch\n\nx = 1\nraise ValueError('bad setup')\n"),  # raises at import
        ("import torch\n\nprint('not a task')\n", PLAIN_CANDIDATE),  # reference without Model
        (broken_forward, PLAIN_CANDIDATE),  # reference whose forward fails
    ]
    results = ke.evaluate_batch(pairs, device="cpu", cache_root=str(tmp_path), **FAST)
    got = [(r.status, r.compiled, r.correct, r.speedup, r.message) for r in results]
    assert got[0][:4] == ("runtime_error", False, False, 0.0), got[0]
    assert got[0][4].startswith("candidate failed during load: line 3: SyntaxError: "), got[0]
    assert got[0][4].endswith(": class ModelNew(torch.nn.Module:") and "^" not in got[0][4], got[0]
    no_class = ("runtime_error", False, False, 0.0, "candidate failed during load: the code defines no class ModelNew")
    assert got[1] == no_class and got[2] == no_class, got[1:3]
    assert got[3] == ("runtime_error", False, False, 0.0, "candidate failed during load: line 4: ValueError: bad setup")
    assert got[4] == ("reference_error", False, False, 0.0, "the task's fault, not the candidate's: "
                      "reference failed during load: the code defines no class Model"), got[4]
    assert got[5] == ("reference_error", False, False, 0.0, "the task's fault, not the candidate's: "
                      "reference failed during check: line 15: NameError: name 'undefined_matrix' is not defined"), got[5]
