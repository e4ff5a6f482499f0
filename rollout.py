"""Multi-turn rollout: tasks in, training samples out, the way Kevin-32B does it.

For every task, G trajectories refine a kernel over T turns. A turn: each trajectory's prompt
(the task plus its earlier attempts' code, summary and feedback, never the thinking:
summarize.build_prompt), one batched engine.generate, the response parsed and gated
(kernel_gate.check_format), the harness's verdicts (the injected evaluate_batch), the score
(rewards.kernel_score). After the last turn every (trajectory, turn) is a `Sample` with its
discounted return R_t = sum_{k >= t} gamma^(k - t) s_k; the task id is the GRPO group key.

The schedule: a trajectory whose verdict needs no harness (a format error, a verdict
`reusing_verdicts` holds) writes its next turn at once, and each harness call judges every
candidate written so far, whatever its turn (RolloutConfig.overlap_turns; off: turn by turn).
A task whose reference fails (reference_error) returns no samples; a candidate the harness could
not judge (harness_error) has no score and is left out of its group.

Token ids are kept end to end: the prompt is tokenised once, the completion is the ids as sampled;
`loss_mask` is 1 on sampled tokens only. The engine is anything with generate, encode_prompt and
count_tokens (engines.Engine). eval.py continues trajectories from given histories at a turn
offset (beam search, --resume) and reads each turn's samples through `on_turn`.
"""
from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

import kernel_gate
import rewards
import summarize
from engines import Completion, Engine


@dataclass
class Sample:
    """One (trajectory, turn) training sample. `loss_mask` is aligned with `input_ids`
    (prompt_ids + completion_ids): 0 on the prompt, 1 on every sampled token."""
    task_id: str                 # GRPO group key
    trajectory: int              # 0..G-1 within the task
    turn: int                    # 0..T-1
    prompt_ids: list[int]
    completion_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float] | None
    text: str                    # the response, decoded from completion_ids
    truncated: bool              # cut at max_new_tokens
    status: str                  # harness status, or "format_error" from parse/gate
    score: float                 # s_t
    discounted_return: float     # R_t
    speedup: float
    code: str | None
    feedback: str                # the line the next turn's prompt shows
    # The harness's verdict as eval.py records it (defaults: no verdict, e.g. a format error).
    correct: bool = False
    ref_ms: float = 0.0
    candidate_ms: float = 0.0
    timing_ok: bool = False
    message: str = ""
    summary: str = ""            # the response's own summary, as later prompts show it
    boundary: str = ""           # what the candidate's processes ran behind (kernel_eval.EvalResult.boundary)

    @property
    def input_ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids


@dataclass(kw_only=True)
class Sampling:
    """The sampling settings train.py and eval.py share, each a flag of both (flags.py); the defaults are
    train.py's smoke run's, eval.py replaces them with Kevin's protocol."""
    trajectories: int = 4             # G: trajectories per task
    turns: int = 2                    # T: refinement turns per trajectory
    max_prompt_tokens: int = 8192     # prompt budget; the earliest turns' attempts are dropped first
    max_new_tokens: int = 2560        # tokens per response (the smoke run's: room for an oracle answer in bytes)
    temperature: float = 1.0          # sampling temperature (train.py: also the one of the loss's log-probs)
    top_p: float = 1.0                # nucleus sampling; below 1, samples from a distribution the loss does not model
    seed: int = 0                     # seeds the sampling (train.py: also a tiny model's weights and the task draws)


@dataclass
class RolloutConfig:
    n_trajectories: int = 16          # G (Kevin: 16)
    n_turns: int = 4                  # T (Kevin: 4)
    max_new_tokens: int = 16384
    max_prompt_tokens: int = 8192
    temperature: float = 0.9
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    language: str = "cuda"            # "cuda" on GPU, "cpp" in CPU mode
    gamma: float = 0.4
    return_mode: str = "sum"          # "sum" or "max" (rewards.discounted_returns)
    correctness_weight: float = 0.3
    speedup_cap: float | None = None  # Kevin: no cap
    # Kevin's "not okay" ratio: QwQ's thinking normally opens with "Okay"; a rising share of
    # thinking that does not is an early sign of the policy drifting into junk.
    expected_thinking_opening: str = "Okay"
    # DAPO's overlong filtering: train on nothing from completions cut at max_new_tokens.
    mask_truncated: bool = False
    # A trajectory whose verdict is known without the harness (a format error, a verdict
    # reusing_verdicts holds) writes its next turn at once, and the harness judges it in one batch
    # with the other trajectories' earlier turns. Off: every turn waits for all verdicts of the
    # turn before (eval.py: its sampling is seeded per turn, so a resumed run draws the same).
    overlap_turns: bool = True


