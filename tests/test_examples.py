"""The learning demo's pieces: examples/learning_report.py (table, done-when check, PNG) and
examples/learning_run.sh end to end on the CPU at its smallest size (slow)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import learning_report  # noqa: E402


def _row(step, correct, reward, per_turn=None, statuses=None):
    return {"step": step, "correct_rate": correct, "reward_mean": reward,
            "correct_rate_per_turn": per_turn or [correct, correct],
            "status_counts": statuses or {"correct": 1, "format_error": 1}, "seconds_step": 10.0}


def _write_run(folder, rows):
    os.makedirs(folder)
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return os.path.join(folder, "metrics.jsonl")


def test_done_when_by_hand():
    rising = [_row(s, 0.1 if s <= 5 else 0.3, 0.03 if s <= 5 else 0.09) for s in range(1, 11)]
    check = learning_report.done_when(rising)
    assert check["enough_steps"] and check["rate_ok"] and check["reward_rose"] and check["met"]
    assert check["first_correct"] == pytest.approx(0.1) and check["last_correct"] == pytest.approx(0.3)
    # +20 points from 30%: neither 2x nor +30 points
    modest = [_row(s, 0.3 if s <= 5 else 0.5, 0.1 if s <= 5 else 0.2) for s in range(1, 11)]
    assert not learning_report.done_when(modest)["rate_ok"]
    # +30 points from 40% passes by the second rule
    assert learning_report.done_when([_row(s, 0.4 if s <= 5 else 0.7, s) for s in range(1, 11)])["met"]
    # reward must rise with the rate
    assert not learning_report.done_when([_row(s, 0.1 if s <= 5 else 0.3, 1.0 - s / 10) for s in range(1, 11)])["met"]
    # fewer than 2 x window steps: the windows overlap, never "met"
    short = learning_report.done_when([_row(s, 0.1 if s <= 2 else 0.9, s) for s in range(1, 8)])
    assert short["rate_ok"] and not short["enough_steps"] and not short["met"]


def test_report_table_and_png(tmp_path):
    rows = [_row(s, 0.1 * s, 0.03 * s, per_turn=[0.1 * s, 0.05 * s],
                 statuses={"correct": s, "format_error": 10 - s}) for s in range(1, 11)]
    for r in rows:
        r.update(advantage_nonzero=0.75, approx_kl=0.03)
    a = _write_run(str(tmp_path / "rl_seed0"), rows)
    b = _write_run(str(tmp_path / "rl_seed1"), rows[:3])
    png = str(tmp_path / "seeds.png")
    runs = [learning_report.load_run(a), learning_report.load_run(b)]
    text = learning_report.report(runs)
    assert "**rl_seed0** (10 steps)" in text and "Done-when: **met**" in text
    assert "too few steps: 3 < 10" in text and "Runs meeting it: 1 of 2." in text
    # step 1 of seed 0: 10% correct, turns 10.0 / 5.0, format errors 90%, advantages 75% nonzero, KL 0.03
    assert "| 1 | 10.0% | 10.0 / 5.0 | 0.0300 | 90.0% | 75.0% | 0.03 | 10 |" in text
    assert learning_report.main([a, b, str(tmp_path / "none" / "metrics.jsonl"), "--png", png]) == 0
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_report_table_shows_where_the_steps_evaluation_went():
    """train.py's rows carry evaluation seconds, harness calls, timeout seconds and the harness's counts; the table
    shows evaluation's share of the step beside them, and "-" for a row written before the counts."""
    new = dict(_row(2, 0.5, 0.15), seconds_evaluation=8.0, timeout_seconds=3.5, kernels_compiled=5,
               builds_reused=2, verdicts_reused=7, harness_calls=1)
    old = dict(_row(1, 0.5, 0.15), seconds_evaluation=9.0)
    table = learning_report.run_table({"rows": [old, new], "extra": {}})
    assert "| eval s (share) | harness calls | timeouts s | compiled / cached / verdicts reused | step s |" in table
    assert table.splitlines()[-1].endswith("| 8 (80%) | 1 | 4 | 5 / 2 / 7 | 10 |"), table
    assert table.splitlines()[-2].endswith("| 9 (90%) | - | - | - | 10 |"), table


