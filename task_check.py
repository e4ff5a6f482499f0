"""The task checker: whether each task is a fair test with a good answer.

A task (tasks.py) is a reference `Model` and, for the built-in set, a known-good `ModelNew` per
language. Its solution is judged by kernel_eval, the reward's own harness (evaluate_batch: the same
compile, isolation, comparison and timing); its reference is checked here: it runs, its outputs
are finite and spread well beyond the tolerance (else a constant or a kernel that writes zeros
would pass), they change when the last 1/16 of any input is zeroed (else a kernel that
skips its last block would pass), and ModelNew creates Model's parameters under the same seed:

    python task_check.py --device cpu                  # the C++ solutions
    python task_check.py --device cuda --json out.json # the CUDA solutions, on a GPU
    python task_check.py --kernelbench KernelBench     # a checkout's references (no solutions)

This file sits above tasks and kernel_eval and neither imports it; kernel_eval (and torch) load
only once the tasks are read, so a bad task folder is refused in a moment.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass, field

import checkpoint
from tasks import Task, TaskError, load_builtin, load_kernelbench, parse_levels

# ---------------------------------------------------------------- the reference checks
# A task's solution is judged by kernel_eval exactly as the reward judges a policy's answer: the same
# compile, isolated workers, comparison and paired timing, through its public evaluate_batch. What
# the harness cannot see is whether the task itself is a fair test; that is checked here, in this
# process, on the task's own code (trusted: it is the reference the harness runs too).

MIN_STD_RATIO = 10.0    # each output's std must exceed this x atol: else a constant is within tolerance
TAIL_FRACTION = 1 / 16  # zeroed at the end of each input in turn: the reference's output must change
PASSING = ("correct", "no solution")  # "no solution": none in the device's language, reference checked only
NOT_A_VERDICT = ("harness_error",)    # the harness could not judge: neither pass nor fail


@dataclass
class CheckResult:
    """One task: the harness's verdict on its solution and what makes its reference unfair."""
    task_id: str
    level: int
    status: str                   # kernel_eval's status, or "no solution"
    findings: list = field(default_factory=list)  # reference-quality problems; [] when the test is fair
    speedup: float = 0.0
    ref_ms: float = 0.0           # 0.0 when not timed
    solution_ms: float = 0.0
    timing_ok: bool = True
    message: str = ""             # kernel_eval's message

    @property
    def ok(self) -> bool:
        return self.status in PASSING and not self.findings


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


def _on_cpu(outputs: list) -> list:
    import torch
    return [y.cpu() if isinstance(y, torch.Tensor) else y for y in outputs]


def _first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"


def degeneracy_reason(outputs: list, tolerances: dict, min_std_ratio: float = MIN_STD_RATIO) -> str | None:
    """Why the reference's `outputs` would let a wrong kernel pass, or None: an output that is not
    a floating-point tensor of 2+ elements, has non-finite values, or spreads less than
    min_std_ratio x atol (its tolerance in `tolerances`, as the harness compares): then a constant
    is within tolerance. A spread above 10 x atol also keeps an output from being within tolerance
    of zeros (that needs every |y| <= atol / (1 - rtol)), so a kernel that writes only zeros fails."""
    import torch
    from kernel_verdict import tolerance_for
    for i, y in enumerate(outputs):
        name = f"output {i}"
        if not isinstance(y, torch.Tensor) or not y.is_floating_point():
            return f"{name} is not a floating-point tensor"
        if y.numel() < 2:
            return f"{name} has {y.numel()} element(s)"
        if not torch.isfinite(y).all():
            return f"{name} has non-finite values"
        atol, _ = tolerance_for(str(y.dtype).replace("torch.", ""), tolerances)
        std = y.float().std().item()
        if std < min_std_ratio * atol:
            return f"{name} std {std:.3g} < {min_std_ratio:g} x atol; a constant would pass"
    return None


def partial_computation_reason(model, inputs: list, outputs: list, tolerances: dict,
                               tail_fraction: float = TAIL_FRACTION) -> str | None:
    """Zero the last `tail_fraction` of each floating-point input in turn: the outputs must then
    differ from `outputs` beyond tolerance, else a kernel that skips its last block (or ignores
    that input) would pass. None when every input matters."""
    import torch
    from kernel_verdict import compare_outputs
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() < 2:
            continue
        perturbed = _clone(inputs)
        perturbed[i] = x.clone(memory_format=torch.contiguous_format)  # its last elements in memory
        perturbed[i].view(-1)[-max(1, int(x.numel() * tail_fraction)):] = 0
        if compare_outputs(outputs, _on_cpu(_outputs(model(*perturbed))), tolerances) is None:
            return f"zeroing the last {tail_fraction:.0%} of input {i} leaves the output unchanged"
    return None


class _Unbuilt:
    """Stands in for a solution's extension while only its parameters are compared."""

    def __getattr__(self, name: str):
        def unbuilt(*args, **kwargs):
            raise RuntimeError(f"{name}: the checker builds no extension in its own process")
        return unbuilt


