"""Tests for kernel_eval: the parent's helpers and phases (no compile), then the adversarial suite and
the built-in benign set on CPU (slow: one shared C++ build), then the CUDA versions (gpu). What a
verdict is (comparison, op check, paired timing, run limits) is tested alone in test_kernel_verdict.py.

Each adversarial candidate states its expected verdict in its first line, `# expect: STATUS`, where
STATUS is an EvalResult status, or `timing_rejected` (correct but the timing cross-check refuses the
speedup) or `no_speedup` (correct, and not measured faster than the reference)."""
import contextlib
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import time

import pytest
import torch

import kernel_boundary
import kernel_eval as ke
import kernel_memory
import kernel_sandbox as sandbox
import kernel_verdict

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


# ----------------------------------------------------------------------------- helpers of the parent

def _tensor_file(sets) -> int:
    fd = kernel_memory.memfd("test")
    kernel_memory.write_tensor_sets(fd, sets)
    return fd


def test_output_file_mapped_writable_cannot_be_sealed():
    import mmap
    fd = _tensor_file([[torch.ones(10)]])
    live = mmap.mmap(fd, 0)  # a candidate that keeps a writable mapping could rewrite it after the check
    with pytest.raises(ke.Failure, match="mapped writable"):
        kernel_memory.seal_output(fd, 1 << 20)
    live.close()
    kernel_memory.seal_output(fd, 1 << 20)
    os.close(fd)
    fd = _tensor_file([[torch.ones(10)]])
    with pytest.raises(ke.Failure, match="limit"):
        kernel_memory.seal_output(fd, 16)
    os.close(fd)


def test_precheck_rejects_without_compiling(tmp_path):
    t0 = time.monotonic()
    result = ke.evaluate(REFERENCE, "print('no kernel')", device="cpu", cache_root=str(tmp_path),
                         precheck=lambda src: "no load_inline kernel found")
    assert result.status == "format_error" and "no load_inline" in result.message
    assert result.to_dict()["status"] == "format_error" and result.status in kernel_verdict.STATUSES
    assert time.monotonic() - t0 < 5 and not os.path.exists(os.path.join(tmp_path, "compiled"))
    assert result.build_reused is None  # never reached the compiler: neither built nor reused


def test_build_reused_says_whether_the_compile_record_came_from_the_cache(tmp_path):
    """Two identical candidates in a fresh cache are built now (both say so: they share the one
    build); the same source in a later batch finds the build in the cache. No C++: the candidate's
    build is its import, which is what the compile phase records."""
    src = REFERENCE.replace("class Model(", "class ModelNew(")
    cfg = dict(cache_root=str(tmp_path), cpu_trials=2, time_candidate=False)
    first = ke.evaluate_batch([(REFERENCE, src), (REFERENCE, src)], device="cpu", **cfg)
    again = ke.evaluate(REFERENCE, src, device="cpu", **cfg)
    info = [(r.status, r.build_reused, r.seconds.get("compile")) for r in first + [again]]
    assert [r.build_reused for r in first] == [False, False] and again.build_reused is True, info
    assert again.seconds["compile"] == 0.0 and again.status == first[0].status, info


# a task whose model takes an int, a float, a tuple and a tensor (drawn unseeded: only the file carries its values)
INIT_REFERENCE = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, offset, scale, shape, weight):
        super().__init__()
        kinds = (type(offset), type(scale), type(shape), type(weight))
        assert kinds == (int, float, tuple, torch.Tensor), kinds
        self.offset, self.scale, self.shape, self.weight = offset, scale, shape, weight.clone()

    def forward(self, x):
        return (x * self.weight * self.scale + self.offset).reshape(self.shape)

def get_inputs():
    return [torch.randn(2, 8)]

def get_init_inputs():
    return [3, 0.5, (4, 4), torch.randn(8)]
"""
# a candidate whose constructor tries every way to write the init file it was handed, and says how each went
INIT_WRITER = INIT_REFERENCE.replace("class Model(", "class ModelNew(") + """
import mmap, os

def attempts(fd):
    yield "pwrite", lambda: os.pwrite(fd, bytes(8), 0)
    yield "reopened", lambda: os.pwrite(os.open(f"/proc/self/fd/{fd}", os.O_RDWR), bytes(8), 0)
    yield "truncate", lambda: os.ftruncate(fd, 0)
    yield "mmap", lambda: mmap.mmap(fd, 0, prot=mmap.PROT_READ | mmap.PROT_WRITE)

class Writer(ModelNew):
    def __init__(self, *init_inputs):
        outcomes = []
        for fd in map(int, os.listdir("/proc/self/fd")):
            try:
                if "kernel_eval-init-inputs" not in os.readlink(f"/proc/self/fd/{fd}"):
                    continue
            except OSError:
                continue
            for name, attempt in attempts(fd):
                try:
                    attempt()
                    outcomes.append(name + " written")
                except OSError as e:
                    outcomes.append(f"{name} {type(e).__name__}")
        raise RuntimeError("init file: " + (", ".join(outcomes) or "not held"))

ModelNew = Writer
"""


def test_init_inputs_travel_in_a_sealed_file_with_their_types(tmp_path):
    """A model's constructor arguments (an int, a float, a tuple, a tensor) reach the candidate as
    the reference's get_init_inputs returned them (types and values: the tensor is drawn unseeded,
    so only the file holds it), in a file the parent sealed: a candidate that tries to write it,
    through its fd, a reopened fd, a truncate or a writable mapping, is refused every time, and the
    candidate judged after it on the same session still gets the reference's values."""
    honest = INIT_REFERENCE.replace("class Model(", "class ModelNew(")
    cfg = dict(cache_root=str(tmp_path), op_check=False, time_candidate=False, max_parallel_runs=1)
    writer, after = ke.evaluate_batch([(INIT_REFERENCE, INIT_WRITER), (INIT_REFERENCE, honest)], device="cpu", **cfg)
    assert after.status == "correct", after.message
    assert writer.status == "runtime_error" and "init file: pwrite PermissionError, reopened PermissionError, " \
        "truncate PermissionError, mmap PermissionError" in writer.message, writer.message


