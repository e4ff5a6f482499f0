"""Kevin's test-time beam search over refinement trajectories.

Kevin-32B (Cognition, 2025) spends a fixed test-time budget of kernels per task in rounds
instead of on independent trajectories: W trajectories each refine their kernel for S turns;
they are ranked by the best kernel score each has reached so far; the best K are kept and
each is replicated W / K times (the replicas continue from the same history and diverge by
sampling); repeat for R rounds. The paper's setting: W = 16 trajectories, keep K = 4,
S = 4 turns a round. With rounds r = 0..R-1 and slots j = 0..W-1 of a task:

    b_j(r)     = max(b_parent(j)(r-1), max_{k in the S kernels of j in round r} s_k)   (b(-1) = -inf)
    kept(r)    = the K slots of largest b(r); ties go to the lower slot index
    parent(j)  = kept(r)[j // (W / K)]                  for the slots of round r + 1
    budget     = W * S * R kernels per task             (Kevin: 16 * 4 * 2 = 128 = 16 x 8)

A round in which every trajectory of a task failed (every b_j <= `failure_score`, 0 for
rewards.kernel_score) keeps all W as they are, each once: ranking failures against each other
would collapse the search onto the trajectory that happens to come first.

Nothing here knows about models or the harness: the caller injects `refine`, which runs S
turns on a batch of trajectory states and returns each one's new state and kernel scores
(eval.py passes a rollout over all tasks at once). Only the ranking and the replication live
here, so they can be tested with a fake `refine` whose scores are known.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence


@dataclass
class BeamConfig:
    width: int = 16              # W, trajectories per task in every round
    keep: int = 4                # K, trajectories kept after a round
    steps_per_round: int = 4     # S, refinement turns a round
    rounds: int = 2              # R
    failure_score: float = 0.0   # a best score at or below this means no correct kernel yet

    @property
    def budget(self) -> int:
        """Kernels per task: W x S x R."""
        return self.width * self.steps_per_round * self.rounds

    def check(self) -> None:
        if min(self.width, self.keep, self.steps_per_round, self.rounds) < 1:
            raise ValueError(f"BeamConfig: width, keep, steps_per_round and rounds must all be >= 1, got {self}")
        if self.keep > self.width or self.width % self.keep:
            raise ValueError(f"BeamConfig: keep ({self.keep}) must divide width ({self.width}) so every "
                             "kept trajectory gets the same number of replicas")


@dataclass
class Round:
    """What one round did, per task: `parents[t][j]` is the slot of the previous round that slot
    j continued (None in round 0); `best[t][j]` is b_j after the round; `kept[t]` the slots
    kept, best first (all of them when `all_failed[t]`)."""
    index: int
    start_turn: int
    parents: list[list[int | None]]
    best: list[list[float]]
    kept: list[list[int]]
    all_failed: list[bool]


@dataclass
class BeamResult:
    states: list[Any]            # the last round's states, task-major, W per task
    best: list[list[float]]      # b_j after the last round, per task
    rounds: list[Round] = field(default_factory=list)
    budget: int = 0              # W x S x R kernels per task, as configured
    kernels: int = 0             # kernels `refine` reported, over all tasks


def select_parents(best: Sequence[float], keep: int, failure_score: float = 0.0) -> tuple[list[int], list[int]]:
    """(kept slots best first, parent slot of each next-round slot) for one task's W scores."""
    width = len(best)
    if all(b <= failure_score for b in best):
        return list(range(width)), list(range(width))
    kept = sorted(range(width), key=lambda j: (-best[j], j))[:keep]
    return kept, [j for j in kept for _ in range(width // keep)]


def beam_search(initial_states: Sequence[Any], refine: Callable[..., list[tuple[Any, list[float]]]],
                config: BeamConfig) -> BeamResult:
    """Run the search for every task at once. `initial_states` has one state per task (e.g. an
    empty history). `refine(states, *, start_turn, n_turns, parents)` gets all tasks' W states
    (task-major), the global turn the round starts at, S, and each state's parent slot (None in
    round 0), and returns one (new state, [score of each kernel it produced]) per state."""
    config.check()
    W, n_tasks = config.width, len(initial_states)
    states = [initial_states[t] for t in range(n_tasks) for _ in range(W)]
    parents: list[int | None] = [None] * (n_tasks * W)
    inherited = [float("-inf")] * (n_tasks * W)
    result = BeamResult(states=[], best=[], budget=config.budget)
    for r in range(config.rounds):
        start_turn = r * config.steps_per_round
        refined = refine(states, start_turn=start_turn, n_turns=config.steps_per_round, parents=parents)
        if len(refined) != len(states):
            raise RuntimeError(f"beam_search: refine returned {len(refined)} trajectories for {len(states)}")
        states = [state for state, _ in refined]
        best = [max([inherited[i], *scores]) for i, (_, scores) in enumerate(refined)]
        result.kernels += sum(len(scores) for _, scores in refined)
        per_task = [best[t * W:(t + 1) * W] for t in range(n_tasks)]
        record = Round(r, start_turn, [parents[t * W:(t + 1) * W] for t in range(n_tasks)], per_task, [], [])
        result.rounds.append(record)
        if r == config.rounds - 1:
            break
        next_states, next_parents, next_inherited = [], [], []
        for t, task_best in enumerate(per_task):
            kept, chosen = select_parents(task_best, config.keep, config.failure_score)
            record.kept.append(kept)
            record.all_failed.append(len(kept) == W and all(b <= config.failure_score for b in task_best))
            next_states += [states[t * W + j] for j in chosen]
            next_parents += chosen
            next_inherited += [task_best[j] for j in chosen]
        states, parents, inherited = next_states, next_parents, next_inherited
    last = result.rounds[-1]
    last.kept = [select_parents(b, config.keep, config.failure_score)[0] for b in last.best]
    last.all_failed = [all(x <= config.failure_score for x in b) for b in last.best]
    result.states, result.best = states, last.best
    return result
