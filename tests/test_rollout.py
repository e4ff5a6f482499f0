"""Tests for rollout.py: the multi-turn rollout and its samples with a scripted engine and a
tiny HF model, the oracle-mixed engine through a scripted policy; and one slow end-to-end run
on real C++ kernels with the oracle engine. The engines' own tests are in test_engines.py."""
import math
import re
from dataclasses import dataclass

import pytest
import torch

import engines
import rollout
import summarize
from test_engines import EOS, tiny_model

transformers = pytest.importorskip("transformers")
from transformers import ByT5Tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    return ByT5Tokenizer()


# ------------------------------------------------------------------------- the rollout


@dataclass
class FakeTask:
    task_id: str
    reference_src: str
    solutions: dict


TASK_A = FakeTask("t/a", "class Model:  # task A\n    pass\n", {"cpp": "A"})
TASK_B = FakeTask("t/b", "class Model:  # task B\n    pass\n", {"cpp": "B"})


def response(thinking: str, code: str | None, summary: str) -> str:
    body = f"```python\n{code}\n```\n" if code is not None else ""
    return f"<think>\n{thinking}\n</think>\n{body}{summary}"


def kernel(tag: str) -> str:
    # Enough to pass kernel_gate.check_format for cpp: a load_inline kernel and ModelNew.
    return ("import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"
            f"src = 'torch::Tensor f(torch::Tensor x) {{ return x; }} // {tag}'\n"
            "ext = load_inline(name='e', cpp_sources=src, functions=['f'])\n"
            "class ModelNew(nn.Module):\n    def forward(self, x):\n        return ext.f(x)\n")


class ScriptedEngine:
    """Answers from a script keyed by (task marker, trajectory, turn); ids from the real ByT5
    tokenizer, EOS appended as a sampled token, so masks can be checked. The key is read from the
    prompt, as a policy reads its context: the turn is the number of attempts it shows, the trajectory
    the one whose scripted answers those attempts are (identical histories: the first not yet
    answered at that turn), so a call may hold any trajectories at any turns."""

    def __init__(self, tokenizer, script, truncate_at=None):
        self.tokenizer, self.script, self.truncate_at = tokenizer, script, truncate_at
        self.calls, self.answered = [], set()
        self.prompt_opens_thinking = True   # as QwQ's template, which ends the prompt in <think>

    def encode_prompt(self, text):
        return engines.render_prompt(self.tokenizer, text)

    def count_tokens(self, text):
        return len(self.tokenizer(text, add_special_tokens=False).input_ids)

    def key(self, prompt: str) -> tuple:
        task = "A" if "task A" in prompt else "B"
        attempts = re.findall(r"Attempt (\d+):\n```python\n(.*?)\n```\nSummary: ", prompt, re.S)
        turn = max((int(n) for n, _ in attempts), default=0)
        for k in sorted({k for t, k, _ in self.script if t == task}):
            if (task, k, turn) in self.answered:
                continue
            shown = [summarize.parse_response(self.emit(self.script[(task, k, int(n) - 1)]).text,
                                              self.prompt_opens_thinking).code or "" for n, _ in attempts]
            if all(code.rstrip() == own.rstrip() for (_, code), own in zip(attempts, shown)):
                self.answered.add((task, k, turn))
                return task, k, turn
        raise AssertionError(f"no scripted trajectory of task {task} left at turn {turn}")

    def generate(self, prompt_token_ids, *, n, max_new_tokens, temperature, top_p, stop):
        self.calls.append((len(prompt_token_ids), n))
        out = []
        for ids in prompt_token_ids:
            group = []
            for _ in range(n):
                group.append(self.emit(self.script[self.key(self.tokenizer.decode(ids))]))
            out.append(group)
        return out

    def emit(self, text: str) -> engines.Completion:
        ids_out, finish = self.tokenizer(text, add_special_tokens=False).input_ids + [EOS], "stop"
        if self.truncate_at is not None and len(ids_out) > self.truncate_at:
            ids_out, finish = ids_out[:self.truncate_at], "length"
        return engines.Completion(ids_out, None, self.tokenizer.decode(ids_out, skip_special_tokens=True), finish)


def fake_evaluator(verdicts):
    """Verdict by the tag in the code's source; records every batch it was given."""
    batches = []

    def evaluate_batch(pairs):
        batches.append(pairs)
        out = []
        for _, code in pairs:
            tag = code.split("// ")[1].split("'")[0]
            status, speedup = verdicts[tag]
            out.append({"status": status, "correct": status == "correct", "compiled": True,
                        "speedup": speedup, "ref_ms": 1.0, "candidate_ms": 1.0,
                        "message": f"verdict for {tag}"})
        return out
    return evaluate_batch, batches


