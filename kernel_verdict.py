"""kernel_verdict: what a verdict is. Statuses and EvalResult, the output comparison, the op check, run
limits and the timed calls a side gets (block_calls), the paired-timing verdict (paired_verdict,
timing_verdict) and finite speedups, and how messages are trimmed.

For a candidate C against a reference R (kernel_eval.py runs them; these functions decide):

    correct = for every trial t (fresh inputs x_t): shape and dtype equal, no NaN/Inf where R has
              none, |C(x_t) - R(x_t)| <= atol + rtol |R(x_t)| (compare_outputs, tolerance_for), inputs
              unchanged, and no torch compute operator in C's forward (flag_ops: the aten operators of
              the allowed rows of kernel_gate.CALLS, the one table of what a kernel may call)
    speedup = median(R's times) / median(C's times), timed in turn in one window, if correct and the
              parent's own clock confirms the claimed times (paired_verdict, finite_speedup), else 0

A candidate's run request may take what run_limit derives from the reference's time for the same
request, under a fixed ceiling. Statuses (STATUSES): format_error, compile_error, timeout (which
phase), runtime_error (exception, crash, malformed data, a resource limit), incorrect, correct,
reference_error (the task's own reference failed: no verdict on the candidate), harness_error (the
task's copies do not fit even with the device to itself: no verdict). A timing the cross-check
refuses keeps correct and pays 0.

Pure: no processes, no files, no torch.cuda state (torch is imported only to compare tensors, on the
device they are on). The only project import is kernel_gate. Imported by the parent (kernel_eval)
and by the reference's worker (kernel_worker), which compares outputs where they live. `cfg` below
is a kernel_eval.EvalConfig (these functions read its verdict fields).
"""
from __future__ import annotations

import dataclasses
import math
import re
import statistics
from dataclasses import dataclass, field

import kernel_gate

STATUSES = ("format_error", "compile_error", "runtime_error", "timeout", "incorrect", "correct", "reference_error",
            "harness_error")


class Failure(Exception):
    """The end of one candidate's evaluation in a phase: its status (STATUSES) and message."""

    def __init__(self, status: str, message: str, waited_s: float = 0.0):
        super().__init__(message)
        self.status, self.message = status, message
        self.waited_s = waited_s  # a timeout: the seconds the phase was waited on (EvalResult.timeout_seconds)


@dataclass
class EvalResult:
    """One candidate's verdict, as kernel_eval returns it and rewards.kernel_score pays it."""
    status: str  # one of STATUSES
    compiled: bool = False
    correct: bool = False
    speedup: float = 0.0
    ref_ms: float = 0.0
    candidate_ms: float = 0.0
    message: str = ""
    timing_ok: bool = True
    claimed_ms: float = 0.0  # the candidate process's own median, before the cross-check
    wall_ms: float = 0.0  # the parent's clock over the timing request
    # the timing window as paired_verdict saw it, per side ("reference", "candidate") and block in
    # time order: [calls, median and mean claimed ms/call, parent's ms/call]; a diagnostic
    blocks: dict = field(default_factory=dict)
    ops: list = field(default_factory=list)  # aten compute ops seen in forward (when flagged)
    alone: bool = False  # judged again with the device to itself, after running out of memory beside others
    trials: int = 0  # correctness trials run (plan_copies: fewer than n_correct_trials for a large task)
    seconds: dict = field(default_factory=dict)  # per phase
    timeout_seconds: float = 0.0  # seconds spent waiting on the phase that timed out (status timeout)
    build_reused: bool | None = None  # the compile record came from the build cache (None: never compiled)
    early_verdict: str = ""  # a compile error judged from a failed header tier: the rule (kernel_early_verdict)
    boundary: str = ""  # what the candidate's processes ran behind (kernel_boundary.boundary_for)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------- correct

