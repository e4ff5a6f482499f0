"""Tasks: the programs the policy learns to make faster, where they come from, and a checker.

A task is a KernelBench-format PyTorch program (Ouyang et al. 2025, "KernelBench: Can LLMs
Write Efficient GPU Kernels?"): a `class Model(nn.Module)` whose `forward` is the reference
computation, `get_inputs()` returning the forward arguments and `get_init_inputs()` returning
the constructor arguments. The policy answers with a `class ModelNew` that computes the same
thing with its own kernel; the reward is correctness and speedup over `Model`.

Three sources give the same `Task` record:
  - the built-in set `tasks/level{L}/{NN}_{name}/{reference,solution_cuda,solution_cpp}.py`,
    written for this project, each with a known-good CUDA and C++ solution;
  - a KernelBench checkout (`KernelBench/level1/19_ReLU.py`);
  - a JSONL (or parquet) export with the fields `code`, `name`, `problem_id`, `level`.
Files are validated with `ast` (syntax, `Model`, `get_inputs`, `get_init_inputs`), never
imported, and a loader never skips a file silently: a malformed file raises `TaskError`.

`split_tasks` gives the deterministic train / held-out split; Kevin-32B trains on 180 of the
200 KernelBench level-1 and level-2 problems and holds out 20 (`n_heldout=20`).

The checker proves each built-in problem is a fair benchmark: the reference runs and is timed,
its output is not degenerate (finite, spread well above the tolerance, not
zeros, and visibly changed when the tail of an input is zeroed, so a kernel that skips its
last block fails), and the stored solution matches it on fresh random inputs:

    python tasks.py check --device cpu                  # C++ solutions, the CI main job
    python tasks.py check --device cuda --write-times tasks/reference_times.json
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import inspect
import json
import math
import os
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

LANGUAGES = ("cuda", "cpp")
LANGUAGE_FOR_DEVICE = {"cuda": "cuda", "cpu": "cpp"}
BUILTIN_DIR = re.compile(r"^(\d+)_([a-z0-9_]+)$")
KERNELBENCH_FILE = re.compile(r"^(\d+)_(.+)\.py$")
LEVEL_DIR = re.compile(r"^level(\d+)$")


class TaskError(ValueError):
    """A task file or record is malformed; the message names the file and what is wrong."""


@dataclass
class Task:
    task_id: str
    name: str
    level: int
    reference_src: str
    solutions: dict[str, str] = field(default_factory=dict)
    source_path: str | None = None
    problem_id: int | None = None


# ---------------------------------------------------------------- validation (ast only)

def _top_level_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    classes, functions = set(), set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            classes.add(node.name)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            functions.add(node.name)
        elif isinstance(node, ast.Assign):  # e.g. `get_inputs = make_inputs`
            functions.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return classes, functions


def _parse(src: str, where: str) -> ast.Module:
    try:
        return ast.parse(src, filename=where)
    except SyntaxError as e:
        raise TaskError(f"{where}: syntax error at line {e.lineno}: {e.msg}") from e


def validate_reference(src: str, where: str) -> None:
    """Raise TaskError unless `src` parses and defines Model, get_inputs and get_init_inputs."""
    classes, functions = _top_level_names(_parse(src, where))
    missing = [] if "Model" in classes else ["class Model"]
    missing += [f"def {f}()" for f in ("get_inputs", "get_init_inputs") if f not in functions]
    if missing:
        raise TaskError(f"{where}: not a KernelBench-format task, missing {', '.join(missing)}")


def validate_solution(src: str, where: str) -> None:
    """Raise TaskError unless `src` parses and defines class ModelNew."""
    classes, _ = _top_level_names(_parse(src, where))
    if "ModelNew" not in classes:
        raise TaskError(f"{where}: solution is missing class ModelNew")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


# ---------------------------------------------------------------- loaders

def _resolve_root(root: str) -> str:
    """A relative root is looked up from the working directory, then next to this file."""
    if os.path.isdir(root) or os.path.isabs(root):
        return root
    beside_module = os.path.join(os.path.dirname(os.path.abspath(__file__)), root)
    return beside_module if os.path.isdir(beside_module) else root


def _level_dirs(root: str, levels=None) -> list[tuple[int, str]]:
    """(level, path) for `root/level{L}`; every requested level must exist."""
    if not os.path.isdir(root):
        raise TaskError(f"{root}: task directory does not exist")
    if levels is not None:
        found = [(int(L), os.path.join(root, f"level{int(L)}")) for L in levels]
        for L, path in found:
            if not os.path.isdir(path):
                raise TaskError(f"{path}: level {L} directory does not exist")
        return found
    found = sorted((int(m.group(1)), os.path.join(root, d)) for d in os.listdir(root)
                   if (m := LEVEL_DIR.match(d)) and os.path.isdir(os.path.join(root, d)))
    if not found:
        raise TaskError(f"{root}: no level*/ directories")
    return found


def load_builtin(root: str = "tasks", levels=None) -> list[Task]:
    """The built-in set: `root/level{L}/{NN}_{snake_name}/` with reference and two solutions."""
    root = _resolve_root(root)
    tasks = []
    for level, level_dir in _level_dirs(root, levels):
        for entry in sorted(os.listdir(level_dir)):
            if entry == "__pycache__":
                continue
            path = os.path.join(level_dir, entry)
            m = BUILTIN_DIR.match(entry)
            if not m or not os.path.isdir(path):
                raise TaskError(f"{path}: expected a problem directory named NN_snake_name")
            files = {"reference": "reference.py", "cuda": "solution_cuda.py", "cpp": "solution_cpp.py"}
            for fname in files.values():
                if not os.path.isfile(os.path.join(path, fname)):
                    raise TaskError(f"{path}: missing {fname}")
            ref_path = os.path.join(path, files["reference"])
            reference_src = _read(ref_path)
            validate_reference(reference_src, ref_path)
            solutions = {}
            for lang in LANGUAGES:
                sol_path = os.path.join(path, files[lang])
                solutions[lang] = _read(sol_path)
                validate_solution(solutions[lang], sol_path)
            tasks.append(Task(task_id=f"builtin/level{level}/{entry}", name=m.group(2), level=level,
                              reference_src=reference_src, solutions=solutions,
                              source_path=ref_path, problem_id=int(m.group(1))))
    return tasks


def load_kernelbench(path: str, levels=(1, 2)) -> list[Task]:
    """A KernelBench checkout: the repository root or its `KernelBench/` folder."""
    if not os.path.isdir(path):
        raise TaskError(f"{path}: KernelBench directory does not exist")
    inner = os.path.join(path, "KernelBench")
    root = inner if os.path.isdir(inner) else path
    tasks = []
    for level, level_dir in _level_dirs(root, levels):
        for entry in sorted(os.listdir(level_dir)):
            if entry == "__pycache__":
                continue
            file_path = os.path.join(level_dir, entry)
            m = KERNELBENCH_FILE.match(entry)
            if not m or not os.path.isfile(file_path):
                raise TaskError(f"{file_path}: expected a problem file named N_Name.py")
            src = _read(file_path)
            validate_reference(src, file_path)
            problem_id, name = int(m.group(1)), m.group(2)
            tasks.append(Task(task_id=f"kernelbench/level{level}/{problem_id}_{name}", name=name,
                              level=level, reference_src=src, source_path=file_path,
                              problem_id=problem_id))
    tasks.sort(key=lambda t: (t.level, t.problem_id))
    return tasks


def _task_from_record(record: dict, where: str) -> Task:
    for key in ("code", "name", "problem_id", "level"):
        if key not in record:
            raise TaskError(f"{where}: record has no field '{key}'")
    validate_reference(record["code"], where)
    solutions = record.get("solutions") or {}
    for lang, src in solutions.items():
        if lang not in LANGUAGES:
            raise TaskError(f"{where}: unknown solution language '{lang}' (expected {LANGUAGES})")
        validate_solution(src, f"{where} (solution {lang})")
    level, problem_id = int(record["level"]), int(record["problem_id"])
    task_id = record.get("task_id") or f"kernelbench/level{level}/{problem_id}_{record['name']}"
    return Task(task_id=task_id, name=record["name"], level=level, reference_src=record["code"],
                solutions=dict(solutions), source_path=where, problem_id=problem_id)


def _record(task: Task) -> dict:
    record = {"task_id": task.task_id, "code": task.reference_src, "name": task.name,
              "problem_id": task.problem_id, "level": task.level}
    if task.solutions:
        record["solutions"] = task.solutions
    return record


def load_jsonl(path: str) -> list[Task]:
    """One task per line: {"code", "name", "problem_id", "level"[, "task_id", "solutions"]}."""
    if not os.path.isfile(path):
        raise TaskError(f"{path}: file does not exist")
    tasks = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise TaskError(f"{where}: not valid JSON ({e.msg})") from e
            tasks.append(_task_from_record(record, where))
    return tasks


def _atomic_write(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp_", suffix=os.path.basename(path))
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def export_jsonl(tasks: list[Task], path: str) -> None:
    _atomic_write(path, "".join(json.dumps(_record(t)) + "\n" for t in tasks))


def _pandas():
    try:
        import pandas
    except ImportError as e:
        raise TaskError("parquet needs pandas and pyarrow (pip install pandas pyarrow); "
                        "JSONL works without them") from e
    return pandas


def load_parquet(path: str) -> list[Task]:
    """The same fields as JSONL in a parquet table (the layout of the KernelBench dataset)."""
    if not os.path.isfile(path):
        raise TaskError(f"{path}: file does not exist")
    frame = _pandas().read_parquet(path)
    tasks = []
    for row, record in enumerate(frame.to_dict("records")):
        record = {k: v for k, v in record.items() if v is not None and not (isinstance(v, float) and math.isnan(v))}
        tasks.append(_task_from_record(record, f"{path}:row {row}"))
    return tasks


def export_parquet(tasks: list[Task], path: str) -> None:
    frame = _pandas().DataFrame([{**_record(t), "solutions": json.dumps(t.solutions)} for t in tasks])
    tmp = f"{path}.tmp"
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def load_source(source: str, levels=None) -> list[Task]:
    """Tasks from a `--tasks` argument: "builtin", a .jsonl or .parquet export, or a KernelBench
    checkout (levels 1 and 2 unless `levels` says otherwise); `levels` filters every source."""
    if source == "builtin":
        return load_builtin(levels=levels)
    if source.endswith((".jsonl", ".parquet")):
        found = load_jsonl(source) if source.endswith(".jsonl") else load_parquet(source)
        return [t for t in found if levels is None or t.level in levels]
    if os.path.isdir(source):
        return load_kernelbench(source, levels=levels or (1, 2))
    raise TaskError(f"tasks: {source!r} is not 'builtin', a KernelBench checkout, a .jsonl or a .parquet")


# ---------------------------------------------------------------- split

def split_tasks(tasks: list[Task], n_heldout: int = 20, seed: int = 0,
                stratify: bool = True) -> tuple[list[Task], list[Task]]:
    """Deterministic (train, heldout), both sorted by task_id.

    Tasks are sorted by task_id, then shuffled by `random.Random` seeded with a string, which
    hashes with SHA-512 and so does not depend on PYTHONHASHSEED. With `stratify`, each level
    holds out its share of `n_heldout` (largest remainder), e.g. 10 + 10 of KernelBench L1+L2.
    """
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise TaskError("split_tasks: duplicate task_id in the task list")
    if not 0 <= n_heldout <= len(tasks):
        raise TaskError(f"split_tasks: n_heldout={n_heldout} but there are {len(tasks)} tasks")
    ordered = sorted(tasks, key=lambda t: t.task_id)
    groups = {}
    for t in ordered:
        groups.setdefault(t.level if stratify else 0, []).append(t)
    exact = {g: n_heldout * len(members) / len(ordered) for g, members in groups.items()}
    quota = {g: int(x) for g, x in exact.items()}
    by_remainder = sorted(groups, key=lambda g: (-(exact[g] - quota[g]), g))
    for g in by_remainder[: n_heldout - sum(quota.values())]:
        quota[g] += 1
    heldout = []
    for g, members in groups.items():
        shuffled = list(members)
        random.Random(f"split:{seed}:{g}").shuffle(shuffled)
        heldout += shuffled[: quota[g]]
    held_ids = {t.task_id for t in heldout}
    return ([t for t in ordered if t.task_id not in held_ids],
            sorted(heldout, key=lambda t: t.task_id))


SAMPLERS = ("uniform", "prioritized")


def draw_tasks(pool: list[Task], count: int, *, seed: int, step: int, sampler: str = "uniform",
               success: dict | None = None, priority_floor: float = 0.05) -> list[Task]:
    """`count` distinct tasks for training step `step`, without replacement.

    Seeded by (seed, step), so every rank of a run draws the same tasks and a resumed run redraws
    them. "uniform": each remaining task equally likely. "prioritized" (Kimi k1.5 §2.3.4,
    curriculum sampling): task i weighs 1 - success_i + priority_floor, success_i = correct /
    attempted from `success` {task_id: (correct, attempted)} (0 for a task never tried), so tasks
    the policy already solves are drawn less often, yet never with probability 0 (the floor)."""
    if sampler not in SAMPLERS:
        raise ValueError(f"draw_tasks: sampler must be one of {SAMPLERS}, got {sampler!r}")
    rng = random.Random(f"draw:{seed}:{step}")
    pool, success, chosen = list(pool), success or {}, []
    for _ in range(min(count, len(pool))):
        if sampler == "prioritized":
            rates = [success.get(t.task_id, (0, 0)) for t in pool]
            weights = [1.0 - done / max(1, tried) + priority_floor for done, tried in rates]
            chosen.append(pool.pop(rng.choices(range(len(pool)), weights)[0]))
        else:
            chosen.append(pool.pop(rng.randrange(len(pool))))
    return chosen


# ---------------------------------------------------------------- the checker

def cache_root() -> str:
    return os.environ.get("KERNEL_RL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "kernel-rl")


BUILT_MARKER = ".kernel_rl_built"


def _load_built(name: str, build_directory: str):
    """Import a finished build straight from its directory, or None if there is none.

    The directory name already hashes every build input, so a finished build is valid as it
    is; going through load_inline again would re-check torch's shared precompiled header,
    which any other process building with different flags may have just rewritten.
    """
    import importlib.util
    library = os.path.join(build_directory, f"{name}.so")  # torch's name for the build output
    if not (os.path.isfile(os.path.join(build_directory, BUILT_MARKER)) and os.path.isfile(library)):
        return None
    spec = importlib.util.spec_from_file_location(name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _private_pch(root: str, cflags: list[str], include_paths) -> str:
    """A precompiled torch/extension.h for these flags, in our cache; returns the header to -include.

    Same idea as load_inline(use_pch=True), but torch keeps one .gch inside its install and
    rebuilds it (about a minute) whenever any process on the machine asks for other flags;
    a header per flag set never thrashes. A .gch whose flags do not match is ignored by
    gcc, so a mismatch costs time, never correctness.
    """
    import subprocess
    import sysconfig

    import torch
    torch_include = os.path.join(os.path.dirname(torch.__file__), "include")
    compiler = os.environ.get("CXX", "c++")
    flags = (["-I", torch_include, "-I", sysconfig.get_path("include"),
              "-I", os.path.join(torch_include, "torch", "csrc", "api", "include")]
             + [f"-I{p}" for p in include_paths or []]
             + list(cflags) + ["-DTORCH_API_INCLUDE_EXTENSION_H", "-std=c++20", "-fPIC"])
    key = hashlib.sha256(json.dumps([compiler, torch.__version__, flags]).encode()).hexdigest()[:16]
    directory = os.path.join(root, "pch", key)
    header = os.path.join(directory, "torch_extension.h")
    if not os.path.isfile(header + ".gch"):
        os.makedirs(directory, exist_ok=True)
        with open(header, "w") as f:
            f.write("#include <torch/extension.h>\n")
        tmp = f"{header}.gch.{os.getpid()}.tmp"
        subprocess.run([compiler, "-x", "c++-header", header, "-o", tmp] + flags, check=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        os.replace(tmp, header + ".gch")  # concurrent builders each write whole files
    return header


_patch_lock = threading.Lock()
_patch = {"depth": 0, "original": None}


@contextlib.contextmanager
def fast_load_inline(device: str, root: str | None = None):
    """Patch `torch.utils.cpp_extension.load_inline` while a solution is exec'd.

    Each distinct source gets its own build directory keyed by a hash of everything that
    changes the binary, so a rerun loads in milliseconds and two sources never share one;
    C++ gets -O3 when the source names no -O level (load_inline's default is -O0, which makes
    CPU speedups meaningless); C++-only builds on CPU include a precompiled torch header
    (`_private_pch`) unless the source asks for torch's own `use_pch`.
    Re-entrant across threads: the outermost entry installs the patch (with its device and
    root), the last exit restores the original.
    """
    from torch.utils import cpp_extension

    with _patch_lock:
        if _patch["depth"] == 0:
            _patch["original"] = cpp_extension.load_inline
            cpp_extension.load_inline = _fast_wrapper(_patch["original"], device, root)
        _patch["depth"] += 1
    try:
        yield
    finally:
        with _patch_lock:
            _patch["depth"] -= 1
            if _patch["depth"] == 0:
                cpp_extension.load_inline = _patch["original"]


def _fast_wrapper(original, device: str, root: str | None):
    import torch

    signature = inspect.signature(original)
    builds = os.path.join(root or cache_root(), "builds")

    def load_inline(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        cflags = list(a.get("extra_cflags") or [])
        if not any(flag.startswith("-O") for flag in cflags):
            cflags.append("-O3")
        a["extra_cflags"] = cflags
        if device == "cpu" and not a.get("cuda_sources") and not a.get("use_pch"):
            header = _private_pch(root or cache_root(), cflags, a.get("extra_include_paths"))
            cflags += ["-include", header]
        if a.get("build_directory") is None:
            key_fields = {k: v for k, v in a.items() if k not in ("verbose", "build_directory")}
            key_fields["torch"] = torch.__version__
            if a.get("cuda_sources"):  # the binary depends on the GPU architecture too
                key_fields["arch"] = os.environ.get("TORCH_CUDA_ARCH_LIST") or (
                    torch.cuda.get_device_capability() if torch.cuda.is_available() else None)
            digest = hashlib.sha256(json.dumps(key_fields, sort_keys=True, default=str).encode()).hexdigest()
            a["build_directory"] = os.path.join(builds, f"{a['name']}_{digest[:16]}")
            os.makedirs(a["build_directory"], exist_ok=True)
            built = _load_built(a["name"], a["build_directory"]) if a["is_python_module"] else None
            if built is not None:
                return built
        module = original(**a)
        if a["is_python_module"]:
            open(os.path.join(a["build_directory"], BUILT_MARKER), "w").close()
        return module

    return load_inline


@dataclass
class CheckResult:
    task_id: str
    level: int
    ok: bool
    verdict: str              # "ok" or the first reason it failed
    ref_ms: float | None = None
    solution_ms: float | None = None
    max_abs_err: float | None = None
    build_s: float | None = None
    output_std: float | None = None


def _exec(src: str, where: str) -> dict:
    namespace = {"__name__": "__task__", "__file__": where}
    exec(compile(src, where, "exec"), namespace)
    return namespace


def _outputs(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _make_inputs(namespace: dict, seed: int, device: str) -> list:
    import torch
    torch.manual_seed(seed)
    return [x.to(device) if isinstance(x, torch.Tensor) else x for x in namespace["get_inputs"]()]


def _clone(inputs: list) -> list:
    import torch
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


class _Timer:
    """Wall time of one call: CUDA events around a device-wide sync on cuda (so work on any
    stream is counted), perf_counter on cpu. On cuda the L2 cache is flushed first."""

    def __init__(self, device: str):
        import torch
        self.device = device
        self.flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=device) if device == "cuda" else None

    def __call__(self, fn, *args):
        import torch
        if self.device != "cuda":
            start = time.perf_counter()
            out = fn(*args)
            return out, (time.perf_counter() - start) * 1e3
        self.flush.zero_()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn(*args)
        torch.cuda.synchronize()
        end.record()
        end.synchronize()
        return out, start.elapsed_time(end)


def degeneracy_reason(out, atol: float, rtol: float, min_std_ratio: float) -> str | None:
    """Why a reference output would let a wrong kernel pass, or None if it is fine."""
    import torch
    for i, y in enumerate(_outputs(out)):
        name = f"output {i}"
        if not isinstance(y, torch.Tensor) or not y.is_floating_point():
            return f"{name} is not a floating-point tensor"
        if y.numel() < 2:
            return f"{name} has {y.numel()} element(s)"
        if not torch.isfinite(y).all():
            return f"{name} has non-finite values"
        std = y.float().std().item()
        if std < min_std_ratio * atol:
            return f"{name} std {std:.3g} < {min_std_ratio:g} x atol; a constant would pass"
        if torch.allclose(y, torch.zeros_like(y), atol=atol, rtol=rtol):
            return f"{name} is close to zeros"
    return None


def _outputs_close(a, b, atol: float, rtol: float) -> bool:
    return all(x.shape == y.shape and torch_allclose(x, y, atol, rtol)
               for x, y in zip(_outputs(a), _outputs(b)))


def torch_allclose(x, y, atol: float, rtol: float) -> bool:
    import torch
    return bool(torch.allclose(x.float(), y.float(), atol=atol, rtol=rtol))


def partial_computation_reason(model, inputs: list, out, atol: float, rtol: float,
                               tail_fraction: float) -> str | None:
    """Zero the last `tail_fraction` of each floating input: the output must change clearly,
    else a kernel that skips its last block (or ignores that input) would pass."""
    import torch
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() < 2:
            continue
        perturbed = _clone(inputs)
        flat = perturbed[i].view(-1)
        flat[-max(1, int(flat.numel() * tail_fraction)):] = 0
        if _outputs_close(model(*perturbed), out, atol, rtol):
            return f"zeroing the last {tail_fraction:.0%} of input {i} leaves the output unchanged"
    return None


def _parameter_mismatch(reference, candidate) -> str | None:
    import torch
    ref = list(reference.parameters()) + list(reference.buffers())
    new = list(candidate.parameters()) + list(candidate.buffers())
    if len(ref) != len(new):
        return f"ModelNew has {len(new)} parameters/buffers, Model has {len(ref)}"
    for i, (a, b) in enumerate(zip(ref, new)):
        if a.shape != b.shape or not torch.equal(a, b):
            return (f"parameter {i} differs from Model's under the same seed "
                    f"({tuple(a.shape)} vs {tuple(b.shape)}); create them in the same order with the same init")
    return None


def _solution_path(task: Task, language: str) -> str:
    return os.path.join(os.path.dirname(task.source_path or task.task_id), f"solution_{language}.py")


def build_solution(task: Task, device: str, cache_dir: str | None = None) -> tuple[dict, float]:
    """Exec the solution for `device` with fast builds: (its namespace, seconds taken)."""
    language = LANGUAGE_FOR_DEVICE[device]
    if language not in task.solutions:
        raise TaskError(f"{task.task_id}: no {language} solution")
    start = time.perf_counter()
    with fast_load_inline(device, cache_dir):
        namespace = _exec(task.solutions[language], _solution_path(task, language))
    return namespace, time.perf_counter() - start


def check_task(task: Task, device: str = "cpu", trials: int = 3, atol: float = 1e-2,
               rtol: float = 1e-2, seed: int = 0, min_std_ratio: float = 10.0,
               tail_fraction: float = 1 / 16, cache_dir: str | None = None,
               built: tuple[dict, float] | None = None) -> CheckResult:
    """Check one task's reference and its solution for `device` (see the module docstring).

    `built` is build_solution's result when the caller compiled the solution ahead of time.
    """
    import torch

    result = CheckResult(task_id=task.task_id, level=task.level, ok=False, verdict="")
    language = LANGUAGE_FOR_DEVICE[device]
    if language not in task.solutions:
        result.verdict = f"no {language} solution"
        return result
    where = task.source_path or task.task_id
    with torch.no_grad():
        ref_ns = _exec(task.reference_src, where)
        torch.manual_seed(seed)
        init = ref_ns["get_init_inputs"]()
        model = ref_ns["Model"](*init).to(device)

        inputs = _make_inputs(ref_ns, seed, device)
        out = model(*_clone(inputs))
        reason = degeneracy_reason(out, atol, rtol, min_std_ratio)
        reason = reason or partial_computation_reason(model, inputs, out, atol, rtol, tail_fraction)
        if reason:
            result.verdict = f"degenerate reference: {reason}"
            return result

        sol_ns, result.build_s = built or build_solution(task, device, cache_dir)
        with fast_load_inline(device, cache_dir):  # a solution may build in __init__
            torch.manual_seed(seed)
            candidate = sol_ns["ModelNew"](*init).to(device)
        result.output_std = _outputs(out)[0].float().std().item()
        reason = _parameter_mismatch(model, candidate)
        if reason:
            result.verdict = reason
            return result

        candidate(*_clone(inputs))  # warm-up (the reference was warmed up above)
        timer = _Timer(device)
        ref_times, sol_times, max_err = [], [], 0.0
        for trial in range(trials):
            if trial > 0:  # trial 0 reuses the inputs already drawn for the reference checks
                inputs = _make_inputs(ref_ns, seed + trial, device)
            expected, ref_ms = timer(model, *_clone(inputs))
            given = _clone(inputs)
            got, sol_ms = timer(candidate, *given)
            ref_times.append(ref_ms)
            sol_times.append(sol_ms)
            if len(_outputs(expected)) != len(_outputs(got)):
                result.verdict = f"trial {trial}: {len(_outputs(got))} outputs, expected {len(_outputs(expected))}"
                return result
            for x, y in zip(_outputs(expected), _outputs(got)):
                if not torch.is_tensor(y) or x.shape != y.shape:
                    result.verdict = f"trial {trial}: output shape {getattr(y, 'shape', type(y))} != {tuple(x.shape)}"
                    return result
                err = (x.float() - y.float()).abs().max().item()
                max_err = max(max_err, err) if math.isfinite(err) else math.inf
                if not torch_allclose(x, y, atol, rtol):
                    result.max_abs_err = max_err
                    result.verdict = f"trial {trial}: mismatch, max abs err {err:.3g} (atol=rtol={atol:g})"
                    return result
            if any(torch.is_tensor(a) and not torch.equal(a, b) for a, b in zip(inputs, given)):
                result.verdict = f"trial {trial}: the solution modified its inputs"
                return result
    result.ref_ms = statistics.median(ref_times)
    result.solution_ms = statistics.median(sol_times)
    result.max_abs_err = max_err
    result.ok, result.verdict = True, "ok"
    return result


def _row(cells, widths) -> str:
    return "  ".join(str(c).ljust(w) if i == 0 or i == len(cells) - 1 else str(c).rjust(w)
                     for i, (c, w) in enumerate(zip(cells, widths)))


def _fmt(x, spec) -> str:
    return "-" if x is None else format(x, spec)


def check_all(tasks: list[Task], device: str = "cpu", build_workers: int = 1, done: list | None = None,
              **kwargs) -> list[CheckResult]:
    """check_task over `tasks` with a progress bar and a live table; errors become verdicts.

    `build_workers` solutions compile at once, ahead of the runs (a CUDA build is ~50 s of
    mostly single-threaded nvcc, so a GPU host wants several; a 2-core CPU machine wants 1).
    `done` (optional) receives each result as soon as it is known: what was checked before a
    Ctrl-C. On any interruption the queued builds are cancelled and the running ones killed.
    """
    from tqdm import tqdm

    width = max([len(t.task_id) for t in tasks] + [7])
    widths = [width, 5, 9, 9, 9, 7, 0]
    tqdm.write(_row(["problem", "level", "ref ms", "sol ms", "max err", "build s", "verdict"], widths))
    # Solutions build on background threads, ahead of the task being run: the compiler
    # then overlaps the reference runs instead of adding to them. Only module-level code
    # runs there (load_inline); seeds, models and timing stay on this thread.
    cache_dir = kwargs.get("cache_dir")
    builder = ThreadPoolExecutor(max_workers=build_workers)
    finished = False
    try:
        builds = [builder.submit(build_solution, t, device, cache_dir) for t in tasks]
        results = _check_in_order(tasks, builds, device, widths, kwargs, [] if done is None else done)
        finished = True
        return results
    finally:
        # `with ThreadPoolExecutor` would wait for every queued build after a Ctrl-C
        builder.shutdown(wait=finished, cancel_futures=not finished)
        if not finished:
            kill_builds()


def kill_builds() -> None:
    """SIGKILL every process this one started (ninja, the compilers), deepest first: the build
    threads' load_inline then fail at once instead of compiling on after a Ctrl-C."""
    import signal

    from kernel_eval import _descendants  # the checker may use the harness's helpers (DESIGN.md)
    for pid in reversed(_descendants(os.getpid())):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def _check_in_order(tasks, builds, device, widths, kwargs, results: list) -> list[CheckResult]:
    from tqdm import tqdm

    for task, build in tqdm(list(zip(tasks, builds)), desc=f"checking on {device}", unit="task", leave=False):
        try:
            r = check_task(task, device=device, built=build.result(), **kwargs)
        except Exception as e:  # reported in the table and the exit code, never hidden
            first_line = (str(e).strip().splitlines() or [""])[0][:200]
            r = CheckResult(task.task_id, task.level, False, f"error: {type(e).__name__}: {first_line}")
        results.append(r)
        tqdm.write(_row([r.task_id, r.level, _fmt(r.ref_ms, ".3f"), _fmt(r.solution_ms, ".3f"),
                         _fmt(r.max_abs_err, ".2e"), _fmt(r.build_s, ".1f"),
                         r.verdict if r.ok else f"FAIL {r.verdict}"], widths))
    return results