def test_rollout_samples_prompts_returns_and_stats(tokenizer):
    script = {}
    for task in "AB":
        script[(task, 0, 0)] = response("Okay, plan A0.", kernel(f"{task}00"), f"summary {task}00")
        script[(task, 0, 1)] = response("SECRET thinking.", kernel(f"{task}01"), f"summary {task}01")
        script[(task, 0, 2)] = response("Okay.", kernel(f"{task}02"), f"summary {task}02")
        script[(task, 1, 0)] = response("Hmm, no code this time.", None, "forgot the code")
        script[(task, 1, 1)] = response("Okay.", kernel(f"{task}11"), f"summary {task}11")
        script[(task, 1, 2)] = response("Okay.", kernel(f"{task}12"), f"summary {task}12")
    verdicts = {}
    for task in "AB":
        verdicts.update({f"{task}00": ("correct", 1.0), f"{task}01": ("incorrect", 0.0),
                         f"{task}02": ("correct", 2.0), f"{task}11": ("compile_error", 0.0),
                         f"{task}12": ("correct", 0.5)})
    runs = {}
    for overlap in (False, True):
        engine = ScriptedEngine(tokenizer, script)
        evaluate_batch, batches = fake_evaluator(verdicts)
        config = rollout.RolloutConfig(n_trajectories=2, n_turns=3, max_new_tokens=4096,
                                       max_prompt_tokens=100_000, language="cpp", overlap_turns=overlap)
        runs[overlap] = rollout.rollout([TASK_A, TASK_B], engine, evaluate_batch, config), engine.calls, batches
    # Turn by turn: one batched generate and one harness call per turn (without the response that had
    # no code); turn 0 sends each task's prompt once with n=G.
    _, calls, batches = runs[False]
    assert calls == [(2, 2), (4, 1), (4, 1)]
    assert [len(b) for b in batches] == [2, 4, 4]
    # Overlapped: trajectory 1's turn 0 had no code, so its turn 1 is written at once and judged in the
    # first harness call, beside trajectory 0's turn 0; then 1's turn 2 beside 0's turn 1; then 0's turn 2.
    (samples, stats), calls, batches = runs[True]
    assert calls == [(2, 2), (2, 1), (4, 1), (2, 1)]
    assert [sorted(code.split("// ")[1][:3] for _, code in b) for b in batches] == [
        ["A00", "A11", "B00", "B11"], ["A01", "A12", "B01", "B12"], ["A02", "B02"]]
    # The same samples and stats either way: each trajectory sees only its own history.
    fields = lambda s: (s.task_id, s.trajectory, s.turn, s.prompt_ids, s.completion_ids, s.status, s.score,  # noqa: E731
                        s.discounted_return, s.feedback)
    assert list(map(fields, samples)) == list(map(fields, runs[False][0][0]))
    assert stats == runs[False][0][1]
    assert len(samples) == 2 * 2 * 3
    by_key = {(s.task_id, s.trajectory, s.turn): s for s in samples}
    for s in samples:
        assert s.input_ids == s.prompt_ids + s.completion_ids
        assert s.loss_mask == [0] * len(s.prompt_ids) + [1] * len(s.completion_ids)
        assert s.completion_ids[-1] == EOS and not s.truncated
        assert tokenizer.decode(s.completion_ids, skip_special_tokens=True) == s.text
    # Returns, by hand: scores of trajectory 0 are 1.3, 0, 2.3; gamma 0.4, sum.
    r = [by_key[("t/a", 0, t)].discounted_return for t in range(3)]
    assert r == pytest.approx([1.3 + 0.4 * 0.92, 0.92, 2.3])
    # Trajectory 1: no code (format_error, 0), compile error (0), correct at 0.5x (0.8).
    s10 = by_key[("t/b", 1, 0)]
    assert (s10.status, s10.score, s10.code) == ("format_error", 0.0, None)
    assert [by_key[("t/b", 1, t)].discounted_return for t in range(3)] == pytest.approx([0.128, 0.32, 0.8])
    # Turn 2's prompt shows turn 1's code, summary and feedback, and none of its thinking.
    prompt = tokenizer.decode(by_key[("t/a", 0, 2)].prompt_ids)
    turn1 = by_key[("t/a", 0, 1)]
    assert kernel("A01").strip() in prompt and "summary A01" in prompt
    assert turn1.feedback in prompt and "verdict for A01" in turn1.feedback
    assert "SECRET" not in prompt and "plan A0" not in prompt
    assert "task A" in prompt and "task B" not in prompt
    # Per-turn stats.
    assert stats[0]["status_counts"] == {"correct": 2, "format_error": 2}
    # the parser's own refusal, as the policy's feedback gives it
    assert stats[0]["format_error_reasons"] == {"format_error: no ```python code block found; after thinking, "
                                                "give the complete code defining class ModelNew in one ```python block.": 2}
    assert stats[1]["format_error_reasons"] == {}
    assert stats[0]["mean_score"] == pytest.approx(1.3 / 2)
    assert stats[0]["not_okay_ratio"] == pytest.approx(0.5)   # the "Hmm" responses
    assert stats[1]["not_okay_ratio"] == pytest.approx(0.5)   # the "SECRET" ones
    assert stats[2]["best_speedup"] == 2.0 and stats[2]["correct_rate"] == 1.0


