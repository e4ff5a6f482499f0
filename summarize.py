'''Summarize: split a response into thinking, code and summary; feedback; the turn-t prompt.

Kevin-32B's multi-turn loop (Cognition, 2025) keeps the prompt short as turns pile up:
turn t sees the task plus, for each earlier turn k < t, only the code, the model's own
short summary of what it tried, and one line of feedback from the harness; never the
thinking, which is the bulk of the tokens. When even that does not fit the prompt
budget, the earliest attempts go first; the task itself is never cut.

A response is expected to look like

    <think> ... free reasoning ... </think>
    ```python
    ... complete code defining ModelNew ...
    ```
    One or two sentences on what was tried.

The prompt's rules are kernel_gate's (describe_rules: its table CALLS of what a kernel may call,
the imports, the rules no table lists), read from it, never copied. Standard library and
kernel_gate only: token counting is a callable handed in by the caller, and a verdict is read as
a plain dict (rollout.verdict_record makes one from the harness's EvalResult).
'''
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Callable, Mapping

import kernel_gate

FEEDBACK_CHARS = 1200  # error text shown back to the model is trimmed to this budget
SUMMARY_CHARS = 1000   # a turn's own summary, as later prompts show it


@dataclass
class Parsed:
    thinking: str
    code: str | None
    summary: str
    error: str | None  # why no usable code was found (reads after "Your response broke a rule: ")


@dataclass
class Attempt:
    """One earlier turn as later prompts see it (its thinking is deliberately absent)."""
    code: str
    summary: str
    feedback: str


_OPEN_FENCE = re.compile(r"[ \t]*```[ \t]*([\w+.-]*)")
_CLOSE_FENCE = re.compile(r"[ \t]*```[ \t]*")
_DEFINES_MODELNEW = re.compile(r"^\s*class\s+ModelNew\b", re.MULTILINE)


def parse_response(text: str, thinking_open: bool = False) -> Parsed:
    """Split a response into (thinking, code, summary, error).

    thinking: inside <think>...</think>; with no </think> the reasoning never ended, so
    everything after <think> is thinking and no code is taken from it; with no tags at
    all there is no thinking. `thinking_open`: the prompt itself ended with <think> (as
    QwQ's and Qwen3's chat templates do), so the response starts inside the thinking and
    without a </think> all of it is unfinished reasoning. code: the last ```python (or
    unlabeled) fenced block after the thinking that defines `class ModelNew`. summary:
    the prose after that block.
    """
    if not isinstance(text, str):
        raise TypeError(f"response must be str, got {type(text).__name__}")
    text = text.replace("\r\n", "\n")
    thinking, rest = "", text
    open_at = text.find("<think>")
    close_at = text.rfind("</think>")
    if close_at != -1:
        start = open_at + len("<think>") if -1 < open_at < close_at else 0
        thinking, rest = text[start:close_at].strip(), text[close_at + len("</think>"):]
    elif open_at != -1 or thinking_open:
        start = open_at + len("<think>") if open_at != -1 else 0
        return Parsed(text[start:].strip(), None, "",
                      "the response ended inside <think> without </think>; finish thinking "
                      "with </think>, then give the code in one ```python block.")
    chosen = None
    for language, body, end in _fenced_blocks(rest):
        if language in ("", "python", "py", "python3") and _DEFINES_MODELNEW.search(body):
            chosen = (body, end)
    if chosen is None:
        has_fence = "```" in rest
        why = ("none of the code blocks is a ```python block defining class ModelNew; "
               "give the complete code in one such block." if has_fence else
               "no ```python code block found; after thinking, give the complete code "
               "defining class ModelNew in one ```python block.")
        return Parsed(thinking, None, rest.strip(), why)
    body, end = chosen
    return Parsed(thinking, body.rstrip() + "\n", rest[end:].strip(), None)


def _fenced_blocks(text: str):
    """Yield (language, body, end offset) of each closed ``` block, in one linear pass.

    Line by line rather than one regex: a lazy multi-line regex rescans to the end
    for every unclosed opening fence, which is quadratic on adversarial output.
    """
    language, body_start, offset = None, 0, 0
    for line in text.splitlines(keepends=True):
        stripped = line.rstrip()
        if language is None:
            opening = _OPEN_FENCE.match(stripped)
            if opening:
                language, body_start = opening.group(1).lower(), offset + len(line)
        elif _CLOSE_FENCE.fullmatch(stripped):
            yield language, text[body_start:offset], offset + len(stripped)
            language = None
        offset += len(line)


