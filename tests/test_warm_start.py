"""examples/warm_start.py: the variants, the prompts, the loss mask, and the saved checkpoint."""
import json
import os
import random
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import engines  # noqa: E402
import kernel_gate  # noqa: E402
import summarize  # noqa: E402
import tasks  # noqa: E402
import warm_start  # noqa: E402

ALL_TASKS = tasks.load_builtin(os.path.join(ROOT, "tasks"))


@pytest.fixture(scope="module")
def tokenizer():
    return warm_start.build_tokenizer(ALL_TASKS, vocab_size=1024, max_token_length=16)


def test_drop_declaration_removes_a_used_declaration():
    code = ("int64_t unused = 3;\n"
            "const int64_t n = x.numel();\n"
            "for (int64_t i = 0; i < n; ++i) out[i] = in[i];\n")
    broken, name = warm_start.drop_declaration(code)
    assert name == "n"  # `unused` is never used later, so dropping it would still compile
    assert "const int64_t n" not in broken and "int64_t unused = 3;" in broken
    with pytest.raises(ValueError, match="no declaration"):
        warm_start.drop_declaration("out[0] = 1;\n")


@pytest.mark.parametrize("language", ["cuda", "cpp"])
def test_every_builtin_task_has_distinct_variants_that_pass_the_gate(language):
    # The variants must reach the harness (a gate refusal would make them format errors, a different
    # lesson) and must differ from each other. A task whose C++ host function has no loop to repeat
    # has no slow variant: one line says so, and the demo's tasks all have one.
    for task in ALL_TASKS:
        solution = task.solutions[language]
        try:
            codes = {v: warm_start.variant_code(solution, v, language) for v in warm_start.VARIANTS}
        except ValueError as e:
            assert language == "cpp" and "no top-level for loop" in str(e), task.task_id
            assert not any(task.task_id.endswith(n) for n in warm_start.DEFAULT_TASKS.split(","))
            continue
        assert codes["fast"] == solution
        assert len(set(codes.values())) == len(codes), task.task_id
        for variant, code in codes.items():
            assert kernel_gate.check_format(code, language) is None, (task.task_id, variant)


def test_slow_code_repeats_the_launch_or_the_loop():
    cuda = ("void f(torch::Tensor x) {\n"
            "    k<<<blocks, 256, 0, s>>>(\n"
            "        x.data_ptr<float>(), n);\n"
            "    C10_CUDA_KERNEL_LAUNCH_CHECK();\n}")
    assert warm_start.slow_code(cuda, "cuda", passes=3) == (
        "void f(torch::Tensor x) {\n"
        "    for (int pass = 0; pass < 3; ++pass) {\n"
        "        k<<<blocks, 256, 0, s>>>(\n"
        "            x.data_ptr<float>(), n);\n"
        "    }\n"
        "    C10_CUDA_KERNEL_LAUNCH_CHECK();\n}")
    braced = ("torch::Tensor f(torch::Tensor x) {\n"
              "    for (int64_t i = 0; i < n; ++i) {\n"
              "        out[i] = in[(i)];\n"
              "    }\n"
              "    return y;\n}")
    assert warm_start.slow_code(braced, "cpp", passes=2) == (
        "torch::Tensor f(torch::Tensor x) {\n"
        "    for (int pass = 0; pass < 2; ++pass) {\n"
        "        for (int64_t i = 0; i < n; ++i) {\n"
        "            out[i] = in[(i)];\n"
        "        }\n"
        "    }\n"
        "    return y;\n}")
    one_statement = "torch::Tensor f() {\n    for (int p = 0; p < b; ++p)\n        g(p, h(p));\n    return y;\n}"
    assert warm_start.slow_code(one_statement, "cpp", passes=2) == (
        "torch::Tensor f() {\n    for (int pass = 0; pass < 2; ++pass) {\n"
        "        for (int p = 0; p < b; ++p)\n            g(p, h(p));\n    }\n    return y;\n}")
    with pytest.raises(ValueError, match="no kernel launch"):
        warm_start.slow_code("void f() {}", "cuda")


def test_turn0_prompt_is_exactly_the_rollouts(tokenizer):
    args = warm_start.parse_args(["--out", "unused", "--language", "cpp", "--later-turn-share", "0"])
    task = warm_start.select_tasks(ALL_TASKS, "level1/01_relu")[0]
    example = warm_start.draw_example(task, tokenizer, random.Random(1), args)
    engine_like = engines.HFEngine.__new__(engines.HFEngine)  # encode_prompt/count_tokens only
    engine_like.tokenizer = tokenizer
    expected = engine_like.encode_prompt(summarize.build_prompt(
        task.reference_src, [], language="cpp", count_tokens=engine_like.count_tokens,
        max_prompt_tokens=args.max_prompt_tokens))
    assert example.prompt_ids == expected and example.n_attempts == 0
    assert example.response_ids[-1] == tokenizer.eos_token_id
    parsed = summarize.parse_response(tokenizer.decode(example.response_ids, skip_special_tokens=True))
    assert parsed.error is None
    assert parsed.code.strip() == warm_start.variant_code(task.solutions["cpp"], example.variant, "cpp").strip()