def compare_outputs(ref: list, cand, tolerances: dict, device=None) -> str | None:
    """None if `cand` (CPU tensors) matches `ref` (tensors on any device), else a short reason. Compared on
    `device` (None: each reference output's), COMPARE_CHUNK values at a time: neither output is ever copied
    whole (a large task's outputs are most of the device)."""
    import torch
    if not isinstance(cand, (list, tuple)) or len(cand) != len(ref):
        got = len(cand) if isinstance(cand, (list, tuple)) else type(cand).__name__
        return f"expected {len(ref)} output tensor(s), got {got}"
    for k, (r, c) in enumerate(zip(ref, cand)):
        name = f"output {k}" if len(ref) > 1 else "output"
        if not isinstance(c, torch.Tensor):
            return f"{name} is {type(c).__name__}, expected a tensor"
        if c.device.type != "cpu" or c.layout != torch.strided or type(c) is not torch.Tensor:
            return f"{name} is not a plain dense tensor"
        if tuple(c.shape) != tuple(r.shape):
            return f"{name} shape {tuple(c.shape)}, expected {tuple(r.shape)}"
        if c.dtype != r.dtype:
            return f"{name} dtype {str(c.dtype).replace('torch.', '')}, expected {str(r.dtype).replace('torch.', '')}"
        on = torch.device(device) if device is not None else r.device
        if not r.is_floating_point() and not r.is_complex():
            rf, cf = r.reshape(-1), c.reshape(-1)
            differ = sum(int((cf[i: i + COMPARE_CHUNK].to(on) != rf[i: i + COMPARE_CHUNK].to(on)).sum())
                         for i in range(0, rf.numel(), COMPARE_CHUNK))
            if differ:
                return f"{name}: {differ} of {r.numel()} values differ"
            continue
        reason = _compare_floats(r, c, name, tolerance_for(str(r.dtype).replace("torch.", ""), tolerances), on)
        if reason:
            return reason
    return None


COMPARE_CHUNK = 1 << 24  # elements per step: bounded temporaries, whatever the output's size


def _compare_floats(r, c, name: str, tol: tuple, on) -> str | None:
    """|c - r| <= atol + rtol |r| wherever r is finite, and c non-finite exactly where r is (same
    values); in float32 (float64 for float64), chunk by chunk on device `on`."""
    import torch
    atol, rtol = tol
    if r.is_complex():
        r, c = torch.view_as_real(r), torch.view_as_real(c)
    work = torch.float64 if r.dtype == torch.float64 else torch.float32
    rf, cf = r.reshape(-1), c.reshape(-1)
    zero = torch.zeros((), dtype=torch.int64, device=on)
    extra, extra_nan, outside, nonfinite_differ = zero.clone(), zero.clone(), zero.clone(), zero.clone()
    max_diff = torch.zeros((), dtype=work, device=on)
    for i in range(0, rf.numel(), COMPARE_CHUNK):
        rr, cc = rf[i: i + COMPARE_CHUNK].to(on, work), cf[i: i + COMPARE_CHUNK].to(on, work)
        diff = (cc - rr).abs_()
        within = diff <= rr.abs().mul_(rtol).add_(atol)
        if bool(within.all()):
            continue  # the usual chunk: every value within tolerance (a NaN anywhere fails this)
        r_fin, c_fin = torch.isfinite(rr), torch.isfinite(cc)
        new_bad = r_fin & ~c_fin  # unwritten memory shows up as NaN (poison) here
        extra += new_bad.sum()
        extra_nan += (new_bad & torch.isnan(cc)).sum()
        r_bad = ~r_fin
        nonfinite_differ += (r_bad & (cc.nan_to_num() != rr.nan_to_num())).sum()
        bad = r_fin & c_fin & ~within
        outside += bad.sum()
        max_diff = torch.maximum(max_diff, torch.where(bad, diff, 0).max())
    n = r.numel()
    if extra.item():
        kind = "NaN" if extra_nan.item() else "Inf"
        return f"{name} has {kind} at {extra.item()} of {n} positions (unwritten memory?)"
    if nonfinite_differ.item():
        return f"{name}: non-finite values differ from the reference"
    if outside.item():
        return (f"{name}: {outside.item()} of {n} values outside tolerance "
                f"(atol={atol}, rtol={rtol}); max abs diff {max_diff.item():.4g}")
    return None


def tolerance_for(dtype_name: str, tolerances: dict) -> tuple:
    return tolerances.get(dtype_name, tolerances.get("float32", (1e-2, 1e-2)))


def flag_ops(ops: list) -> list:
    """The compute operators among recorded aten op names ('aten::add' etc.): what the allowed rows of
    kernel_gate.CALLS (the one table of what a candidate may call, and why) do not list."""
    allowed, flagged = kernel_gate.allowed().aten_ops, []
    for op in ops:
        ns, _, base = op.partition("::")
        if ns == "aten" and base not in allowed and base.rstrip("_") not in allowed:
            flagged.append(op)
    return sorted(set(flagged))