# ---------------------------------------------------------------------------------------
# The rollout


@dataclass
class _Turn:
    prompt_ids: list[int]
    completion: Completion
    status: str
    score: float
    speedup: float
    code: str | None
    summary: str
    feedback: str
    thinking_opens_as_expected: bool
    correct: bool = False
    ref_ms: float = 0.0
    candidate_ms: float = 0.0
    timing_ok: bool = False
    message: str = ""
    timeout_seconds: float = 0.0  # seconds the harness waited on this candidate's phase that timed out
    build_reused: bool | None = None  # its build came from the harness's cache (None: not known, or no build)
    early_verdict: str = ""  # a compile error judged from a failed header tier: the rule (EvalResult.early_verdict)
    verdict_reused: bool = False  # the verdict of an earlier identical (reference, code) pair (reusing_verdicts)
    boundary: str = ""
    seconds: dict = field(default_factory=dict)  # the harness's phases for this candidate (EvalResult.seconds)


@dataclass
class _Trajectory:
    task_index: int
    index: int
    history: list = field(default_factory=list)   # summarize.Attempt records
    turns: list[_Turn] = field(default_factory=list)


REFERENCE_ERROR = "reference_error"  # kernel_eval's status for a task whose own reference failed
HARNESS_ERROR = "harness_error"  # kernel_eval's status for a candidate it could not judge: no verdict


def verdict_record(result: Any) -> dict:
    """The harness's verdict as a plain dict, the one form read outside kernel_eval (the rollout,
    rewards.kernel_score, summarize.feedback, eval.py's records): kernel_eval.EvalResult (a
    dataclass) becomes its fields; a dict (a stored record, a stand-in evaluator's) is copied."""
    if isinstance(result, Mapping):
        return dict(result)
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        return dataclasses.asdict(result)
    raise TypeError(f"a verdict is kernel_eval.EvalResult or a dict, got {type(result).__name__}")