def test_variant_mixture_follows_the_shares():
    shares = warm_start.parse_shares("fast=0.1,slow=0.2,wrong_values=0.3,no_compile=0.4")
    rng = random.Random(0)
    draws = [warm_start.draw_variant(rng, shares) for _ in range(4000)]
    for variant, share in shares.items():
        assert abs(draws.count(variant) / 4000 - share) < 0.03, variant
    for bad, why in [("fast=0.5,slow=0.5", "each of"), ("fast=1,fast=0", "named twice"),
                     ("fast=0.5,slow=0.6,wrong_values=0,no_compile=-0.1", "each of")]:
        with pytest.raises(ValueError, match=why):
            warm_start.parse_shares(bad)


def test_later_turn_prompts_show_earlier_attempts(tokenizer):
    args = warm_start.parse_args(["--out", "unused", "--language", "cuda", "--later-turn-share", "1",
                                  "--stray-share", "0"])
    task = warm_start.select_tasks(ALL_TASKS, "level1/07_row_sum")[0]
    example = warm_start.draw_example(task, tokenizer, random.Random(3), args)
    text = tokenizer.decode(example.prompt_ids)
    assert example.n_attempts in (1, 2)
    assert "Attempt 1:" in text and "Feedback: Your code" in text


def test_earlier_attempts_follow_the_history_shares_and_responses_the_shares(tokenizer):
    # every earlier attempt the fast kernel, every response the slow one: the two mixtures are apart
    args = warm_start.parse_args(["--out", "unused", "--language", "cpp", "--later-turn-share", "1",
                                  "--stray-share", "0", "--repeat-share", "0",
                                  "--history-shares", "fast=1,slow=0,wrong_values=0,no_compile=0",
                                  "--shares", "fast=0,slow=1,wrong_values=0,no_compile=0"])
    task = warm_start.select_tasks(ALL_TASKS, "level1/01_relu")[0]
    fast = warm_start.variant_code(task.solutions["cpp"], "fast", "cpp").strip()
    slow = warm_start.variant_code(task.solutions["cpp"], "slow", "cpp").strip()
    for seed in range(4):
        example = warm_start.draw_example(task, tokenizer, random.Random(seed), args)
        prompt = tokenizer.decode(example.prompt_ids)
        code = summarize.parse_response(tokenizer.decode(example.response_ids, skip_special_tokens=True)).code
        assert example.variant == "slow" and code.strip() == slow
        assert prompt.count(fast) == example.n_attempts and slow not in prompt
    with pytest.raises(SystemExit):
        warm_start.parse_args(["--out", "unused", "--history-shares", "fast=1"])


def test_a_repeat_response_is_the_last_attempts_code(tokenizer):
    args = warm_start.parse_args(["--out", "unused", "--language", "cpp", "--later-turn-share", "1",
                                  "--repeat-share", "1", "--stray-share", "0"])
    task = warm_start.select_tasks(ALL_TASKS, "level1/01_relu")[0]
    for seed in range(6):
        example = warm_start.draw_example(task, tokenizer, random.Random(seed), args)
        prompt = tokenizer.decode(example.prompt_ids)
        code = summarize.parse_response(tokenizer.decode(example.response_ids, skip_special_tokens=True)).code
        last_attempt = prompt[prompt.rindex(f"Attempt {example.n_attempts}:"):]
        assert code.strip() in last_attempt


@pytest.mark.parametrize("language", ["cuda", "cpp"])
def test_stray_attempts_are_none_of_the_variants_and_get_rollouts_feedback(language):
    task = warm_start.select_tasks(ALL_TASKS, "level1/01_relu")[0]
    shares = warm_start.parse_shares(warm_start.DEFAULT_SHARES)
    raw = [warm_start.variant_code(task.solutions[language], v, language) for v in warm_start.VARIANTS]
    variants = {code.strip() for code in raw}
    kinds = set()
    for seed in range(40):
        attempt = warm_start.stray_attempt(task, language, random.Random(seed), shares)
        assert attempt.code.strip() not in variants
        if attempt.feedback.startswith("Your response broke a rule"):
            kinds.add("format")   # what rollout would record for the same cut response: a rule it broke
            assert attempt.code == "" or kernel_gate.check_format(attempt.code, language) is not None
        else:
            kinds.add("compile")
            assert attempt.feedback.startswith("Your code failed to compile: compilation failed:")
            # one line of a variant dropped
            assert any(len(attempt.code.split("\n")) + 1 == len(code.split("\n")) for code in raw)
    assert kinds == {"format", "compile"}


