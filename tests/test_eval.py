"""Tests for eval.py: each metric against a hand-computed table (a task with no correct kernel,
ties, speedups exactly p, an incorrect kernel's speedup ignored, a correct kernel not timed),
beam lineages, --resume after a run killed between turns, beam search and the grid through
the CLI (with a deterministic stand-in for the harness), candidate folders; and one slow run of
the oracle and the corrupted oracle on two built-in tasks through the real harness on the CPU."""
import json
import math
import os
import re

import pytest

import engines
import eval as evaluation
import tasks as tasks_module


def rec(task, traj, turn, correct, speedup, level):
    return {"task_id": task, "trajectory": traj, "turn": turn, "correct": correct,
            "speedup": speedup, "level": level}


# (task, level): [(trajectory, turn, correct, speedup)]; turns count from 1
TABLE = {
    ("A", 1): [(0, 1, False, 0.0), (0, 2, True, 2.0), (1, 1, True, 0.5), (1, 2, False, 9.0)],  # 9.0 is wrong: ignored
    ("B", 1): [(0, 1, False, 0.0), (0, 2, False, 0.0), (1, 1, False, 0.0), (1, 2, False, 0.0)],  # nothing correct
    ("C", 2): [(0, 1, True, 1.5), (0, 2, False, 0.0), (1, 1, False, 0.0), (1, 2, True, 1.5)],    # tie, exactly 1.5
    ("D", 2): [(0, 1, True, 0.0), (0, 2, False, 0.0), (1, 1, False, 0.0), (1, 2, False, 0.0)],   # correct, not timed
}
RECORDS = [rec(task, *row, level) for (task, level), rows in TABLE.items() for row in rows]


def test_metrics_against_a_hand_computed_table():
    s = evaluation.summarize_records(RECORDS)
    assert (s["n_tasks"], s["n_kernels"]) == (4, 16)
    assert s["correct_kernel"] == pytest.approx(5 / 16)
    assert s["correct_avg"] == pytest.approx((1 + 0 + 1 + 0.5) / 4)
    assert s["correct_best"] == pytest.approx(3 / 4)
    assert evaluation.best_speedups(RECORDS) == {"A": 2.0, "B": 0.0, "C": 1.5, "D": 0.0}
    assert s["speedup_best_mean"] == pytest.approx(3.5 / 4)
    assert s["speedup_best_geomean"] == pytest.approx(math.sqrt(2.0 * 1.5))
    # b > p strictly: C's 1.5 is not fast_1.5, A's 2.0 is not fast_2; D (correct, untimed)
    # counts for fast_0 only, so fast_0 equals best@N correctness.
    assert s["fast_p"] == {"0": 0.75, "1": 0.5, "1.5": 0.25, "2": 0.0}

    one, two = s["per_level"]["1"], s["per_level"]["2"]
    assert (one["correct_kernel"], one["correct_avg"], one["correct_best"]) == (0.25, 0.5, 0.5)
    assert (one["speedup_best_mean"], one["speedup_best_geomean"]) == (1.0, 2.0)
    assert one["fast_p"] == {"0": 0.5, "1": 0.5, "1.5": 0.5, "2": 0.0}
    assert (two["correct_kernel"], two["correct_avg"], two["correct_best"]) == (3 / 8, 0.75, 1.0)
    assert (two["speedup_best_mean"], two["speedup_best_geomean"]) == (0.75, 1.5)
    assert two["fast_p"] == {"0": 1.0, "1": 0.5, "1.5": 0.0, "2": 0.0}

    t0, t1 = s["per_turn"]
    assert t0["turn"] == 1 and t1["turn"] == 2 and t0["correct_kernel"] == pytest.approx(3 / 8)
    assert t0["correct_avg"] == pytest.approx((0.5 + 0 + 0.5 + 0.5) / 4)
    assert t0["correct_best"] == 0.75
    assert t0["speedup_best_mean"] == pytest.approx((0.5 + 0 + 1.5 + 0) / 4)
    assert t0["speedup_best_geomean"] == pytest.approx(math.sqrt(0.5 * 1.5))
    assert t0["fast_p"] == {"0": 0.75, "1": 0.25, "1.5": 0.0, "2": 0.0}
    assert {k: t1[k] for k in s if k in t1} == {k: s[k] for k in t1 if k in s}  # the last turn is all