def test_rollout_drops_a_task_whose_reference_failed_and_reports_it(tokenizer):
    # Task B's reference fails in the harness at turn 0 (kernel_eval's "reference_error"): its
    # candidates are not judged again, none of its samples is trained on (a group of zeros would
    # teach the policy that every answer to B is bad), the stats name it, on_turn still shows it.
    script = {}
    for task in "AB":
        for g in range(2):
            for t in range(2):
                script[(task, g, t)] = response("Okay.", kernel(f"{task}{g}{t}"), f"summary {task}{g}{t}")
    verdicts = {f"A{g}{t}": ("correct", 1.0) for g in range(2) for t in range(2)}
    verdicts.update({f"B{g}{t}": ("reference_error", 0.0) for g in range(2) for t in range(2)})
    engine = ScriptedEngine(tokenizer, script)
    evaluate_batch, batches = fake_evaluator(verdicts)
    config = rollout.RolloutConfig(n_trajectories=2, n_turns=2, max_new_tokens=4096,
                                   max_prompt_tokens=100_000, language="cpp")
    seen = []
    samples, stats = rollout.rollout([TASK_A, TASK_B], engine, evaluate_batch, config,
                                     on_turn=lambda turn, ss: seen.extend(ss))
    assert {s.task_id for s in samples} == {"t/a"} and len(samples) == 2 * 2
    assert [len(b) for b in batches] == [4, 2]  # turn 1 does not send B's candidates again
    assert [st["reference_error_tasks"] for st in stats] == [["t/b"], ["t/b"]]
    assert stats[0]["status_counts"] == {"correct": 2, "reference_error": 2}
    b_seen = [s for s in seen if s.task_id == "t/b"]
    assert len(b_seen) == 4 and all(s.status == "reference_error" and s.score == 0.0 for s in b_seen)
    assert "reference failed" in b_seen[0].feedback


def test_rollout_leaves_out_a_sample_the_harness_could_not_judge(tokenizer):
    # kernel_eval's "harness_error" is no verdict, not a verdict of 0: that sample is not trained on
    # (nor counted in its group's statistics), the trajectory goes on, the turn before it gets a
    # return from the judged turns only, and the stats count it.
    script = {}
    for g in range(2):
        for t in range(2):
            script[("A", g, t)] = response("Okay.", kernel(f"A{g}{t}"), f"summary A{g}{t}")
    verdicts = {"A00": ("correct", 1.0), "A01": ("harness_error", 0.0),
                "A10": ("incorrect", 0.0), "A11": ("correct", 2.0)}
    engine = ScriptedEngine(tokenizer, script)
    evaluate_batch, batches = fake_evaluator(verdicts)
    config = rollout.RolloutConfig(n_trajectories=2, n_turns=2, max_new_tokens=4096,
                                   max_prompt_tokens=100_000, language="cpp")
    samples, stats = rollout.rollout([TASK_A], engine, evaluate_batch, config)
    by_key = {(s.trajectory, s.turn): s for s in samples}
    assert sorted(by_key) == [(0, 0), (1, 0), (1, 1)]
    assert by_key[(0, 0)].discounted_return == pytest.approx(1.3)  # nothing from the unjudged turn
    assert by_key[(1, 0)].discounted_return == pytest.approx(0.4 * 2.3)
    assert [len(b) for b in batches] == [2, 2]  # the trajectory went on to turn 1
    assert stats[1]["status_counts"] == {"harness_error": 1, "correct": 1}


def test_verdict_record_is_the_one_form_a_verdict_is_read_in(tokenizer):
    import kernel_eval
    result = kernel_eval.EvalResult(status="correct", compiled=True, correct=True, speedup=1.5, message="ok")
    assert rollout.verdict_record(result) == result.to_dict()
    stored = {"status": "incorrect", "correct": False}
    assert rollout.verdict_record(stored) == stored and rollout.verdict_record(stored) is not stored
    with pytest.raises(TypeError, match="kernel_eval.EvalResult or a dict, got tuple"):
        rollout.verdict_record(("correct", 1.5))
    # the rollout reads EvalResults and dicts alike: the same samples either way
    script = {("A", g, t): response("Okay.", kernel(f"A{g}{t}"), f"summary A{g}{t}") for g in range(2) for t in range(2)}
    verdicts = {"A00": ("correct", 1.0), "A01": ("incorrect", 0.0), "A10": ("compile_error", 0.0),
                "A11": ("correct", 2.0)}
    config = rollout.RolloutConfig(n_trajectories=2, n_turns=2, max_new_tokens=4096,
                                   max_prompt_tokens=100_000, language="cpp")
    as_dicts, _ = fake_evaluator(verdicts)

    def as_results(pairs):
        return [kernel_eval.EvalResult(**d) for d in as_dicts(pairs)]
    runs = [rollout.rollout([TASK_A], ScriptedEngine(tokenizer, script), evaluate, config)[0]
            for evaluate in (as_dicts, as_results)]
    assert runs[0] == runs[1] and [s.score for s in runs[0]] == pytest.approx([1.3, 0.0, 0.0, 2.3])


