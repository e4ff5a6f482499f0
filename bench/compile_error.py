"""What a CUDA compile error costs with and without name probes (kernel_build.py, "name probes"),
through the harness's compile phase (kernel_eval's confined compile workers, as evaluate runs them;
compile only, so no GPU is needed). Per built-in task, its CUDA solution's `no_compile` variant
(examples/warm_start.py: a declaration dropped, so an undefined identifier), each row in fresh caches:

  no probes   the slim tier fails, then the source as written fails (kernel_eval without probes)
  first       the slim tier fails, the worker waits while the name probe is compiled, then reads
              its answer ("undeclared": the slim tier's diagnostics, no build as written)
  again       a new source with the same names (a comment added): the slim tier, then the answer
  other       another declaration dropped instead (other names, same headers): the slim tier, then the
              answers the first probe also gave (it looks up the source's other identifiers too)

    python bench/compile_error.py --tasks level1/01_relu,level1/07_row_sum

`--early`: errors the headers as written cannot rescue (kernel_early_verdict.py), each judged
with early verdicts off (the slim tier, then the build as written or a name probe) and on (the slim tier,
then the unit as written preprocessed), fresh caches each: the kernel's first `(` unclosed ("unbalanced"),
a use of a variable misspelt ("undefined"), the kernel renamed so that its launch names nothing
("launched": undefined, called), a declaration repeated ("redeclared"), and where the next line is a
declaration too, that line pasted over it ("pasted": one variable declared twice, the other undefined,
a name torch's headers may spell: on, a name probe, then the rules), then another such source in the
caches it left ("pasted, again": the probe's answer read), the same beside the kernel renamed ("pasted,
launched": the probe asked about the pasted line's names, not the called one), and where the solution
has a #define, that line dropped ("define dropped": undefined at the first use in each scope, as nvcc
reports it), and where a declared name is compared (`c < cols`), its declaration dropped ("compared,
dropped": `expected a ">"`). `--row NAME` runs only that row (and its ", again").

    python bench/compile_error.py --early --tasks level1/01_relu,level1/07_row_sum

Needs nvcc. With a CPU build of torch (no CUDA_HOME of its own), the workers get nvcc's toolkit
through a sitecustomize.py this script writes; put cuBLAS, cuSPARSE and cuSOLVER headers on CPATH,
outside the temp dir, which the workers' view hides (docs/PERFORMANCE.md says how it ran on the CPU box).
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples"))

import kernel_eval  # noqa: E402
import tasks  # noqa: E402
from warm_start import _DECLARATION, DEFAULT_TASKS, drop_declaration  # noqa: E402

SITECUSTOMIZE = """import os
import torch.utils.cpp_extension as ce
ce.CUDA_HOME = ce.CUDA_HOME or os.environ["CUDA_HOME"]  # a CPU build of torch: nvcc's toolkit (bench only)
"""


def toolkit_for_cpu_torch(root: str) -> None:
    """Workers of a CPU build of torch see no CUDA_HOME: give them nvcc's through a sitecustomize.py
    on PYTHONPATH (kernel_boundary binds this process's sys.path into their view, read-only)."""
    import torch
    if torch.cuda._is_compiled():
        return
    nvcc = shutil.which("nvcc")
    home = os.environ.get("CUDA_HOME") or (nvcc and os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    if not home:
        raise SystemExit("bench/compile_error.py: no CUDA toolkit (nvcc not on PATH, CUDA_HOME unset)")
    site = os.path.join(root, "site")
    os.makedirs(site, exist_ok=True)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE)
    os.environ["CUDA_HOME"] = home
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")]))
    sys.path.append(site)


def early_variants(solution: str) -> dict:
    """{rule: the solution broken as that early-verdict rule reads it}; raises if it has no declaration."""
    lines = solution.split("\n")
    at = next(k for k, line in enumerate(lines) if _DECLARATION.match(line)
              and re.search(rf"\b{_DECLARATION.match(line).group(1)}\b", "\n".join(lines[k + 1:])))
    name = _DECLARATION.match(lines[at]).group(1)
    rest = "\n".join(lines[at + 1:])
    kernel = solution.index("__global__")
    kernel_name = re.search(r"__global__\s+void\s+(\w+)", solution).group(1)

    def renamed(source: str) -> str:  # the kernel renamed, so that its launch names nothing
        return source.replace(f"void {kernel_name}(", f"void {kernel_name}_v2(", 1)

    def again(source: str) -> str:  # another source (another hash) with the same names and headers
        return source.replace("import torch\n", "import torch  # again\n", 1)

    variants = {"unbalanced": solution[:kernel] + solution[kernel:].replace(")", "", 1),
                "undefined": "\n".join(lines[:at + 1]) + "\n" + re.sub(rf"\b{name}\b", name + "_typo", rest, count=1),
                "launched": renamed(solution),
                "redeclared": "\n".join(lines[:at + 1] + [lines[at]] + lines[at + 1:])}
    if at + 1 < len(lines) and _DECLARATION.match(lines[at + 1]):  # the next line pasted over the declaration
        variants["pasted"] = "\n".join(lines[:at] + [lines[at + 1]] + lines[at + 1:])
        variants["pasted, again"] = again(variants["pasted"])
        # ... beside the kernel renamed: a called name no probe is asked about, the rules read it alone
        variants["pasted, launched"] = renamed(variants["pasted"])
        variants["pasted, launched, again"] = again(variants["pasted, launched"])
    if define := re.search(r"^#define \w+ .*\n", solution, re.M):  # its name's uses reported once a scope
        variants["define dropped"] = solution.replace(define.group(0), "", 1)
    compared = next((k for k, line in enumerate(lines) if _DECLARATION.match(line) and re.search(
        rf"\b{_DECLARATION.match(line).group(1)} < ", "\n".join(lines[k + 1:]))), None)
    if compared is not None:  # `c < cols)` with c declared nowhere: C++20 reads c as a template's name
        variants["compared, dropped"] = "\n".join(lines[:compared] + lines[compared + 1:])
    return variants


def early_table(solutions: list, arch: str, root: str, only: set | None = None) -> None:
    print("| task | error | early verdicts off: s, builds | on: s, builds | rule | message |\n|---|---|---:|---:|---|---|",
          flush=True)
    for task, solution in solutions:
        for rule, source in early_variants(solution).items():
            if only and rule not in only and rule.replace(", again", "") not in only:
                continue
            row = []
            for early in (False, True):
                # "..., again": in the caches its row without ", again" left (its name probe answered)
                folder = rule.replace(", again", "")
                cfg = kernel_eval.EvalConfig(cache_root=os.path.join(root, task.replace("/", "_"), folder, str(early)),
                                             build=kernel_eval.kernel_build.BuildConfig(early_verdicts=early))
                t0 = time.monotonic()
                record = kernel_eval._compile(source, kernel_eval.Context("cuda", arch, cfg), probes=True)
                row.append((time.monotonic() - t0, record))
            (off, r_off), (on, r_on) = row
            message = re.search(r"error: ([^\n]*)", r_on["message"])
            print(f"| {task} | {rule} | {off:.1f}, {r_off.get('builds')} | {on:.1f}, {r_on.get('builds')} "
                  f"| {r_on.get('early_verdict', '-')} | {message.group(1)[:60] if message else r_on['status']} |",
                  flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks", default=DEFAULT_TASKS, help="built-in task ids without 'builtin/', comma-separated")
    p.add_argument("--arch", default=os.environ.get("TORCH_CUDA_ARCH_LIST", "9.0"))
    p.add_argument("--early", action="store_true", help="the early-verdict table instead of the name probes'")
    p.add_argument("--row", action="append", default=[], help="with --early: only this error (repeatable; "
                   "its ', again' row comes with it), e.g. --row 'pasted, launched'")
    a = p.parse_args()
    by_id = {t.task_id: t for t in tasks.load_builtin()}
    try:
        solutions = [(t, by_id["builtin/" + t].solutions["cuda"]) for t in a.tasks.split(",")]
    except KeyError as e:
        raise SystemExit(f"bench/compile_error.py: no built-in CUDA solution for {e.args[0]}") from None
    root = tempfile.mkdtemp(prefix="bench-compile-")
    try:
        toolkit_for_cpu_torch(root)
        if a.early:
            early_table(solutions, a.arch, root, set(a.row) or None)
            return
        print("| task | undefined names | no probes s (slim + as written) | first s (slim + probe) "
              "| again s (slim) | other names | other s | answers |\n|---|---|---:|---:|---:|---|---:|---|", flush=True)
        for task, solution in solutions:
            broken, first_name = drop_declaration(solution)
            # the next declaration drop_declaration would take: the first one kept out of its sight
            kept = re.sub(rf"^(\s*)(?=(?:const\s+)?\w+\s+{first_name}\s*=)", r"\1/*kept*/", solution,
                          count=1, flags=re.M)
            other = drop_declaration(kept)[0].replace("/*kept*/", "")
            plain = kernel_eval.EvalConfig(cache_root=os.path.join(root, task.replace("/", "_"), "plain"))
            probed = kernel_eval.EvalConfig(cache_root=os.path.join(root, task.replace("/", "_"), "probed"))

            def timed(source: str, cfg: kernel_eval.EvalConfig, probes: bool) -> tuple:
                t0 = time.monotonic()
                record = kernel_eval._compile(source, kernel_eval.Context("cuda", a.arch, cfg), probes=probes)
                return time.monotonic() - t0, record

            without, record = timed(broken, plain, probes=False)
            first, record_first = timed(broken, probed, probes=True)
            again, record_again = timed(broken.replace("__global__", "// a new source\n__global__", 1), probed, True)
            later, record_other = timed(other, probed, probes=True)
            records = (record, record_first, record_again, record_other)
            probes = os.path.join(probed.cache_root, "name_probes")
            answers = {}
            for r in (record_first, record_other):
                for name in r.get("undefined_names") or []:
                    found = glob.glob(os.path.join(probes, "*", name))
                    answers[name] = open(found[0]).read() if found else "not probed"
            answer = ", ".join(f"{n}: {v}" for n, v in answers.items()) or "not probed"
            if {r["status"] for r in records} != {"compile_error"}:
                answer += f" (statuses {[r['status'] for r in records]}: {record_other['message'][:80]!r})"
            print(f"| {task} | {', '.join(record_first.get('undefined_names') or []) or '-'} | {without:.1f} "
                  f"| {first:.1f} | {again:.1f} | {', '.join(record_other.get('undefined_names') or []) or '-'} "
                  f"| {later:.1f} | {answer} |", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