# ----------------------------------------------------------------------------- limits and speedup

def run_limit(cfg, ref: tuple | None, ceiling_s: float) -> tuple:
    """(seconds, how derived): what a candidate may take for a run request (check, timing) for which the
    reference took `ref` = (seconds of compute, seconds moving the data the candidate moves; None: unknown):
    run_timeout_multiple x the first + run_timeout_io_multiple x the second + slack, at most `ceiling_s`."""
    if ref is None:
        return ceiling_s, "the fixed ceiling: the reference's time for this request is unknown"
    compute_s, moving_s = ref
    how = (f"{cfg.run_timeout_multiple:g} x the reference's {compute_s:.2g} s"
           + (f" + {cfg.run_timeout_io_multiple:g} x its {moving_s:.2g} s moving the data" if moving_s else "")
           + f" + {cfg.run_timeout_slack_s:g} s")
    derived = cfg.run_timeout_multiple * compute_s + cfg.run_timeout_io_multiple * moving_s + cfg.run_timeout_slack_s
    if derived >= ceiling_s:
        return ceiling_s, f"the fixed ceiling, under {how}"
    return derived, how


def request_key(msg: dict) -> tuple | str:
    """The reference's measured request (ReferenceSession.seconds) a candidate's matches: a timing request with
    as many calls; time_outputs (writing the timed sets' outputs: less than a check) "check"."""
    if msg["cmd"] == "time_outputs":
        return "check"
    return (msg["cmd"], msg.get("calls", msg.get("trials", msg.get("warmup"))))


def reference_seconds(seconds: dict, msg: dict) -> tuple | None:
    """The reference's (compute, moving) seconds for the request a candidate's `msg` matches (request_key); for a
    timing request with fewer calls than the reference's (a slower candidate's block), the per-call share of the
    reference's nearest larger one of that kind; None when unknown."""
    key = request_key(msg)
    if key in seconds or not isinstance(key, tuple) or key[0] not in ("warm", "time") or type(key[1]) is not int:
        return seconds.get(key)
    nearest = min((k[1] for k in seconds if isinstance(k, tuple) and k[0] == key[0] and type(k[1]) is int
                   and k[1] > key[1]), default=None)
    if nearest is None:
        return None
    compute_s, moving_s = seconds[(key[0], nearest)]
    return compute_s * key[1] / nearest, moving_s


def block_calls(trials: int, blocks: int, budget_ms: float, per_call_ms: float) -> int:
    """Timed calls per block for `trials` calls a side over `blocks` blocks, within `budget_ms` a side when
    one call takes per_call_ms (that side's, on the parent's clock); at least one."""
    wanted = math.ceil(trials / blocks)
    if per_call_ms <= 0 or wanted * blocks * per_call_ms <= budget_ms:
        return wanted
    return max(1, min(wanted, int(budget_ms / (blocks * per_call_ms))))