def test_init_inputs_a_tensor_file_cannot_hold_are_the_tasks_fault(tmp_path):
    reference = INIT_REFERENCE.replace("def __init__(self, offset, scale, shape, weight):",
                                       "def __init__(self, options, offset=3, scale=0.5, shape=(4, 4), weight=None):")
    reference = reference.replace("kinds = (type(offset)", "weight = torch.ones(8)\n        kinds = (type(offset)")
    reference = reference.replace("return [3, 0.5, (4, 4), torch.randn(8)]", "return [{'scale': 0.5}]")
    result = ke.evaluate(reference, reference.replace("class Model(", "class ModelNew("), device="cpu",
                         cache_root=str(tmp_path), op_check=False, time_candidate=False)
    assert result.status == "reference_error", result.message
    assert "get_init_inputs() holds what the harness cannot pass to a candidate: a dict cannot travel" in result.message


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


def _reference_outputs(session, check_fd: int) -> list:
    """What the reference session holds, recomputed here from the session's own seeds and files."""
    import types
    module = types.ModuleType("adversarial_reference")
    exec(compile(REFERENCE, "reference.py", "exec"), module.__dict__)
    torch.manual_seed(session.init_seed)
    model = module.Model(*module.get_init_inputs())
    with torch.no_grad():
        return [[model(*xs)] for xs in kernel_memory.read_tensor_sets(check_fd, 1 << 30)]


@pytest.mark.parametrize("recompute", [False, True], ids=["kept", "recomputed"])
def test_reference_session_judges_and_restarts_on_the_same_inputs(tmp_path, recompute):
    # recompute_outputs: the reference's outputs are not kept but computed again from the sealed inputs
    # when judged (a large task's); every verdict below the same
    cfg = ke.EvalConfig(cache_root=str(tmp_path), cpu_trials=2, recompute_outputs=recompute)
    session = ke.reference_session(REFERENCE, ke.Context("cpu", "", cfg), users=1)
    files = session.ready()
    assert session.recompute == recompute
    assert session.out_bytes["check"][0] == [64 * 4096 * 4]
    inputs_before = kernel_memory.read_tensor_sets(files["check"], 1 << 30)
    right = _reference_outputs(session, files["check"])
    assert len(right) == cfg.n_correct_trials

    def judge(sets, trial=None):
        fd = _tensor_file(sets)
        try:
            return session.judge(fd, "check", 1 << 30, trial=trial)
        finally:
            os.close(fd)

    assert judge(right) is None
    wrong = [[o.clone() for o in outs] for outs in right]
    wrong[3][0][0, 0] += 1.0
    assert judge(wrong).startswith("trial 4/5: output: 1 of")
    assert "expected 5 output sets" in judge(right[:4])
    # a check trial alone (a candidate's check: one trial's outputs judged before the next runs)
    assert judge(right[3:4], trial=3) is None and judge(right[2:3], trial=2) is None
    assert judge(wrong[3:4], trial=3).startswith("trial 4/5: output: 1 of")
    assert judge(right[2:3], trial=3).startswith("trial 4/5: output:")  # another trial's outputs
    assert judge(right[3:5], trial=3) == "expected 1 output set, got 2"
    fd = kernel_memory.memfd("garbage")
    os.write(fd, b"not a tensor file" * 10)
    with pytest.raises(ke.Failure, match="unreadable outputs"):
        session.judge(fd, "check", 1 << 30)
    os.close(fd)
    # the reference worker dies (say a candidate's file crashed it): that candidate's verdict is a
    # runtime_error; a candidate that got its inputs before still reads them (its own duplicates) and
    # is judged by a fresh worker on the same secret seeds, without asking for its inputs again
    for pid in sandbox.children_of(session.worker.proc.pid):
        os.kill(pid, 9)
    with pytest.raises(ke.Failure, match="could not be compared"):
        judge(right)
    assert session.worker is None and session.files == {}
    inputs_held = kernel_memory.read_tensor_sets(files["check"], 1 << 30)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(inputs_before, inputs_held))
    assert judge(right) is None
    files_after = session.ready()
    inputs_after = kernel_memory.read_tensor_sets(files_after["check"], 1 << 30)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(inputs_before, inputs_after))
    for fd in list(files.values()) + list(files_after.values()):
        os.close(fd)
    session.release()
    assert session.worker is None and session.files == {}


def test_forked_run_workers_see_what_spawned_ones_see(tmp_path):
    """A candidate's run worker forked from the run zygote is the process a spawned one would be:
    the same environment (in os.environ and in /proc/self/environ, apart from its own tag) and the
    same heap poison (MALLOC_PERTURB_, read by glibc at process start: the zygote's start), and it
    names its role for ps. The reference's session is forked too. Outside the boundary, whose own
    forked and spawned workers tests/test_kernel_sandbox.py compares: this one writes its report
    into the test's directory and reads its parent's name."""
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
        src = f"REPORT, TAG = {str(report) + '.' + str(forked)!r}, {sandbox.TAG_ENV!r}" + source
        [result] = ke.evaluate_batch([(REFERENCE, src)], device="cpu", cache_root=str(tmp_path / "cache"),
                                     run_zygote=forked, time_candidate=False, sandbox="off")
        assert result.status == "incorrect", result.message  # it ran: ModelNew is not the reference
        seen[forked] = eval((tmp_path / f"report.{forked}").read_text())
    (initial_f, env_f, poisoned_f, comm_f, parent_f), (initial_s, env_s, poisoned_s, comm_s, _) = seen[True], seen[False]
    assert initial_f == initial_s and env_f == env_s
    assert initial_f == env_f  # nothing added or dropped after start
    assert poisoned_f and poisoned_s
    assert (comm_f, parent_f) == ("keval-cand", "keval-super")
    assert comm_s.startswith("python")


