"""examples/warm_start.py: the variants, the prompts, the loss mask, and the saved checkpoint."""
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
    # The broken variants must reach the harness (a gate refusal would make them format errors,
    # a different lesson) and must differ from the solution (else "broken" would be correct).
    for task in ALL_TASKS:
        solution = task.solutions[language]
        codes = {v: warm_start.variant_code(solution, v) for v in warm_start.VARIANTS}
        assert codes["correct"] == solution
        assert len(set(codes.values())) == len(codes), task.task_id
        for variant, code in codes.items():
            assert kernel_gate.check_format(code, language) is None, (task.task_id, variant)


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
    assert parsed.code.strip() == warm_start.variant_code(task.solutions["cpp"], example.variant).strip()


def test_variant_mixture_follows_correct_share():
    rng = random.Random(0)
    draws = [warm_start.draw_variant(rng, 0.3) for _ in range(4000)]
    assert abs(draws.count("correct") / 4000 - 0.3) < 0.03
    assert abs(draws.count("wrong_values") / 4000 - 0.35) < 0.03


def test_later_turn_prompts_show_earlier_attempts(tokenizer):
    args = warm_start.parse_args(["--out", "unused", "--language", "cuda", "--later-turn-share", "1"])
    task = warm_start.select_tasks(ALL_TASKS, "level1/07_row_sum")[0]
    example = warm_start.draw_example(task, tokenizer, random.Random(3), args)
    text = tokenizer.decode(example.prompt_ids)
    assert example.n_attempts in (1, 2)
    assert "Attempt 1:" in text and "Feedback: Your code" in text


def test_response_loss_is_the_masked_mean_over_response_tokens(tokenizer):
    # Against the naive form: full logits, log-softmax, mean over the response positions only.
    args = warm_start.parse_args(["--out", "unused", "--hidden", "32", "--layers", "1", "--heads", "2"])
    model = warm_start.build_model(tokenizer, args)
    batch = [warm_start.Example("t", "correct", 0, [5, 6, 7], [8, 9, 1]),
             warm_start.Example("t", "correct", 0, [5, 6], [10, 1])]
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