def rollout(tasks: Sequence[Any], engine: Engine, evaluate_batch: Callable[[list[tuple[str, str]]], list],
            config: RolloutConfig, *, histories: Sequence[Sequence[summarize.Attempt]] | None = None,
            start_turn: int = 0,
            on_turn: Callable[[int, list[Sample]], None] | None = None) -> tuple[list[Sample], list[dict]]:
    """Run G trajectories x T turns on every task; return the samples (task-major, then
    trajectory, then turn) and one stats dict per turn. `tasks` need `.task_id` and
    `.reference_src`; `evaluate_batch(pairs)` returns one result per (reference, candidate)
    pair with status/correct/speedup/message (kernel_eval.EvalResult or a dict; verdict_record).

    `histories` (one list of earlier attempts per trajectory, task-major, G per task) and
    `start_turn` continue trajectories that already ran `start_turn` turns (beam search's
    replicas, eval.py's --resume): their prompts show those attempts, and samples are
    numbered from `start_turn`. Returns cover the turns run here only. `on_turn(turn,
    samples)` is called as soon as each turn is judged, with that turn's samples, whose
    `discounted_return` is NaN (the later scores it depends on do not exist yet)."""
    if not tasks:
        raise ValueError("rollout: the task list is empty")
    if config.n_trajectories < 1 or config.n_turns < 1:
        raise ValueError(f"RolloutConfig needs n_trajectories >= 1 and n_turns >= 1, got "
                         f"{config.n_trajectories} and {config.n_turns}")
    if config.return_mode not in rewards.RETURN_MODES:
        raise ValueError(f"RolloutConfig.return_mode must be 'sum' or 'max', got {config.return_mode!r}")
    trajectories = [_Trajectory(t, g) for t in range(len(tasks)) for g in range(config.n_trajectories)]
    if histories is not None:
        if len(histories) != len(trajectories):
            raise ValueError(f"rollout: {len(histories)} histories for {len(tasks)} tasks x "
                             f"{config.n_trajectories} trajectories = {len(trajectories)}")
        for trajectory, history in zip(trajectories, histories):
            trajectory.history = list(history)
    if start_turn < 0:
        raise ValueError(f"rollout: start_turn must be >= 0, got {start_turn}")
    n_turns, thinking_open = config.n_turns, getattr(engine, "prompt_opens_thinking", False)
    known = getattr(evaluate_batch, "known", None)   # reusing_verdicts: a verdict it holds already
    waiting: dict[int, tuple] = {}  # row -> (prompt ids, completion, parsed response, pair) for the harness
    stats: list[dict] = []
    broken: set[int] = set()  # indexes of tasks whose reference failed (reference_error)

    def record(row: int, prompt, completion, parsed, rejection, verdict) -> None:
        trajectory = trajectories[row]
        done = _turn_record(prompt, completion, parsed, rejection, verdict, thinking_open, config)
        trajectory.turns.append(done)
        trajectory.history.append(summarize.Attempt(code=done.code or "", summary=done.summary,
                                                    feedback=done.feedback))
        if done.status == REFERENCE_ERROR:
            broken.add(trajectory.task_index)

    def report_finished_turns() -> None:  # in turn order: a trajectory finishes turn t before t + 1
        while len(stats) < n_turns and all(len(tr.turns) > len(stats) for tr in trajectories):
            turn = len(stats)
            turns = [tr.turns[turn] for tr in trajectories]
            stats.append(dict(turn_stats(start_turn + turn, turns),
                              reference_error_tasks=sorted(tasks[i].task_id for i in broken)))
            if on_turn is not None:
                on_turn(start_turn + turn, [_sample(tasks[tr.task_index].task_id, tr.index, start_turn + turn,
                                                    t, float("nan"), config) for tr, t in zip(trajectories, turns)])

    while True:
        rows = [r for r, tr in enumerate(trajectories) if len(tr.turns) < n_turns and r not in waiting]
        if rows:  # a generation round: every trajectory whose last verdict is known writes its next turn
            prompt_ids = [engine.encode_prompt(summarize.build_prompt(
                tasks[trajectories[r].task_index].reference_src, trajectories[r].history,
                language=config.language, count_tokens=engine.count_tokens,
                max_prompt_tokens=config.max_prompt_tokens)) for r in rows]
            # Fresh trajectories of a task share their first prompt; continued ones need not.
            shared_prompt = histories is None and all(not tr.turns for tr in trajectories)
            completions = _generate_turn(engine, prompt_ids, shared_prompt, config)
            if len(completions) != len(rows):
                raise RuntimeError(f"the engine returned {len(completions)} completions for {len(rows)} prompts")
            went_on = False
            for r, prompt, completion in zip(rows, prompt_ids, completions):
                parsed, rejection, pair = _read(completion, tasks[trajectories[r].task_index], thinking_open, config)
                if trajectories[r].task_index in broken:  # its reference failed earlier: not judged again
                    rejection, verdict = None, {"status": REFERENCE_ERROR,
                                                "message": "the task's reference failed in an earlier turn"}
                else:
                    verdict = known(pair) if pair and known else None
                if pair and verdict is None:
                    waiting[r] = (prompt, completion, parsed, pair)
                else:
                    record(r, prompt, completion, parsed, rejection, verdict)
                    went_on |= len(trajectories[r].turns) < n_turns
            report_finished_turns()
            if went_on and (config.overlap_turns or not waiting):
                continue
        if not waiting:
            break
        rows = list(waiting)  # a harness round: every candidate written so far, whatever its turn
        verdicts = evaluate_batch([waiting[r][3] for r in rows])
        if len(verdicts) != len(rows):
            raise RuntimeError(f"evaluate_batch returned {len(verdicts)} results for {len(rows)} candidates")
        for r, verdict in zip(rows, verdicts):
            prompt, completion, parsed, _ = waiting.pop(r)
            record(r, prompt, completion, parsed, None, verdict_record(verdict))
        report_finished_turns()
    kept = [tr for tr in trajectories if tr.task_index not in broken]
    return _samples(tasks, kept, config, start_turn), stats


