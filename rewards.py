"""Rewards: the kernel score of one turn and the discounted returns of a refinement trajectory.

Kevin-32B (Cognition, 2025) scores each turn t of a refinement trajectory by

    s_t = correct_t * (0.3 + speedup_t)                       (kernel_score)

and credits a turn with what its refinements later achieved:

    sum:  R_t = sum_{k>=t} gamma^(k-t) * s_k                  (Kevin uses gamma = 0.4)
    max:  R_t = max_{k>=t} gamma^(k-t) * s_k                  (discounted_returns)

A turn scores 0 before any compiling when its response did not parse or its code broke the
rules of what a kernel may call (turn_score; the rules and the gate are kernel_gate.py's).
Kimi k1.5's length penalty is here too, off unless a caller adds it.

The scores read a verdict as a plain dict (rollout.verdict_record makes one from the harness's
EvalResult). Standard library only, so the file can be copied alone.
"""
from __future__ import annotations

import math
from typing import Iterable, Mapping


def kernel_score(verdict: Mapping, correctness_weight: float = 0.3,
                 speedup_cap: float | None = None) -> float:
    """s = correct * (correctness_weight + speedup), speedup optionally capped at speedup_cap.

    `verdict` is the harness's verdict as a dict (rollout.verdict_record); only `correct` and
    `speedup` are read, and a missing one is a KeyError. A speedup that is not a finite number
    >= 0 (inf from a claimed time of ~0 ms, NaN, None) is a measurement nobody can trust: the
    kernel is paid for its correctness alone. No verdict of the harness may raise here, or one
    candidate would stop a training run.
    """
    if not verdict["correct"]:
        return 0.0
    try:
        speedup = float(verdict["speedup"])
    except (TypeError, ValueError):
        speedup = 0.0
    if not math.isfinite(speedup) or speedup < 0:
        speedup = 0.0
    if speedup_cap is not None:
        speedup = min(speedup, speedup_cap)
    return correctness_weight + speedup


def turn_score(parse_error: str | None, gate_reason: str | None, verdict: Mapping | None,
               correctness_weight: float = 0.3, speedup_cap: float | None = None) -> float:
    """One turn's score: 0 when the response did not parse or broke a rule
    (kernel_gate.check_format), else kernel_score."""
    if parse_error or gate_reason or verdict is None:
        return 0.0
    return kernel_score(verdict, correctness_weight, speedup_cap)


RETURN_MODES = ("sum", "max")


def discounted_returns(scores: Iterable[float], gamma: float = 0.4,
                       mode: str = "sum") -> list[float]:
    """Per-turn returns of one trajectory.

    sum: R_t = sum_{k>=t} gamma^(k-t) s_k  = s_t + gamma * R_{t+1}
    max: R_t = max_{k>=t} gamma^(k-t) s_k  = max(s_t, gamma * R_{t+1})   (gamma >= 0)
    """
    if mode not in RETURN_MODES:
        raise ValueError(f"mode must be 'sum' or 'max', got {mode!r}")
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    scores = [float(s) for s in scores]
    returns = [0.0] * len(scores)
    later = None
    for t in range(len(scores) - 1, -1, -1):
        if later is None:
            returns[t] = scores[t]
        elif mode == "sum":
            returns[t] = scores[t] + gamma * later
        else:
            returns[t] = max(scores[t], gamma * later)
        later = returns[t]
    return returns


def length_penalty(lengths: list[int], correct: list[bool], weight: float = 1.0) -> list[float]:
    """Kimi k1.5's length reward over one group of responses to the same prompt (off by default).

    lambda_i = 0.5 - (len_i - min_len) / (max_len - min_len); a correct response gets
    lambda_i, an incorrect one min(0, lambda_i). All lengths equal: 0 for everyone.
    The caller adds weight * this to the score.
    """
    if len(lengths) != len(correct):
        raise ValueError(f"{len(lengths)} lengths but {len(correct)} correctness flags")
    if not lengths:
        return []
    lo, hi = min(lengths), max(lengths)
    if hi == lo:
        return [0.0] * len(lengths)
    out = []
    for n, ok in zip(lengths, correct):
        lam = 0.5 - (n - lo) / (hi - lo)
        out.append(weight * (lam if ok else min(0.0, lam)))
    return out
