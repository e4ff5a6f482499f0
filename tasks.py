"""Tasks: the programs the policy learns to make faster, where they come from, how they are split and drawn.

A task is a KernelBench-format PyTorch program (Ouyang et al. 2025, "KernelBench: Can LLMs
Write Efficient GPU Kernels?"): a `class Model(nn.Module)` whose `forward` is the reference
computation, `get_inputs()` returning the forward arguments and `get_init_inputs()` returning
the constructor arguments. The policy answers with a `class ModelNew` that computes the same
thing with its own kernel; the reward is correctness and speedup over `Model`.

Three sources give the same `Task` record:
  - the built-in set `tasks/level{L}/{NN}_{name}/{reference,solution_cuda,solution_cpp}.py`,
    written for this project, each with a known-good CUDA and C++ solution and, on its size
    lines, `# cpu:` sizes that the CPU judges it at (sized_for);
  - a KernelBench checkout (`KernelBench/level1/19_ReLU.py`);
  - a JSONL (or parquet) export with the fields `code`, `name`, `problem_id`, `level`.
Files are validated with `ast` (syntax, `Model`, `get_inputs`, `get_init_inputs`), never
imported, and a loader never skips a file silently: a malformed file raises `TaskError`.

`split_tasks` gives the deterministic train / held-out split; Kevin-32B trains on 180 of the
200 KernelBench level-1 and level-2 problems and holds out 20 (`n_heldout=20`).

A task set is written as JSONL with `python tasks.py export --out tasks.jsonl` (the built-in set;
`--kernelbench PATH` a checkout's). Whether each task is a fair test with a good answer is
task_check.py's business (it judges the solutions through kernel_eval, which sits above this file).
"""
from __future__ import annotations

import argparse
import ast
import io
import json
import math
import os
import random
import re
import sys
from dataclasses import dataclass, field

import checkpoint

LANGUAGES = ("cuda", "cpp")
LANGUAGE_FOR_DEVICE = {"cuda": "cuda", "cpu": "cpp"}
BUILTIN_DIR = re.compile(r"^(\d+)_([a-z0-9_]+)$")
KERNELBENCH_FILE = re.compile(r"^(\d+)_(.+)\.py$")
LEVEL_DIR = re.compile(r"^level(\d+)$")
# A built-in reference's size line may carry its CPU size: `ROWS, COLS = 8192, 8192  # cpu: 512, 1024`
# (GPU sizes would make a CPU verdict one of torch's loops over 64M elements, not of the kernel).
CPU_NOTE = re.compile(r"#\s*cpu:")
CPU_SIZE_LINE = re.compile(r"^(?P<names>[A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)*)\s*=\s*(?P<gpu>[^#]+?)\s*"
                           r"#\s*cpu:\s*(?P<cpu>[^#]+?)\s*$")


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


def _values(text: str) -> int | None:
    """How many values `text` is (a tuple's length, else 1), or None when it is not an expression."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None
    return len(node.elts) if isinstance(node, ast.Tuple) else 1


def sized_for(src: str, device: str | None, where: str) -> str:
    """`src` as judged on `device`: on "cpu", each top-level line `NAMES = GPU  # cpu: CPU` becomes
    `NAMES = CPU  # the CPU size; on a GPU: GPU`; on any other device (or None) `src` unchanged. Every
    annotation is checked on every device (as many values as names, on both sides), so a malformed
    one is a TaskError naming the file and line wherever the task is loaded."""
    lines = src.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if not CPU_NOTE.search(line):
            continue
        m = CPU_SIZE_LINE.match(line.rstrip("\r\n"))
        names = len(m.group("names").split(",")) if m else 0
        if not m or _values(m.group("gpu")) != names or _values(m.group("cpu")) != names:
            raise TaskError(f"{where}:{i + 1}: malformed cpu size annotation {line.strip()!r}: expected "
                            "`NAME[, NAME...] = VALUES  # cpu: VALUES`, as many values as names on each side, "
                            "at the start of a line")
        if device == "cpu":
            ending = line[len(line.rstrip("\r\n")):]
            lines[i] = f"{m.group('names')} = {m.group('cpu')}  # the CPU size; on a GPU: {m.group('gpu')}{ending}"
    return "".join(lines)


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


def load_builtin(root: str = "tasks", levels=None, device: str | None = None) -> list[Task]:
    """The built-in set: `root/level{L}/{NN}_{snake_name}/` with reference and two solutions; each
    reference as judged on `device` (sized_for: the CPU sizes on "cpu")."""
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
            reference_src = sized_for(_read(ref_path), device, ref_path)
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


def export_jsonl(tasks: list[Task], path: str) -> None:
    checkpoint.atomic_write(path, "".join(json.dumps(_record(t)) + "\n" for t in tasks))


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
    table = io.BytesIO()
    frame.to_parquet(table, index=False)
    checkpoint.atomic_write(path, table.getvalue())


def load_source(source: str, levels=None, device: str | None = None) -> list[Task]:
    """Tasks from a `--tasks` argument: "builtin" (its references as judged on `device`), a .jsonl or
    .parquet export, or a KernelBench checkout (levels 1 and 2 unless `levels` says otherwise), the
    last two as they are on every device; `levels` filters every source."""
    if source == "builtin":
        return load_builtin(levels=levels, device=device)
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


def select_tasks(source: str, levels: str | None, prog: str, *, split: str = "all", n_heldout: int = 0,
                 split_seed: int = 0, task_ids: str = "", limit: int = 0, device: str | None = None) -> list[Task]:
    """The tasks a command line asked for, or one line that says why there are none: `source`
    (load_source, as judged on `device`) at `levels` ("1,2"; None: all), the `split` part ("train", "heldout" or "all")
    of split_tasks(n_heldout), then only the comma-separated `task_ids` (an id outside that part
    is refused), then the first `limit` (0: all)."""
    level_list = tuple(parse_levels(levels, prog)) if levels else None
    try:
        found = load_source(source, level_list, device)
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


# ---------------------------------------------------------------- command line

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    export = sub.add_parser("export", help="write a task set as JSONL")
    export.add_argument("--kernelbench", default=None, help="a KernelBench checkout (else built-in)")
    export.add_argument("--levels", default="1,2", help="comma-separated level numbers, e.g. 1,2")
    export.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    try:
        levels = parse_levels(args.levels, "tasks.py export")
        tasks = load_kernelbench(args.kernelbench, levels) if args.kernelbench else load_builtin(levels=levels)
        export_jsonl(tasks, args.out)
        print(f"wrote {len(tasks)} tasks to {args.out}")
        return 0
    except TaskError as e:  # a missing or malformed task: one line that names the file
        print(f"tasks.py {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # loading tasks: nothing was started
        print("tasks.py: interrupted", file=sys.stderr)
        os._exit(130)