def paired_verdict(ref_blocks: list, cand_blocks: list, cfg, cpu: bool = False) -> dict:
    """The speedup from reference and candidate blocks timed in one window, each block (claimed per-call
    times, the parent's ms over the block: wall on GPU; on CPU the CPU time of the worker's process tree,
    which load does not inflate): {"speedup", "ref_ms" (the reference's time paid), "claimed_ms",
    "parent_ms", "problem", "note"}. Per call (the same loop runs on both sides; a candidate slower than the
    reference has fewer calls in its blocks, _paired_timing):

        speedup    = median(reference times) / median(candidate times)   (the reference's capped on GPU)
        overhead   = parent's ms - sum(reference times), per reference block: a request's cost beyond its
                     calls (refills, flushes, syncs, the request: trusted, it runs the task's own code)
        parent_ms  = low((candidate block's parent's ms - low(overheads)) / its calls)
        resolution = noise x (low(overheads) - min(overheads)) / candidate's calls + abs
        low        = the lower median (the 2nd smallest of 4 blocks)

    A stall (a worker or the parent's timing thread descheduled, another thread holding the GIL) only
    lengthens a block, so each side is read from its less-stalled half: up to half of either side's
    blocks may stall without changing the verdict. A lie is not a stall: a block's wall time is never
    less than the work the candidate did in it.
        paid iff parent_ms <= (1 + rel) x median(candidate times) + resolution   (else its clock lies)
             and parent_ms > resolution                      (else the parent cannot confirm it)

    On GPU the reference paid is at most ref_slowdown_max x the median of its first block (timed before
    any candidate block): GPU work the candidate left queued would slow the reference and inflate the
    speedup; an honest window shows the same when a multi-op reference's launch level switches, so the
    excess is not paid rather than the speedup refused. CPU time is not slowed by other processes."""
    ref_times = [t for times, _ in ref_blocks for t in times]
    cand_times = [t for times, _ in cand_blocks for t in times]
    out = {"speedup": 0.0, "ref_ms": statistics.median(ref_times), "claimed_ms": 0.0, "parent_ms": 0.0,
           "problem": None, "note": None}
    if not cand_times or not all(math.isfinite(t) and t > 0 for t in cand_times):
        out["problem"] = "timing cross-check failed: the candidate's clock reported non-positive or non-finite times"
        return out
    overheads = [ms - math.fsum(times) for times, ms in ref_blocks]
    claimed = out["claimed_ms"] = statistics.median(cand_times)
    overhead = statistics.median_low(overheads)
    parent = statistics.median_low([(ms - overhead) / len(times) for times, ms in cand_blocks])
    out["parent_ms"] = max(parent, 0.0)
    resolution = cfg.cross_check_noise * (overhead - min(overheads)) / min(len(t) for t, _ in cand_blocks) + (
        cfg.cpu_cross_check_abs_ms if cpu else cfg.cross_check_abs_ms)
    if not parent <= (1 + cfg.cross_check_rel) * claimed + resolution:
        out["problem"] = (f"timing cross-check failed: claimed {claimed:.4g} ms/call but the harness's clock saw "
                          f"{parent:.4g} ms/call (the reference's loop overhead taken out)")
    elif not parent > resolution:
        out["problem"] = (f"timing cross-check failed: {claimed:.4g} ms/call is faster than the harness's clock "
                          f"resolves in this window ({resolution:.2g} ms/call): speedup unconfirmable")
    else:
        first = statistics.median(ref_blocks[0][0])  # timed before any candidate block
        if not cpu and out["ref_ms"] > cfg.ref_slowdown_max * first:
            out["note"] = (f"the reference ran {out['ref_ms'] / first:.3g}x slower beside the candidate than "
                           f"before it: paid against {cfg.ref_slowdown_max:g}x its time before it")
            out["ref_ms"] = cfg.ref_slowdown_max * first
        out["speedup"], out["problem"] = finite_speedup(out["ref_ms"], claimed)
    return out


def timing_verdict(result: EvalResult, ref_blocks: list, cand_blocks: list, cfg, cpu: bool = False) -> None:
    """paired_verdict's speedup, times and message, written into `result` (the timing a check passed)."""
    verdict = paired_verdict(ref_blocks, cand_blocks, cfg, cpu=cpu)
    result.ref_ms, result.claimed_ms, result.speedup = verdict["ref_ms"], verdict["claimed_ms"], verdict["speedup"]
    result.wall_ms = sum(wall for _, wall in cand_blocks)
    result.blocks = {side: [[len(times), statistics.median(times), statistics.fmean(times), ms / len(times)]
                            for times, ms in side_blocks]
                     for side, side_blocks in (("reference", ref_blocks), ("candidate", cand_blocks))}
    if verdict["problem"]:
        result.timing_ok, result.speedup = False, 0.0
        result.candidate_ms = verdict["parent_ms"]
        result.message = verdict["problem"] + "; speedup not rewarded"
    else:
        result.candidate_ms = verdict["claimed_ms"]
        result.message = correct_message(result.ref_ms, result.candidate_ms, result.speedup, verdict["note"])


def correct_message(ref_ms: float, candidate_ms: float, speedup: float, note: str = "") -> str:
    """A timed correct verdict's message."""
    return (f"correct; {ref_ms:.4g} ms reference vs {candidate_ms:.4g} ms candidate ({speedup:.3g}x), "
            "timed in turn in one window" + (f" ({note})" if note else ""))


