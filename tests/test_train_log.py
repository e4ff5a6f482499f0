"""train_log.py: a metrics.jsonl line from two ranks' summaries, checked by hand, and the flop count."""
import json
import types

import train_log


def _summary(rows, loss, clips, kl, nonzero, clock, turn_stats, flops):
    return {"rows": rows, "loss": loss, "clips": clips, "approx_kl": kl, "advantage_nonzero": nonzero,
            "clock": clock, "turn_stats": turn_stats, "flops": flops}


def test_step_record_from_two_ranks_by_hand(tmp_path):
    # (task, turn, status, score, speedup, completion tokens, truncated, code_id)
    rank0 = _summary([("a", 0, "correct", 0.3, 1.5, 100, False, "k1"), ("a", 1, "format_error", 0.0, 0.0, 300, True, "")],
                     [0.25, -0.5], [0.1], [0.02], 1.0, {"generation": 5.0, "evaluation": 2.0, "training": 1.0,
                                                       "generation_calls": 3, "evaluation_calls": 1},
                     [{"turn": 1, "n": 2, "not_okay_ratio": 0.5, "status_counts": {"correct": 1, "format_error": 1},
                       "kernels_compiled": 1, "builds_reused": 0, "verdicts_reused": 0,
                       "format_error_reasons": {"format_error: no code in the response": 1},
                       "latency_by_status": {"correct": [12.5]}}], 1e12)
    rank1 = _summary([("b", 0, "incorrect", 0.0, 0.0, 200, False, "k2"), ("b", 1, "correct", 0.9, 3.0, 200, False, "k3")],
                     [0.75, 0.5], [0.3], [0.04], 0.5, {"generation": 7.0, "evaluation": 1.0, "training": 1.5,
                                                       "generation_calls": 2, "evaluation_calls": 2},
                     # b's third candidate got no verdict (harness_error): no row, counted apart
                     [{"turn": 1, "n": 3, "not_okay_ratio": 0.0, "reference_error_tasks": ["c"], "timeout_seconds": 8.5,
                       "format_error_reasons": {"format_error: no code in the response": 2, "format_error: gate": 1},
                       "status_counts": {"incorrect": 1, "correct": 1, "harness_error": 1},
                       "kernels_compiled": 1, "builds_reused": 1, "verdicts_reused": 1,
                       "slowest_seconds": {"compile": 9.5, "since_batch_start": 14.2},
                       "slowest_verdict": "timeout: candidate timed out during check",
                       "latency_by_status": {"correct": [14.2], "incorrect": [9.0]}}], 2e12)
    update_out = {"loss": [0.25, -0.5], "grad_norm": [0.2, 0.1], "lr": 1e-5}
    record = train_log.step_record(4, [rank0, rank1], update_out, n_turns=2)
    assert record["step"] == 5
    assert record["reward_mean"] == (0.3 + 0.9) / 4 and record["correct_rate"] == 0.5
    assert record["correct_rate_per_turn"] == [0.5, 0.5]
    assert record["best_speedup"] == 3.0
    assert record["speedup_correct_mean"] == (1.5 + 3.0) / 2   # the correct rows only
    assert record["speedup_correct_mean_per_turn"] == [1.5, 3.0]
    assert record["samples"] == [("a", 0, "correct", 1.5, "k1"), ("a", 1, "format_error", 0.0, ""),
                                 ("b", 0, "incorrect", 0.0, "k2"), ("b", 1, "correct", 3.0, "k3")]
    assert record["status_counts"] == {"correct": 2, "format_error": 1, "incorrect": 1}   # the rows trained on
    assert record["response_tokens_mean"] == 200 and record["truncated_rate"] == 0.25
    assert record["not_okay_ratio"] == (0.5 * 2 + 0.0 * 3) / 5 and record["harness_errors"] == 1
    assert record["timeout_seconds"] == 8.5  # rank 0's turn stats name none: 0
    assert (record["kernels_compiled"], record["builds_reused"], record["verdicts_reused"]) == (2, 1, 1)
    # summed over the ranks, per turn
    assert record["format_error_reasons"] == [{}, {"format_error: no code in the response": 3, "format_error: gate": 1}]
    assert record["slowest_seconds"] == [{}, {"compile": 9.5, "since_batch_start": 14.2}]  # per turn and rank
    assert record["latency_by_status"] == {"correct": [12.5, 14.2], "incorrect": [9.0]}
    assert record["slowest_verdict"] == ["", "timeout: candidate timed out during check"]
    assert record["loss"] == ((0.25 + 0.75) + (-0.5 + 0.5)) / 2   # ranks summed, optimizer steps averaged
    assert abs(record["clip_fraction"] - 0.2) < 1e-12 and abs(record["approx_kl"] - 0.03) < 1e-12
    assert record["advantage_nonzero"] == 0.75 and record["grad_norm"] == 0.1 and record["lr"] == 1e-5
    assert record["train_flops"] == 3e12 and record["ranks"] == 2 and record["reference_error_tasks"] == ["c"]
    assert (record["seconds_generation"], record["seconds_evaluation"], record["seconds_training"]) == (7.0, 2.0, 1.5)
    assert (record["harness_calls"], record["generation_rounds"]) == (2, 3)   # the busiest rank's
    record["seconds_step"] = 10.0
    line = train_log.step_line(record)
    assert ("eval 2.0 s (20% of the step) in 2 harness call(s): compiled 2, cached 1, verdicts reused 1, "
            "timeouts 8.5 s") in line, line
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.write(json.dumps(record) + "\n")
    train_log.plot_curves(str(tmp_path))
    assert (tmp_path / "plots" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_code_id_names_a_kernel_by_its_code():
    assert train_log.code_id("  int x;\n") == train_log.code_id("int x;") != train_log.code_id("int y;")
    assert train_log.code_id(None) == train_log.code_id("  ") == ""
    assert train_log.mean_speedup_of_correct([("a", 0, "incorrect", 0.0, 0.0)]) is None


def test_curves_are_a_grid_of_panels_with_whole_steps(tmp_path):
    """Three steps: a plain axis would tick 1.0, 1.25, 1.5, ...; the panels sit in a grid, not a strip."""
    import matplotlib.image
    rows = [{"step": s, "reward_mean": 0.1 * s, "correct_rate": 0.2, "speedup_correct_mean": None if s == 2 else 1.0, "response_tokens_mean": 9.0,
             "seconds_step": 3.0, "correct_rate_per_turn": [0.1, 0.3]} for s in (1, 2, 3)]
    fig = train_log.curves_figure(rows)
    ticks = [t for ax in fig.axes for t in ax.get_xticks() if 1 <= t <= 3]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    assert [text.get_text() for text in fig.axes[-1].get_legend().get_texts()] == ["turn 1", "turn 2"]
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    train_log.plot_curves(str(tmp_path))
    height, width, _ = matplotlib.image.imread(tmp_path / "plots" / "curves.png").shape
    assert width / height < 2.5, (width, height)


def test_forward_flops_by_hand():
    config = types.SimpleNamespace(hidden_size=4, num_hidden_layers=2, vocab_size=10)
    sample = types.SimpleNamespace(input_ids=[0] * 5, completion_ids=[0] * 2)
    # 2 x 100 params x 5 tokens + 2 x 4 x 10 x 2 trained + 2 x 2 layers x 4 x 5^2
    assert train_log.forward_flops(100, config, [sample, sample]) == 2 * (1000 + 160 + 400)