def test_rollout_keeps_truncated_completions_and_collates_without_masking_by_pad(tokenizer):
    script = {(t, k, turn): response("Okay, " + "long " * 40, kernel(f"{t}{k}{turn}"), "s")
              for t in "AB" for k in range(2) for turn in range(2)}
    engine = ScriptedEngine(tokenizer, script, truncate_at=50)
    evaluate_batch, batches = fake_evaluator({})
    for mask_truncated in (False, True):
        engine.answered.clear()
        config = rollout.RolloutConfig(n_trajectories=2, n_turns=2, max_new_tokens=50,
                                       max_prompt_tokens=100_000, language="cpp",
                                       mask_truncated=mask_truncated)
        samples, stats = rollout.rollout([TASK_A, TASK_B], engine, evaluate_batch, config)
        assert not batches  # cut inside the thinking: nothing to evaluate
        for s in samples:
            assert s.truncated and len(s.completion_ids) == 50
            assert (s.status, s.score) == ("format_error", 0.0)
            assert s.loss_mask == [0] * len(s.prompt_ids) + [0 if mask_truncated else 1] * 50
        assert stats[0]["truncated_rate"] == 1.0

    # Collation: pad id equal to EOS; a completion's own final EOS stays in the loss.
    short = rollout.Sample("t", 0, 0, [5, 6], [7, EOS], [0, 0, 1, 1], None, "", False,
                           "correct", 1.3, 1.3, 1.0, "", "")
    long = rollout.Sample("t", 1, 0, [5, 6, 7], [8, 9, 10, EOS], [0, 0, 0, 1, 1, 1, 1], None,
                          "", False, "correct", 0.3, 0.3, 0.0, "", "")
    batch = rollout.collate_samples([short, long], pad_token_id=EOS)
    assert batch["input_ids"].tolist() == [[5, 6, 7, EOS, EOS, EOS, EOS], [5, 6, 7, 8, 9, 10, EOS]]
    assert batch["loss_mask"].tolist() == [[0, 0, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1, 1]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0, 0], [1] * 7]


@pytest.mark.parametrize("device,fast", [
    ("cpu", False), ("cpu", True),
    pytest.param("cuda", True, marks=pytest.mark.gpu)])
def test_rollout_with_tiny_hf_model_end_to_end(tokenizer, device, fast):
    """Random text: nothing parses, nothing is evaluated, every sample still has exact
    prompt/completion ids and masks, and truncated ones are marked; through plain generate
    and the fast decoder (on CUDA with its graph-captured step, in bf16)."""
    model = tiny_model(seed=11, eos_logit=2.0).to(device)
    if device == "cuda":
        model = model.to(torch.bfloat16)
    engine = engines.HFEngine(model, tokenizer, fast=fast)
    evaluate_batch, batches = fake_evaluator({})
    config = rollout.RolloutConfig(n_trajectories=2, n_turns=2, max_new_tokens=16,
                                   max_prompt_tokens=100_000, language="cpp", temperature=1.0)
    torch.manual_seed(0)
    samples, stats = rollout.rollout([TASK_A, TASK_B], engine, evaluate_batch, config)
    assert len(samples) == 8 and not batches
    for s in samples:
        assert s.status == "format_error" and s.score == 0.0 and s.discounted_return == 0.0
        assert s.loss_mask == [0] * len(s.prompt_ids) + [1] * len(s.completion_ids)
        assert s.truncated == (len(s.completion_ids) == 16 and s.completion_ids[-1] != EOS)
        assert len(s.logprobs) == len(s.completion_ids)
        prompt = tokenizer.decode(s.prompt_ids)
        assert prompt.startswith("User: ") and prompt.endswith("Assistant: ")
        assert ("task A" in prompt) == (s.task_id == "t/a")
    turn2_prompt = tokenizer.decode(samples[1].prompt_ids)
    assert "Attempt 1:" in turn2_prompt and samples[0].feedback in turn2_prompt
    assert stats[1]["mean_response_tokens"] == pytest.approx(
        sum(len(s.completion_ids) for s in samples if s.turn == 1) / 4)


def test_rollout_refuses_an_empty_task_list(tokenizer):
    engine = ScriptedEngine(tokenizer, {})
    with pytest.raises(ValueError, match="task list is empty"):
        rollout.rollout([], engine, fake_evaluator({})[0], rollout.RolloutConfig(language="cpp"))


def test_rollout_refuses_an_engine_that_answers_fewer_prompts_than_it_was_given(tokenizer):
    class Short(ScriptedEngine):
        def generate(self, prompt_token_ids, **kwargs):
            return super().generate(prompt_token_ids, **kwargs)[:-1]
    script = {(t, k, 0): response("Okay.", kernel(t), "s") for t in "AB" for k in range(2)}
    config = rollout.RolloutConfig(n_trajectories=2, n_turns=1, max_new_tokens=4096,
                                   max_prompt_tokens=100_000, language="cpp")
    with pytest.raises(RuntimeError, match="the engine returned 2 completions for 4 prompts"):
        rollout.rollout([TASK_A, TASK_B], Short(tokenizer, script), fake_evaluator({})[0], config)


