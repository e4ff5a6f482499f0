"""Tests for rewards.py: the kernel score, the turn score and the discounted returns against
hand-computed values and their definitions, Kimi's length penalty, and the file alone."""
import os
import shutil
import subprocess
import sys

import pytest

from rewards import discounted_returns, kernel_score, length_penalty, turn_score

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_kernel_score_hand_values():
    assert kernel_score({"correct": True, "speedup": 1.85}) == pytest.approx(2.15)
    assert kernel_score({"correct": False, "speedup": 0.0}) == 0.0
    assert kernel_score({"correct": True, "speedup": 9.0}, speedup_cap=4.0) == pytest.approx(4.3)
    assert kernel_score({"correct": True, "speedup": 2.0}, correctness_weight=1.0) == 3.0
    with pytest.raises(KeyError, match="speedup"):
        kernel_score({"correct": True})


@pytest.mark.parametrize("speedup", [float("inf"), float("nan"), -1.0, None, 1e308 * 10])
def test_untrustworthy_speedups_pay_correctness_alone_and_never_raise(speedup):
    # 5e-324 ms claimed by a candidate gives ref_ms / 5e-324 = inf: training must go on.
    import kernel_eval
    import rollout
    result = rollout.verdict_record(
        kernel_eval.EvalResult(status="correct", compiled=True, correct=True, speedup=speedup))
    assert kernel_score(result) == pytest.approx(0.3)
    assert kernel_score(result, speedup_cap=4.0) == pytest.approx(0.3)
    returns = discounted_returns([kernel_score(result), 0.0, kernel_score(result)], gamma=0.4)
    assert returns == pytest.approx([0.3 + 0.4 * 0.4 * 0.3, 0.4 * 0.3, 0.3])
    assert kernel_score({"correct": False, "speedup": speedup}) == 0.0


def test_turn_score():
    good = {"correct": True, "speedup": 1.0}
    assert turn_score(None, None, good) == pytest.approx(1.3)
    assert turn_score("no code", None, good) == 0.0
    assert turn_score(None, "uses torch.relu", good) == 0.0


def test_discounted_returns_hand_values():
    s = [0.0, 1.3, 0.0, 2.0]
    # sum: R3 = 2; R2 = 0 + .4*2 = .8; R1 = 1.3 + .4*.8 = 1.62; R0 = .4*1.62 = .648
    assert discounted_returns(s, 0.4, "sum") == pytest.approx([0.648, 1.62, 0.8, 2.0])
    # max: R3 = 2; R2 = max(0, .8) = .8; R1 = max(1.3, .32) = 1.3; R0 = max(0, .52) = .52
    assert discounted_returns(s, 0.4, "max") == pytest.approx([0.52, 1.3, 0.8, 2.0])
    assert discounted_returns([], 0.4) == []
    assert discounted_returns([3.0], 0.9, "max") == [3.0]


def test_discounted_returns_match_the_definition():
    import random
    rng = random.Random(0)
    for _ in range(50):
        s = [rng.choice([0.0, rng.uniform(0, 5)]) for _ in range(rng.randint(1, 8))]
        g = rng.uniform(0, 1)
        n = len(s)
        want_sum = [sum(g ** (k - t) * s[k] for k in range(t, n)) for t in range(n)]
        want_max = [max(g ** (k - t) * s[k] for k in range(t, n)) for t in range(n)]
        assert discounted_returns(s, g, "sum") == pytest.approx(want_sum)
        assert discounted_returns(s, g, "max") == pytest.approx(want_max)
    with pytest.raises(ValueError):
        discounted_returns([1.0], 0.4, "mean")


def test_length_penalty_kimi_formula():
    # lengths 10, 20, 30: lambda = .5, 0, -.5; incorrect ones keep only the negative part
    assert length_penalty([10, 20, 30], [True, True, True]) == pytest.approx([0.5, 0.0, -0.5])
    assert length_penalty([10, 20, 30], [False, True, False]) == pytest.approx([0.0, 0.0, -0.5])
    assert length_penalty([5, 5], [True, False]) == [0.0, 0.0]


def test_imports_with_only_the_standard_library(tmp_path):
    shutil.copy(os.path.join(ROOT, "rewards.py"), tmp_path)
    out = subprocess.run([sys.executable, "-S", "-E", "-c",
                          "import rewards, sys; assert 'torch' not in sys.modules; "
                          "print(rewards.kernel_score({'correct': True, 'speedup': 1.0}))"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1.3"
