"""Tests for summarize.py: parsing messy responses, feedback lines, prompt budgets, the rule of
what a kernel may call as the prompt states it."""
import os
import shutil
import subprocess
import sys

import pytest

import summarize
from summarize import (EXAMPLE_CPP, EXAMPLE_CUDA, Attempt, build_prompt, feedback,
                       parse_response)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CODE = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
TASK = ("import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
        "    def forward(self, x):\n        return torch.relu(x)\n\n"
        "def get_inputs():\n    return [torch.randn(8)]\n\ndef get_init_inputs():\n    return []\n")


def words(text):
    return len(text.split())


# ---------------------------------------------------------------- parse_response
def test_well_formed_response():
    text = f"<think>try float4 loads</think>\nHere it is:\n```python\n{CODE}```\nUsed float4 loads."
    p = parse_response(text)
    assert p.thinking == "try float4 loads"
    assert p.code == CODE
    assert p.summary == "Used float4 loads."
    assert p.error is None


def test_last_block_defining_modelnew_wins():
    old = CODE.replace("return x", "return x + 0")
    text = (f"<think>plan</think>\n```python\n{old}```\nThen a fix:\n```python\n{CODE}```\n"
            "```bash\npython run.py\n```\nTried two versions.")
    p = parse_response(text)
    assert p.code == CODE
    assert p.summary.endswith("Tried two versions.")


def test_blocks_without_modelnew_and_other_languages_are_skipped():
    text = f"</think>```cpp\nint main() {{}}\n```\n```\n{CODE}```\n```python\nprint(1)\n```\nDone."
    p = parse_response(text)
    assert p.code == CODE  # an unlabeled fence counts as python
    assert p.summary.startswith("```python\nprint(1)")


def test_code_inside_thinking_is_not_taken():
    text = f"<think>draft:\n```python\n{CODE}```\n</think>\nI will not answer."
    p = parse_response(text)
    assert p.code is None and "no ```python" in p.error
    assert "draft" in p.thinking


def test_cut_inside_thinking_opened_by_the_prompt_yields_no_code():
    # QwQ's template ends the prompt with "<think>\n": the completion holds only reasoning,
    # with a draft block in it, and was cut before </think>.
    text = f"Okay, a draft:\n```python\n{CODE}```\nbut wait, this is not done"
    assert parse_response(text).code == CODE  # without the flag: taken (the old behaviour)
    p = parse_response(text, thinking_open=True)
    assert p.code is None and "</think>" in p.error
    assert p.thinking.startswith("Okay, a draft")
    # The same completion that did close its thinking keeps its answer.
    closed = parse_response(f"plan\n</think>\n```python\n{CODE}```\nDone.", thinking_open=True)
    assert closed.code == CODE and closed.thinking == "plan" and closed.summary == "Done."


def test_unclosed_think_is_all_thinking():
    text = f"<think>long reasoning\n```python\n{CODE}```\nand it never ends"
    p = parse_response(text)
    assert p.code is None
    assert "</think>" in p.error
    assert p.thinking.startswith("long reasoning")


def test_no_tags_at_all_and_missing_opening_tag():
    p = parse_response(f"```python\n{CODE}```\nsummary here")
    assert (p.thinking, p.code, p.summary, p.error) == ("", CODE, "summary here", None)
    # chat templates often put <think> in the prompt, so the response starts inside it
    p = parse_response(f"reasoning only\n</think>\n```python\n{CODE}```")
    assert p.thinking == "reasoning only" and p.code == CODE and p.summary == ""


def test_no_code_gives_an_actionable_error():
    p = parse_response("<think>hmm</think>\nI cannot do this.")
    assert p.code is None and "```python" in p.error and "ModelNew" in p.error
    p = parse_response("<think>hmm</think>\n```python\nprint('hi')\n```")
    assert p.code is None and "class ModelNew" in p.error


def test_non_ascii_and_crlf():
    code = CODE.replace("return x", "return x  # ok: µs, 速度, ✓")
    p = parse_response(f"<think>思考 — ünïcode</think>\n```python\n{code}```\nRésumé: 2× faster.")
    assert p.thinking == "思考 — ünïcode"
    assert "速度" in p.code and p.summary == "Résumé: 2× faster."
    p = parse_response(f"<think>a</think>\r\n```python\r\n{code}```\r\ndone\r\n")
    assert p.code is not None and "class ModelNew" in p.code