def test_metrics_of_nothing_and_untrusted_speedups():
    assert evaluation.geomean([0.0, 0.0]) == 0.0 and evaluation.geomean([]) == 0.0
    assert evaluation.fast_p({}, {}, 0.0) == 0.0 and evaluation.correct_best([]) == 0.0
    with pytest.raises(ValueError, match="p must be >= 0"):
        evaluation.fast_p({"A": 1.0}, {"A": True}, -1.0)
    bad = [rec("A", 0, 0, True, float("inf"), 1), rec("A", 0, 1, True, float("nan"), 1)]
    assert evaluation.best_speedups(bad) == {"A": 0.0}   # correct, but no speedup to trust


def test_a_task_whose_reference_failed_is_left_out_and_named():
    # kernel_eval's reference_error is the task's fault: none of the task's records counts against
    # the model (here B would otherwise lower every rate), and the summary names the task.
    broken = [dict(r, status="reference_error", correct=False, speedup=0.0) for r in RECORDS if r["task_id"] == "B"]
    others = [dict(r, status="correct" if r["correct"] else "incorrect") for r in RECORDS if r["task_id"] != "B"]
    s = evaluation.summarize_records(others + broken)
    assert s["reference_error_tasks"] == ["B"]
    assert (s["n_tasks"], s["n_kernels"]) == (3, 12)
    assert s["correct_best"] == 1.0 and s["correct_avg"] == pytest.approx((1 + 1 + 0.5) / 3)
    assert s["per_level"]["1"]["n_tasks"] == 1
    assert "their reference failed in the harness (the task's fault, not the model's): B" in \
        evaluation.summary_markdown(s, "t")
    assert evaluation.summarize_records(others)["reference_error_tasks"] == []


def test_a_kernel_the_harness_could_not_judge_is_counted_apart_never_as_a_failure():
    # kernel_eval's harness_error is no verdict: such records are not kernels (an incorrect kernel would
    # lower correct_kernel) but are counted apart; their trajectories and tasks stay, with what their
    # judged kernels reached, and a task none of whose kernels was judged is named.
    judged = [dict(r, status="correct" if r["correct"] else "incorrect") for r in RECORDS]
    unjudged = [dict(rec("A", 2, 1, False, 0.0, 1), status="harness_error"),
                dict(rec("C", 0, 3, False, 0.0, 2), status="harness_error")]
    s, plain = evaluation.summarize_records(judged + unjudged), evaluation.summarize_records(judged)
    assert s["harness_errors"] == 2 and plain["harness_errors"] == 0
    assert s["n_kernels"] == 16 and s["correct_kernel"] == pytest.approx(5 / 16)
    assert s["per_level"]["1"]["harness_errors"] == 1 and s["per_turn"][0]["harness_errors"] == 1
    same = ("n_tasks", "correct_best", "speedup_best_mean", "speedup_best_geomean", "fast_p")
    assert {k: s[k] for k in same} == {k: plain[k] for k in same} and s["harness_error_tasks"] == []
    # A's third trajectory exists but was never judged: it counts as a trajectory without a correct kernel
    assert s["correct_avg"] == pytest.approx((2 / 3 + 0 + 1 + 0.5) / 4)
    alone = evaluation.summarize_records(judged + [dict(rec("E", 0, 1, False, 0.0, 1), status="harness_error")])
    assert alone["n_tasks"] == 5 and alone["harness_error_tasks"] == ["E"] and alone["n_kernels"] == 16
    text = evaluation.summary_markdown(alone, "t")
    assert "No verdict for 1 kernels (harness_error" in text and "(none for E)" in text
    assert "No verdict" not in evaluation.summary_markdown(plain, "t")