def test_rollout_takes_no_code_from_a_completion_cut_inside_thinking_the_template_opened(tokenizer):
    # The template opened <think>; the completion is all reasoning with a draft kernel in it.
    script = {(t, 0, 0): f"Okay, a draft:\n```python\n{kernel(t)}\n```\nstill thinking" for t in "AB"}
    engine = ScriptedEngine(tokenizer, script)
    evaluate_batch, batches = fake_evaluator({"A": ("correct", 1.0), "B": ("correct", 1.0)})
    config = rollout.RolloutConfig(n_trajectories=1, n_turns=1, max_new_tokens=4096,
                                   max_prompt_tokens=100_000, language="cpp")
    open_samples, _ = rollout.rollout([TASK_A, TASK_B], engine, evaluate_batch, config)
    assert batches == [] and {s.status for s in open_samples} == {"format_error"}
    assert all("</think>" in s.feedback for s in open_samples)
    engine.prompt_opens_thinking = False   # a template that does not open it
    engine.answered.clear()
    closed_samples, _ = rollout.rollout([TASK_A, TASK_B], engine, evaluate_batch, config)
    assert {s.status for s in closed_samples} == {"correct"}


def test_oracle_mixed_engine_writes_oracle_answers_in_policy_tokens(tokenizer):
    solution = {"t/a": kernel("A"), "t/b": kernel("B")}
    tasks_ = [FakeTask(t.task_id, t.reference_src, {"cpp": solution[t.task_id]}) for t in (TASK_A, TASK_B)]
    policy = ScriptedEngine(tokenizer, {(t, k, 0): "policy text" for t in "AB" for k in range(8)})
    policy.prompt_opens_thinking = False
    prompts = [policy.encode_prompt(f"solve {t.reference_src}") for t in tasks_]
    for share, want_oracle in ((0.0, 0), (1.0, 16)):
        policy.answered.clear()
        engine = engines.OracleMixedEngine(policy, tokenizer, tasks_, oracle_share=share, language="cpp")
        groups = engine.generate(prompts, n=8, max_new_tokens=100_000)
        oracle = [c for g in groups for c in g if c.logprobs is None and c.text != "policy text"]
        assert len(oracle) == want_oracle
    policy.answered.clear()
    engine = engines.OracleMixedEngine(policy, tokenizer, tasks_, oracle_share=0.5, language="cpp", seed=2)
    groups = engine.generate(prompts, n=8, max_new_tokens=100_000)
    for task, group in zip(tasks_, groups):
        kinds = {c.text == "policy text" for c in group}
        assert kinds == {True, False}   # both kinds in each group at seed 2
        for c in group:
            if c.text == "policy text":
                continue
            # the oracle's text in the policy's own tokens, ended by EOS; parses to the solution
            assert c.token_ids == tokenizer(c.text, add_special_tokens=False).input_ids + [EOS]
            assert summarize.parse_response(c.text).code.strip() == task.solutions["cpp"].strip()
            assert c.finish_reason == "stop"
    cut = engines.OracleMixedEngine(policy, tokenizer, tasks_, oracle_share=1.0, language="cpp")
    short = cut.generate(prompts[:1], n=1, max_new_tokens=12)[0][0]
    assert (short.finish_reason, len(short.token_ids)) == ("length", 12)
    with pytest.raises(ValueError, match="oracle_share"):
        engines.OracleMixedEngine(policy, tokenizer, tasks_, oracle_share=1.5, language="cpp")


@pytest.mark.slow
@pytest.mark.parametrize("language,device", [
    ("cpp", "cpu"), pytest.param("cuda", "cuda", marks=pytest.mark.gpu)])
def test_oracle_rollout_on_real_kernels(language, device):
    """2 tasks x 2 trajectories x 2 turns through the real harness (C++ on CPU, CUDA on a
    GPU): correct solutions score > 0, corrupted ones (wrong output) score 0."""
    import kernel_eval
    import tasks as tasks_module
    wanted = ("builtin/level1/01_relu", "builtin/level2/06_bias_tanh_multiply")
    builtin = [t for t in tasks_module.load_builtin(device=device) if t.task_id in wanted]
    assert [t.task_id for t in builtin] == list(wanted)
    # seed 1 with rate 0.5 gives both kinds in these 8 answers.
    engine = engines.OracleEngine(builtin, language=language, corrupt_rate=0.5, seed=1)

    def evaluate_batch(pairs):   # two input sets checked, not five: the rollout is under test here
        return kernel_eval.evaluate_batch(pairs, device=device, n_correct_trials=2)

    config = rollout.RolloutConfig(n_trajectories=2, n_turns=2, max_new_tokens=100_000,
                                   max_prompt_tokens=100_000, language=language)
    samples, stats = rollout.rollout(builtin, engine, evaluate_batch, config)
    assert len(samples) == 8
    solution = {t.task_id: summarize.parse_response(
        engines.ORACLE_RESPONSE.format(code=t.solutions[language].strip("\n"), summary="")).code
        for t in builtin}
    seen = [(s.code != solution[s.task_id], s.status, s.score, s.feedback[:300]) for s in samples]
    assert {corrupted for corrupted, *_ in seen} == {True, False}, seen
    for corrupted, status, score, _ in seen:
        if corrupted:
            assert status == "incorrect" and score == 0.0, seen
        else:
            assert status == "correct" and score > 0.3 - 1e-9, seen
    for task in builtin:
        for g in range(2):
            s0, s1 = sorted((s for s in samples if s.task_id == task.task_id and s.trajectory == g),
                            key=lambda s: s.turn)
            assert s1.discounted_return == pytest.approx(s1.score)
            assert s0.discounted_return == pytest.approx(s0.score + 0.4 * s1.score)
    assert sum(st["status_counts"].get("correct", 0) for st in stats) == sum(
        s.code == solution[s.task_id] for s in samples)


