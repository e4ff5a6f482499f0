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
# computes; the format rules (a kernel, no torch compute) are rewards.py's business.
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
    level1 = [t for t in loaded if t.level == 1]
    assert len(level1) == 12
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
    rewards = pytest.importorskip("rewards")
    rejected = [(t.task_id, lang, rewards.check_format(src, language=lang))
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
    assert not any(p.name.startswith(".tmp_") for p in tmp_path.iterdir())


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


# ---------------------------------------------------------------- checker, no compiler

def test_checker_passes_a_correct_solution():
    result = tasks.check_task(_task(), device="cpu", trials=2)
    assert result.ok, result.verdict
    assert result.max_abs_err == 0.0 and result.ref_ms > 0 and result.solution_ms > 0


def test_checker_fails_a_wrong_solution():
    wrong = GOOD_SOLUTION.replace("x.clamp_min(0)", "x.clamp_min(0) * 1.05")
    result = tasks.check_task(_task(solution=wrong), device="cpu", trials=2)
    assert not result.ok and "mismatch" in result.verdict and result.max_abs_err > 1e-2


def test_checker_fails_a_solution_that_skips_the_last_block():
    skips_tail = GOOD_SOLUTION.replace("return x.clamp_min(0)",
                                       "y = x.clamp_min(0)\n        y.view(-1)[-64:] = 0\n        return y")
    result = tasks.check_task(_task(solution=skips_tail), device="cpu", trials=2)
    assert not result.ok and "mismatch" in result.verdict


def test_checker_fails_a_solution_that_writes_its_input():
    in_place = GOOD_SOLUTION.replace("x.clamp_min(0)", "x.clamp_min_(0)")
    result = tasks.check_task(_task(solution=in_place), device="cpu", trials=2)
    assert not result.ok and "modified its inputs" in result.verdict


@pytest.mark.parametrize("forward,reason", [
    ("torch.ones_like(x) * 3.0", "a constant would pass"),
    ("torch.relu(x) * 1e-4", "a constant would pass"),
    ("x * float('nan')", "non-finite"),
    ("x.sum()", "1 element"),
    ("x[:1].expand_as(x) * 1.0", "zeroing the last"),
])
def test_checker_rejects_degenerate_references(forward, reason):
    reference = GOOD_REFERENCE.replace("torch.relu(x)", forward)
    result = tasks.check_task(_task(reference=reference), device="cpu", trials=1)
    assert not result.ok and result.verdict.startswith("degenerate reference") and reason in result.verdict


def test_checker_rejects_parameters_that_differ_from_the_reference():
    reference = '''
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
    solution = '''
import math
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, n))
        self.bias = nn.Parameter(torch.empty(n))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        nn.init.uniform_(self.bias, -1 / math.sqrt(n), 1 / math.sqrt(n))

    def forward(self, x):
        return x @ self.weight.t() + self.bias
'''
    assert tasks.check_task(_task(reference, solution), device="cpu", trials=1).ok
    swapped = solution.replace("        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))\n", "")
    swapped = swapped.replace("math.sqrt(n))\n", "math.sqrt(n))\n        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))\n")
    result = tasks.check_task(_task(reference, swapped), device="cpu", trials=1)
    assert not result.ok and "parameter 0 differs" in result.verdict


def test_fast_load_inline_rewrites_build_arguments(tmp_path, monkeypatch):
    from torch.utils import cpp_extension

    calls = []

    def fake_load_inline(name, cpp_sources, cuda_sources=None, functions=None, extra_cflags=None,
                         build_directory=None, use_pch=False, is_python_module=True, verbose=False):
        calls.append(dict(name=name, cflags=extra_cflags, build_directory=build_directory, use_pch=use_pch))
        return name

    monkeypatch.setattr(cpp_extension, "load_inline", fake_load_inline)
    pch_requests = []
    monkeypatch.setattr(tasks, "_private_pch", lambda root, cflags, include_paths: pch_requests.append(
        (root, list(cflags))) or f"{root}/pch/{cflags[0]}/torch_extension.h")
    with tasks.fast_load_inline("cpu", str(tmp_path)):
        cpp_extension.load_inline(name="a", cpp_sources="int f();")
        cpp_extension.load_inline(name="a", cpp_sources="int g();")
        cpp_extension.load_inline(name="a", cpp_sources="int f();", extra_cflags=["-O2"])
        cpp_extension.load_inline(name="a", cpp_sources="int f();")
    with tasks.fast_load_inline("cuda", str(tmp_path)):
        cpp_extension.load_inline(name="a", cpp_sources="int f();", cuda_sources="__global__ void k() {}")
    assert cpp_extension.load_inline is fake_load_inline
    f, g, o2, f_again, cuda = calls
    # C++ on CPU includes a precompiled header built for exactly its flags; CUDA builds do not
    assert f["cflags"] == ["-O3", "-include", f"{tmp_path}/pch/-O3/torch_extension.h"]
    assert o2["cflags"] == ["-O2", "-include", f"{tmp_path}/pch/-O2/torch_extension.h"]
    assert cuda["cflags"] == ["-O3"] and not any(c["use_pch"] for c in calls)
    assert pch_requests[0] == (str(tmp_path), ["-O3"]) and len(pch_requests) == 4
    dirs = [c["build_directory"] for c in calls]
    assert all(d.startswith(os.path.join(str(tmp_path), "builds", "a_")) and os.path.isdir(d) for d in dirs)
    assert f_again["build_directory"] == f["build_directory"] and len(set(dirs)) == 4


def test_check_all_turns_failures_into_verdicts_and_restores_load_inline():
    from torch.utils import cpp_extension

    original = cpp_extension.load_inline
    broken = "import torch\nraise RuntimeError('build exploded')\n"
    results = tasks.check_all([_task(task_id="t/level1/01_good"), _task(solution=broken, task_id="t/level1/02_bad"),
                               _task(task_id="t/level1/03_good")], device="cpu", trials=1)
    assert [r.ok for r in results] == [True, False, True]
    assert results[1].verdict == "error: RuntimeError: build exploded"
    assert cpp_extension.load_inline is original


def test_cli_reports_a_missing_filter():
    assert tasks.main(["check", "--only", "no-such-task"]) == 2


# ---------------------------------------------------------------- checker, real builds

@pytest.mark.slow
def test_checker_passes_every_builtin_problem_on_cpu(tmp_path):
    """The CI main job: every built-in reference is fair and its C++ solution matches it."""
    out = tmp_path / "check.json"
    times = tmp_path / "times.json"
    code = tasks.main(["check", "--device", "cpu", "--trials", "2", "--json", str(out),
                       "--write-times", str(times)])
    results = json.loads(out.read_text())
    failed = [(r["task_id"], r["verdict"]) for r in results if not r["ok"]]
    assert code == 0 and not failed, failed
    assert {r["task_id"] for r in results} == {t.task_id for t in tasks.load_builtin()}
    recorded = json.loads(times.read_text())
    assert set(recorded["ref_ms"]) == {r["task_id"] for r in results}
    assert all(v > 0 for v in recorded["ref_ms"].values()) and recorded["device"].startswith("cpu")


@pytest.mark.gpu
@pytest.mark.slow
def test_checker_passes_every_builtin_problem_on_cuda(tmp_path):
    out = tmp_path / "check.json"
    code = tasks.main(["check", "--device", "cuda", "--trials", "3", "--json", str(out)])
    failed = [(r["task_id"], r["verdict"]) for r in json.loads(out.read_text()) if not r["ok"]]
    assert code == 0 and not failed, failed