def refusal(argv, capsys) -> tuple[int, list[str]]:
    """eval.main's exit code and stderr lines for a refusal, as the interpreter gives them (a SystemExit
    with a message prints it and exits 1)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        evaluation.main(argv)
    err = capsys.readouterr().err.splitlines()
    return (1, err + [info.value.code]) if isinstance(info.value.code, str) else (info.value.code, err)


def test_eval_cli_refuses_bad_arguments_in_one_line(tmp_path, capsys):
    (tmp_path / "a_file").write_text("")
    out = str(tmp_path / "out")
    for extra, code, message in (
            (["--device", "bogus"], 1, "eval.py: --device bogus: expected cpu, cuda or cuda:N"),
            (["--device", "cpu", "--levels", "one"], 1,
             "eval.py: --levels 'one': expected comma-separated level numbers, e.g. 1,2"),
            (["--device", "cpu", "--turns", "0"], 1, "eval.py: --turns 0: must be at least 1"),
            (["--device", "cpu", "--top-p", "0"], 1,
             "eval.py: --top-p 0.0 --temperature 0.9: expected 0 < top-p <= 1 and temperature >= 0 (0: greedy)"),
            (["--device", "cpu", "--grid", "0x8"], 1,
             "eval.py: --grid entries are GxT or beam:WxSxR with positive integers, got '0x8'"),
            (["--device", "cpu", "--grid", "16x8,beam:4x4"], 1,
             "eval.py: --grid entries are GxT or beam:WxSxR with positive integers, got 'beam:4x4'"),
            (["--device", "cpu", "--out", str(tmp_path / "a_file")], 2,
             f"eval.py: --out {tmp_path / 'a_file'}: {tmp_path / 'a_file'} is a file, not a folder"),
            (["--device", "cpu", "--out", str(tmp_path / "a_file" / "run")], 2,
             f"eval.py: --out {tmp_path / 'a_file' / 'run'}: {tmp_path / 'a_file'} is a file, not a folder"),
            (["--device", "cpu", "--policy", str(tmp_path / "no" / "such" / "folder")], 1,
             f"eval.py: --policy {tmp_path / 'no' / 'such' / 'folder'}: no such folder")):
        assert refusal(["--policy", "oracle", "--out", out, *extra], capsys) == (code, [message])
        assert not os.path.exists(out)   # refused before anything is written


def test_every_flag_has_a_one_line_help_with_its_default_and_its_choices(capsys):
    with pytest.raises(SystemExit) as info:
        evaluation.main(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    entries = re.split(r"\n  (?=-)", text.split("\noptions:\n", 1)[1])   # one per flag, its wrapped help joined
    helps = {entry.split()[0].rstrip(","): " ".join(entry.split()) for entry in entries if entry.split()[0] != "-h,"}
    assert {"--policy", "--grid", "--top-p", "--out", "--progress"} <= set(helps)
    assert "--no-progress" in helps["--progress"]
    for flag, help_text in helps.items():
        assert help_text.endswith(")") and ("(default: " in help_text or help_text.endswith("(required)")), help_text
    assert helps["--trajectories"].endswith("(default: 16, Kevin's protocol)")
    assert helps["--split"].startswith("--split {all,train,heldout} ")


def test_a_run_says_how_many_kernels_it_is_about_to_judge(tmp_path, fake_harness, capsys):
    """With eval.py's defaults (Kevin's 16 x 8) a CPU run is thousands of kernels: said before it starts."""
    assert evaluation.main(["--policy", "oracle", "--device", "cpu", "--task-ids", TWO[0], "--no-progress",
                            "--out", str(tmp_path / "one")]) == 0
    assert ("eval.py: 1 task x 16 trajectories x 8 turns = 128 kernels to judge on cpu (--limit, --trajectories "
            "and --turns make it smaller)") in capsys.readouterr().err.splitlines()
    assert len(read_records(tmp_path / "one")) == 128
    assert evaluation.main(cli(tmp_path / "grid", "--grid", "4x2,beam:4x1x2")) == 0
    assert ("eval.py: 2 tasks x (4 trajectories x 2 turns + beam 4 x 1 turns x 2 rounds) = 32 kernels to judge on "
            "cpu (--limit, --trajectories and --turns make it smaller)") in capsys.readouterr().err.splitlines()


def test_beam_records_are_grouped_by_lineage():
    # W = 2, keep 1: round 1's two slots both continue round-0 slot 0, whose kernel was correct.
    records = [{**rec("T", 0, 1, True, 1.2, 1), "round": 0, "parent": None},
               {**rec("T", 1, 1, False, 0.0, 1), "round": 0, "parent": None},
               {**rec("T", 0, 2, False, 0.0, 1), "round": 1, "parent": 0},
               {**rec("T", 1, 2, False, 0.0, 1), "round": 1, "parent": 0}]
    groups = evaluation.trajectory_groups(records)
    assert sorted(groups) == [("T", 0), ("T", 1)]
    assert all(records[0] in kernels and records[1] not in kernels for kernels in groups.values())
    assert evaluation.correct_avg(records) == 1.0        # by slot it would be 0.5
    assert evaluation.correct_avg(records[:2]) == 0.5   # after round 0 alone
    assert evaluation.summarize_records(records)["per_turn"][0]["correct_avg"] == 0.5


# ------------------------------------------------------------------- the CLI, harness faked

TWO = ("builtin/level1/01_relu", "builtin/level2/06_bias_tanh_multiply")


def fake_evaluate_batch(pairs, device="cpu", **_):
    """Deterministic verdicts: a built-in solution is correct at a speedup fixed by its task,
    anything else (a corrupted one) is incorrect."""
    solutions = {t.solutions["cpp"].strip(): i for i, t in enumerate(tasks_module.load_builtin())}
    out = []
    for _, code in pairs:
        index = solutions.get(code.strip())
        ok = index is not None
        out.append({"status": "correct" if ok else "incorrect", "correct": ok, "compiled": True,
                    "speedup": 1.0 + 0.25 * index if ok else 0.0, "ref_ms": 2.0, "candidate_ms": 1.0,
                    "timing_ok": True, "message": "" if ok else "output mismatch"})
    return out


@pytest.fixture
def fake_harness(monkeypatch):
    import kernel_eval
    monkeypatch.setattr(kernel_eval, "evaluate_batch", fake_evaluate_batch)


def cli(out, *extra):
    return ["--policy", "oracle", "--corrupt-rate", "0.5", "--tasks", "builtin", "--device", "cpu",
            "--task-ids", ",".join(TWO), "--no-progress", "--out", str(out), *extra]


def read_records(out):
    with open(os.path.join(out, "records.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_resume_after_a_kill_between_turns_gives_the_records_of_an_uninterrupted_run(tmp_path, fake_harness, monkeypatch):
    args = ("--trajectories", "3", "--turns", "3")
    assert evaluation.main(cli(tmp_path / "whole", *args)) == 0
    whole = read_records(tmp_path / "whole")
    assert len(whole) == 2 * 3 * 3 and {r["correct"] for r in whole} == {True, False}

    original, calls = evaluation.RecordWriter.write, []

    def write_then_die(self, records):
        if calls:
            raise KeyboardInterrupt("killed after turn 0")
        calls.append(1)
        original(self, records)

    monkeypatch.setattr(evaluation.RecordWriter, "write", write_then_die)
    with pytest.raises(KeyboardInterrupt):
        evaluation.main(cli(tmp_path / "cut", *args))
    monkeypatch.setattr(evaluation.RecordWriter, "write", original)
    assert {r["turn"] for r in read_records(tmp_path / "cut")} == {1}   # turns count from 1
    with pytest.raises(SystemExit, match="pass --resume"):
        evaluation.main(cli(tmp_path / "cut", *args))
    with pytest.raises(SystemExit, match="different protocol.*turns"):
        evaluation.main(cli(tmp_path / "cut", "--trajectories", "3", "--turns", "4", "--resume"))
    assert evaluation.main(cli(tmp_path / "cut", *args, "--resume")) == 0
    assert read_records(tmp_path / "cut") == whole
    with open(tmp_path / "whole" / "summary.json") as a, open(tmp_path / "cut" / "summary.json") as b:
        assert json.load(a) == json.load(b)


def test_outputs_of_a_run(tmp_path, fake_harness):
    assert evaluation.main(cli(tmp_path, "--trajectories", "2", "--turns", "2")) == 0
    records = read_records(tmp_path)
    assert len(records) == 8
    for r in records:
        assert set(r) >= {"task_id", "level", "trajectory", "turn", "status", "correct", "speedup", "ref_ms",
                          "candidate_ms", "timing_ok", "message", "code_hash", "feedback"}
        assert os.path.exists(tmp_path / "code" / f"{r['code_hash']}.py")
    with open(tmp_path / "summary.json") as f:
        summary = json.load(f)
    assert set(summary) >= {"correct_avg", "correct_best", "speedup_best_mean", "speedup_best_geomean",
                            "fast_p", "per_level", "per_turn"}
    assert summary == {**evaluation.summarize_records(records), **{k: summary[k] for k in ("shape", "search", "kernel_budget_per_task")}}
    assert set(summary["fast_p"]) == {"0", "1", "1.5", "2"} and set(summary["per_level"]) == {"1", "2"}
    for name in ("summary.md", "speedup_vs_turn.png", "fast_p.png"):
        assert os.path.getsize(tmp_path / name) > 0
    assert "| all | 2 | 8 |" in (tmp_path / "summary.md").read_text()
    # one turn numbering, from 1, as train.py's: records, summary and table
    assert {r["turn"] for r in records} == {1, 2} and [m["turn"] for m in summary["per_turn"]] == [1, 2]
    table = (tmp_path / "summary.md").read_text()
    assert "over turns 1..t" in table and "| turn 1 |" in table and "| turn 2 |" in table and "| turn 0 |" not in table


def test_beam_search_and_grid_through_the_cli(tmp_path, fake_harness):
    assert evaluation.main(cli(tmp_path / "beam", "--search", "beam", "--beam-width", "4", "--beam-keep", "2",
                               "--beam-steps", "1", "--beam-rounds", "2")) == 0
    records = read_records(tmp_path / "beam")
    assert len(records) == 2 * 4 * 1 * 2
    assert {(r["round"], r["turn"]) for r in records} == {(0, 1), (1, 2)}
    assert {r["parent"] for r in records if r["round"] == 0} == {None}
    summary = json.loads((tmp_path / "beam" / "summary.json").read_text())
    assert summary["beam"]["budget"] == 8 and summary["beam"]["kernels"] == 16
    # Every round-1 slot continues a round-0 slot of the same task that was kept.
    kept0 = summary["beam"]["kept"][0]
    for t, task in enumerate(TWO):
        assert {r["parent"] for r in records if r["round"] == 1 and r["task_id"] == task} <= set(kept0[t])

    assert evaluation.main(cli(tmp_path / "grid", "--grid", "4x2,8x1,beam:4x1x2")) == 0
    grid = json.loads((tmp_path / "grid" / "grid.json").read_text())
    assert [(g["name"], g["budget"]) for g in grid] == [("4x2", 8), ("8x1", 8), ("beam_4x1x2", 8)]
    for g in grid:
        assert len(read_records(tmp_path / "grid" / g["name"])) == 2 * 8
    assert "| 8x1 | trajectories | 8 |" in (tmp_path / "grid" / "grid.md").read_text()
    assert os.path.getsize(tmp_path / "grid" / "scaling.png") > 0
    with pytest.raises(SystemExit, match="pass --resume"):
        evaluation.main(cli(tmp_path / "grid", "--grid", "4x2,8x1,beam:4x1x2"))
    # A finished grid resumed: nothing runs again, the same table comes back.
    (tmp_path / "grid" / "beam_4x1x2" / "records.jsonl").write_text("")   # a beam's records are not reread
    assert evaluation.main(cli(tmp_path / "grid", "--grid", "4x2,8x1,beam:4x1x2", "--resume")) == 0
    assert json.loads((tmp_path / "grid" / "grid.json").read_text()) == grid
    with pytest.raises(ValueError, match="GxT or beam:WxSxR"):
        evaluation.parse_shape("16by8")


def test_candidate_folder_is_judged_as_it_is(tmp_path, fake_harness):
    relu = next(t for t in tasks_module.load_builtin() if t.task_id == TWO[0])
    folder = tmp_path / "cands" / TWO[0]
    folder.mkdir(parents=True)
    (folder / "0.py").write_text(relu.solutions["cpp"])
    (folder / "1.py").write_text(engines.corrupt_solution(relu.solutions["cpp"]))
    (folder / "2.py").write_text("import torch\nclass ModelNew(torch.nn.Module):\n"
                                 "    def forward(self, x):\n        return torch.relu(x)\n")
    args = ["--policy", str(tmp_path / "cands"), "--tasks", "builtin", "--device", "cpu", "--task-ids", ",".join(TWO),
            "--no-progress", "--out", str(tmp_path / "out")]
    assert evaluation.main(args) == 0
    records = read_records(tmp_path / "out")
    assert [(r["trajectory"], r["status"]) for r in records] == [(0, "correct"), (1, "incorrect"), (2, "format_error")]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["tasks_without_candidates"] == 1 and summary["n_tasks"] == 1
    assert summary["correct_best"] == 1.0 and summary["correct_kernel"] == pytest.approx(1 / 3)


def test_kernels_the_harness_could_not_judge_are_counted_apart_in_a_run_and_a_folder(tmp_path, monkeypatch):
    """The harness says harness_error (no verdict) for every candidate of one task: the records say so,
    with no score; the summary counts them apart and keeps the task, named."""
    import kernel_eval
    builtin = {t.task_id: t for t in tasks_module.load_builtin(device="cpu")}   # the references eval.py judges on cpu

    def out_of_memory_on_one_task(pairs, device="cpu", **_):   # EvalResults, as the harness gives them
        return [kernel_eval.EvalResult(status="harness_error", message="the task's copies do not fit in memory")
                if reference == builtin[TWO[1]].reference_src else kernel_eval.EvalResult(**verdict)
                for (reference, _), verdict in zip(pairs, fake_evaluate_batch(pairs))]
    monkeypatch.setattr(kernel_eval, "evaluate_batch", out_of_memory_on_one_task)
    assert evaluation.main(cli(tmp_path / "run", "--trajectories", "2", "--turns", "2")) == 0
    unjudged = [r for r in read_records(tmp_path / "run") if r["task_id"] == TWO[1]]
    assert len(unjudged) == 4 and all(r["status"] == "harness_error" and r["score"] is None for r in unjudged)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["n_tasks"], summary["n_kernels"], summary["harness_errors"]) == (2, 4, 4)
    assert summary["harness_error_tasks"] == [TWO[1]] and summary["reference_error_tasks"] == []
    assert "No verdict for 4 kernels" in (tmp_path / "run" / "summary.md").read_text()
    for task_id in TWO:   # a folder of candidates: each built-in solution once
        (tmp_path / "cands" / task_id).mkdir(parents=True)
        (tmp_path / "cands" / task_id / "0.py").write_text(builtin[task_id].solutions["cpp"])
    assert evaluation.main(["--policy", str(tmp_path / "cands"), "--tasks", "builtin", "--device", "cpu",
                            "--task-ids", ",".join(TWO), "--no-progress", "--out", str(tmp_path / "folder")]) == 0
    assert [(r["status"], r["score"]) for r in read_records(tmp_path / "folder")] == [("correct", 1.3), ("harness_error", None)]
    summary = json.loads((tmp_path / "folder" / "summary.json").read_text())
    assert (summary["n_tasks"], summary["n_kernels"], summary["harness_errors"]) == (2, 1, 1)
    assert summary["correct_kernel"] == 1.0 and summary["correct_best"] == 0.5


# ------------------------------------------------------------------- the real harness


@pytest.mark.slow
def test_oracle_and_corrupted_oracle_on_two_builtin_tasks_on_cpu(tmp_path):
    base = ["--tasks", "builtin", "--device", "cpu", "--task-ids", ",".join(TWO), "--no-progress"]
    assert evaluation.main(["--policy", "oracle", *base, "--trajectories", "1", "--turns", "1",
                            "--out", str(tmp_path / "oracle")]) == 0
    good = json.loads((tmp_path / "oracle" / "summary.json").read_text())
    assert good["n_kernels"] == 2 and good["correct_kernel"] == 1.0
    assert good["correct_avg"] == good["correct_best"] == 1.0 and good["fast_p"]["0"] == 1.0
    import kernel_boundary  # each record says what the candidate ran behind (--sandbox auto: namespaces where they work)
    assert {r["boundary"] for r in read_records(tmp_path / "oracle")} == {kernel_boundary.boundary_for("auto")}
    assert evaluation.main(["--policy", "oracle-corrupt", *base, "--trajectories", "1", "--turns", "1",
                            "--sandbox", "off", "--out", str(tmp_path / "corrupt")]) == 0
    bad = json.loads((tmp_path / "corrupt" / "summary.json").read_text())
    assert bad["correct_best"] == 0.0 and bad["fast_p"]["0"] == 0.0
    assert {(r["status"], r["boundary"]) for r in read_records(tmp_path / "corrupt")} == {("incorrect", "process")}


def test_hf_model_policy_from_a_saved_folder(tmp_path, fake_harness):
    """A local model folder (what train.py exports) runs through HFEngine: a tiny random model
    writes no parsable code, so every kernel is a format error and nothing is correct."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=384, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, eos_token_id=1,
                                      pad_token_id=0, bos_token_id=None)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "model")
    transformers.ByT5Tokenizer().save_pretrained(tmp_path / "model")
    assert evaluation.main(["--policy", str(tmp_path / "model"), "--tasks", "builtin", "--device", "cpu",
                            "--task-ids", TWO[0], "--trajectories", "2", "--turns", "2", "--max-new-tokens", "8",
                            "--max-prompt-tokens", "100000", "--no-progress", "--out", str(tmp_path / "out")]) == 0
    records = read_records(tmp_path / "out")
    assert len(records) == 4 and {r["status"] for r in records} == {"format_error"}
    assert all(0 < r["completion_tokens"] <= 8 for r in records)
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["correct_best"] == 0.0