def test_a_stray_last_attempt_is_never_repeated(tokenizer):
    args = warm_start.parse_args(["--out", "unused", "--language", "cpp", "--later-turn-share", "1",
                                  "--repeat-share", "1", "--stray-share", "1"])
    task = warm_start.select_tasks(ALL_TASKS, "level1/01_relu")[0]
    variants = {warm_start.variant_code(task.solutions["cpp"], v, "cpp").strip() for v in warm_start.VARIANTS}
    for seed in range(6):
        example = warm_start.draw_example(task, tokenizer, random.Random(seed), args)
        code = summarize.parse_response(tokenizer.decode(example.response_ids, skip_special_tokens=True)).code
        assert code.strip() in variants and example.n_attempts in (1, 2)


def test_later_turns_show_the_harness_feedback_once_variants_json_is_there(tmp_path):
    task = warm_start.select_tasks(ALL_TASKS, "level1/01_relu")[0]
    feedback = warm_start.Feedback(str(tmp_path / "variants.json"), every=1)
    made_up = feedback(task, "slow", "cpp")
    assert made_up == warm_start.made_up_feedback(task.solutions["cpp"], "slow")
    real = "Your code is correct and ran at 0.31x the speed of the reference (2.000 ms vs 0.620 ms)."
    (tmp_path / "variants.json").write_text(json.dumps({f"{task.task_id}:slow": {"feedback": real}}))
    assert feedback(task, "slow", "cpp") == real   # every call looks while none was found
    assert feedback(task, "fast", "cpp") == warm_start.made_up_feedback(task.solutions["cpp"], "fast")


def test_response_loss_is_the_masked_mean_over_response_tokens(tokenizer):
    # Against the naive form: full logits, log-softmax, mean over the response positions only.
    args = warm_start.parse_args(["--out", "unused", "--hidden", "32", "--layers", "1", "--heads", "2"])
    model = warm_start.build_model(tokenizer, args)
    batch = [warm_start.Example("t", "fast", 0, [5, 6, 7], [8, 9, 1]),
             warm_start.Example("t", "fast", 0, [5, 6], [10, 1])]
    got = warm_start.response_loss(model, batch, torch.device("cpu"))
    terms = []
    for e in batch:
        seq = torch.tensor([e.prompt_ids + e.response_ids])
        logp = model(input_ids=seq).logits[0].double().log_softmax(-1)
        for pos in range(len(e.prompt_ids), seq.shape[1]):
            terms.append(-logp[pos - 1, seq[0, pos]])
    assert torch.allclose(got.double(), torch.stack(terms).mean(), atol=1e-5)
    # a change in the prompt's last token changes nothing it is asked to predict, only context
    assert len(terms) == 5


@pytest.mark.slow
def test_saved_checkpoint_loads_with_auto_classes(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    args = warm_start.parse_args(["--out", str(tmp_path), "--hidden", "32", "--layers", "1", "--heads", "2"])
    model = warm_start.build_model(tokenizer, args)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded_tok = AutoTokenizer.from_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    text = summarize.build_prompt(ALL_TASKS[0].reference_src, [], language="cuda",
                                  count_tokens=len, max_prompt_tokens=1 << 20)
    assert engines.render_prompt(loaded_tok, text) == engines.render_prompt(tokenizer, text)
    assert loaded_tok.eos_token_id == 1 and loaded_tok.pad_token_id == 0
    assert len(loaded_tok) == loaded.config.vocab_size  # no token the model cannot embed
    ids = torch.tensor([engines.render_prompt(tokenizer, text)[:50]])
    assert torch.equal(loaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_no_check_samples_means_no_check(tokenizer, tmp_path):
    # --check-samples 0 with --check-every set (the demo's setting) trains on past the check step
    args = warm_start.parse_args(["--out", str(tmp_path), "--language", "cpp", "--tasks", "level1/01_relu",
                                  "--hidden", "32", "--layers", "1", "--heads", "2", "--steps", "3",
                                  "--batch-size", "2", "--check-every", "1", "--check-samples", "0",
                                  "--log-every", "1"])
    model = warm_start.build_model(tokenizer, args)
    train_tasks = warm_start.select_tasks(ALL_TASKS, args.tasks)
    history = warm_start.train(model, train_tasks, tokenizer, args, torch.device("cpu"), lambda line: None)
    assert [h["step"] for h in history if "on_distribution" not in h] == [0, 1, 2]