def parameter_mismatch_reason(reference, solution_src: str, init: list, seed: int, where: str) -> str | None:
    """Why the solution's ModelNew, built from `init` under `seed`, does not hold the parameters and
    buffers of `reference` (built under the same seed), or None. The harness seeds both models
    alike, so a solution that creates them in another order or with another init is judged on
    other weights; this says so by name instead of as an output mismatch. ModelNew is constructed
    with load_inline stubbed out: parameters need no kernel, and a build here would be a second
    compile outside the harness."""
    import torch
    from unittest import mock

    from torch.utils import cpp_extension
    try:
        with mock.patch.object(cpp_extension, "load_inline", lambda *args, **kwargs: _Unbuilt()):
            namespace = _exec(solution_src, where)
            torch.manual_seed(seed)
            candidate = namespace["ModelNew"](*init)
    except Exception as e:  # the solution's own code: its failure is a finding, not a crash of the checker
        return f"ModelNew could not be constructed to compare its parameters: {_first_line(e)}"
    ref = [t.detach().cpu() for t in list(reference.parameters()) + list(reference.buffers())]
    new = [t.detach().cpu() for t in list(candidate.parameters()) + list(candidate.buffers())]
    if len(ref) != len(new):
        return f"ModelNew has {len(new)} parameters/buffers, Model has {len(ref)}"
    for i, (a, b) in enumerate(zip(ref, new)):
        if a.shape != b.shape or not torch.equal(a, b):
            return (f"parameter {i} differs from Model's under the same seed ({tuple(a.shape)} vs "
                    f"{tuple(b.shape)}); create them in the same order with the same init")
    return None


def reference_findings(task: Task, device: str, tolerances: dict, seed: int = 0,
                       solution_src: str | None = None) -> list[str]:
    """What makes `task` an unfair test ([] when nothing does), its reference run once on `device`
    under `seed`: the reference fails, its outputs are degenerate (degeneracy_reason) or ignore the
    tail of an input (partial_computation_reason); and, given `solution_src`, its ModelNew does
    not create Model's parameters (parameter_mismatch_reason)."""
    import torch
    where = task.source_path or task.task_id
    findings = []
    try:
        with torch.no_grad():
            namespace = _exec(task.reference_src, where)
            init = namespace["get_init_inputs"]()
            torch.manual_seed(seed)  # after get_init_inputs, as the harness seeds both models
            model = namespace["Model"](*init)
            if solution_src is not None:
                findings.append(parameter_mismatch_reason(model, solution_src, init, seed,
                                                          f"{task.task_id} (solution)"))
            model = model.to(device)
            inputs = _make_inputs(namespace, seed, device)
            outputs = _outputs(model(*_clone(inputs)))
            findings.append(degeneracy_reason(outputs, tolerances)
                            or partial_computation_reason(model, inputs, outputs, tolerances))
    except Exception as e:  # the task's own code: its failure is the finding
        findings.append(f"the reference failed: {_first_line(e)}")
    return [f for f in findings if f]


def check_tasks(tasks: list[Task], device: str = "cpu", config=None, seed: int = 0, progress: bool = True):
    """Yield one CheckResult per task, in order. kernel_eval judges every solution in the device's
    language (`cpp` on cpu, else `cuda`) in one batch (evaluate_batch with `config`, an EvalConfig;
    None: the reward's defaults); then each reference is checked here (reference_findings) with
    the config's tolerances, after the batch so that nothing here runs beside a timed window."""
    import kernel_eval
    from tqdm import tqdm

    config = config or kernel_eval.EvalConfig()
    language = "cpp" if device == "cpu" else "cuda"
    judged = [i for i, t in enumerate(tasks) if language in t.solutions]
    pairs = [(tasks[i].reference_src, tasks[i].solutions[language]) for i in judged]
    verdicts = kernel_eval.evaluate_batch(pairs, device=device, config=config, progress=progress) if pairs else []
    verdict_of = dict(zip(judged, verdicts))
    for i, task in enumerate(tqdm(tasks, desc="reference checks", unit="task", leave=False, disable=not progress)):
        solution = task.solutions.get(language)
        findings = reference_findings(task, device, config.tolerances, seed, solution)
        if device != "cpu":
            import torch
            torch.cuda.empty_cache()  # this task's tensors: not held while the next one runs
        verdict = verdict_of.get(i)
        if verdict is None:
            yield CheckResult(task.task_id, task.level, "no solution", findings)
            continue
        yield CheckResult(task.task_id, task.level, verdict.status, findings, speedup=verdict.speedup,
                          ref_ms=verdict.ref_ms, solution_ms=verdict.candidate_ms, timing_ok=verdict.timing_ok,
                          message=verdict.message)


# ---------------------------------------------------------------- command line

COLUMNS = ("problem", "level", "status", "speedup", "ref ms", "sol ms", "reference", "notes")


def _row(cells, widths) -> str:
    """Text columns left-aligned, numbers right-aligned."""
    numeric = {1, 3, 4, 5}
    return "  ".join(str(c).rjust(w) if i in numeric else str(c).ljust(w)
                     for i, (c, w) in enumerate(zip(cells, widths))).rstrip()