# a reference that takes SPIN_S of CPU per call (its first FIRST_CALL_S more), and candidates that are
# honest, honest and 3x slower, hung in their check, or hung once timing starts (after the check's
# n_correct_trials calls)
SPIN_REFERENCE = """
import time
import torch
import torch.nn as nn
SPIN_S = 0.05
FIRST_CALL_S = 3.0

def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass

class Model(nn.Module):
    calls = 0

    def forward(self, x):
        Model.calls += 1
        spin(SPIN_S + (FIRST_CALL_S if Model.calls == 1 else 0.0))  # a cold start: lazy loads, a handle
        return x * 2.0

def get_inputs():
    return [torch.randn(64)]

def get_init_inputs():
    return []
"""
SPIN_CANDIDATE = """
import time
import torch
import torch.nn as nn
CALLS = [0]

def spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass

class ModelNew(nn.Module):
    def forward(self, x):
        CALLS[0] += 1
        if HANG_AFTER is not None and CALLS[0] > HANG_AFTER:
            while True:
                time.sleep(1.0)
        spin(FACTOR * 0.05)
        return x * 2.0
"""


@pytest.mark.slow
def test_a_hung_candidate_times_out_at_a_limit_derived_from_the_reference(tmp_path):
    """A candidate hung in its check, or once timing starts, is a timeout within 10x (the multiple
    set here) the reference's warm time for the same request + the slack, far below the fixed 120 s / 300 s,
    and says so (the reference's cold first call, 3 s, would put the check's limit past 35 s); an honest
    candidate 3x slower than the reference stays correct."""
    cfg = dict(cache_root=str(tmp_path), op_check=False, cpu_trials=2, run_timeout_multiple=10)
    n = ke.EvalConfig().n_correct_trials
    variants = {"honest": (1, None), "slower_3x": (3, None), "hung_in_check": (1, 0), "hung_in_timing": (1, n)}
    srcs = {name: SPIN_CANDIDATE + f"FACTOR, HANG_AFTER = {factor}, {hang}\n"
            for name, (factor, hang) in variants.items()}
    t0 = time.monotonic()
    results = dict(zip(srcs, ke.evaluate_batch([(SPIN_REFERENCE, s) for s in srcs.values()], device="cpu", **cfg)))
    elapsed = time.monotonic() - t0
    info = {k: (r.status, r.message, r.timeout_seconds) for k, r in results.items()}
    assert results["honest"].status == "correct" and results["slower_3x"].status == "correct", info
    assert results["honest"].timeout_seconds == 0.0, info
    for name, phase in (("hung_in_check", "check"), ("hung_in_timing", "time")):
        r = results[name]
        m = re.search(rf"candidate timed out during {phase} \(limit ([\d.]+) s: 10 x the reference's ([\d.e-]+) s"
                      r"(?: \+ 3 x its ([\d.e-]+) s moving the data)? \+ 5 s\)", r.message)
        assert r.status == "timeout" and m, info
        limit, ref_s, moving_s = float(m.group(1)), float(m.group(2)), float(m.group(3) or 0)
        assert limit == pytest.approx(10 * ref_s + 3 * moving_s + 5, rel=0.06, abs=0.06), info  # printed rounded
        assert 5 <= limit < 30 and limit * 0.95 <= r.timeout_seconds < limit + 5, info
    assert elapsed < 120, elapsed  # both hangs together cost less than the old check limit alone
    # again on the cached footprint: no probe runs, so the reference's first forward is its rehearsal
    again = ke.evaluate_batch([(SPIN_REFERENCE, srcs["hung_in_check"])], device="cpu", **cfg)[0]
    m = re.search(r"during check \(limit ([\d.]+) s: 10 x the reference's", again.message)
    assert again.status == "timeout" and m and 5 <= float(m.group(1)) < 30, again.message


# a task whose check is mostly data (16 MB an input set, one add): its candidates hung in their check,
# or honest
DATA_REFERENCE = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x + 1.0

def get_inputs():
    return [torch.randn(4_000_000)]

def get_init_inputs():
    return []
"""
DATA_CANDIDATE = """
import time
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        while HANG:
            time.sleep(1.0)
        return x + 1.0