def test_report_says_the_median_and_slowest_evaluation_and_each_timeouts_limit():
    limit = "candidate timed out during check (limit 38 s: 30 x the reference's 1.1 s + 5 s)"
    rows = [dict(_row(1, 0.5, 0.15), seconds_evaluation=83.0, timeout_seconds=38.0, timeout_messages=[limit]),
            dict(_row(2, 0.5, 0.15), seconds_evaluation=4.0, timeout_seconds=0.0, timeout_messages=[]),
            dict(_row(3, 0.5, 0.15), seconds_evaluation=17.0,
                 slowest_seconds=[{"compile": 9.6, "compile.build": 9.1, "check": 0.4, "since_batch_start": 15.0}, {}],
                 slowest_verdict=["incorrect: trial 1/5: output: 3 values outside tolerance", ""]),
            dict(_row(4, 0.5, 0.15), seconds_evaluation=5.0, slowest_seconds=[{"compile": 4.9}])]  # before the key
    lines = learning_report.time_lines({"rows": rows})
    assert lines == ["Evaluation a step: median 11 s, max 83 s; lost to timeouts 38 s in all.", f"- step 1: {limit}",
                     "- step 3, last verdict of each turn (s): compile 9.6, compile.build 9.1, check 0.4 "
                     "[incorrect: trial 1/5: output: 3 values outside tolerance]",
                     "- step 4, last verdict of each turn (s): compile 4.9"]
    assert learning_report.time_lines({"rows": [_row(1, 0.5, 0.15)]}) == []  # rows from before these keys


def test_report_reads_the_old_learning_rl_metrics():
    old = os.path.join(ROOT, "docs", "learning", "h200_lr3e-4", "rl_seed0_metrics.jsonl")
    run = learning_report.load_run(old)
    assert run["label"] == "rl_seed0_metrics" and run["rows"][0]["step"] == 1
    assert run["rows"][1]["correct_rate_per_turn"] == pytest.approx([0.703125, 0.28125])


@pytest.mark.slow
def test_learning_run_cpu_smallest(tmp_path):
    """The whole script on the CPU: a 2-step warm start, train.py for 1 step of G=2 x T=1 on relu,
    the report. Junk policy, no oracle: every answer a format error, so no build (about 2 minutes)."""
    # what an earlier run would have left in the harness's cache, for run_info.txt to count (no key of this run's)
    for path in (tmp_path / "cache" / "compiled" / "a.json", tmp_path / "cache" / "compiled" / "b.json",
                 tmp_path / "cache" / "name_probes" / "context" / "stride"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    env = dict(os.environ, OUT=str(tmp_path / "out"), WORK=str(tmp_path / "work"), MODE="cpu", WS_STEPS="2",
               G="2", T="1", STEPS="1", SEEDS="0", ORACLE_SHARE="0", MAX_NEW="64", VARIANTS="0",
               BUDGET="900", PYTHON=sys.executable, KERNEL_EVAL_CACHE=str(tmp_path / "cache"))
    proc = subprocess.run(["bash", os.path.join(ROOT, "examples", "learning_run.sh")], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "out"
    assert sorted(os.listdir(out)) == ["learning.tgz", "report.md", "rl_seed0_curves.png", "rl_seed0_metrics.jsonl",
                                       "run_info.txt", "seeds.png"]
    with open(out / "rl_seed0_metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [1] and len(rows[0]["correct_rate_per_turn"]) == 1
    assert sum(rows[0]["status_counts"].values()) == 2
    run_info = (out / "run_info.txt").read_text()
    assert f"kernel_eval cache at start ({tmp_path / 'cache'}): 2 compile records, 1 name probe answers" in run_info
    report = (out / "report.md").read_text()
    assert "**rl_seed0** (1 steps)" in report and "too few steps" in report
    with open(tmp_path / "work" / "rl_seed0" / "config.json") as f:
        config = json.load(f)
    assert config["lr"] == 3e-5 and config["grad_clip"] == 1.0 and config["time_kernels"] is False