def _cells(r: CheckResult) -> list:
    timed = r.status == "correct" and r.ref_ms > 0
    notes = list(r.findings)
    if r.status in NOT_A_VERDICT:
        notes.append(f"{r.status}: " + " ".join(r.message.split()))
    elif r.status not in PASSING or not r.timing_ok:
        notes.append(" ".join(r.message.split()))
    status = "no verdict" if r.status in NOT_A_VERDICT else r.status
    return [r.task_id, r.level, status, f"{r.speedup:.2f}x" if timed else "-",
            f"{r.ref_ms:.3f}" if timed else "-", f"{r.solution_ms:.3f}" if timed else "-",
            "FAIL" if r.findings else "ok", "; ".join(notes)[:400]]


def _device_name(device: str) -> str:
    import platform

    import torch
    if device != "cpu":
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu {platform.processor() or platform.machine()} x{os.cpu_count()}"


def _write_json(path: str, results: list[CheckResult]) -> None:
    checkpoint.atomic_write(path, json.dumps([{**asdict(r), "ok": r.ok} for r in results], indent=1) + "\n")


def _summary(results: list[CheckResult], device: str) -> str:
    unjudged = [r for r in results if r.status in NOT_A_VERDICT]
    failed = [r for r in results if not r.ok and r.status not in NOT_A_VERDICT]
    line = f"{len(results) - len(failed) - len(unjudged)}/{len(results)} problems ok on {_device_name(device)}"
    if failed:
        line += f"; failed: {', '.join(r.task_id for r in failed)}"
    if unjudged:
        line += f"; not judged (the harness could not judge): {', '.join(r.task_id for r in unjudged)}"
    return line


def _check(args) -> int:
    from tqdm import tqdm

    if args.trials is not None and args.trials < 1:
        raise SystemExit(f"task_check.py: --trials {args.trials}: must be at least 1")
    levels = parse_levels(args.levels, "task_check.py") if args.levels else None

    def load(device):
        found = (load_kernelbench(args.kernelbench, levels or (1, 2)) if args.kernelbench
                 else load_builtin(args.root, levels, device))
        return [t for t in found if args.only is None or args.only in t.task_id]
    tasks = load(args.device)  # a bad task folder is refused before torch loads
    if not tasks:
        print(f"task_check.py: no task id contains {args.only!r}", file=sys.stderr)
        return 2
    import kernel_eval
    device = kernel_eval.resolve_device(args.device, "task_check.py")
    if device != args.device:  # --device not given: the built-in references at the sizes of the one chosen
        tasks = load(device)
    settings = {"time_candidate": not args.no_time}
    if args.trials:
        settings["cpu_trials" if device == "cpu" else "gpu_trials"] = args.trials
    config = kernel_eval.EvalConfig(**settings)

    widths = [max([len(t.task_id) for t in tasks] + [len(COLUMNS[0])]), 5, 13, 8, 9, 9, 9, 0]
    tqdm.write(_row(COLUMNS, widths))
    results: list[CheckResult] = []
    try:
        for r in check_tasks(tasks, device, config, seed=args.seed):
            results.append(r)
            tqdm.write(_row(_cells(r), widths))
    except KeyboardInterrupt:  # kernel_eval has stopped every worker and build of its batch
        if args.json:  # what was checked before the interruption stays readable
            _write_json(args.json, results)
        print(f"task_check.py: interrupted after {len(results)}/{len(tasks)} problems; every worker and build "
              "was stopped" + (f", partial results in {args.json}" if args.json else ""), file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)  # skip joining the batch's threads, which would wait for phases nobody needs now
    print(_summary(results, device))
    if args.json:
        _write_json(args.json, results)
    return 0 if all(r.ok for r in results) else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description="Judge each task's solution through kernel_eval (the reward's compile, isolation, comparison "
                    "and timing) and check that its reference is a fair test: it runs, its outputs are finite and "
                    "spread well beyond the tolerance, they change when the tail of any input is zeroed, and the "
                    "solution's ModelNew creates Model's parameters. Exit 0 when every task passes, 1 when one "
                    "fails or could not be judged, 2 on bad input.")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--root", default="tasks", help="a built-in-format task directory (default: tasks)")
    source.add_argument("--kernelbench", default=None,
                        help="a KernelBench checkout: its references are checked (they have no solutions)")
    parser.add_argument("--levels", default=None, help="comma-separated levels (default: all; 1,2 for --kernelbench)")
    parser.add_argument("--only", default=None, help="check only task ids containing this")
    parser.add_argument("--device", default=None,
                        help="cpu (C++ solutions), cuda or cuda:N (CUDA solutions); default: cuda when torch sees one, else cpu")
    parser.add_argument("--trials", type=int, default=None, help="timed calls per side (default: kernel_eval's)")
    parser.add_argument("--no-time", action="store_true", help="check correctness only")
    parser.add_argument("--seed", type=int, default=0, help="seed of the reference checks' inputs and parameters")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    try:
        return _check(args)
    except TaskError as e:  # a missing or malformed task: one line that names the file
        print(f"task_check.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # outside the checker's loop (loading tasks or torch): nothing was started
        print("task_check.py: interrupted", file=sys.stderr)
        os._exit(130)