"""


@pytest.mark.slow
def test_a_hung_candidate_on_a_large_task_is_allowed_the_data_once_not_the_multiple(tmp_path):
    """Where drawing and moving the inputs is most of the reference's check, a hung candidate's limit
    is the multiple x the forwards alone + io multiple x the moving: the data is not multiplied by
    the factor a slow kernel gets, and an honest candidate that moves the same data stays correct."""
    cfg = dict(cache_root=str(tmp_path), op_check=False, time_candidate=False)
    honest, hung = ke.evaluate_batch([(DATA_REFERENCE, DATA_CANDIDATE + "HANG = False\n"),
                                      (DATA_REFERENCE, DATA_CANDIDATE + "HANG = True\n")], device="cpu", **cfg)
    assert honest.status == "correct", honest.message
    m = re.search(r"during check \(limit ([\d.]+) s: 30 x the reference's ([\d.e-]+) s \+ 3 x its ([\d.e-]+) s "
                  r"moving the data \+ 5 s\)", hung.message)
    assert hung.status == "timeout" and m, hung.message
    limit, forward_s, moving_s = (float(g) for g in m.groups())
    assert moving_s > 2 * forward_s, hung.message  # drawing 5 x 4M normals and writing them: more than 5 adds
    assert limit == pytest.approx(30 * forward_s + 3 * moving_s + 5, rel=0.06, abs=0.06), hung.message
    assert limit * 0.95 <= hung.timeout_seconds < limit + 5, (limit, hung.timeout_seconds)


WRONG_THEN_HUNG_CANDIDATE = """
import time
import torch.nn as nn

class ModelNew(nn.Module):
    calls = 0

    def forward(self, x):
        ModelNew.calls += 1
        while ModelNew.calls > 1:
            time.sleep(1.0)
        return x + 2.0