def test_rollout_continues_from_histories_at_a_turn_offset_and_reports_each_turn(tokenizer):
    script = {}
    for task in "AB":
        for k in range(2):
            for turn in range(3):
                script[(task, k, turn)] = response("Okay.", kernel(f"{task}{k}{turn}"), f"summary {task}{k}{turn}")
    verdicts = {f"{t}{k}{turn}": (("correct", 1.5) if (k + turn) % 2 == 0 else ("incorrect", 0.0))
                for t in "AB" for k in range(2) for turn in range(3)}
    config = rollout.RolloutConfig(n_trajectories=2, n_turns=3, max_new_tokens=4096,
                                   max_prompt_tokens=100_000, language="cpp")
    seen = []
    whole, _ = rollout.rollout([TASK_A, TASK_B], ScriptedEngine(tokenizer, script),
                               fake_evaluator(verdicts)[0], config,
                               on_turn=lambda turn, samples: seen.append((turn, samples)))
    # The callback: once per turn, as judged, with that turn's samples and the verdict fields.
    assert [turn for turn, _ in seen] == [0, 1, 2]
    for turn, samples in seen:
        assert [(s.task_id, s.trajectory, s.turn) for s in samples] == [
            (t, k, turn) for t in ("t/a", "t/b") for k in range(2)]
        assert all(math.isnan(s.discounted_return) for s in samples)
    first = seen[0][1][0]
    assert (first.correct, first.ref_ms, first.candidate_ms, first.timing_ok) == (True, 1.0, 1.0, True)
    assert (first.message, first.summary) == ("verdict for A00", "summary A00")
    assert [s.correct for s in whole] == [s.status == "correct" for s in whole]

    # The first turn alone, then the other two from its histories at turn offset 1.
    head, _ = rollout.rollout([TASK_A, TASK_B], ScriptedEngine(tokenizer, script),
                              fake_evaluator(verdicts)[0], rollout.RolloutConfig(
                                  **{**config.__dict__, "n_turns": 1}))
    histories = [[summarize.Attempt(s.code or "", s.summary, s.feedback)] for s in head]
    engine = ScriptedEngine(tokenizer, script)
    tail, stats = rollout.rollout([TASK_A, TASK_B], engine, fake_evaluator(verdicts)[0],
                                  rollout.RolloutConfig(**{**config.__dict__, "n_turns": 2}),
                                  histories=histories, start_turn=1)
    assert engine.calls == [(4, 1), (4, 1)]   # continued trajectories: one prompt each
    assert [st["turn"] for st in stats] == [1, 2]
    later = [s for s in whole if s.turn >= 1]
    key = lambda s: (s.task_id, s.trajectory, s.turn)  # noqa: E731
    assert sorted(map(key, tail)) == sorted(map(key, later))
    by_key = {key(s): s for s in tail}
    for s in later:
        t = by_key[key(s)]
        assert (t.prompt_ids, t.completion_ids, t.status, t.score) == (s.prompt_ids, s.completion_ids, s.status, s.score)
    with pytest.raises(ValueError, match="3 histories for 2 tasks x 2 trajectories"):
        rollout.rollout([TASK_A, TASK_B], engine, fake_evaluator(verdicts)[0], config, histories=histories[:3])




def test_micro_batches_pack_sorted_samples_under_the_padded_token_budget():
    def sample(n_prompt, n_completion):
        return rollout.Sample("t", 0, 0, [5] * n_prompt, [6] * n_completion,
                              [0] * n_prompt + [1] * n_completion, None, "", False, "correct", 0.0, 0.0, 0.0, None, "")
    samples = [sample(2, 3), sample(3, 2), sample(1, 3)]   # lengths 5, 5, 4
    batches = rollout.micro_batches(samples, 0, 10, torch.device("cpu"))
    # sorted by length: 4 (row 2), then 5 (row 0) -> 2 x 5 = 10 fits; row 1 would make 3 x 5 = 15
    assert [b["rows"] for b in batches] == [[2, 0], [1]]
    assert batches[0]["input_ids"].tolist() == [[5, 6, 6, 6, 0], [5, 5, 6, 6, 6]]
    assert batches[0]["loss_mask"].tolist() == [[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]]
    assert "attention_mask" not in batches[0]
    empty = rollout.empty_micro_batch(0, torch.device("cpu"))
    assert empty["rows"] == [] and int(empty["loss_mask"].sum()) == 0


