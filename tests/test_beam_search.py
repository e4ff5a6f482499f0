"""Tests for beam_search.py with a fake refine whose scores are known: which trajectories
survive each round, replication counts, ties, all-failed rounds, the budget."""
import pytest

import beam_search
from beam_search import BeamConfig


def fake_refine(table, calls):
    """A state is its lineage: a tuple of (round, slot) pairs. The scores of the kernels a
    slot produces in a round come from `table[(task, round, slot)]` (default: all failed)."""
    def refine(states, *, start_turn, n_turns, parents):
        calls.append((start_turn, n_turns, list(parents)))
        width = len(states) // len({s[0] for s in states})
        out = []
        for i, state in enumerate(states):
            task, slot, rnd = state[0], i % width, start_turn // n_turns
            scores = table.get((task, rnd, slot), [0.0] * n_turns)
            assert len(scores) == n_turns
            out.append((state + ((rnd, slot),), scores))
        return out
    return refine


def test_select_parents_ranks_breaks_ties_by_slot_and_replicates():
    kept, parents = beam_search.select_parents([0.3, 2.0, 0.0, 2.0, 1.3, 0.3, 0.0, 0.0], keep=4)
    assert kept == [1, 3, 4, 0]            # 2.0 (slot 1 before 3), 1.3, then 0.3 (slot 0 before 5)
    assert parents == [1, 1, 3, 3, 4, 4, 0, 0]
    kept, parents = beam_search.select_parents([0.0] * 4, keep=2)
    assert kept == parents == [0, 1, 2, 3]  # all failed: keep them all, no collapse onto slot 0


def test_beam_search_rounds_survivors_replicas_and_budget():
    # Task "a": after round 0 the best are slots 5 (3.0), 2 (1.3), 1 and 7 (tie at 0.8: 1 first).
    # Task "b": every kernel fails in round 0, so all 8 continue as they are.
    cfg = BeamConfig(width=8, keep=4, steps_per_round=2, rounds=3)
    table = {("a", 0, 5): [0.0, 3.0], ("a", 0, 2): [1.3, 0.0], ("a", 0, 7): [0.8, 0.3],
             ("a", 0, 1): [0.3, 0.8], ("a", 0, 0): [0.3, 0.3],
             # round 1, task a: the replicas of slot 2 (slots 2, 3) beat the inherited 3.0
             ("a", 1, 3): [0.0, 4.0], ("a", 1, 2): [3.5, 0.0],
             # round 1, task b: one slot finds a correct kernel
             ("b", 1, 6): [0.0, 0.3]}
    calls = []
    result = beam_search.beam_search([("a",), ("b",)], fake_refine(table, calls), cfg)
    assert result.budget == 8 * 2 * 3 and result.kernels == 2 * 8 * 2 * 3
    assert [c[:2] for c in calls] == [(0, 2), (2, 2), (4, 2)]
    r0, r1, r2 = result.rounds
    assert r0.parents == [[None] * 8, [None] * 8]
    assert r0.kept == [[5, 2, 1, 7], list(range(8))] and r0.all_failed == [False, True]
    assert r1.parents == [[5, 5, 2, 2, 1, 1, 7, 7], list(range(8))]
    # Inherited bests: replicas of slot 5 keep 3.0 without producing anything better.
    assert r1.best[0] == [3.0, 3.0, 3.5, 4.0, 0.8, 0.8, 0.8, 0.8]
    assert r1.kept[0] == [3, 2, 0, 1] and r1.kept[1][0] == 6 and not r1.all_failed[1]
    assert r2.parents == [[3, 3, 2, 2, 0, 0, 1, 1], [6, 6, 0, 0, 1, 1, 2, 2]]
    # The states carry their lineage: slot 0 of round 2 of task a descends from round-1 slot 3,
    # which descends from round-0 slot 2.
    assert result.states[0] == ("a", (0, 2), (1, 3), (2, 0))
    assert result.states[8 + 2] == ("b", (0, 0), (1, 0), (2, 2))
    assert result.best[0][:2] == [4.0, 4.0]


def test_beam_config_refuses_uneven_replication():
    with pytest.raises(ValueError, match="must divide width"):
        beam_search.beam_search([("a",)], fake_refine({}, []), BeamConfig(width=6, keep=4))
    with pytest.raises(ValueError, match=">= 1"):
        BeamConfig(rounds=0).check()
    assert BeamConfig().budget == 16 * 4 * 2   # Kevin: same budget as 16 trajectories x 8 turns