def test_megabyte_response_parses():
    thinking = "x = x + 1 ? maybe " * 60000  # ~1 MB
    text = f"<think>{thinking}</think>\n```python\n{CODE}```\nok"
    assert len(text) > 1_000_000
    p = parse_response(text)
    assert p.code == CODE and len(p.thinking) > 1_000_000 - 100
    p = parse_response("```" * 300000)  # a megabyte of fences, no code
    assert p.code is None and p.error


# ---------------------------------------------------------------- feedback
def test_feedback_messages():
    assert feedback("no ```python block") == "Your response broke a rule: no ```python block"
    assert feedback({"status": "compile_error", "message": "error: x undeclared"}) == \
        "Your code failed to compile: error: x undeclared"
    assert feedback({"status": "runtime_error", "message": "illegal memory access"}) == \
        "Your code raised a runtime error: illegal memory access"
    assert feedback({"status": "timeout", "message": ""}).startswith("Your code ran out of time")
    assert feedback({"status": "incorrect", "message": "max abs diff 0.5"}) == \
        "Your code produced incorrect output: max abs diff 0.5"
    assert feedback({"status": "correct", "speedup": 1.849, "message": ""}) == \
        "Your code is correct and ran at 1.85x the speed of the reference."
    assert feedback({"status": "correct", "speedup": 1.0, "message": "timed 100 runs"}).endswith(
        "reference. timed 100 runs")
    assert "(0.500 ms vs 1.000 ms)" in feedback(
        {"status": "correct", "speedup": 2.0, "ref_ms": 1.0, "candidate_ms": 0.5})
    # Correct but not timed (timing off, or a time the harness could not confirm): no "0.00x".
    untimed = feedback({"status": "correct", "speedup": 0.0, "message": ""})
    assert untimed == "Your code is correct; its speed was not measured."
    unconfirmed = feedback({"status": "correct", "speedup": 0.0, "timing_ok": False,
                            "message": "the parent's clock disagrees"})
    assert "0.00x" not in unconfirmed and unconfirmed.endswith("the parent's clock disagrees")
    assert "not measured" in feedback({"status": "correct", "speedup": float("inf"), "message": ""})
    assert feedback({"status": "format_error", "message": "uses torch.relu"}) == \
        "Your response broke a rule: uses torch.relu"

    with pytest.raises(TypeError, match="verdict dict"):   # an EvalResult goes through rollout.verdict_record
        feedback(None)
    with pytest.raises(ValueError, match="status"):
        feedback({"status": "weird"})


def test_feedback_trims_long_errors_keeping_both_ends():
    message = "FIRST " + "noise " * 5000 + " LAST"
    line = feedback({"status": "compile_error", "message": message}, budget=300)
    assert "FIRST" in line and "LAST" in line and "characters cut" in line
    assert len(line) < 400


# ---------------------------------------------------------------- build_prompt
def test_first_turn_has_instruction_example_and_task():
    for language, example in (("cuda", EXAMPLE_CUDA), ("cpp", EXAMPLE_CPP)):
        p = build_prompt(TASK, [], language=language, count_tokens=words, max_prompt_tokens=10**6)
        assert example in p and TASK.rstrip() in p and "<think>" in p
        assert "previous attempts" not in p.lower()
    assert "__global__" in build_prompt(TASK, [], language="cuda", count_tokens=words,
                                        max_prompt_tokens=10**6)


def test_the_prompt_states_the_gates_rules():
    """The prompt's rules are kernel_gate's: every row of the table of what a kernel may call (each
    allowed row's every spelling), and every import the gate lets through."""
    import kernel_gate
    for language in ("cuda", "cpp"):
        rules = summarize.base_instruction(language)
        for row in kernel_gate.CALLS:
            assert row.what in rules
            if row.forward:
                assert all(spelling in rules for spelling in row.python), row.what
        assert all(name in rules for name in kernel_gate.ALLOWED_IMPORTS)


