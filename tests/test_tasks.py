"""Tests for tasks.py: loaders, validation, JSONL round trip, split, and the task checker."""
import ast
import json
import os
import re
import subprocess
import sys

import pytest

import tasks
from tasks import Task, TaskError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "kernelbench")

GOOD_REFERENCE = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)

def get_inputs():
    return [torch.randn(64, 64)]

def get_init_inputs():
    return []
'''

# Solutions for the checker tests need no compiler: the checker judges what ModelNew
# computes; the format rules (a kernel, no torch compute) are kernel_gate.py's business.
GOOD_SOLUTION = '''
import torch.nn as nn

class ModelNew(nn.Module):
    def forward(self, x):
        return x.clamp_min(0)
'''


def _task(reference=GOOD_REFERENCE, solution=GOOD_SOLUTION, task_id="test/level1/01_t"):
    return Task(task_id=task_id, name="t", level=1, reference_src=reference,
                solutions={"cpp": solution, "cuda": solution}, source_path=None, problem_id=1)


# ---------------------------------------------------------------- built-in set

def test_builtin_set_is_complete_and_well_formed():
    loaded = tasks.load_builtin()
    assert loaded and {t.level for t in loaded} <= {1, 2, 3}  # tasks/README.md: what each level holds
    for t in loaded:
        assert re.fullmatch(r"builtin/level\d/\d\d_[a-z0-9_]+", t.task_id), t.task_id
        assert t.task_id.startswith(f"builtin/level{t.level}/{t.problem_id:02d}_")
        assert set(t.solutions) == {"cuda", "cpp"}
        assert "class ModelNew" in t.solutions["cuda"] and "class ModelNew" in t.solutions["cpp"]
        # the two languages keep to their own load_inline arguments
        assert "cuda_sources=" in t.solutions["cuda"] and "__global__" in t.solutions["cuda"]
        assert "cuda_sources" not in t.solutions["cpp"] and "__global__" not in t.solutions["cpp"]
    ids = [t.task_id for t in loaded]
    assert len(set(ids)) == len(ids)


def test_builtin_extension_names_are_distinct():
    names = [m for t in tasks.load_builtin() for src in t.solutions.values()
             for m in re.findall(r'name="([^"]+)"', src)]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_builtin_solutions_keep_to_the_import_rules():
    allowed = {"torch", "torch.nn", "torch.utils.cpp_extension", "math"}
    for t in tasks.load_builtin():
        for lang, src in t.solutions.items():
            imports = set(re.findall(r"^(?:from|import)\s+([\w.]+)", src, flags=re.M))
            assert imports <= allowed, (t.task_id, lang, imports - allowed)
            statements = {type(n).__name__ for n in ast.walk(ast.parse(src))}
            assert not statements & {"Try", "Pass"}, (t.task_id, lang)


def test_builtin_solutions_pass_the_reward_format_gate():
    kernel_gate = pytest.importorskip("kernel_gate")
    rejected = [(t.task_id, lang, kernel_gate.check_format(src, language=lang))
                for t in tasks.load_builtin() for lang, src in t.solutions.items()]
    assert [r for r in rejected if r[2]] == []


def test_builtin_root_resolves_from_another_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert len(tasks.load_builtin("tasks")) == len(tasks.load_builtin(os.path.join(ROOT, "tasks")))


def _write_problem(level_dir, name, reference=GOOD_REFERENCE, solution=GOOD_SOLUTION):
    d = level_dir / name
    d.mkdir(parents=True)
    (d / "reference.py").write_text(reference)
    (d / "solution_cuda.py").write_text(solution)
    (d / "solution_cpp.py").write_text(solution)
    return d


def test_builtin_loader_reads_a_fresh_tree(tmp_path):
    _write_problem(tmp_path / "level1", "01_relu")
    _write_problem(tmp_path / "level2", "03_other")
    loaded = tasks.load_builtin(str(tmp_path))
    assert [(t.task_id, t.level, t.problem_id, t.name) for t in loaded] == [
        ("builtin/level1/01_relu", 1, 1, "relu"), ("builtin/level2/03_other", 2, 3, "other")]


def test_builtin_loader_rejects_bad_layouts(tmp_path):
    with pytest.raises(TaskError, match="does not exist"):
        tasks.load_builtin(str(tmp_path / "nowhere"))
    with pytest.raises(TaskError, match="no level"):
        tasks.load_builtin(str(tmp_path))
    bad_name = _write_problem(tmp_path / "level1", "Relu")
    with pytest.raises(TaskError, match=re.escape(str(bad_name))):
        tasks.load_builtin(str(tmp_path))
    bad_name.rename(tmp_path / "level1" / "01_relu")
    (tmp_path / "level1" / "01_relu" / "solution_cpp.py").unlink()
    with pytest.raises(TaskError, match="missing solution_cpp.py"):
        tasks.load_builtin(str(tmp_path))
    (tmp_path / "level1" / "01_relu" / "solution_cpp.py").write_text("class Model: pass\n")
    with pytest.raises(TaskError, match="solution_cpp.py: solution is missing class ModelNew"):
        tasks.load_builtin(str(tmp_path))


SIZED_REFERENCE = GOOD_REFERENCE.replace("torch.randn(64, 64)", "torch.randn(ROWS, COLS)") + \
    "\nROWS, COLS = 8192, 4096  # cpu: 64, 32\nSCALE = 2.0\n"


def _run(src: str):
    namespace = {}
    exec(src, namespace)
    return namespace


def test_cpu_sizes_replace_the_annotated_values_on_the_cpu_only(tmp_path):
    _write_problem(tmp_path / "level1", "01_relu", SIZED_REFERENCE)
    cpu = tasks.load_builtin(str(tmp_path), device="cpu")[0].reference_src
    assert "ROWS, COLS = 64, 32  # the CPU size; on a GPU: 8192, 4096\n" in cpu
    assert (_run(cpu)["ROWS"], _run(cpu)["COLS"], _run(cpu)["SCALE"]) == (64, 32, 2.0)
    for device in (None, "cuda", "cuda:1"):  # the file as it is, on every other device
        assert tasks.load_builtin(str(tmp_path), device=device)[0].reference_src == SIZED_REFERENCE
    assert tasks.sized_for(cpu, "cpu", "again") == cpu  # applied once: nothing left to apply
    assert [t.reference_src for t in tasks.load_source("builtin", device="cpu")] == \
        [t.reference_src for t in tasks.load_builtin(device="cpu")]


@pytest.mark.parametrize("line", [
    "ROWS, COLS = 8192, 4096  # cpu: 64",            # fewer values than names
    "ROWS = 8192  # cpu: 64, 32",                    # more
    "ROWS = 8192  # cpu: 64 +",                      # not an expression
    "ROWS, COLS = 8192  # cpu: 64, 32",              # the GPU side does not match either
    "    ROWS = 8192  # cpu: 64",                    # not at the start of a line
    "x = torch.randn(8)  # cpu: torch.randn(2) # x",  # a second comment
    "# cpu: 64",                                     # no assignment
])
def test_malformed_cpu_size_is_a_task_error_naming_the_file_and_line(tmp_path, line):
    d = _write_problem(tmp_path / "level1", "01_relu", GOOD_REFERENCE + line + "\n")
    where = f"{d / 'reference.py'}:{GOOD_REFERENCE.count(chr(10)) + 1}"
    for device in ("cpu", "cuda"):  # refused wherever the task is loaded
        with pytest.raises(TaskError, match=re.escape(f"{where}: malformed cpu size annotation")):
            tasks.load_builtin(str(tmp_path), device=device)


def test_every_builtin_task_has_cpu_sizes():
    """Each built-in reference declares its CPU sizes, and on the CPU its inputs are smaller: the
    inputs' elements at most MAX_CPU_ELEMENTS (a C++ verdict's seconds are then the kernel's, not
    torch's loops over a GPU-size tensor)."""
    import torch
    max_cpu_elements = 1 << 23
    for gpu, cpu in zip(tasks.load_builtin(), tasks.load_builtin(device="cpu")):
        assert "# cpu:" in gpu.reference_src and "# cpu:" not in cpu.reference_src, gpu.task_id
        sizes = {}
        for name, t in (("gpu", gpu), ("cpu", cpu)):
            with torch.device("meta"):  # shapes only, no memory
                inputs = _run(t.reference_src)["get_inputs"]()
            sizes[name] = sum(x.numel() for x in inputs)
        assert sizes["cpu"] < sizes["gpu"] and sizes["cpu"] <= max_cpu_elements, (gpu.task_id, sizes)


def test_kernel_eval_cli_refuses_a_malformed_cpu_size_in_one_line(tmp_path):
    ref = tmp_path / "reference.py"
    ref.write_text(GOOD_REFERENCE + "ROWS = 8192  # cpu: 64, 32\n")
    cand = tmp_path / "candidate.py"
    cand.write_text(GOOD_SOLUTION)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "kernel_eval.py"), str(ref), str(cand), "--device", "cpu"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"kernel_eval.py: {ref}:{GOOD_REFERENCE.count(chr(10)) + 1}: malformed cpu size annotation "
        "'ROWS = 8192  # cpu: 64, 32': expected `NAME[, NAME...] = VALUES  # cpu: VALUES`, as many values "
        "as names on each side, at the start of a line"]


# ---------------------------------------------------------------- KernelBench checkout

def test_kernelbench_fixture_from_root_and_subfolder():
    from_root = tasks.load_kernelbench(FIXTURE)
    from_sub = tasks.load_kernelbench(os.path.join(FIXTURE, "KernelBench"))
    assert [t.task_id for t in from_root] == [t.task_id for t in from_sub] == [
        "kernelbench/level1/1_Square_matrix_multiplication_",
        "kernelbench/level1/19_ReLU",
        "kernelbench/level2/1_Conv2D_ReLU_BiasAdd",
    ]
    relu = from_root[1]
    assert (relu.name, relu.level, relu.problem_id, relu.solutions) == ("ReLU", 1, 19, {})
    assert relu.source_path.endswith(os.path.join("level1", "19_ReLU.py"))
    assert "torch.relu" in relu.reference_src
    assert [t.level for t in tasks.load_kernelbench(FIXTURE, levels=(3,))] == [3]


def test_kernelbench_missing_level_is_an_error(tmp_path):
    (tmp_path / "level1").mkdir()
    with pytest.raises(TaskError, match="level 2 directory does not exist"):
        tasks.load_kernelbench(str(tmp_path), levels=(1, 2))


MALFORMED = {
    "syntax": ("import torch\nclass Model(:\n", "syntax error at line 2"),
    "no_model": (GOOD_REFERENCE.replace("class Model", "class Other"), "missing class Model"),
    "no_get_inputs": (GOOD_REFERENCE.replace("def get_inputs", "def inputs"), "missing def get_inputs()"),
    "no_get_init_inputs": (GOOD_REFERENCE.replace("def get_init_inputs", "def init_inputs"),
                           "missing def get_init_inputs()"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_kernelbench_malformed_file_names_the_file(tmp_path, case):
    source, message = MALFORMED[case]
    level = tmp_path / "KernelBench" / "level1"
    level.mkdir(parents=True)
    (level / "1_Good.py").write_text(GOOD_REFERENCE)
    bad = level / "2_Bad.py"
    bad.write_text(source)
    with pytest.raises(TaskError) as info:
        tasks.load_kernelbench(str(tmp_path), levels=(1,))
    assert str(bad) in str(info.value) and message in str(info.value)


def test_kernelbench_validation_does_not_execute_the_file(tmp_path):
    level = tmp_path / "level1"
    level.mkdir()
    marker = tmp_path / "executed"
    (level / "1_Side_effect.py").write_text(f"open({str(marker)!r}, 'w')\n" + GOOD_REFERENCE)
    assert len(tasks.load_kernelbench(str(tmp_path), levels=(1,))) == 1
    assert not marker.exists()


@pytest.mark.parametrize("entry", ["relu.py", "19_ReLU.txt", "notes"])
def test_kernelbench_unexpected_entry_is_an_error(tmp_path, entry):
    level = tmp_path / "level1"
    level.mkdir()
    (level / "19_ReLU.py").write_text(GOOD_REFERENCE)
    (level / entry).write_text("")
    with pytest.raises(TaskError, match=re.escape(str(level / entry))):
        tasks.load_kernelbench(str(tmp_path), levels=(1,))


# ---------------------------------------------------------------- JSONL / parquet

def test_jsonl_round_trip(tmp_path):
    original = tasks.load_kernelbench(FIXTURE) + tasks.load_builtin()[:2]
    path = tmp_path / "tasks.jsonl"
    tasks.export_jsonl(original, str(path))
    loaded = tasks.load_jsonl(str(path))
    key = lambda t: (t.task_id, t.name, t.level, t.problem_id, t.reference_src, t.solutions)
    assert [key(t) for t in loaded] == [key(t) for t in original]
    first = json.loads(path.read_text().splitlines()[0])
    assert {"code", "name", "problem_id", "level"} <= set(first)
    assert [p.name for p in tmp_path.iterdir()] == ["tasks.jsonl"]   # no temp file left beside it


def test_load_source_reads_every_kind_and_filters_levels(tmp_path):
    builtin = tasks.load_source("builtin", levels=(2,))
    assert builtin and {t.level for t in builtin} == {2}
    path = tmp_path / "tasks.jsonl"
    tasks.export_jsonl(tasks.load_builtin(), str(path))
    assert [t.task_id for t in tasks.load_source(str(path), levels=(2,))] == [t.task_id for t in builtin]
    assert [t.task_id for t in tasks.load_source(FIXTURE)] == [t.task_id for t in tasks.load_kernelbench(FIXTURE)]
    with pytest.raises(TaskError, match="not 'builtin', a KernelBench checkout"):
        tasks.load_source(str(tmp_path / "missing"))


def test_jsonl_without_task_id_gets_a_kernelbench_id(tmp_path):
    path = tmp_path / "kb.jsonl"
    path.write_text(json.dumps({"code": GOOD_REFERENCE, "name": "ReLU", "problem_id": 19, "level": 1}) + "\n")
    (task,) = tasks.load_jsonl(str(path))
    assert task.task_id == "kernelbench/level1/19_ReLU" and task.solutions == {}


@pytest.mark.parametrize("line,message", [
    ('{"code": "x", "name": "a", "level": 1}', "no field 'problem_id'"),
    ("{not json", "not valid JSON"),
    (json.dumps({"code": "class Model: pass", "name": "a", "problem_id": 1, "level": 1}), "missing def get_inputs()"),
])
def test_jsonl_bad_record_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    good = json.dumps({"code": GOOD_REFERENCE, "name": "a", "problem_id": 1, "level": 1})
    path.write_text(good + "\n" + line + "\n")
    with pytest.raises(TaskError, match=re.escape(f"{path}:2") + ".*" + re.escape(message)):
        tasks.load_jsonl(str(path))


def test_parquet_round_trip_or_clear_error(tmp_path):
    original = tasks.load_builtin()[:2]
    path = str(tmp_path / "tasks.parquet")
    try:
        import pandas  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError:
        with pytest.raises(TaskError, match="pandas and pyarrow"):
            tasks.export_parquet(original, path)
        return
    tasks.export_parquet(original, path)
    assert [t.task_id for t in tasks.load_parquet(path)] == [t.task_id for t in original]


# ---------------------------------------------------------------- split

def _fake_tasks(counts):
    return [Task(f"kb/level{level}/{i}_p", f"p{i}", level, GOOD_REFERENCE, problem_id=i)
            for level, n in counts.items() for i in range(1, n + 1)]


def test_split_kevin_sizes_stratified_and_disjoint():
    pool = _fake_tasks({1: 100, 2: 100})
    train, heldout = tasks.split_tasks(pool, n_heldout=20, seed=0)
    assert (len(train), len(heldout)) == (180, 20)
    assert not {t.task_id for t in train} & {t.task_id for t in heldout}
    assert sum(t.level == 1 for t in heldout) == sum(t.level == 2 for t in heldout) == 10
    assert [t.task_id for t in train] == sorted(t.task_id for t in train)


def test_split_uneven_levels_follow_largest_remainder():
    train, heldout = tasks.split_tasks(_fake_tasks({1: 10, 2: 5}), n_heldout=4, seed=0)
    # exact shares 2.67 and 1.33: level 1 gets the spare one
    assert (sum(t.level == 1 for t in heldout), sum(t.level == 2 for t in heldout)) == (3, 1)
    assert len(train) == 11


def test_split_is_deterministic_order_free_and_seeded():
    pool = _fake_tasks({1: 30, 2: 30})
    _, a = tasks.split_tasks(pool, n_heldout=6, seed=0)
    _, b = tasks.split_tasks(list(reversed(pool)), n_heldout=6, seed=0)
    assert [t.task_id for t in a] == [t.task_id for t in b]
    held = {tuple(t.task_id for t in tasks.split_tasks(pool, n_heldout=6, seed=s)[1]) for s in range(5)}
    assert len(held) > 1


def test_split_does_not_depend_on_the_hash_seed():
    code = ("import sys; sys.path.insert(0, %r); import tasks; from tasks import Task;"
            "pool = [Task(f'kb/level{L}/{i}_p', 'p', L, '') for L in (1, 2) for i in range(40)];"
            "print([t.task_id for t in tasks.split_tasks(pool, n_heldout=8, seed=3)[1]])") % ROOT
    outputs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(outputs) == 1


def test_split_rejects_bad_requests():
    pool = _fake_tasks({1: 3})
    with pytest.raises(TaskError, match="n_heldout=4"):
        tasks.split_tasks(pool, n_heldout=4)
    with pytest.raises(TaskError, match="duplicate"):
        tasks.split_tasks(pool + pool[:1], n_heldout=1)



def test_draw_tasks_is_seeded_by_step_distinct_and_capped_by_the_pool():
    pool = _fake_tasks({1: 10})
    ids = lambda drawn: [t.task_id for t in drawn]
    first = tasks.draw_tasks(pool, 4, seed=0, step=3)
    assert ids(first) == ids(tasks.draw_tasks(pool, 4, seed=0, step=3))   # every rank, and a resumed run
    assert len(set(ids(first))) == 4
    assert len({tuple(ids(tasks.draw_tasks(pool, 4, seed=0, step=s))) for s in range(6)}) > 1
    assert sorted(ids(tasks.draw_tasks(pool, 50, seed=0, step=0))) == sorted(ids(pool))


def test_prioritized_draw_weighs_a_solved_task_by_the_floor_alone():
    """Two tasks, one always solved (weight 0 + 0.05), one never tried (weight 1 + 0.05): the
    solved one is drawn with probability 0.05 / 1.1 = 4.5% (uniform: 50%)."""
    pool = _fake_tasks({1: 2})
    solved = pool[0].task_id
    success = {solved: (10, 10)}
    for sampler, expected in [("prioritized", 0.05 / 1.1), ("uniform", 0.5)]:
        hits = sum(tasks.draw_tasks(pool, 1, seed=0, step=s, sampler=sampler, success=success,
                                    priority_floor=0.05)[0].task_id == solved for s in range(2000))
        sd = (2000 * expected * (1 - expected)) ** 0.5
        assert abs(hits - 2000 * expected) < 5 * sd, (sampler, hits)
    with pytest.raises(ValueError, match="sampler must be one of .*'bogus'"):
        tasks.draw_tasks(pool, 1, seed=0, step=0, sampler="bogus")


# ---------------------------------------------------------------- checker: the reference-quality checks
# No compiler and no harness: these run the task's reference (and construct ModelNew) in this process.

TOLERANCES = {"float32": (1e-2, 1e-2)}  # kernel_eval's default for fp32


def findings(reference=GOOD_REFERENCE, solution=None):
    return tasks.reference_findings(_task(reference=reference), "cpu", TOLERANCES, seed=0, solution_src=solution)


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
    assert tasks.reference_findings(_task(reference=reference), "cpu", strict) == []


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
    """Runs each built-in reference at its CPU size (no build): what `tasks.py check --device cpu` finds, minus
    the harness. The GPU sizes are checked on a GPU (`tasks.py check --device cuda`)."""
    unfair = {t.task_id: f for t in tasks.load_builtin(device="cpu")
              if (f := tasks.reference_findings(t, "cpu", TOLERANCES, solution_src=t.solutions["cpp"]))}
    assert unfair == {}


# ---------------------------------------------------------------- checker: the command line

def check_cli(*args, cwd=ROOT, timeout=900):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tasks.py"), "check", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout)


def one_line_error(proc, message):
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [message]


def test_check_bad_inputs_are_one_line_errors(tmp_path):
    one_line_error(check_cli("--root", str(tmp_path / "nowhere")),
                   f"tasks.py check: {tmp_path / 'nowhere'}: task directory does not exist")
    _write_problem(tmp_path / "level1", "01_relu")
    (tmp_path / "level1" / "01_relu" / "solution_cpp.py").unlink()
    one_line_error(check_cli("--root", str(tmp_path)), f"tasks.py check: {tmp_path / 'level1' / '01_relu'}: "
                                                       "missing solution_cpp.py")
    one_line_error(check_cli("--kernelbench", str(tmp_path / "nowhere")),
                   f"tasks.py check: {tmp_path / 'nowhere'}: KernelBench directory does not exist")
    not_a_checkout = tmp_path / "empty"
    not_a_checkout.mkdir()
    one_line_error(check_cli("--kernelbench", str(not_a_checkout)),
                   f"tasks.py check: {not_a_checkout / 'level1'}: level 1 directory does not exist")
    one_line_error(check_cli("--only", "no-such-task"), "tasks.py check: no task id contains 'no-such-task'")


def test_check_runs_a_kernelbench_checkouts_references_alone(tmp_path):
    out = tmp_path / "check.json"
    proc = check_cli("--kernelbench", FIXTURE, "--levels", "1,2", "--device", "cpu", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    assert [(r["task_id"], r["status"], r["findings"], r["ok"]) for r in results] == [
        (t.task_id, "no solution", [], True) for t in tasks.load_kernelbench(FIXTURE)]
    assert proc.stdout.splitlines()[-1].startswith(f"{len(results)}/{len(results)} problems ok on cpu")


def test_check_loads_tasks_without_the_harness():
    """tasks.py imports kernel_eval inside the checker only: the loaders work without it."""
    code = ("import sys; sys.modules['kernel_eval'] = None; sys.path.insert(0, %r); import tasks;"
            "print(len(tasks.load_builtin()) == len(tasks.load_source('builtin')) > 0)") % ROOT
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "True\n"


def test_check_says_when_the_harness_could_not_judge(tmp_path, monkeypatch, capsys):
    """A harness_error is no verdict: neither ok nor a failed solution, and the exit is non-zero."""
    kernel_eval = pytest.importorskip("kernel_eval")

    def cannot_judge(pairs, device, config, progress):
        return [kernel_eval.EvalResult(status="harness_error", message="out of memory on the device")] * len(pairs)

    monkeypatch.setattr(kernel_eval, "evaluate_batch", cannot_judge)
    _write_problem(tmp_path / "level1", "01_relu")
    out = tmp_path / "check.json"
    assert tasks.main(["check", "--root", str(tmp_path), "--device", "cpu", "--json", str(out)]) == 1
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