def test_reused_verdicts_judge_each_distinct_pair_once():
    calls = []

    def evaluate(pairs, **kwargs):
        calls.append(list(pairs))
        return [{"status": "correct", "message": f"verdict of {code} for {ref}"} for ref, code in pairs]
    once = rollout.reusing_verdicts(evaluate)
    first = once([("r", "a"), ("r", "b"), ("r", "a")])
    assert [v["message"] for v in first] == ["verdict of a for r", "verdict of b for r", "verdict of a for r"]
    # the first appearance is the harness's verdict; a repeat, in this batch or a later one, is marked
    assert [v.get("verdict_reused", False) for v in first] == [False, False, True]
    second = once([("r", "a"), ("r2", "a")])
    assert [(v["message"], v.get("verdict_reused", False)) for v in second] == [
        ("verdict of a for r", True), ("verdict of a for r2", False)]
    assert calls == [[("r", "a"), ("r", "b")], [("r2", "a")]]


def test_a_reused_timed_verdict_keeps_its_first_speedup():
    speedups = iter([1.25, 0.5])

    def evaluate(pairs, **kwargs):
        return [{"status": "correct", "speedup": next(speedups)} for _ in pairs]
    once = rollout.reusing_verdicts(evaluate)
    assert [v["speedup"] for v in once([("r", "a")])] == [1.25]
    assert [(v["speedup"], v["verdict_reused"]) for v in once([("r", "a")])] == [(1.25, True)]


def test_a_verdict_known_without_the_harness_lets_its_trajectory_go_on(tokenizer):
    """reusing_verdicts holds kernel X's verdict from an earlier step. Trajectory 0 repeats X at turn 0,
    then writes a new kernel W; trajectory 1 writes a new kernel Y, then repeats it. Overlapped, W is
    written while Y waits for the harness and both are judged in one call, so the step waits for one
    round of builds; turn by turn, W waits for Y's verdict and is judged in a second call."""
    script = {("A", 0, 0): response("Okay.", kernel("X"), "s"), ("A", 0, 1): response("Okay.", kernel("W"), "s"),
              ("A", 1, 0): response("Okay.", kernel("Y"), "s"), ("A", 1, 1): response("Okay.", kernel("Y"), "s")}
    runs = {}
    for overlap in (False, True):
        harness, batches = fake_evaluator({tag: ("correct", 1.0) for tag in "XWY"})
        evaluate = rollout.reusing_verdicts(harness)
        assert evaluate.known((TASK_A.reference_src, kernel("X"))) is None
        evaluate([(TASK_A.reference_src, kernel("X"))])   # the earlier step
        assert evaluate.known((TASK_A.reference_src, kernel("X")))["verdict_reused"] is True
        config = rollout.RolloutConfig(n_trajectories=2, n_turns=2, max_new_tokens=4096,
                                       max_prompt_tokens=100_000, language="cpp", overlap_turns=overlap)
        samples, stats = rollout.rollout([TASK_A], ScriptedEngine(tokenizer, script), evaluate, config)
        runs[overlap] = [sorted(code.split("// ")[1][0] for _, code in b) for b in batches[1:]], samples, stats
    assert runs[True][0] == [["W", "Y"]]
    assert runs[False][0] == [["Y"], ["W"]]
    fields = lambda s: (s.trajectory, s.turn, s.prompt_ids, s.completion_ids, s.status, s.discounted_return)  # noqa: E731
    assert list(map(fields, runs[True][1])) == list(map(fields, runs[False][1]))
    assert [st["verdicts_reused"] for st in runs[True][2]] == [1, 1]   # X at turn 0, Y at turn 1


def caching_harness(verdicts, built=()):
    """A stand-in for kernel_eval.evaluate_batch's accounting: a batch builds each distinct code once
    (identical candidates share the build, even across tasks), a later batch finds it in the cache
    (build_reused); a timeout waits `seconds` per candidate judged. Verdict by tag, as fake_evaluator."""
    cache, batches = set(built), []

    def evaluate_batch(pairs):
        batches.append(list(pairs))
        before = set(cache)
        cache.update(code for _, code in pairs)
        out = []
        for _, code in pairs:
            status, seconds = verdicts[code.split("// ")[1].split("'")[0]]
            out.append({"status": status, "correct": status == "correct", "compiled": True, "speedup": 1.0,
                        "message": f"candidate timed out during check ({code.split('// ')[1].split(chr(39))[0]})",
                        "timeout_seconds": seconds, "build_reused": code in before,
                        "seconds": {"compile": 1.0, "since_batch_start": 1.0 + seconds}})
        return out
    return evaluate_batch, batches