# --------------------------------------------------------------------------- feedback
def _trim(text: str, budget: int = FEEDBACK_CHARS) -> str:
    """Keep both ends of a long error: compilers put the cause first, Python puts it last."""
    text = text.strip()
    if len(text) <= budget:
        return text
    head = budget * 2 // 3
    tail = budget - head
    return f"{text[:head]}\n[... {len(text) - budget} characters cut ...]\n{text[-tail:]}"


def feedback(verdict_or_error: Mapping | str, budget: int = FEEDBACK_CHARS) -> str:
    """One feedback message for the model: a parse/format error string, or the harness's verdict
    as a dict (rollout.verdict_record)."""
    if isinstance(verdict_or_error, str):
        return f"Your response broke a rule: {_trim(verdict_or_error, budget)}"
    if not isinstance(verdict_or_error, Mapping):
        raise TypeError("feedback needs a verdict dict (rollout.verdict_record) or an error string; got "
                        f"{type(verdict_or_error).__name__}")
    verdict = verdict_or_error
    status = verdict.get("status")
    message = _trim(str(verdict.get("message", "") or ""), budget)
    detail = f": {message}" if message else "."
    if status == "format_error":
        return f"Your response broke a rule{detail}"
    if status == "compile_error":
        return f"Your code failed to compile{detail}"
    if status in ("runtime_error", "timeout"):
        what = "ran out of time" if status == "timeout" else "raised a runtime error"
        return f"Your code {what}{detail}"
    if status == "incorrect":
        return f"Your code produced incorrect output{detail}"
    if status == "reference_error":  # the task's fault; rollout does not train on these turns
        return f"The task's reference failed, so your code was not judged{detail}"
    if status == "harness_error":  # no verdict; rollout does not train on these turns
        return f"The harness could not judge your code (its own capacity), so it has no verdict{detail}"
    if status == "correct":
        speedup = float(verdict.get("speedup", 0.0) or 0.0)
        note = f" {message}" if message else ""
        # A correct kernel that was not timed (timing off, or a time the harness could not
        # confirm) has speedup 0: "0.00x" would tell the model its kernel never finished.
        if not (math.isfinite(speedup) and speedup > 0) or verdict.get("timing_ok", True) is False:
            return f"Your code is correct; its speed was not measured.{note}"
        ref_ms, cand_ms = verdict.get("ref_ms"), verdict.get("candidate_ms")
        times = (f" ({cand_ms:.3f} ms vs {ref_ms:.3f} ms)"
                 if isinstance(ref_ms, (int, float)) and isinstance(cand_ms, (int, float)) else "")
        return (f"Your code is correct and ran at {speedup:.2f}x the speed of the "
                f"reference{times}.{note}")
    raise ValueError(f"unknown result status {status!r}; expected one of format_error, "
                     "compile_error, runtime_error, timeout, incorrect, correct, reference_error, harness_error")