"""


def test_each_check_trial_is_judged_before_the_next_runs(tmp_path):
    """The check runs one trial at a time, its outputs judged before the next trial runs (so one
    trial's outputs are in host memory at a time): a candidate wrong in its first trial is incorrect
    there, without waiting for a second trial that would hang until the time limit."""
    t0 = time.monotonic()
    [r] = ke.evaluate_batch([(ALONE_REFERENCE, WRONG_THEN_HUNG_CANDIDATE)], device="cpu", cache_root=str(tmp_path),
                            op_check=False, time_candidate=False)
    assert r.status == "incorrect" and re.match(r"trial 1/5: output: \d+ of 4096 values", r.message), r.message
    assert r.trials == 1 and time.monotonic() - t0 < 60


ALONE_REFERENCE = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x * 2.0

def get_inputs():
    return [torch.randn(4096)]

def get_init_inputs():
    return []
"""
ALONE_CANDIDATE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = """
torch::Tensor twice(torch::Tensor x) {
    auto y = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* out = y.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) out[i] = 2.0f * in[i];
    return y;
}
"""
ext = load_inline(name="twice", cpp_sources=source, functions=["twice"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.twice(x.contiguous())
'''


ALONE_FILES = ("kernel_eval.py", "kernel_boundary.py", "kernel_gate.py", "kernel_memory.py", "kernel_reference.py",
               "kernel_sandbox.py", "kernel_types.py", "kernel_verdict.py", "kernel_worker.py")


@pytest.mark.slow
def test_the_harness_files_alone_judge_a_cpp_candidate(tmp_path):
    """kernel_eval.py and its sibling modules (ALONE_FILES) copied alone into an empty folder (no
    kernel_build.py, nothing of this project importable) judge a C++ candidate correct: plain
    load_inline, in a build directory of the candidate's own, with every worker, supervisor and
    zygote started from the copies."""
    import shutil
    alone = tmp_path / "alone"
    alone.mkdir()
    for name in ALONE_FILES:
        shutil.copy(os.path.join(ROOT, name), alone / name)
    (tmp_path / "reference.py").write_text(ALONE_REFERENCE)
    (tmp_path / "candidate.py").write_text(ALONE_CANDIDATE)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cache = tmp_path / "cache"
    proc = subprocess.run([sys.executable, str(alone / "kernel_eval.py"), "reference.py", "candidate.py", "--device",
                           "cpu", "--json", "--trials", "2", "--cache-root", str(cache)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    verdict = json.loads(proc.stdout.strip().splitlines()[-1])
    assert verdict["status"] == "correct" and verdict["compiled"], verdict["message"]
    # built by plain load_inline, not kernel_build's patch (confined: in the candidate's own directory)
    assert glob.glob(str(cache / "**" / "build" / "by-source" / "*"), recursive=True)
    assert sorted(p for p in os.listdir(alone) if p != "__pycache__") == sorted(ALONE_FILES)


# ----------------------------------------------------------------------------- CPU suite (slow)

@pytest.fixture(scope="module")
def cache_root():
    # KERNEL_EVAL_TEST_CACHE reuses builds across local runs; otherwise the session's cache
    # (tests/conftest.py), which CI starts empty and other modules' tests share
    return os.environ.get("KERNEL_EVAL_TEST_CACHE") or ke.EvalConfig().cache_root


CPP_CASES = cases("cpp")
# candidates that attack across the boundary (issue 39): judged with the setup they need (a port, a
# planted key and secrets, a cache of their own), below
BOUNDARY = {"proc_secrets", "kill_parent", "poison_cache", "connect_port", "read_home_key"}
# import_hang hangs in the compile phase too: run alone with a short compile limit; loaded_benign is
# judged while busy processes load the machine
SEPARATE = {"import_hang", "loaded_benign"} | BOUNDARY


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


def test_a_reference_failing_when_its_outputs_are_computed_again_is_the_tasks_fault(tmp_path):
    # with recompute_outputs the judge runs the reference's forward again: its failure there is a
    # reference_error that fails the task, never a runtime_error charged to the candidate
    flag = tmp_path / "broken"
    ref = REFERENCE.replace("    def forward(self, x):\n",
                            f"    def forward(self, x):\n        if __import__('os').path.exists({str(flag)!r}):\n"
                            "            raise RuntimeError('the reference broke')\n")
    assert ref != REFERENCE
    cfg = ke.EvalConfig(cache_root=str(tmp_path / "cache"), cpu_trials=2, recompute_outputs=True)
    session = ke.reference_session(ref, ke.Context("cpu", "", cfg), users=1)
    files = session.ready()
    right = _reference_outputs(session, files["check"])
    fd = _tensor_file(right)
    try:
        assert session.judge(fd, "check", 1 << 30) is None
        flag.touch()
        with pytest.raises(ke.Failure) as failed:
            session.judge(fd, "check", 1 << 30)
    finally:
        os.close(fd)
        for f in files.values():
            os.close(f)
        session.release()
    assert failed.value.status == "reference_error", failed.value.message
    assert "the task's fault" in failed.value.message and "the reference broke" in failed.value.message


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
    # outside the boundary: the suite's candidates share one C++ extension, which confined candidates
    # would each build (28 s apiece here: 14 min instead of 1 on the 2-core box); the cases whose
    # processes meet the boundary are judged behind it too (`attacks`, PROCESS_CASES)
    names = [n for n in CPP_CASES if n not in SEPARATE]
    pairs = [(REFERENCE, open(CPP_CASES[n]).read()) for n in names]
    results = ke.evaluate_batch(pairs, device="cpu", cache_root=cache_root, sandbox="off", **FAST)
    return dict(zip(names, results))


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in CPP_CASES if n not in SEPARATE])
def test_adversarial_cpp(name, cpp_results):
    check_expectation(name, expectation(CPP_CASES[name]), cpp_results[name], ke.EvalConfig(**FAST))


@pytest.mark.slow
def test_outputs_that_compute_on_first_use_are_refused(cpp_results):
    """A tensor subclass computed on first use is refused when the check trials see it, and when
    only the timed calls get it (issue 39: judged correct before); so is a plain output beside a
    torch function mode left to fill it on first use. The honest twin of the same kernel passes."""
    for name, phase in (("lazy_output", "check"), ("lazy_when_timed", "time")):
        r = cpp_results[name]
        assert r.status == "runtime_error" and not r.correct and r.speedup == 0.0, (name, r.message)
        assert r.message.startswith(f"candidate failed during {phase}: "), r.message
        assert "candidate_module.LazyRelu (a torch.Tensor subclass)" in r.message, r.message
    mode = cpp_results["fill_on_first_use"]
    assert mode.status == "runtime_error" and "mode active" in mode.message, mode.message
    assert cpp_results["benign"].status == "correct", cpp_results["benign"].message


# the cases that attack the outputs or their comparison, judged again with the reference's outputs not kept
# but computed when judged (recompute_outputs: what a task whose outputs fill the device gets)
OUTPUT_CASES = ["benign", "cached_by_pointer", "cached_output", "freed_reference_memory", "half_output",
                "heap_search", "inplace_input", "lower_precision", "partial_write", "patch_comparison"]


@pytest.fixture(scope="module")
def cpp_results_recomputed(cache_root):
    pairs = [(REFERENCE, open(CPP_CASES[n]).read()) for n in OUTPUT_CASES]
    results = ke.evaluate_batch(pairs, device="cpu", cache_root=cache_root, sandbox="off", recompute_outputs=True,
                                **FAST)
    return dict(zip(OUTPUT_CASES, results))


@pytest.mark.slow
@pytest.mark.parametrize("name", OUTPUT_CASES)
def test_adversarial_cpp_with_the_reference_outputs_recomputed(name, cpp_results_recomputed):
    check_expectation(name, expectation(CPP_CASES[name]), cpp_results_recomputed[name], ke.EvalConfig(**FAST))


@pytest.mark.slow
def test_honest_cpp_kernel_keeps_its_speedup_under_load(cpp_results, cache_root):
    judged_under_load(CPP_CASES["loaded_benign"], "cpu", cache_root=cache_root, **FAST)


@pytest.mark.slow
def test_warm_up_is_timed_by_the_parent_when_the_candidate_patches_its_clocks(cache_root):
    """A candidate that freezes every clock in its process still gets a bounded warm-up (rounds of
    calls until the parent's clock says cpu_warmup_ms) and the verdict its case expects: a warm-up
    timed by the candidate's own clock would never end."""
    path = CPP_CASES["patch_clock"]
    t0 = time.monotonic()
    result = ke.evaluate(REFERENCE, open(path).read(), device="cpu", cache_root=cache_root,
                         **dict(FAST, cpu_warmup_ms=300.0))
    check_expectation("patch_clock", expectation(path), result, ke.EvalConfig(**FAST))
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
    assert [pid for pid in sandbox.children_of(os.getpid()) if _is_kernel_eval_process(pid)] == []


def _is_kernel_eval_process(pid: int) -> bool:
    """A supervisor, zygote or worker: every process the sandbox starts runs kernel_worker.py."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"kernel_worker.py" in f.read()
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


@pytest.mark.slow
def test_a_callers_zygotes_serve_its_next_batch_and_stop_when_it_closes_them(cpp_results, cache_root):
    """train.py keeps one Zygotes for the run: the processes that started in the first batch fork the
    next batch's workers, evaluate_batch leaves them running, and leaving the with-block stops them."""
    benign = open(CPP_CASES["benign"]).read()
    with sandbox.Zygotes() as zygotes:
        first = ke.evaluate_batch([(REFERENCE, benign)], device="cpu", cache_root=cache_root, zygotes=zygotes, **FAST)
        assert first[0].status == "correct", first[0].message
        started = [z.proc for z in zygotes.all()]
        assert started and all(p.poll() is None for p in started)  # still running between the batches
        second = ke.evaluate_batch([(REFERENCE, benign), (REFERENCE, open(CPP_CASES["half_output"]).read())],
                                   device="cpu", cache_root=cache_root, zygotes=zygotes, **FAST)
        assert [r.status for r in second] == ["correct", "incorrect"], [r.message for r in second]
        assert [z.proc for z in zygotes.all()] == started  # no zygote started again
    assert all(p.poll() is not None for p in started) and zygotes.all() == []


@pytest.mark.slow
def test_a_kept_zygote_that_died_is_replaced_in_the_next_batch(cpp_results, cache_root):
    """Killed between batches (out of memory, or an unconfined candidate): the next batch's fork finds it
    gone and spawns its workers instead; the batch after starts a fresh zygote. Every verdict stands."""
    benign = open(CPP_CASES["benign"]).read()
    with sandbox.Zygotes() as zygotes:
        statuses = []
        for batch in range(3):
            if batch == 1:
                (killed,) = [z.proc for z in zygotes.all()]
                killed.kill()
                killed.wait()
            statuses.append(ke.evaluate_batch([(REFERENCE, benign)], device="cpu", cache_root=cache_root,
                                              zygotes=zygotes, **FAST)[0].status)
            if batch == 1:
                assert [z.out_of_service != "" for z in zygotes.all()] == [True]  # the fork failed
        assert statuses == ["correct"] * 3
        (fresh,) = [z.proc for z in zygotes.all()]
        assert fresh.pid != killed.pid and fresh.poll() is None


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
    monkeypatch.setattr(kernel_boundary, "ENV_ALLOWED", kernel_boundary.ENV_ALLOWED | {"OPENAI_API_KEY"})
    leaked = judged_without_secrets(open(CPP_CASES["benign"]).read(), "cpu", monkeypatch, cache_root=cache_root, **FAST)
    assert leaked.status == "runtime_error" and "sees the harness's secret" in leaked.message, leaked.message



def cpus_seen(path: str, device: str, log: str, **cfg) -> tuple:
    """Judge the kernel at `path` on `device`, its module recording the CPUs it may run on when
    imported (compile and run workers) and at every forward (checks and timed calls): (result,
    CPU sets seen at import, CPU sets seen in forward). Outside the boundary (the record is a file
    of the test's; the CPUs are set before the boundary is entered)."""
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
    result = ke.evaluate(REFERENCE, src, device=device, sandbox="off", **cfg)
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
    result = ke.evaluate(REFERENCE, open(CPP_CASES["benign"]).read(), device="cpu", cache_root=cache_root,
                         **dict(FAST, time_candidate=False))
    assert result.status == "correct" and result.seconds["compile"] == 0.0, (result.status, result.seconds)
    assert result.build_reused is True
    assert not any(k.startswith("compile.") for k in result.seconds)  # no build's profile: nothing built


@pytest.mark.slow
def test_cli_prints_one_json_verdict(cpp_results, cache_root):
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "kernel_eval.py"), os.path.join(ADV, "reference.py"),
                           CPP_CASES["partial_write"], "--device", "cpu", "--json", "--cache-root", cache_root],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdict = json.loads(proc.stdout.strip().splitlines()[-1])
    assert verdict["status"] == "incorrect" and verdict["speedup"] == 0.0 and verdict["compiled"]


def assert_each_side_times_its_own_count(builtin: list, results: list) -> None:
    """A side's blocks hold calls for its own block_ms: a candidate never more calls than the reference, and one
    3x slower or more fewer (its blocks as long as the reference's, not 3x as long). Some built-in solutions
    are that slow (the C++ ones 6-9x slower than torch's CPU kernels); the check needs at least one."""
    calls = {t.task_id: [r.blocks[side][0][0] for side in ("reference", "candidate")] for t, r in zip(builtin, results)}
    assert all(c <= ref for ref, c in calls.values()), calls
    slow = [t.task_id for t, r in zip(builtin, results) if r.claimed_ms >= 3 * r.ref_ms]
    assert slow and all(calls[task][1] < calls[task][0] for task in slow), (slow, calls)


@pytest.mark.slow
def test_builtin_solutions_are_accepted_on_cpu(cache_root):
    tasks = pytest.importorskip("tasks")
    builtin = [t for t in tasks.load_builtin(os.path.join(ROOT, "tasks"), device="cpu") if "cpp" in t.solutions]
    if not builtin:
        pytest.skip("no built-in tasks with a C++ solution yet")
    pairs = [(t.reference_src, t.solutions["cpp"]) for t in builtin]
    # real tasks at their CPU sizes: cheap trial counts (two input sets checked), the default phase limits
    results = ke.evaluate_batch(pairs, device="cpu", cache_root=cache_root, cpu_trials=3, n_correct_trials=2,
                                max_parallel_runs=2)
    bad = {t.task_id: (r.status, r.message) for t, r in zip(builtin, results) if r.status != "correct"}
    assert not bad, bad
    assert_each_side_times_its_own_count(builtin, results)


# ----------------------------------------------------------------------------- the boundary (issue 39)
# Candidates that go for what the harness's uid could reach before kernel_boundary's boundary: other
# processes through /proc, their supervisor, the network, the home directory, the shared build cache.
# Each must score nothing and leave nothing behind. On cpu (slow) and, the same cases in CUDA, on a GPU.

BOUNDARY_PROBLEM = kernel_boundary.boundary_problem()
needs_namespaces = pytest.mark.skipif(bool(BOUNDARY_PROBLEM), reason=f"no namespaces here: {BOUNDARY_PROBLEM}")
DEVICES = [pytest.param("cpu", marks=pytest.mark.slow), pytest.param("cuda", marks=pytest.mark.gpu)]
# the suite's cases whose processes meet the boundary (a crash, a hang killed from outside its PID
# namespace, an escaped grandchild): judged behind it with the attacks
PROCESS_CASES = {"cpu": ("segfault", "kernel_hang", "escaped_child"),
                 "cuda": ("illegal_address", "kernel_hang", "escaped_child")}


def device_cases(device: str) -> dict:
    return CPP_CASES if device == "cpu" else CUDA_CASES


def device_cfg(device: str) -> dict:
    return FAST if device == "cpu" else dict(check_timeout_s=30, load_timeout_s=180, gpu_trials=30)


def listening():
    """A TCP port on 127.0.0.1, and what each connection to it sent (a thread accepts them)."""
    import socket
    import threading
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.settimeout(0.1)
    received, done = [], threading.Event()

    def accept():
        while not done.is_set():
            with contextlib.suppress(OSError):
                conn, _ = server.accept()
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    received.append(conn.recv(64))
                conn.close()

    thread = threading.Thread(target=accept)
    thread.start()

    def stop():
        done.set()
        thread.join()
        server.close()
    return server.getsockname()[1], received, stop


@pytest.fixture(scope="module", params=DEVICES)
def attacks(request, cache_root, tmp_path_factory):
    """proc_secrets, kill_parent, connect_port and read_home_key, the PROCESS_CASES and the honest
    control, judged in one batch while the reference's source holds a secret, $HOME a key file, and a
    port on 127.0.0.1 listens."""
    device = request.param
    import secrets as _secrets
    planted = {"home_key": "keval-home-key-" + _secrets.token_hex(8),
               "reference": "keval-reference-secret-" + _secrets.token_hex(8)}
    home = tmp_path_factory.mktemp("home")
    (home / ".keval_fake_key").write_text(planted["home_key"])
    scratch = tmp_path_factory.mktemp("scratch")
    port, received, stop = listening()
    names = ["proc_secrets", "kill_parent", "connect_port", "read_home_key", "benign", *PROCESS_CASES[device]]
    reference = REFERENCE + f"\n_SECRET = {planted['reference']!r}  # in the reference session's memory\n"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(home))
        mp.setenv("KERNEL_EVAL_TEST_PORT", str(port))  # the harness's prefix: workers get it
        try:
            results = ke.evaluate_batch([(reference, open(device_cases(device)[n]).read()) for n in names],
                                        device=device, cache_root=cache_root, scratch_root=str(scratch),
                                        **device_cfg(device))
        finally:
            stop()
    return {"results": dict(zip(names, results)), "planted": planted, "received": received, "scratch": scratch,
            "home": home, "device": device}


def scored_nothing(result: ke.EvalResult, planted: dict) -> str:
    assert result.status == "runtime_error" and not result.correct and result.speedup == 0.0, result.message
    for name, secret in planted.items():
        assert secret not in result.message, f"the {name} reached the verdict: {result.message}"
    return result.message


@needs_namespaces
def test_a_candidate_reads_no_other_process_through_proc(attacks):
    message = scored_nothing(attacks["results"]["proc_secrets"], attacks["planted"])
    assert "saw 0 other processes; loot: []" in message, message


@needs_namespaces
def test_a_candidate_can_neither_ptrace_nor_kill_its_supervisor(attacks):
    message = scored_nothing(attacks["results"]["kill_parent"], attacks["planted"])
    assert "its parent is out of reach: getppid() = 0" in message, message
    assert attacks["results"]["benign"].status == "correct", attacks["results"]["benign"].message


@needs_namespaces
def test_a_candidate_opens_no_network_connection(attacks):
    message = scored_nothing(attacks["results"]["connect_port"], attacks["planted"])
    assert "no connection to port" in message and attacks["received"] == [], (message, attacks["received"])


@needs_namespaces
def test_a_candidate_cannot_read_the_harness_home_directory(attacks):
    message = scored_nothing(attacks["results"]["read_home_key"], attacks["planted"])
    assert "no key: [Errno 2] No such file or directory" in message, message


@needs_namespaces
def test_crashes_exits_hangs_and_escapes_keep_their_verdicts_behind_the_boundary(attacks):
    """The worker is pid 1 of its namespace: a signal it sends itself is ignored, one from the kernel
    (a fault) or from outside (the supervisor's SIGKILL) is not; its escaped grandchild dies with it."""
    device = attacks["device"]
    for name in PROCESS_CASES[device]:
        path = device_cases(device)[name]
        check_expectation(name, expectation(path), attacks["results"][name], ke.EvalConfig(**device_cfg(device)))
    time.sleep(0.5)
    assert leftover_processes(b"keval-escapee") == []


@needs_namespaces
def test_attacks_leave_nothing_behind_and_say_their_boundary(attacks):
    assert all(r.boundary == "namespaces" for r in attacks["results"].values())
    assert os.listdir(attacks["scratch"]) == []  # every worker's scratch removed
    # .nv: the CUDA driver's JIT cache, written by the trusted side (the reference worker runs with
    # the harness's HOME); a candidate's home is a tmpfs of its own
    assert sorted(set(os.listdir(attacks["home"])) - {".nv"}) == [".keval_fake_key"]
    assert [pid for pid in sandbox.children_of(os.getpid()) if _is_kernel_eval_process(pid)] == []


@needs_namespaces
@pytest.mark.parametrize("device", DEVICES)
def test_a_candidate_cannot_poison_the_build_cache_for_a_later_one(device, tmp_path):
    """A victim is judged and its compile cached; a poisoner then compiles, rewriting every compile
    record and planting a file in the build cache; the victim judged again keeps its verdict (its
    record unchanged: not rebuilt), and the cache holds nothing the poisoner wrote outside its own
    build directory; nor do /tmp, /dev/shm or the home directory."""
    cases, cfg = device_cases(device), dict(device_cfg(device), cache_root=str(tmp_path / "cache"))
    victim = open(cases["benign"]).read() + "\n# the victim\n"
    first = ke.evaluate(REFERENCE, victim, device=device, **cfg)
    assert first.status == "correct", first.message
    records = {p: open(p).read() for p in glob.glob(str(tmp_path / "cache" / "compiled" / "*.json"))}
    poisoner = ke.evaluate(REFERENCE, open(cases["poison_cache"]).read(), device=device, **cfg)
    again = ke.evaluate(REFERENCE, victim, device=device, **cfg)
    assert again.status == "correct" and again.seconds["compile"] == 0.0, (again.status, again.message)
    assert all(open(p).read() == text for p, text in records.items())
    assert poisoner.status == "runtime_error" and not poisoner.correct, poisoner.message
    assert "the shared build cache took none of its writes" in poisoner.message, poisoner.message
    planted = [p for p in glob.glob(str(tmp_path / "cache" / "**" / "keval-poison*"), recursive=True)]
    own = os.path.join(str(tmp_path / "cache"), "candidates", "")
    assert all(p.startswith(own) for p in planted), planted  # only in a build directory of its own
    for where in ("/tmp", "/dev/shm", os.path.expanduser("~")):
        assert not os.path.exists(os.path.join(where, "keval-poison-leftover")), where


def test_the_boundary_is_chosen_by_sandbox_and_recorded(monkeypatch):
    refused = lambda src: "refused before any worker"  # noqa: E731 - no process starts
    assert ke.evaluate(REFERENCE, "x", device="cpu", sandbox="off", precheck=refused).boundary == "process"
    with pytest.raises(ValueError, match="sandbox must be one of"):
        ke.evaluate(REFERENCE, "x", device="cpu", sandbox="maybe", precheck=refused)
    monkeypatch.setattr(kernel_boundary, "_boundary_problem", "no namespaces in this test")
    with pytest.raises(kernel_boundary.BoundaryUnavailable, match="no namespaces in this test"):
        ke.evaluate(REFERENCE, "x", device="cpu", sandbox="require", precheck=refused)


def test_cli_refuses_sandbox_require_without_namespaces_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(kernel_boundary, "_boundary_problem", "no namespaces in this test")
    code = ke.main([os.path.join(ADV, "reference.py"), CPP_CASES["benign"], "--device", "cpu", "--sandbox", "require"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err == ("kernel_eval.py: sandbox 'require': candidates cannot be confined here: "
                                 "no namespaces in this test"), err


# ----------------------------------------------------------------------------- memory-aware judging

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
    assert no_verdict.message.startswith("no verdict: judging this task needs ") and "GiB host memory (have " in no_verdict.message
    assert no_verdict.speedup == 0.0 and not no_verdict.correct


# ----------------------------------------------------------------------------- CUDA suite (gpu)

CUDA_CASES = cases("cuda")
CUDA_SEPARATE = {"loaded_benign"} | BOUNDARY


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


@pytest.fixture(scope="module")
def cuda_results_recomputed(cache_root):
    pairs = [(REFERENCE, open(CUDA_CASES[n]).read()) for n in OUTPUT_CASES]
    results = ke.evaluate_batch(pairs, device="cuda", cache_root=cache_root, recompute_outputs=True,
                                check_timeout_s=30, load_timeout_s=180, gpu_trials=30)
    return dict(zip(OUTPUT_CASES, results))


@pytest.mark.gpu
@pytest.mark.parametrize("name", OUTPUT_CASES)
def test_adversarial_cuda_with_the_reference_outputs_recomputed(name, cuda_results_recomputed):
    check_expectation(name, expectation(CUDA_CASES[name]), cuda_results_recomputed[name], ke.EvalConfig())


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
    assert_each_side_times_its_own_count(builtin, results)


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
    # where the failed compile's time went: its build, inside the compile phase
    assert 0.0 < result.seconds["compile.build"] <= result.seconds["compile"], result.seconds
    again = ke.evaluate(REFERENCE, BROKEN_CPP, device="cpu", cache_root=cache_root, **FAST)
    assert again.status == "compile_error" and again.message == result.message and again.seconds["compile"] == 0.0
    assert not any(k.startswith("compile.") for k in again.seconds)  # nothing built: the cached record


PLAIN_CANDIDATE = ("import torch\n\nclass ModelNew(torch.nn.Module):\n    def __init__(self, scale):\n"
                   "        super().__init__()\n\n    def forward(self, x):\n        return x\n")


BUILDS_THEN_RAISES = '''import torch
from torch.utils.cpp_extension import load_inline

host = """
#include <Python.h>
static struct PyModuleDef tiny_module = {PyModuleDef_HEAD_INIT, "tiny", nullptr, -1, nullptr};
PyMODINIT_FUNC PyInit_tiny(void) { return PyModule_Create(&tiny_module); }
"""
tiny = load_inline(name="tiny", cpp_sources=host, no_implicit_headers=True)
raise ValueError("after its build")
'''


@pytest.mark.slow
def test_a_candidate_failing_after_its_build_keeps_where_its_compile_time_went(cache_root):
    """A source that builds an extension, then raises: a runtime_error at load, and its compile phase
    still says how much of it was the build (the step report's compile.build)."""
    result = ke.evaluate(REFERENCE, BUILDS_THEN_RAISES, device="cpu", cache_root=cache_root, **FAST)
    assert result.status == "runtime_error" and result.message.endswith("ValueError: after its build"), result.message
    assert 0.0 < result.seconds["compile.build"] <= result.seconds["compile"], result.seconds


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