@pytest.mark.parametrize("reuse", [False, True])
def test_turn_stats_count_builds_compiled_and_reused_and_verdicts_reused(tokenizer, reuse):
    """Turn 0: A's two trajectories and B's first write the same kernel X (a 5 s timeout), B's second
    kernel Y, already in the harness's cache. Turn 1: both first trajectories write X again, A's second
    a new kernel Z (a 7 s timeout), B's second no code. Counted by hand: one build for X however many
    candidates share it; with reused verdicts, a repeated pair is neither judged nor waited on again."""
    script = {("A", 0, 0): response("Okay.", kernel("X"), "s"), ("A", 1, 0): response("Okay.", kernel("X"), "s"),
              ("B", 0, 0): response("Okay.", kernel("X"), "s"), ("B", 1, 0): response("Okay.", kernel("Y"), "s"),
              ("A", 0, 1): response("Okay.", kernel("X"), "s"), ("A", 1, 1): response("Okay.", kernel("Z"), "s"),
              ("B", 0, 1): response("Okay.", kernel("X"), "s"), ("B", 1, 1): response("Okay.", None, "no code")}
    harness, batches = caching_harness({"X": ("timeout", 5.0), "Y": ("correct", 0.0), "Z": ("timeout", 7.0)},
                                       built=[kernel("Y")])
    evaluate = rollout.reusing_verdicts(harness) if reuse else harness
    config = rollout.RolloutConfig(n_trajectories=2, n_turns=2, max_new_tokens=4096,
                                   max_prompt_tokens=100_000, language="cpp")
    _, stats = rollout.rollout([TASK_A, TASK_B], ScriptedEngine(tokenizer, script), evaluate, config)
    counts = [(st["kernels_compiled"], st["builds_reused"], st["verdicts_reused"], st["timeout_seconds"])
              for st in stats]
    if reuse:
        assert [len(b) for b in batches] == [3, 1]   # (A, X), (B, X), (B, Y); then (A, Z)
        assert counts == [(1, 1, 1, 10.0), (1, 0, 2, 7.0)]
    else:
        assert [len(b) for b in batches] == [4, 3]
        assert counts == [(1, 1, 0, 15.0), (1, 1, 0, 17.0)]   # turn 1: Z built, X from the cache
    assert stats[1]["status_counts"] == {"timeout": 3, "format_error": 1}
    # the verdict each turn waited for last: X's 5 s timeout, then Z's 7 s one
    assert [st["slowest_seconds"] for st in stats] == [{"compile": 1.0, "since_batch_start": 6.0},
                                                      {"compile": 1.0, "since_batch_start": 8.0}]
    assert [st["slowest_verdict"] for st in stats] == ["timeout: candidate timed out during check (X)",
                                                      "timeout: candidate timed out during check (Z)"]


def test_turn_stats_give_each_judged_verdicts_latency_by_status(tokenizer):
    """X correct twice (the second reused), Y a compile error judged early twice, Z one built as written
    (and one from the build cache, which is no wait for a build): counted by hand."""
    script = {("A", 0, 0): response("Okay.", kernel("X"), "s"), ("A", 1, 0): response("Okay.", kernel("Y"), "s"),
              ("A", 2, 0): response("Okay.", kernel("X"), "s"), ("A", 3, 0): response("Okay.", kernel("Y"), "s"),
              ("A", 4, 0): response("Okay.", kernel("Z"), "s")}
    verdicts = {kernel("X"): ("correct", 3.25, ""), kernel("Y"): ("compile_error", 1.5, "undefined"),
                kernel("Z"): ("compile_error", 20.0, "")}
    message = 'compilation failed:\nError building extension\nline 3 (cuda.cu:9): error: "i" has already been declared'

    def harness(pairs, **kwargs):
        return [{"status": verdicts[code][0], "correct": verdicts[code][0] == "correct", "speedup": 0.0,
                 "seconds": {"latency": verdicts[code][1]}, "early_verdict": verdicts[code][2],
                 "message": message if verdicts[code][0] == "compile_error" else "", "build_reused": False}
                for _, code in pairs]
    config = rollout.RolloutConfig(n_trajectories=5, n_turns=1, max_new_tokens=4096,
                                   max_prompt_tokens=100_000, language="cpp")
    _, stats = rollout.rollout([TASK_A], ScriptedEngine(tokenizer, script), rollout.reusing_verdicts(harness), config)
    # X's and Y's second appearances reused the first verdict: they waited for nothing and are not counted
    assert stats[0]["latency_by_status"] == {"compile_error": [1.5, 20.0], "correct": [3.25]}
    first = 'line 3 (cuda.cu:9): error: "i" has already been declared'
    assert stats[0]["compile_errors"] == [[1.5, "undefined", first], [20.0, "", first]]
    # without reused verdicts Y is judged twice but is one kernel: listed once
    config.n_trajectories = 4
    _, stats = rollout.rollout([TASK_A], ScriptedEngine(tokenizer, script), harness, config)
    assert stats[0]["compile_errors"] == [[1.5, "undefined", first]]


def test_verdict_line_is_the_status_and_the_first_diagnostic():
    compile_error = ("compilation failed:\nError building extension 'ext'\n"
                     "line 14 (cuda.cu:43): error: identifier \"stride\" is undefined\n      for (...)\n")
    assert rollout.verdict_line("compile_error", compile_error) == \
        'compile_error: line 14 (cuda.cu:43): error: identifier "stride" is undefined'
    assert rollout.verdict_line("incorrect", "trial 1/5: output: 3 values outside tolerance\nmax abs diff 1") == \
        "incorrect: trial 1/5: output: 3 values outside tolerance"
    assert rollout.verdict_line("correct", "") == "correct"
    assert len(rollout.verdict_line("runtime_error", "x" * 500)) == rollout.STATS_MESSAGE_CHARS
