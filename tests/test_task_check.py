"""Tests for task_check.py: the reference checks (no compiler, no harness), then the command line,
which judges each solution through kernel_eval."""
import json
import os
import subprocess
import sys

import pytest

import task_check
import tasks
from tasks import Task
from test_tasks import FIXTURE, GOOD_REFERENCE, GOOD_SOLUTION, ROOT, _write_problem


def _task(reference=GOOD_REFERENCE, solution=GOOD_SOLUTION, task_id="test/level1/01_t"):
    return Task(task_id=task_id, name="t", level=1, reference_src=reference,
                solutions={"cpp": solution, "cuda": solution}, source_path=None, problem_id=1)


# ---------------------------------------------------------------- the reference-quality checks
# No compiler and no harness: these run the task's reference (and construct ModelNew) in this process.

TOLERANCES = {"float32": (1e-2, 1e-2)}  # kernel_eval's default for fp32


def findings(reference=GOOD_REFERENCE, solution=None):
    return task_check.reference_findings(_task(reference=reference), "cpu", TOLERANCES, seed=0, solution_src=solution)


def test_a_fair_reference_has_no_findings():
    assert findings() == []


@pytest.mark.parametrize("forward,reason", [
    ("torch.ones_like(x) * 3.0", "output 0 std 0 < 10 x atol; a constant would pass"),
    ("torch.relu(x) * 1e-3", "a constant would pass"),
    ("x * float('nan')", "output 0 has non-finite values"),
    ("x.sum()", "output 0 has 1 element(s)"),
    ("(x > 0)", "output 0 is not a floating-point tensor"),
])
def test_degenerate_reference_outputs_are_found(forward, reason):
    (finding,) = findings(GOOD_REFERENCE.replace("torch.relu(x)", forward))
    assert reason in finding, finding


def test_spread_is_measured_against_the_harness_tolerance():
    """relu(x) x 0.004 spreads over a std of ~0.0023: under 10 x atol at the default atol 1e-2 (a
    constant, zeros included, would pass), well over it at atol 1e-4."""
    reference = GOOD_REFERENCE.replace("torch.relu(x)", "torch.relu(x) * 0.004")
    assert "a constant would pass" in findings(reference)[0]
    strict = {"float32": (1e-4, 1e-4)}
    assert task_check.reference_findings(_task(reference=reference), "cpu", strict) == []


def test_reference_that_ignores_the_tail_of_an_input_is_found():
    # the output only reads the first row: a kernel that skips its last block would pass
    (finding,) = findings(GOOD_REFERENCE.replace("torch.relu(x)", "x[:1].expand_as(x) * 1.0"))
    assert finding == "zeroing the last 6% of input 0 leaves the output unchanged"
    # a second input that does not matter is found by its index
    two_inputs = GOOD_REFERENCE.replace("def forward(self, x)", "def forward(self, x, unused)").replace(
        "return [torch.randn(64, 64)]", "return [torch.randn(64, 64), torch.randn(64, 64)]")
    assert findings(two_inputs) == ["zeroing the last 6% of input 1 leaves the output unchanged"]


def test_reference_that_fails_is_a_finding_not_a_crash():
    assert findings(GOOD_REFERENCE.replace("return torch.relu(x)", "raise ValueError('broken task')")) == [
        "the reference failed: ValueError: broken task"]


LINEAR_REFERENCE = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.linear = nn.Linear(n, n)

    def forward(self, x):
        return self.linear(x)

def get_inputs():
    return [torch.randn(8, 32)]

def get_init_inputs():
    return [32]
'''

# A solution in the built-in style: its extension is built at import, its parameters are nn.Linear's.
LINEAR_SOLUTION = '''
import math
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

ext = load_inline(name="never_built", cpp_sources="this is not C++", functions=["linear"])
forward_fn = ext.linear

class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, n))
        self.bias = nn.Parameter(torch.empty(n))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        nn.init.uniform_(self.bias, -1 / math.sqrt(n), 1 / math.sqrt(n))

    def forward(self, x):
        return forward_fn(x, self.weight, self.bias)
