"""Tests for tasks.py: loaders, validation, CPU sizes, JSONL round trip, split and sampling.
The task checker's tests are in test_task_check.py."""
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


# ---------------------------------------------------------------- place among the modules

def test_tasks_load_without_the_harness_or_the_checker():
    """tasks.py sits below the harness and the checker (issue 64: no import circle): its loaders work
    with kernel_eval, kernel_verdict and task_check unimportable."""
    code = ("import sys; sys.path.insert(0, %r)\n"
            "for m in ('kernel_eval', 'kernel_verdict', 'task_check'): sys.modules[m] = None\n"
            "import tasks; "
            "print(len(tasks.load_builtin()) == len(tasks.load_source('builtin')) > 0)") % ROOT
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "True\n"