def _device_name(device: str) -> str:
    import platform
    import torch
    if device == "cuda":
        return torch.cuda.get_device_name()
    return f"cpu {platform.processor() or platform.machine()} x{os.cpu_count()}"


def write_times(results: list[CheckResult], path: str, device: str) -> None:
    """`{"device", "torch", "ref_ms": {task_id: ms}}`; entries from the same device are kept."""
    import torch
    record = {"device": _device_name(device), "torch": torch.__version__, "ref_ms": {}}
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
        if old.get("device") == record["device"]:
            record["ref_ms"].update(old.get("ref_ms", {}))
    record["ref_ms"].update({r.task_id: round(r.ref_ms, 4) for r in results if r.ok})
    record["ref_ms"] = dict(sorted(record["ref_ms"].items()))
    _atomic_write(path, json.dumps(record, indent=1) + "\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="run every built-in reference and its solution")
    check.add_argument("--device", choices=["cpu", "cuda"], default=None,
                       help="cpu (C++ solutions) or cuda (CUDA solutions); default: cuda when torch sees one, else cpu")
    check.add_argument("--root", default="tasks", help="built-in task directory")
    check.add_argument("--only", default=None, help="check only task ids containing this")
    check.add_argument("--trials", type=int, default=3, help="random input sets compared and timed")
    check.add_argument("--atol", type=float, default=1e-2)
    check.add_argument("--rtol", type=float, default=1e-2)
    check.add_argument("--seed", type=int, default=0)
    check.add_argument("--build-workers", type=int, default=None,
                       help="solutions compiled at once (default: 1 on cpu, 8 on cuda)")
    check.add_argument("--json", default=None, help="write the results here")
    check.add_argument("--write-times", default=None, help="write {task_id: ref_ms} here")
    export = sub.add_parser("export", help="write a task set as JSONL")
    export.add_argument("--kernelbench", default=None, help="a KernelBench checkout (else built-in)")
    export.add_argument("--levels", default="1,2", help="comma-separated level numbers, e.g. 1,2")
    export.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    if args.command == "export":
        levels = parse_levels(args.levels, "tasks.py export")
        tasks = load_kernelbench(args.kernelbench, levels) if args.kernelbench else load_builtin(levels=levels)
        export_jsonl(tasks, args.out)
        print(f"wrote {len(tasks)} tasks to {args.out}")
        return 0

    for name in ("trials", "build_workers"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise SystemExit(f"tasks.py check: --{name.replace('_', '-')} {getattr(args, name)}: must be at least 1")
    tasks = [t for t in load_builtin(args.root) if args.only is None or args.only in t.task_id]
    if not tasks:
        print(f"tasks.py check: no task id contains {args.only!r}", file=sys.stderr)
        return 2
    import kernel_eval
    device = kernel_eval.resolve_device(args.device, "tasks.py check")
    device = "cuda" if device.startswith("cuda") else device  # the checker runs on the current device
    workers = args.build_workers or (8 if device == "cuda" else 1)
    results: list[CheckResult] = []
    try:
        check_all(tasks, device=device, build_workers=workers, trials=args.trials,
                  atol=args.atol, rtol=args.rtol, seed=args.seed, done=results)
    except KeyboardInterrupt:
        if args.json:  # what was checked before the interruption stays readable
            _atomic_write(args.json, json.dumps([asdict(r) for r in results], indent=1) + "\n")
        print(f"tasks.py check: interrupted after {len(results)}/{len(tasks)} problems; builds stopped"
              + (f", partial results in {args.json}" if args.json else ""), file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)  # skip joining the build threads: their compilers are dead, their work unwanted
    failed = [r for r in results if not r.ok]
    print(f"{len(results) - len(failed)}/{len(results)} problems ok on {_device_name(device)}")
    if args.json:
        _atomic_write(args.json, json.dumps([asdict(r) for r in results], indent=1) + "\n")
    if args.write_times:
        write_times(results, args.write_times, device)
    return 1 if failed else 0


def select_tasks(source: str, levels: str | None, prog: str, *, split: str = "all", n_heldout: int = 0,
                 split_seed: int = 0, task_ids: str = "", limit: int = 0) -> list[Task]:
    """The tasks a command line asked for, or one line that says why there are none: `source`
    (load_source) at `levels` ("1,2"; None: all), the `split` part ("train", "heldout" or "all")
    of split_tasks(n_heldout), then only the comma-separated `task_ids` (an id outside that part
    is refused), then the first `limit` (0: all)."""
    level_list = tuple(parse_levels(levels, prog)) if levels else None
    try:
        found = load_source(source, level_list)
        if split != "all":
            train, heldout = split_tasks(found, n_heldout=min(n_heldout, len(found)), seed=split_seed)
            found = heldout if split == "heldout" else train
    except TaskError as error:
        raise SystemExit(f"{prog}: --tasks: {error}")
    if task_ids:
        wanted = task_ids.split(",")
        unknown = sorted(set(wanted) - {t.task_id for t in found})
        if unknown:
            raise SystemExit(f"{prog}: --task-ids not in the selected tasks: {', '.join(unknown)}")
        found = [t for t in found if t.task_id in wanted]
    found = found[:limit] if limit else found
    if not found:
        raise SystemExit(f"{prog}: no tasks selected")
    return found


def parse_levels(text: str, prog: str) -> list[int]:
    """"1,2" -> [1, 2]; anything else is the user's mistake, said in one line."""
    try:
        levels = [int(x) for x in text.split(",")]
    except ValueError:
        levels = []
    if not levels or any(level < 1 for level in levels):
        raise SystemExit(f"{prog}: --levels {text!r}: expected comma-separated level numbers, e.g. 1,2")
    return levels


if __name__ == "__main__":
    try:
        sys.exit(main())
    except TaskError as e:
        print(f"tasks.py: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # outside the checker's loop (while loading tasks or torch)
        kill_builds()
        print("tasks.py: interrupted", file=sys.stderr)
        os._exit(130)
