"""The learning demo's pieces: examples/learning_report.py (table, done-when check, plots) and
examples/learning_run.sh end to end on the CPU at its smallest size (slow)."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import learning_report  # noqa: E402


def _row(step, correct, speedup=None, per_turn=None, evaluation=10.0, samples=(), latencies=None):
    return {"step": step, "correct_rate": correct, "reward_mean": 0.3 * correct,
            "correct_rate_per_turn": per_turn or [correct, correct], "speedup_correct_mean": speedup,
            "speedup_correct_mean_per_turn": [speedup, speedup], "seconds_evaluation": evaluation,
            "seconds_step": 30.0, "samples": list(samples), "latency_by_status": latencies or {}}


def _write_run(folder, rows):
    os.makedirs(folder)
    with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return os.path.join(folder, "metrics.jsonl")


def test_done_when_by_hand():
    # step 1 at 20% correct and 0.4x; the last 5 at 55% (+35 points) and 0.7x (1.75x): met
    rows = [_row(1, 0.2, 0.4)] + [_row(s, 0.3, 0.5) for s in range(2, 6)] + [_row(s, 0.55, 0.7) for s in range(6, 11)]
    check = learning_report.done_when(rows)
    assert check["met"], check
    assert check["checks"]["correct rate"][0] == (0.2, pytest.approx(0.55))
    # +25 points and under 2x: the rate line fails; 2x of a low start passes it
    assert not learning_report.done_when([_row(1, 0.3, 0.4)] + [_row(s, 0.55, 0.7) for s in range(2, 11)])["met"]
    assert learning_report.done_when([_row(1, 0.1, 0.4)] + [_row(s, 0.2, 0.7) for s in range(2, 11)])["met"]
    # nothing correct at the start nor at the end is not 2x of the start
    never = learning_report.done_when([_row(s, 0.0, None) for s in range(1, 11)])
    assert never["checks"]["correct rate"][1] is False
    # speedup up by only 1.4x
    assert not learning_report.done_when([_row(1, 0.2, 0.5)] + [_row(s, 0.9, 0.7) for s in range(2, 11)])["met"]
    # turn 2 below turn 1 in the last 5 steps
    worse = [_row(1, 0.2, 0.4)] + [_row(s, 0.9, 0.9, per_turn=[1.0, 0.8]) for s in range(2, 11)]
    assert learning_report.done_when(worse)["checks"]["turn 2 vs turn 1"][1] is False
    # evaluation: the first step may be slow, a later one over 45 s fails
    slow = [_row(1, 0.2, 0.4, evaluation=100.0)] + [_row(s, 0.9, 0.9) for s in range(2, 11)]
    assert learning_report.done_when(slow)["met"]
    slow[5]["seconds_evaluation"] = 46.0
    assert not learning_report.done_when(slow)["met"]
    # nine steps are too few
    assert learning_report.done_when(rows[:9])["checks"]["steps"] == (9, False)


def test_report_names_the_variants_and_the_compile_errors_latency(tmp_path):
    variants = tmp_path / "variants.json"
    variants.write_text(json.dumps({"t:fast": {"code_id": "f1", "variant": "fast"},
                                    "t:slow": {"code_id": "s1", "variant": "slow"}}))
    samples = [("t", 0, "correct", 1.0, "f1"), ("t", 0, "correct", 0.25, "s1"), ("t", 1, "correct", 0.25, "s1"),
               ("t", 1, "format_error", 0.0, "")]
    rows = [_row(s, 0.75, 0.5, samples=samples, latencies={"compile_error": [2.0 * s]}) for s in range(1, 11)]
    rows[0]["format_error_reasons"] = [{}, {"format_error: no code in the response": 1}]
    rows[1]["format_error_reasons"] = [{}, {"format_error: no code in the response": 1, "format_error: gate": 1}]
    a = _write_run(str(tmp_path / "rl_seed0"), rows)
    text = learning_report.report([learning_report.load_run(a)], learning_report.load_variants(str(variants)))
    assert "| fast | slow | no code | format errors turn 1 / 2 |" in text
    assert "| 25.0% | 50.0% | 25.0% | 0 / 50 |" in text   # turn 2: one of two samples
    # ten compile errors at 2, 4, ..., 20 s: p50 the 6th (12 s), p90 the 10th (20 s)
    assert "10 verdicts: p50 12.0 s, p90 20.0 s (goal p50 <= 8 s): **no**" in text
    # summed over the steps, most frequent first; a run without the field (older metrics) has no such lines
    assert "- turn 2: 2 x `format_error: no code in the response`; 1 x `format_error: gate`" in text
    assert "- turn 1" not in text
    assert "Compile errors, each distinct kernel" not in text   # no step kept them
    rows[2]["compile_errors"] = [[4.0, "undefined", 'error: identifier "x" is undefined'],
                                 [25.0, "", 'error: "i" has already | been declared']]
    rows[3]["compile_errors"] = [[6.0, "redeclared", "error: y"]]
    text = learning_report.report([learning_report.load_run(_write_run(str(tmp_path / "b"), rows))], {})
    assert "- judged early: 2, p50 6.0 s, max 6.0 s\n- built as written: 1, p50 25.0 s, max 25.0 s" in text
    # slowest first, a | in a diagnostic kept out of the table's cells
    assert ('| 3 | 25.0 | as written | error: "i" has already / been declared |\n| 4 | 6.0 | redeclared | error: y |'
            in text)
    png_dir = tmp_path / "png"
    # a trajectory's turns follow each other (task, then trajectory, then turn): per step, one correct
    # turn 1 kept, one broken; one wrong turn 1 fixed; a lone turn-2 sample of another task pairs with nothing
    steps = [_row(1, 0.5, 0.5, samples=[("t", 0, "correct", 1.0, "f1"), ("t", 1, "correct", 1.0, "f1"),
                                        ("t", 0, "correct", 1.0, "f1"), ("t", 1, "compile_error", 0.0, "x"),
                                        ("t", 0, "incorrect", 0.0, "w"), ("t", 1, "correct", 1.0, "f1"),
                                        ("u", 1, "correct", 1.0, "f2")])] * 3
    assert learning_report.transition_line(steps) == (
        "A later turn after the turn before it (all steps): correct kept 3 / 6 (50%); wrong fixed 3 / 3 (100%). "
        "After a correct kernel: the same kernel again 3, other code 3 (compile_error 3).")
    assert learning_report.transition_line([_row(1, 0.5, 0.5, samples=[("t", 0, "correct", 1.0, "f1")])]) is None
    assert learning_report.main([a, "--variants", str(variants), "--png-dir", str(png_dir)]) == 0
    assert (png_dir / "rl_seed0.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
    assert sorted(os.listdir(out)) == ["learning.tgz", "report.md", "rl_seed0.png", "rl_seed0_metrics.jsonl",
                                       "run_info.txt"]   # VARIANTS=0: no variants.json
    with open(out / "rl_seed0_metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [1] and len(rows[0]["correct_rate_per_turn"]) == 1
    assert sum(rows[0]["status_counts"].values()) == 2
    run_info = (out / "run_info.txt").read_text()
    assert f"kernel_eval cache at start ({tmp_path / 'cache'}): 2 compile records, 1 name probe answers" in run_info
    report = (out / "report.md").read_text()
    assert "**rl_seed0**: done-when not met" in report and "steps: 1 (>= 10): **no**" in report
    with open(tmp_path / "work" / "rl_seed0" / "config.json") as f:
        config = json.load(f)
    assert config["lr"] == 1e-4 and config["grad_clip"] == 1.0 and config["time_kernels"] is True   # the CPU size's