def reusing_verdicts(evaluate_batch: Callable[[list[tuple[str, str]]], list]):
    """evaluate_batch that judges each distinct (reference, code) pair once per run, for a policy that
    repeats itself and would otherwise rebuild and rerun the same kernels every step. With timing on,
    a repeated kernel keeps its first measured speedup (one measurement of identical code on the same
    machine, not a new one each time: its noise is frozen too). A pair's first appearance gets the harness's
    verdict; every other appearance (later in the batch, or in a later call) gets a copy of it
    marked verdict_reused, so the turn stats count it as reused, not as judged again."""
    verdicts = {}

    def known(pair):
        """The verdict this holds for `pair` (marked reused), or None: the rollout need not wait for it."""
        return dict(verdict_record(verdicts[pair]), verdict_reused=True) if pair in verdicts else None

    def evaluate_once(pairs, **kwargs):
        judged_now = sorted(set(pairs) - verdicts.keys())
        if judged_now:
            verdicts.update(zip(judged_now, evaluate_batch(judged_now, **kwargs)))
        first = set(judged_now)
        out = []
        for pair in pairs:
            if pair in first:
                first.discard(pair)
                out.append(verdicts[pair])
            else:
                out.append(known(pair))
        return out
    evaluate_once.known = known
    return evaluate_once


def _generate_turn(engine: Engine, prompt_ids, shared_prompt, config) -> list[Completion]:
    kwargs = dict(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                  top_p=config.top_p, stop=config.stop)
    G = config.n_trajectories
    if shared_prompt:
        # A task's G trajectories share the first prompt: one prompt with n=G lets an
        # engine with prefix caching prefill it once.
        groups = engine.generate(prompt_ids[::G], n=G, **kwargs)
        return [c for group in groups for c in group]
    return [group[0] for group in engine.generate(prompt_ids, n=1, **kwargs)]


def read_response(text: str, language: str, thinking_open: bool = False) -> tuple:
    """(parsed response, why it is a format error or None): the parser's refusal, no code, or the gate's."""
    parsed = summarize.parse_response(text, thinking_open)
    rejection = parsed.error or (None if parsed.code else "no code in the response")
    if rejection is None:
        rejection = kernel_gate.check_format(parsed.code, language)
    return parsed, rejection


def _read(completion: Completion, task, thinking_open: bool, config) -> tuple:
    """(parsed response, why it is a format error or None, the (reference, code) pair to judge or None)."""
    parsed, rejection = read_response(completion.text, config.language, thinking_open)
    return parsed, rejection, (task.reference_src, parsed.code) if rejection is None else None


def _turn_record(prompt_ids, completion, parsed, rejection, verdict: dict | None, thinking_open: bool,
                 config) -> _Turn:
    """A judged turn: a format error (`rejection`, no verdict) or the harness's verdict and its score."""
    opening = (parsed.thinking or completion.text).lstrip()
    expected = opening.startswith(config.expected_thinking_opening)
    if verdict is None:
        return _Turn(prompt_ids, completion, "format_error", 0.0, 0.0, parsed.code, parsed.summary or "",
                     summarize.feedback(rejection), expected, message=rejection)
    score = 0.0 if verdict.get("status") in (REFERENCE_ERROR, HARNESS_ERROR) else rewards.kernel_score(
        verdict, correctness_weight=config.correctness_weight, speedup_cap=config.speedup_cap)
    return _Turn(prompt_ids, completion, verdict.get("status"), score,
                 float(verdict.get("speedup", 0.0) or 0.0), parsed.code,
                 parsed.summary or "", summarize.feedback(verdict), expected,
                 correct=bool(verdict.get("correct", False)),
                 ref_ms=float(verdict.get("ref_ms", 0.0) or 0.0),
                 candidate_ms=float(verdict.get("candidate_ms", 0.0) or 0.0),
                 timing_ok=bool(verdict.get("timing_ok", True)),
                 message=str(verdict.get("message", "") or ""),
                 timeout_seconds=float(verdict.get("timeout_seconds", 0.0) or 0.0),
                 build_reused=verdict.get("build_reused"),
                 early_verdict=str(verdict.get("early_verdict", "") or ""),
                 verdict_reused=bool(verdict.get("verdict_reused", False)),
                 boundary=str(verdict.get("boundary", "") or ""),
                 seconds=dict(verdict.get("seconds") or {}))