def finite_speedup(ref_ms: float, candidate_ms: float) -> tuple:
    """(ref_ms / candidate_ms, None), or (0.0, reason) when either time or their ratio is not a
    positive finite number: a claimed 5e-324 ms is positive and finite, its speedup is not."""
    for who, ms in (("reference", ref_ms), ("candidate", candidate_ms)):
        if not (isinstance(ms, (int, float)) and math.isfinite(ms) and ms > 0):
            return 0.0, f"timing cross-check failed: the {who}'s time ({ms!r} ms) is not a positive finite number"
    ratio = ref_ms / candidate_ms
    if not math.isfinite(ratio):
        return 0.0, f"timing cross-check failed: a claimed {candidate_ms:.3g} ms/call gives no finite speedup"
    return ratio, None


# ----------------------------------------------------------------------------- messages

MAX_RECORDED_ERROR_LINES = 100  # a compile record keeps its .cu unit's errors by line (a probe's answers) up to this


def compile_record(msg: dict, built: dict, message_chars: int) -> dict:
    """A compile worker's last message as the compile's record: ok, compile_error (its build's diagnostics) or
    deferred; `built`: its builds and profile."""
    if msg.get("ok"):
        # the last CUDA build's header tier (None: as written, or none)
        record = {"status": "ok", "message": "", "header_tier": msg.get("header_tier"),
                  "torch_preloaded": msg.get("torch_preloaded") is True, **built}
    elif msg.get("kind") == "build":
        record = {"status": "compile_error", "message": cut(str(msg.get("message", "")), message_chars),
                  **built}
        undefined = msg.get("undefined_names")  # all of the build's errors, when all are undefined names
        if isinstance(undefined, list) and all(isinstance(n, str) for n in undefined):
            record["undefined_names"] = undefined
        errors = msg.get("cuda_errors")  # {line: [messages]} of the .cu unit, when those are all of them
        if isinstance(errors, dict) and len(errors) <= MAX_RECORDED_ERROR_LINES and all(
                isinstance(ms, list) and all(isinstance(m, str) for m in ms) for ms in errors.values()):
            record["cuda_errors"] = {str(line): [m[:300] for m in ms] for line, ms in errors.items()}
        if msg.get("early_verdict") in ("unbalanced", "undefined", "redeclared", "redeclared+undefined"):
            record["early_verdict"] = msg["early_verdict"]  # judged without the build as written (kernel_build)
    else:  # the source failed outside a build (its run worker gives the verdict); what it built, if anything
        record = {"status": "deferred", "message": str(msg.get("message", "")), **built}
    return record


def cacheable(record: dict) -> bool:
    """A compiler diagnostic is a property of the source; a killed compiler or a full disk is not."""
    return record["status"] == "ok" or (
        record["status"] == "compile_error" and "error:" in record["message"]
        and not re.search(r"Killed|internal compiler error|No space left|\.gch|signal", record["message"]))


def cut(text: str, n: int) -> str:
    """`text`, at most n characters (an ellipsis marks a cut)."""
    return text if len(text) <= n else text[: n - 3] + "..."


_ERROR_LINE = re.compile(r"(error|Error|ERROR|undefined reference|fatal)")
# A compiler's or linker's command line, however long its include paths make it: "... -c x.cu -o x.o",
# "... -shared ... -o ext.so". torch prints ninja's first command on its "Error building extension" line.
_COMMAND_LINE = re.compile(r"\s-c\s+\S+\s+-o\s+\S+\s*$|\s-shared\s.*\s-o\s+\S+\.so\s*$")
_BUILD_ERROR_HEAD = re.compile(r"^(Error building extension '[^']*'):.*$")


def trim_error(text: str, max_lines: int = 12, max_chars: int = 1500) -> str:
    """The first useful lines of a compiler/traceback dump, for the model's feedback."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    lines = [re.sub(r"/\S*/(build|torch_extensions|kevalrun-[^/]*)/\S*?/", "", ln) for ln in lines]
    lines = [_BUILD_ERROR_HEAD.sub(r"\1", ln) for ln in lines]
    lines = [ln for ln in lines if not ln.startswith(("ninja: build stopped", "[", "FAILED:"))
             and "nvcc --generate" not in ln and not _COMMAND_LINE.search(ln)]
    picked, seen = [], set()
    for i, ln in enumerate(lines):
        if _ERROR_LINE.search(ln):
            for j in range(max(0, i - 1), min(len(lines), i + 3)):
                if j not in seen:
                    seen.add(j)
                    picked.append(lines[j])
        if len(picked) >= max_lines:
            break
    if not picked:
        picked = lines[-max_lines:]
    out = "\n".join(picked[:max_lines])
    return out if len(out) <= max_chars else out[: max_chars - 3] + "..."