# --------------------------------------------------------------------------- prompts
EXAMPLE_CUDA = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void add_kernel(const float* a, const float* b, float* out, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

torch::Tensor add(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(a.scalar_type() == torch::kFloat32, "float32 only");
    auto a_c = a.contiguous();
    auto b_c = b.contiguous();
    auto out = torch::empty_like(a_c);
    long n = a_c.numel();
    int threads = 256;
    int blocks = (int)((n + threads - 1) / threads);
    add_kernel<<<blocks, threads>>>(a_c.data_ptr<float>(), b_c.data_ptr<float>(),
                                    out.data_ptr<float>(), n);
    return out;
}
"""

cpp_source = "torch::Tensor add(torch::Tensor a, torch::Tensor b);"

add_ext = load_inline(name="example_add_cuda", cpp_sources=cpp_source,
                      cuda_sources=cuda_source, functions=["add"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = add_ext

    def forward(self, a, b):
        return self.ext.add(a, b)
'''

EXAMPLE_CPP = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor add(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.scalar_type() == torch::kFloat32, "float32 only");
    auto a_c = a.contiguous();
    auto b_c = b.contiguous();
    auto out = torch::empty_like(a_c);
    const float* pa = a_c.data_ptr<float>();
    const float* pb = b_c.data_ptr<float>();
    float* po = out.data_ptr<float>();
    int64_t n = a_c.numel();
    #pragma omp parallel for
    for (int64_t i = 0; i < n; ++i) po[i] = pa[i] + pb[i];
    return out;
}
"""

add_ext = load_inline(name="example_add_cpp", cpp_sources=cpp_source, functions=["add"],
                      extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"],
                      verbose=False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = add_ext

    def forward(self, a, b):
        return self.ext.add(a, b)
'''

EXAMPLE_REFERENCE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return a + b


def get_inputs():
    return [torch.randn(4096), torch.randn(4096)]


def get_init_inputs():
    return []
'''

_KERNEL_WORDS = {
    "cuda": ("custom CUDA kernels", "a `__global__` CUDA kernel compiled with "
             "torch.utils.cpp_extension.load_inline(cuda_sources=..., cpp_sources=<declarations>, "
             "functions=[...])"),
    "cpp": ("custom C++ CPU kernels", "a C++ function compiled with "
            "torch.utils.cpp_extension.load_inline(cpp_sources=..., functions=[...]) "
            "(no cuda_sources)"),
}


def base_instruction(language: str) -> str:
    what, how = _KERNEL_WORDS[language]
    return (
        f"You write {what} that replace PyTorch operators to make a model faster.\n"
        f"Given a PyTorch program with class Model, write class ModelNew: same constructor "
        f"arguments, same forward inputs and outputs, numerically equivalent, but the "
        f"computation done by {how}.\n"
        # the gate's rules, read from kernel_gate (CALLS and its lists) each time a prompt is built
        "Rules: " + kernel_gate.describe_rules() + " Create parameters in the same order as Model "
        "so that the same seed gives the same values.\n"
        "Answer format: think inside <think>...</think>; then give the complete code in one "
        "```python block; then, after the block, one or two sentences summarizing what you "
        "tried and why."
    )


def _example_block(language: str) -> str:
    code = EXAMPLE_CUDA if language == "cuda" else EXAMPLE_CPP
    return ("Example. For this reference program:\n```python\n" + EXAMPLE_REFERENCE +
            "```\na valid answer's code is:\n```python\n" + code + "```\n")


def _task_block(task_src: str) -> str:
    return ("Now the task. Optimize this program:\n```python\n" + task_src.rstrip() +
            "\n```\n")


def _attempt_block(number: int, attempt: Attempt) -> str:
    summary = _trim(attempt.summary, SUMMARY_CHARS) or "(no summary given)"
    return (f"Attempt {number}:\n```python\n{attempt.code.rstrip()}\n```\n"
            f"Summary: {summary}\nFeedback: {attempt.feedback.strip()}\n")


def build_prompt(task_src: str, history: list[Attempt], *, language: str,
                 count_tokens: Callable[[str], int], max_prompt_tokens: int) -> str:
    """The turn-(len(history)+1) prompt: instruction, example, task, previous attempts.

    Attempts are numbered from the first turn even after the earliest are dropped to fit
    max_prompt_tokens; the instruction, example and task are never cut. If they alone
    do not fit, that is the caller's budget error and we raise.
    """
    if language not in _KERNEL_WORDS:
        raise ValueError(f"language must be 'cuda' or 'cpp', got {language!r}")
    if not task_src.strip():
        raise ValueError("task_src is empty")
    head = "\n\n".join(block.strip() for block in [
        base_instruction(language), _example_block(language), _task_block(task_src)])
    if not history:
        prompt = head
        if count_tokens(prompt) > max_prompt_tokens:
            raise ValueError(f"the task prompt alone takes {count_tokens(prompt)} tokens, more "
                             f"than max_prompt_tokens={max_prompt_tokens}")
        return prompt
    tail = ("Write a new, complete ModelNew that fixes the problems above or runs faster. "
            "Restart your reasoning in <think>...</think>, then give the full code in one "
            "```python block, then a short summary.")
    blocks = [_attempt_block(i + 1, a) for i, a in enumerate(history)]
    for first in range(len(blocks) + 1):
        kept = blocks[first:]
        dropped = (f"({first} earlier attempt{'s' if first > 1 else ''} omitted to fit.)\n"
                   if first else "")
        middle = ("Your previous attempts, oldest first:\n\n" + dropped + "\n".join(kept)
                  if kept else "Your previous attempts did not fit here; start afresh.\n")
        prompt = "\n\n".join([head, middle.strip(), tail])
        if count_tokens(prompt) <= max_prompt_tokens:
            return prompt
    raise ValueError(f"the task prompt alone takes more than max_prompt_tokens="
                     f"{max_prompt_tokens} tokens ({count_tokens(prompt)} with no attempts)")