STATS_MESSAGE_CHARS = 200  # of a message in the turn's stats (a timeout's: the phase and the limit come first)


def first_diagnostic(message: str) -> str:
    """A verdict message's first diagnostic: its first line after the first with "error:", else its first
    line (a compile error's message opens "compilation failed:", "Error building extension")."""
    lines = [line.strip() for line in message.split("\n") if line.strip()]
    return next((line for line in lines[1:] if re.search("error:", line, re.I)), lines[0] if lines else "")


def verdict_line(status: str, message: str) -> str:
    """"status: the message's first diagnostic", in STATS_MESSAGE_CHARS: what the turn waited for, in the
    step's stats."""
    first = first_diagnostic(message)
    return f"{status}: {first}"[:STATS_MESSAGE_CHARS] if first else status


def turn_stats(turn: int, turns: list[_Turn]) -> dict:
    """What train.py logs per turn: status counts, mean score, best speedup, response lengths,
    truncation, Kevin's "not okay" ratio, why responses were format errors, and where the harness's
    time went: the distinct kernels compiled now and those whose build came from its cache (identical
    candidates share one build, so both count distinct code), the verdicts reused rather than judged
    again, the seconds waited on timed-out phases (a reused verdict's were spent when it was first
    judged) and the messages that say which limit each broke, and the verdict the turn waited for
    last: its phases and its status with its first diagnostic."""
    lengths = [len(t.completion.token_ids) for t in turns]
    judged_now = [t for t in turns if not t.verdict_reused]
    last = max((t for t in judged_now if t.seconds), key=lambda t: t.seconds.get("since_batch_start", 0.0),
               default=None)  # the harness's last verdict (a response without code has no phases)
    n = max(len(turns), 1)
    return {
        "turn": turn,
        "n": len(turns),
        "status_counts": dict(Counter(t.status for t in turns)),
        "correct_rate": sum(t.status == "correct" for t in turns) / n,
        "mean_score": sum(t.score for t in turns) / n,
        "best_speedup": max((t.speedup for t in turns), default=0.0),
        "mean_response_tokens": sum(lengths) / n,
        "max_response_tokens": max(lengths, default=0),
        "truncated_rate": sum(t.completion.finish_reason == "length" for t in turns) / n,
        "not_okay_ratio": sum(not t.thinking_opens_as_expected for t in turns) / n,
        "timeout_seconds": sum(t.timeout_seconds for t in judged_now),
        # which limits they broke: "candidate timed out during check (limit 38 s: 30 x the reference's ...)"
        "timeout_messages": sorted({t.message[:STATS_MESSAGE_CHARS] for t in judged_now if t.status == "timeout"}),
        # why responses were refused before the harness ("no code in the response", the gate's rule)
        "format_error_reasons": dict(Counter(verdict_line("format_error", t.message) for t in turns
                                             if t.status == "format_error")),
        "kernels_compiled": len({t.code for t in judged_now if t.build_reused is False}),
        "builds_reused": len({t.code for t in judged_now if t.build_reused is True}),
        "verdicts_reused": len(turns) - len(judged_now),
        # the phases of the candidate whose verdict came last: the turn waited for it
        "slowest_seconds": {k: round(v, 1) for k, v in (last.seconds if last else {}).items()},
        "slowest_verdict": verdict_line(last.status, last.message) if last else "",
        # each verdict judged now: seconds from its compile's start to its verdict, by status
        "latency_by_status": {status: [round(t.seconds["latency"], 2) for t in judged_now
                                       if t.status == status and "latency" in t.seconds]
                              for status in sorted({t.status for t in judged_now if "latency" in t.seconds})},
        # each distinct kernel that failed to compile now: [latency s, the early rule or "" (built as
        # written), its first diagnostic]: which compile errors wait for a whole build, and why
        "compile_errors": [[round(t.seconds["latency"], 2), t.early_verdict,
                            first_diagnostic(t.message)[:STATS_MESSAGE_CHARS]]
                           for t in {t.code: t for t in judged_now if t.status == "compile_error"
                                     and t.build_reused is False and "latency" in t.seconds}.values()],
    }