def test_later_turns_show_code_summary_feedback_never_thinking():
    thinking = "SECRET-THOUGHTS"
    p = parse_response(f"<think>{thinking}</think>```python\n{CODE}```\nvectorised")
    history = [Attempt(p.code, p.summary, "Your code failed to compile: boom")]
    prompt = build_prompt(TASK, history, language="cuda", count_tokens=words,
                          max_prompt_tokens=10**6)
    assert thinking not in prompt
    assert CODE.rstrip() in prompt and "vectorised" in prompt and "boom" in prompt
    assert "Restart your reasoning" in prompt
    assert prompt.index(TASK.rstrip()) < prompt.index("Attempt 1")


def test_long_summaries_are_trimmed_in_later_prompts():
    history = [Attempt(CODE, "START " + "blah " * 5000 + " END", "Your code failed to compile: x")]
    prompt = build_prompt(TASK, history, language="cuda", count_tokens=words,
                          max_prompt_tokens=10**6)
    assert "START" in prompt and "END" in prompt and prompt.count("blah") < 300


def test_budget_drops_earliest_attempts_first_and_never_the_task():
    history = [Attempt(CODE.replace("return x", f"return x  # v{i}"), f"summary {i}",
                       f"feedback {i}") for i in range(1, 6)]
    full = build_prompt(TASK, history, language="cpp", count_tokens=words,
                        max_prompt_tokens=10**6)
    base = build_prompt(TASK, [], language="cpp", count_tokens=words, max_prompt_tokens=10**6)
    per_attempt = (words(full) - words(base)) // 5
    budget = words(full) - 2 * per_attempt  # room for about three attempts
    p = build_prompt(TASK, history, language="cpp", count_tokens=words, max_prompt_tokens=budget)
    assert words(p) <= budget
    assert "# v1" not in p and "# v5" in p and "# v4" in p
    assert "Attempt 5:" in p and "omitted" in p  # numbering keeps the turn number
    assert TASK.rstrip() in p
    # a budget that only fits the task: every attempt goes, the task stays
    tight = build_prompt(TASK, history, language="cpp", count_tokens=words,
                         max_prompt_tokens=words(base) + 40)
    assert "# v" not in tight and TASK.rstrip() in tight
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        build_prompt(TASK, history, language="cpp", count_tokens=words, max_prompt_tokens=50)


def test_bad_arguments():
    with pytest.raises(ValueError, match="language"):
        build_prompt(TASK, [], language="triton", count_tokens=words, max_prompt_tokens=10**6)
    with pytest.raises(ValueError, match="task_src"):
        build_prompt("  ", [], language="cuda", count_tokens=words, max_prompt_tokens=10**6)


def test_imports_with_only_the_standard_library_and_the_gate(tmp_path):
    for name in ("summarize.py", "kernel_gate.py", "kernel_types.py"):
        shutil.copy(os.path.join(ROOT, name), tmp_path)
    out = subprocess.run([sys.executable, "-S", "-E", "-c",
                          "import summarize, sys; assert 'Import only' in summarize.base_instruction('cuda'); "
                          "assert 'torch' not in sys.modules; "
                          "print(summarize.parse_response('```python\\nclass ModelNew: x=1\\n```').code)"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "class ModelNew: x=1"


def _run_example(code, device, monkeypatch, tmp_path):
    """Build an example with load_inline and compare ModelNew(a, b) with a + b."""
    import torch
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    namespace = {}
    exec(compile(code, f"<EXAMPLE_{device}>", "exec"), namespace)
    model = namespace["ModelNew"]()
    a = torch.randn(4099, device=device)
    b = torch.randn(4099, device=device)
    torch.testing.assert_close(model(a, b), a + b)


@pytest.mark.slow
def test_cpp_example_compiles_and_adds(monkeypatch, tmp_path):
    _run_example(EXAMPLE_CPP, "cpu", monkeypatch, tmp_path)


@pytest.mark.slow
@pytest.mark.gpu
def test_cuda_example_compiles_and_adds(monkeypatch, tmp_path):
    _run_example(EXAMPLE_CUDA, "cuda", monkeypatch, tmp_path)