'''


def test_solution_parameters_are_compared_with_the_references_without_a_build():
    # "this is not C++" would fail any build: the parameters are compared without one
    assert findings(LINEAR_REFERENCE, LINEAR_SOLUTION) == []
    bias_first = LINEAR_SOLUTION.replace("        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))\n", "")
    bias_first = bias_first.replace("math.sqrt(n))\n", "math.sqrt(n))\n        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))\n")
    (finding,) = findings(LINEAR_REFERENCE, bias_first)
    assert finding.startswith("parameter 0 differs from Model's under the same seed ((32, 32) vs (32, 32))")
    no_bias = LINEAR_SOLUTION.replace("        self.bias = nn.Parameter(torch.empty(n))\n", "").replace(
        "        nn.init.uniform_(self.bias, -1 / math.sqrt(n), 1 / math.sqrt(n))\n", "")
    assert findings(LINEAR_REFERENCE, no_bias) == ["ModelNew has 1 parameters/buffers, Model has 2"]
    raises = LINEAR_SOLUTION.replace("forward_fn = ext.linear", "raise ImportError('no such thing')")
    assert findings(LINEAR_REFERENCE, raises) == [
        "ModelNew could not be constructed to compare its parameters: ImportError: no such thing"]


@pytest.mark.slow
def test_every_builtin_reference_is_a_fair_test():
    """Runs each built-in reference at its CPU size (no build): what `task_check.py --device cpu` finds, minus
    the harness. The GPU sizes are checked on a GPU (`task_check.py --device cuda`)."""
    unfair = {t.task_id: f for t in tasks.load_builtin(device="cpu")
              if (f := task_check.reference_findings(t, "cpu", TOLERANCES, solution_src=t.solutions["cpp"]))}
    assert unfair == {}


# ---------------------------------------------------------------- the command line

def check_cli(*args, cwd=ROOT, timeout=900):
    return subprocess.run([sys.executable, os.path.join(ROOT, "task_check.py"), *args], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout)


def one_line_error(proc, message):
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [message]


def test_check_bad_inputs_are_one_line_errors(tmp_path):
    one_line_error(check_cli("--root", str(tmp_path / "nowhere")),
                   f"task_check.py: {tmp_path / 'nowhere'}: task directory does not exist")
    _write_problem(tmp_path / "level1", "01_relu")
    (tmp_path / "level1" / "01_relu" / "solution_cpp.py").unlink()
    one_line_error(check_cli("--root", str(tmp_path)), f"task_check.py: {tmp_path / 'level1' / '01_relu'}: "
                                                       "missing solution_cpp.py")
    one_line_error(check_cli("--kernelbench", str(tmp_path / "nowhere")),
                   f"task_check.py: {tmp_path / 'nowhere'}: KernelBench directory does not exist")
    not_a_checkout = tmp_path / "empty"
    not_a_checkout.mkdir()
    one_line_error(check_cli("--kernelbench", str(not_a_checkout)),
                   f"task_check.py: {not_a_checkout / 'level1'}: level 1 directory does not exist")
    one_line_error(check_cli("--only", "no-such-task"), "task_check.py: no task id contains 'no-such-task'")


def test_check_runs_a_kernelbench_checkouts_references_alone(tmp_path):
    out = tmp_path / "check.json"
    proc = check_cli("--kernelbench", FIXTURE, "--levels", "1,2", "--device", "cpu", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    assert [(r["task_id"], r["status"], r["findings"], r["ok"]) for r in results] == [
        (t.task_id, "no solution", [], True) for t in tasks.load_kernelbench(FIXTURE)]
    assert proc.stdout.splitlines()[-1].startswith(f"{len(results)}/{len(results)} problems ok on cpu")


def test_check_says_when_the_harness_could_not_judge(tmp_path, monkeypatch, capsys):
    """A harness_error is no verdict: neither ok nor a failed solution, and the exit is non-zero."""
    kernel_eval = pytest.importorskip("kernel_eval")

    def cannot_judge(pairs, device, config, progress):
        return [kernel_eval.EvalResult(status="harness_error", message="out of memory on the device")] * len(pairs)

    monkeypatch.setattr(kernel_eval, "evaluate_batch", cannot_judge)
    _write_problem(tmp_path / "level1", "01_relu")
    out = tmp_path / "check.json"
    assert task_check.main(["--root", str(tmp_path), "--device", "cpu", "--json", str(out)]) == 1
    (result,) = json.loads(out.read_text())
    assert (result["status"], result["ok"], result["findings"]) == ("harness_error", False, [])
    lines = capsys.readouterr().out.splitlines()
    assert "no verdict" in lines[1] and "harness_error: out of memory on the device" in lines[1]
    assert lines[-1].startswith("0/1 problems ok on cpu")
    assert lines[-1].endswith("; not judged (the harness could not judge): builtin/level1/01_relu")


# One C++ extension, two solutions: the good one adds 0, the broken one 0.05 to relu(x). Their
# load_inline calls are identical, so the harness builds the extension once for both.
SHIFTED_RELU = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

source = r"""
#include <torch/extension.h>

torch::Tensor shifted_relu(torch::Tensor x, double shift) {
    TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.is_contiguous(), "contiguous float32 only");
    auto y = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* out = y.data_ptr<float>();
    for (int64_t i = 0; i < x.numel(); ++i) out[i] = (in[i] > 0.0f ? in[i] : 0.0f) + static_cast<float>(shift);
    return y;
}
"""
ext = load_inline(name="test_tasks_shifted_relu", cpp_sources=source, functions=["shifted_relu"])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.shifted_relu(x, SHIFT)


SHIFT = 0.0
'''


@pytest.mark.slow
def test_check_passes_a_good_solution_and_fails_a_broken_one_through_the_harness(tmp_path):
    big_relu = GOOD_REFERENCE.replace("torch.randn(64, 64)", "torch.randn(512, 1024)")  # long enough to time
    _write_problem(tmp_path / "level1", "01_good", big_relu, SHIFTED_RELU)
    _write_problem(tmp_path / "level1", "02_broken", big_relu, SHIFTED_RELU.replace("SHIFT = 0.0", "SHIFT = 0.05"))
    out = tmp_path / "check.json"
    proc = check_cli("--root", str(tmp_path), "--device", "cpu", "--json", str(out))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    good, broken = json.loads(out.read_text())
    assert (good["status"], good["findings"], good["ok"]) == ("correct", [], True), good
    assert good["ref_ms"] > 0 and good["solution_ms"] > 0 and good["speedup"] >= 0
    assert (broken["status"], broken["findings"], broken["ok"]) == ("incorrect", [], False), broken
    assert "values outside tolerance" in broken["message"] and "max abs diff 0.05" in broken["message"]
    table = proc.stdout.splitlines()
    assert table[0].split() == ["problem", "level", "status", "speedup", "ref", "ms", "sol", "ms", "reference", "notes"]
    assert table[1].split()[:3] == ["builtin/level1/01_good", "1", "correct"] and table[1].split()[3].endswith("x")
    assert table[2].split()[:3] == ["builtin/level1/02_broken", "1", "incorrect"] and "values outside tolerance" in table[2]
    assert table[-1].startswith("1/2 problems ok on cpu") and table[-1].endswith("; failed: builtin/level1/02_broken")