def _sample(task_id: str, trajectory: int, turn: int, t: _Turn, ret: float, config) -> Sample:
    truncated = t.completion.finish_reason == "length"
    trained = 0 if (truncated and config.mask_truncated) else 1
    return Sample(
        task_id=task_id, trajectory=trajectory, turn=turn,
        prompt_ids=list(t.prompt_ids), completion_ids=list(t.completion.token_ids),
        loss_mask=[0] * len(t.prompt_ids) + [trained] * len(t.completion.token_ids),
        logprobs=t.completion.logprobs, text=t.completion.text, truncated=truncated,
        status=t.status, score=t.score, discounted_return=float(ret), speedup=t.speedup,
        code=t.code, feedback=t.feedback, correct=t.correct, ref_ms=t.ref_ms,
        candidate_ms=t.candidate_ms, timing_ok=t.timing_ok, message=t.message, summary=t.summary,
        boundary=t.boundary)


def _samples(tasks, trajectories, config, start_turn: int = 0) -> list[Sample]:
    samples = []
    for tr in trajectories:
        returns = rewards.discounted_returns([t.score for t in tr.turns], gamma=config.gamma,
                                             mode=config.return_mode)
        for turn_index, (t, ret) in enumerate(zip(tr.turns, returns)):
            if t.status == HARNESS_ERROR:  # no verdict: nothing to learn from this sample
                continue
            samples.append(_sample(tasks[tr.task_index].task_id, tr.index, start_turn + turn_index,
                                   t, float(ret), config))
    return samples


def collate_samples(samples: Sequence[Sample], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad samples into a batch. The loss mask comes from the samples, never from the
    pad id (which may equal EOS, a token the model must learn to emit)."""
    width = max(len(s.input_ids) for s in samples)
    batch = {
        "input_ids": torch.full((len(samples), width), pad_token_id, dtype=torch.long),
        "attention_mask": torch.zeros((len(samples), width), dtype=torch.long),
        "loss_mask": torch.zeros((len(samples), width), dtype=torch.long),
        "returns": torch.tensor([s.discounted_return for s in samples], dtype=torch.float32),
    }
    for row, sample in enumerate(samples):
        ids = sample.input_ids
        batch["input_ids"][row, :len(ids)] = torch.tensor(ids)
        batch["attention_mask"][row, :len(ids)] = 1
        batch["loss_mask"][row, :len(ids)] = torch.tensor(sample.loss_mask)
    return batch


def micro_batches(samples: Sequence[Sample], pad_token_id: int, token_budget: int, device) -> list[dict]:
    """Samples sorted by length and packed, right-padded, under a budget of padded tokens per
    micro-batch (less padding than packing in sample order), on `device`. Each batch also holds
    `rows` (the samples' indices). No attention mask: under the causal mask a right-padded row's real
    tokens never see its pads, and pads are never trained."""
    order = sorted(range(len(samples)), key=lambda i: len(samples[i].input_ids))
    groups, current = [], []
    for i in order:
        width = len(samples[i].input_ids)
        if current and width * (len(current) + 1) > token_budget:
            groups.append(current)
            current = []
        current.append(i)
    if current:
        groups.append(current)
    batches = []
    for rows in groups:
        batch = collate_samples([samples[i] for i in rows], pad_token_id)
        batch = {"input_ids": batch["input_ids"].to(device), "loss_mask": batch["loss_mask"].to(device), "rows": rows}
        batches.append(batch)
    return batches


def empty_micro_batch(pad_token_id: int, device) -> dict:
    """An all-masked row: lets a rank with fewer micro-batches join every FSDP2 collective."""
    return {"input_ids": torch.full((1, 2), pad_token_id, device=device),
            "loss_mask": torch.zeros(1, 2, dtype=torch.long, device=device), "rows": []}
