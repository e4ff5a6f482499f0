"""Warm start for the learning demo: a small causal LM that already writes kernels, fast and slow.

Kevin-32B starts RL from a model that writes correct kernels some of the time. No pretrained model
can be downloaded here, so this script makes one, small enough to train in a minute or two, so that
`train.py --model OUT` shows whether the loop teaches what Kevin's reward pays for. It trains:

- tokenizer: byte-level BPE (`tokenizers`, offline) with Qwen2's normaliser and split regex (what
  AutoTokenizer imposes on a qwen2 checkpoint), trained on every built-in task's turn-0 prompt and
  solutions; ids 0 = <pad>, 1 = </s>; no chat template (rollout uses engines.PLAIN_CHAT_TEMPLATE).
- model: `transformers.Qwen2ForCausalLM` from a config (`--hidden`, `--layers`, `--heads`), random init.
- data, drawn afresh each step: a response in the policy's format whose code is a variant of the
  task's built-in solution, drawn from `--shares`: `fast` (the solution), `slow` (its work repeated
  SLOW_PASSES times: correct, that much slower), `wrong_values` (engines.corrupt_solution) or
  `no_compile` (a used declaration dropped). The thinking and summary come from templates that do not
  depend on the variant: the choice is made inside the code.
- prompts: exactly the rollout's (summarize.build_prompt, engines.render_prompt). With
  `--later-turn-share` the prompt shows one or two earlier attempts drawn from `--history-shares` (every
  variant as often: RL's turn 1 moves to the fast kernel, and turn 2 reads what turn 1 wrote) with their
  feedback: the harness's real line for that variant once `variants.json` (`--variants-only`, run
  beside the training) exists, else a made-up one of the same shape; `--stray-share` of those attempts
  are none of the variants (cut off, or a line dropped), as a sampled policy's often are. The response
  there is drawn from the mixture too, or (`--repeat-share`) repeats the last attempt's code whatever
  its verdict: nothing here teaches what to do after which feedback; RL must.
- loss: next-token cross-entropy on the response and its EOS (mask from the data, not the pad id);
  AdamW, linear warm-up, cosine decay to 10%.

So GRPO can raise the reward only by moving probability to the fast, correct kernel, and a later
turn can beat the first only by learning to use the feedback. A model this small memorises its
tasks; `--heldout` measures that it does not write kernels for others.

    python examples/warm_start.py --language cpp --out runs/warm_cpp --tasks level1/01_relu \
        --hidden 128 --layers 2 --steps 300                  # CPU, C++ kernels
    python examples/warm_start.py --language cuda --device cuda --out runs/warm_cuda
"""
from __future__ import annotations

import argparse
import ast
import json
import math
import os
import random
import re
import sys
import time
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import engines  # noqa: E402
import kernel_verdict  # noqa: E402
import rollout  # noqa: E402
import summarize  # noqa: E402
import tasks as tasks_module  # noqa: E402
from train_log import code_id  # noqa: E402

VARIANTS = ("fast", "slow", "wrong_values", "no_compile")
DEFAULT_SHARES = "fast=0.1,slow=0.3,wrong_values=0.3,no_compile=0.3"
# earlier attempts in later-turn prompts: every variant as often, since RL moves turn 1 towards one of
# them (the fast kernel) and turn 2 then reads it; drawn from DEFAULT_SHARES it would be 7% of them
DEFAULT_HISTORY_SHARES = "fast=0.25,slow=0.25,wrong_values=0.25,no_compile=0.25"
SLOW_PASSES = 8   # the slow variant does the solution's work this many times over
DEFAULT_TASKS = "level1/01_relu,level1/03_silu,level1/07_row_sum,level1/08_max_over_dim"
DEFAULT_HELDOUT = "level1/02_gelu_tanh,level2/06_bias_tanh_multiply"

THINKING = (
    "Okay, the reference computes {what} I will write it as one {lang} function that reads "
    "each input once and writes each output once.",
    "Okay, this is {name}. {what} A plain loop over the elements, launched from ModelNew.forward, "
    "is enough.",
    "Okay, {what} The output has the shape of the reference's; I allocate it with empty and "
    "fill every element in my own kernel.",
    "Okay, let me think about {name}. {what} No torch compute in forward: the kernel does all "
    "of it.",
)
SUMMARIES = (
    "I wrote a {lang} kernel for {name} and called it from ModelNew.forward.",
    "One {lang} kernel computes {name}; forward only allocates the output and calls it.",
    "I replaced the reference's operator with my own {lang} code for {name}.",
)
# Verdicts made up for earlier attempts in later-turn prompts, used until the harness's real verdicts
# of the variants (variants.json, judged beside the training) are there; their text has the shape of
# the harness's messages (kernel_eval), its numbers are made up.
MADE_UP_VERDICTS = {
    "fast": {"status": "correct", "speedup": 1.0, "ref_ms": 0.2, "candidate_ms": 0.2},
    "slow": {"status": "correct", "speedup": 0.25, "ref_ms": 0.2, "candidate_ms": 0.8},
    "wrong_values": {"status": "incorrect", "message": "trial 1/5: output: {n} of {n} values outside tolerance "
                                                      "(atol=0.01, rtol=0.01); max abs diff 1"},
    "no_compile": {"status": "compile_error",
                   "message": "compilation failed:\nError building extension '{name}'\nline {line} (cuda.cu:{line}): "
                              "error: identifier \"{var}\" is undefined"},
}

# transformers' Qwen2Tokenizer pre-tokenisation regex (PRETOKENIZE_REGEX there)
QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
               r"""\s*[\r\n]+|\s+(?!\S)|\s+""")

_DECLARATION = re.compile(
    r"^\s*(?:const\s+)?(?:int64_t|int|long|float|double|auto|bool|size_t)\s+(\w+)\s*=[^;]*;\s*$")


# ---------------------------------------------------------------------------------------
# The data: variants of a solution and the texts around it


def drop_declaration(code: str) -> tuple[str, str]:
    """(code without its first variable declaration whose name is used later, that name):
    the kernel then fails to compile with an undefined identifier. Raises if there is none."""
    lines = code.split("\n")
    for i, line in enumerate(lines):
        match = _DECLARATION.match(line)
        if match and re.search(r"\b" + re.escape(match.group(1)) + r"\b", "\n".join(lines[i + 1:])):
            return "\n".join(lines[:i] + lines[i + 1:]), match.group(1)
    raise ValueError("drop_declaration: no declaration like `const int64_t n = ...;` that is used later")


_CUDA_LAUNCH = re.compile(r"^([ \t]*)(\w+\s*<<<.*?>>>\s*\(.*?\);)[ \t]*$", re.M | re.S)
_CPP_LOOP = re.compile(r"^([ \t]+)for \(", re.M)


def slow_code(solution: str, language: str, passes: int = SLOW_PASSES) -> str:
    """The solution doing its work `passes` times over: correct, about `passes` times slower. CUDA: the
    kernel launch repeated in a loop; C++: the host function's first top-level loop (each built-in C++
    solution writes every output afresh in it, so a repeat gives the same values). Raises if the code
    has no such launch or loop."""
    if language == "cuda":
        match = _CUDA_LAUNCH.search(solution)
        if not match:
            raise ValueError("slow_code: no kernel launch `name<<<...>>>(...);` found")
        indent, launch = match.groups()
        looped = (f"{indent}for (int pass = 0; pass < {passes}; ++pass) {{\n{indent}    "
                  + launch.replace("\n", "\n    ") + f"\n{indent}}}")
        return solution[:match.start()] + looped + solution[match.end():]
    match = _CPP_LOOP.search(solution, max(0, solution.find("torch::Tensor")))
    if not match:
        raise ValueError("slow_code: no top-level for loop in the host function")
    end = _statement_end(solution, match.end() - 1)
    indent, body = match.group(1), solution[match.start():end]
    looped = (f"{indent}for (int pass = 0; pass < {passes}; ++pass) {{\n"
              + "\n".join("    " + line if line.strip() else line for line in body.split("\n"))
              + f"\n{indent}}}")
    return solution[:match.start()] + looped + solution[end:]


def _statement_end(code: str, paren: int) -> int:
    """The index just past the loop statement whose header's "(" is at `paren`: its header, then a
    braced block or one statement up to its ";"."""
    depth, i = 0, paren
    while True:
        depth += {"(": 1, ")": -1}.get(code[i], 0)
        i += 1
        if depth == 0:
            break
    while code[i].isspace():
        i += 1
    if code[i] != "{":
        return code.index(";", i) + 1
    depth = 0
    for i in range(i, len(code)):
        depth += {"{": 1, "}": -1}.get(code[i], 0)
        if depth == 0:
            return i + 1
    raise ValueError("slow_code: unbalanced braces")


def variant_code(solution: str, variant: str, language: str) -> str:
    if variant == "fast":
        return solution
    if variant == "slow":
        return slow_code(solution, language)
    if variant == "wrong_values":
        return engines.corrupt_solution(solution)
    if variant == "no_compile":
        return drop_declaration(solution)[0]
    raise ValueError(f"unknown variant {variant!r}; known: {VARIANTS}")


def parse_shares(text: str, flag: str = "--shares") -> dict:
    """`fast=0.15,slow=0.25,...` -> {variant: share}; every variant named once, shares summing to 1."""
    shares = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        name, _, value = item.partition("=")
        if name not in VARIANTS or name in shares:
            raise ValueError(f"{flag}: {name!r} is not a variant or is named twice; variants: {VARIANTS}")
        shares[name] = float(value)
    if set(shares) != set(VARIANTS) or min(shares.values()) < 0 or abs(sum(shares.values()) - 1) > 1e-6:
        raise ValueError(f"{flag} must give each of {VARIANTS} a share >= 0, summing to 1; got {text!r}")
    return shares


def task_words(task, language: str) -> dict:
    """{name, what, lang}: the task's short name ("relu"), the first line of Model's docstring, the
    kernel language's name ("CUDA" or "C++"): what the templates' {fields} take."""
    name = task.task_id.rsplit("/", 1)[-1].split("_", 1)[-1].replace("_", " ")
    what = ""
    for node in ast.parse(task.reference_src).body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            what = (ast.get_docstring(node) or "").strip().split("\n")[0]
    return {"name": name, "what": what or f"{name}.", "lang": "CUDA" if language == "cuda" else "C++"}


def response_text(task, code: str, language: str, rng: random.Random) -> str:
    words = task_words(task, language)
    thinking = rng.choice(THINKING).format(**words)
    summary = rng.choice(SUMMARIES).format(**words)
    return f"<think>\n{thinking}\n</think>\n```python\n{code.strip(chr(10))}\n```\n{summary}"


def made_up_feedback(solution: str, variant: str) -> str:
    verdict = dict(MADE_UP_VERDICTS[variant])
    if verdict["status"] == "correct":
        verdict["message"] = kernel_verdict.correct_message(verdict["ref_ms"], verdict["candidate_ms"], verdict["speedup"])
    elif variant == "no_compile":
        broken, var = drop_declaration(solution)
        name = re.search(r"name\s*=\s*[\"']([^\"']+)", solution)
        line = next((i + 1 for i, text in enumerate(broken.split("\n")) if re.search(rf"\b{var}\b", text)), 1)
        verdict["message"] = verdict["message"].format(name=name.group(1) if name else "ext", line=line, var=var)
    else:
        verdict["message"] = verdict["message"].format(n=4096)
    return summarize.feedback(verdict)


def draw_variant(rng: random.Random, shares: dict) -> str:
    return rng.choices(list(shares), weights=list(shares.values()))[0]


def stray_attempt(task, language: str, rng: random.Random, shares: dict) -> summarize.Attempt:
    """An earlier attempt that is none of the variants, as a sampled policy writes many: a variant's
    response cut off at a random point (the format error rollout records for it: the parser's or the
    gate's own words), or its code with one line dropped (a compile error, its message made up in the
    harness's shape). RL's later-turn prompts show such attempts; a warm start that never saw one
    loses the answer format after them (half of turn 2's answers in an H100 run were format errors)."""
    code = variant_code(task.solutions[language], draw_variant(rng, shares), language)
    text = response_text(task, code, language, rng)
    if rng.random() < 0.5:
        parsed, rejection = rollout.read_response(text[:rng.randrange(1, len(text))], language)
        if rejection is not None:
            return summarize.Attempt(code=parsed.code or "", summary=parsed.summary or "",
                                     feedback=summarize.feedback(rejection))
    lines = code.split("\n")
    dropped = rng.randrange(len(lines))
    unit = f"cuda.cu:{dropped + 1}" if language == "cuda" else f"main.cpp:{dropped + 1}:1"
    message = (f"compilation failed:\nError building extension 'ext'\nline {dropped + 1} ({unit}): "
               "error: expected a \";\"")
    words = task_words(task, language)
    return summarize.Attempt(code="\n".join(lines[:dropped] + lines[dropped + 1:]),
                             summary=rng.choice(SUMMARIES).format(**words),
                             feedback=summarize.feedback({"status": "compile_error", "message": message}))


class Feedback:
    """The feedback line an earlier attempt of each (task, variant) gets in a later-turn prompt: the
    harness's real one from variants.json once `--variants-only` (run beside the training) has written
    it, else a made-up one of the same shape. The file is looked for again every `every` calls."""

    def __init__(self, path: str, every: int = 200):
        self.path, self.every, self.calls, self.real = path, every, 0, None

    def __call__(self, task, variant: str, language: str) -> str:
        if self.real is None and self.calls % self.every == 0 and os.path.exists(self.path):
            with open(self.path) as f:
                self.real = json.load(f)
        self.calls += 1
        real = (self.real or {}).get(f"{task.task_id}:{variant}")
        return real["feedback"] if real else made_up_feedback(task.solutions[language], variant)


@dataclass
class Example:
    task_id: str
    variant: str
    n_attempts: int           # earlier attempts shown in the prompt (0: a turn-0 prompt)
    prompt_ids: list[int]
    response_ids: list[int]   # the response's tokens, then EOS


def draw_example(task, tokenizer, rng: random.Random, args, feedback=None) -> Example:
    """One training example. A later-turn prompt shows one or two earlier attempts drawn from the
    mixture, with their feedback; its response is drawn from the mixture too (nothing here teaches
    what to do after which feedback: RL must), except that with --repeat-share it repeats the last
    attempt's code, whatever its verdict, so that keeping a kernel is something the policy can do."""
    feedback = feedback or (lambda t, v, language: made_up_feedback(t.solutions[language], v))
    solution = task.solutions[args.language]
    words = task_words(task, args.language)
    history, last = [], None
    if rng.random() < args.later_turn_share:
        for _ in range(rng.choice((1, 2))):
            if rng.random() < args.stray_share:
                last = None   # nothing a response could repeat
                history.append(stray_attempt(task, args.language, rng, args.history_shares))
                continue
            last = draw_variant(rng, args.history_shares)
            history.append(summarize.Attempt(
                code=variant_code(solution, last, args.language),
                summary=rng.choice(SUMMARIES).format(**words), feedback=feedback(task, last, args.language)))
    prompt = summarize.build_prompt(task.reference_src, history, language=args.language,
                                    count_tokens=lambda s: len(tokenizer(s, add_special_tokens=False).input_ids),
                                    max_prompt_tokens=args.max_prompt_tokens)
    repeat = last is not None and rng.random() < args.repeat_share
    variant = last if repeat else draw_variant(rng, args.shares)
    text = response_text(task, variant_code(solution, variant, args.language), args.language, rng)
    response_ids = list(tokenizer(text, add_special_tokens=False).input_ids) + [tokenizer.eos_token_id]
    return Example(task.task_id, variant, len(history), engines.render_prompt(tokenizer, prompt),
                   response_ids)


# ---------------------------------------------------------------------------------------
# Tokenizer and model


def build_tokenizer(all_tasks, vocab_size: int, max_token_length: int):
    """Byte-level BPE trained on every built-in task's turn-0 prompt and solutions, both
    languages; wrapped as a PreTrainedTokenizerFast so save_pretrained/AutoTokenizer work."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    corpus = []
    for language in ("cuda", "cpp"):
        for task in all_tasks:
            corpus.append(summarize.build_prompt(task.reference_src, [], language=language,
                                                 count_tokens=len, max_prompt_tokens=1 << 30))
            corpus.append(response_text(task, task.solutions[language], language, random.Random(0)))
    bpe = Tokenizer(models.BPE())
    # Qwen2Tokenizer's own pipeline (NFC, its split regex, byte-level): AutoTokenizer builds a
    # Qwen2Tokenizer for a qwen2 checkpoint and imposes these, so anything else would tokenise
    # differently once loaded.
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<pad>", "</s>", "<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), max_token_length=max_token_length))
    # unk_token: Qwen2Tokenizer adds its default "<|endoftext|>" on loading if the vocabulary
    # lacks it, which would make len(tokenizer) exceed the model's vocabulary.
    return PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", eos_token="</s>",
                                   unk_token="<|endoftext|>", model_max_length=1 << 20)


def build_model(tokenizer, args):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=args.hidden, intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.heads, max_position_embeddings=args.max_positions,
        tie_word_embeddings=True, bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(args.seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


# ---------------------------------------------------------------------------------------
# Training


def response_loss(model, batch: list[Example], device) -> torch.Tensor:
    """Mean next-token cross-entropy over the response tokens (EOS included) of a batch."""
    width = max(len(e.prompt_ids) + len(e.response_ids) for e in batch)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    attention = torch.zeros_like(ids)
    target_mask = torch.zeros_like(ids)
    for row, e in enumerate(batch):
        seq = e.prompt_ids + e.response_ids
        ids[row, :len(seq)] = torch.tensor(seq)
        attention[row, :len(seq)] = 1
        target_mask[row, len(e.prompt_ids):len(seq)] = 1
    ids, attention, target_mask = ids.to(device), attention.to(device), target_mask.to(device)
    predicts = target_mask[:, 1:].bool()  # position i predicts token i+1
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        hidden = model.model(input_ids=ids, attention_mask=attention).last_hidden_state
        # logits at the response's positions only: the prompt's would be computed for nothing
        logits = model.lm_head(hidden[:, :-1][predicts])
    return torch.nn.functional.cross_entropy(logits.float(), ids[:, 1:][predicts])


def lr_at(step: int, args) -> float:
    warmup = max(1, int(args.warmup_frac * args.steps))
    if step < warmup:
        return args.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, args.steps - warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def on_distribution(model, tokenizer, train_tasks, args) -> dict:
    """Share of turn-0 samples (at --eval-temperature) whose code is exactly one of the trained
    variants, and the share of each variant: no harness, a cheap check of how far the
    model reproduces its mixture rather than garbling it."""
    engine = engines.HFEngine(model, tokenizer, max_batch_rows=args.eval_batch_rows)
    prompts = [engine.encode_prompt(summarize.build_prompt(
        t.reference_src, [], language=args.language, count_tokens=engine.count_tokens,
        max_prompt_tokens=args.max_prompt_tokens)) for t in train_tasks]
    groups = engine.generate(prompts, n=args.check_samples, max_new_tokens=args.max_new_tokens,
                             temperature=args.eval_temperature)
    counts = {v: 0 for v in VARIANTS + ("other",)}
    for task, group in zip(train_tasks, groups):
        codes = {variant_code(task.solutions[args.language], v, args.language).strip(): v for v in VARIANTS}
        for completion in group:
            code = summarize.parse_response(completion.text).code
            counts[codes.get((code or "").strip(), "other")] += 1
    n = sum(counts.values())
    return {"on_distribution": 1 - counts["other"] / n, **{k: c / n for k, c in counts.items()}}


def train(model, train_tasks, tokenizer, args, device, log) -> list[dict]:
    """Next-token training until --steps, --max-seconds, or (checked every --check-every steps)
    until --target-on-distribution of the samples reproduce a trained variant exactly."""
    rng = random.Random(f"warm-start:{args.seed}")
    feedback = Feedback(os.path.join(args.out, "variants.json"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    model.to(device).train()
    history = []
    t0 = time.monotonic()
    for step in range(args.steps):
        if args.check_every and args.check_samples and step and step % args.check_every == 0:
            check = dict(on_distribution(model, tokenizer, train_tasks, args), step=step,
                         seconds=time.monotonic() - t0)
            model.train()
            history.append(check)
            log(json.dumps(check))
            if check["on_distribution"] >= args.target_on_distribution:
                break
        if time.monotonic() - t0 > args.max_seconds:
            log(json.dumps({"event": "time limit", "step": step}))
            break
        batch = [draw_example(rng.choice(train_tasks), tokenizer, rng, args, feedback)
                 for _ in range(args.batch_size)]
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args)
        loss = response_loss(model, batch, device)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        optimizer.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            record = {"step": step, "loss": loss.item(), "grad_norm": grad_norm.item(),
                      "lr": lr_at(step, args), "seconds": time.monotonic() - t0,
                      "tokens": sum(len(e.prompt_ids) + len(e.response_ids) for e in batch)}
            history.append(record)
            log(json.dumps(record))
    return history


# ---------------------------------------------------------------------------------------
# Measuring the warm start with the real harness


def judge_samples(model, tokenizer, eval_tasks, args, device, log, n: int | None = None) -> dict:
    """Turn-0 samples from engines.HFEngine, judged by kernel_eval (no timing): the rollout
    itself, one turn, so the prompts, the parse and the gate are the RL run's."""
    import kernel_eval
    model.to(device).eval()
    engine = engines.HFEngine(model, tokenizer, max_batch_rows=args.eval_batch_rows)
    config = rollout.RolloutConfig(
        n_trajectories=n or args.eval_samples, n_turns=1, max_new_tokens=args.max_new_tokens,
        max_prompt_tokens=args.max_prompt_tokens, temperature=args.eval_temperature,
        language=args.language)

    def evaluate(pairs):
        return kernel_eval.evaluate_batch(pairs, device=args.harness_device, time_candidate=False)

    t0 = time.monotonic()
    samples, _ = rollout.rollout(eval_tasks, engine, evaluate, config)
    by_task = {}
    known = {t.task_id: {variant_code(t.solutions[args.language], v, args.language).strip(): v for v in VARIANTS}
             for t in eval_tasks}
    for s in samples:
        row = by_task.setdefault(s.task_id, {"n": 0, "correct": 0, "statuses": {}, "variants": {},
                                             "distinct_codes": set()})
        row["n"] += 1
        row["correct"] += s.status == "correct"
        row["statuses"][s.status] = row["statuses"].get(s.status, 0) + 1
        variant = known[s.task_id].get((s.code or "").strip(), "other")
        row["variants"][variant] = row["variants"].get(variant, 0) + 1
        row["distinct_codes"].add(s.code)
    for row in by_task.values():
        row["distinct_codes"] = len(row["distinct_codes"])
        row["correct_rate"] = row["correct"] / row["n"]
    result = {"correct_rate": sum(s.status == "correct" for s in samples) / len(samples),
              "n": len(samples), "seconds": time.monotonic() - t0, "by_task": by_task,
              "mean_response_tokens": sum(len(s.completion_ids) for s in samples) / len(samples)}
    log(json.dumps(result))
    return result


def judge_variants(train_tasks, args, log) -> dict:
    """The harness's verdict on each trained variant of each task, timed as the RL run times: what the
    mixture is worth, the feedback line later-turn prompts show for it (the training reads it from
    variants.json once written), each variant's code_id (learning_report.py names the kernels of a
    run's samples with it); run beside the training, it also fills the compile cache for the RL run."""
    import kernel_eval
    keys = [(t, v) for t in train_tasks for v in VARIANTS]
    codes = [variant_code(t.solutions[args.language], v, args.language) for t, v in keys]
    t0 = time.monotonic()
    results = kernel_eval.evaluate_batch([(t.reference_src, c) for (t, _), c in zip(keys, codes)],
                                         device=args.harness_device, time_candidate=True)
    verdicts = {}
    for (t, v), code, result in zip(keys, codes, results):
        record = rollout.verdict_record(result)
        verdicts[f"{t.task_id}:{v}"] = {
            "variant": v, "task_id": t.task_id, "code_id": code_id(code), "status": record["status"],
            "speedup": record.get("speedup", 0.0), "message": (record.get("message") or "")[:300],
            "feedback": summarize.feedback(record)}
    log(json.dumps({"event": "variants judged", "seconds": time.monotonic() - t0,
                    "verdicts": {k: {f: v[f] for f in ("status", "speedup")} for k, v in verdicts.items()}}))
    return verdicts


def select_tasks(all_tasks, spec: str):
    """Tasks whose id ends with one of the comma-separated names (e.g. level1/01_relu)."""
    chosen = []
    for name in [n.strip() for n in spec.split(",") if n.strip()]:
        matches = [t for t in all_tasks if t.task_id.endswith(name)]
        if len(matches) != 1:
            raise SystemExit(f"--tasks: {name!r} matches {len(matches)} built-in tasks, need exactly 1")
        chosen.append(matches[0])
    return chosen


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for save_pretrained (model + tokenizer)")
    p.add_argument("--language", choices=("cuda", "cpp"), default="cuda")
    p.add_argument("--tasks", default=DEFAULT_TASKS, help="comma-separated built-in task names")
    p.add_argument("--heldout", default=DEFAULT_HELDOUT,
                   help="tasks not trained on, sampled and judged too ('' for none)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--harness-device", default=None, help="kernel_eval's device (default: cuda for "
                   "--language cuda, cpu for cpp)")
    p.add_argument("--seed", type=int, default=0)
    # data
    p.add_argument("--shares", default=DEFAULT_SHARES,
                   help="the mixture of the responses' code: the solution (fast), the solution doing its work "
                        f"{SLOW_PASSES}x over (slow), wrong values, no compile")
    p.add_argument("--history-shares", default=DEFAULT_HISTORY_SHARES,
                   help="the mixture of the earlier attempts' code in later-turn prompts (the responses "
                        "there follow --shares)")
    p.add_argument("--later-turn-share", type=float, default=0.3,
                   help="share of training prompts that show earlier attempts (turns > 0)")
    p.add_argument("--repeat-share", type=float, default=0.25,
                   help="share of later-turn responses that repeat the last attempt's code, whatever its verdict")
    p.add_argument("--stray-share", type=float, default=0.3,
                   help="share of earlier attempts in later-turn prompts that are none of the variants "
                        "(cut off, or a line dropped), as a sampled policy's are")
    p.add_argument("--max-prompt-tokens", type=int, default=3072)
    # tokenizer and model
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--max-token-length", type=int, default=16, help="longest token, in characters")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--max-positions", type=int, default=4096)
    # optimisation
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup-frac", type=float, default=0.05)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--max-seconds", type=float, default=float("inf"), help="stop training after this long")
    p.add_argument("--check-every", type=int, default=0,
                   help="every this many steps, sample and stop once --target-on-distribution is met (0: never)")
    p.add_argument("--check-samples", type=int, default=8, help="samples per task in each check (0: no check)")
    p.add_argument("--target-on-distribution", type=float, default=0.9,
                   help="share of samples whose code is exactly a trained variant")
    # measuring
    p.add_argument("--variants-only", action="store_true",
                   help="only judge the trained variants with the harness (variants.json in --out), no training")
    p.add_argument("--eval-samples", type=int, default=8, help="turn-0 samples per task (0: skip)")
    p.add_argument("--heldout-samples", type=int, default=4, help="turn-0 samples per held-out task")
    p.add_argument("--eval-temperature", type=float, default=1.0)
    p.add_argument("--eval-batch-rows", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=1024)
    args = p.parse_args(argv)
    args.harness_device = args.harness_device or ("cuda" if args.language == "cuda" else "cpu")
    if not all(0.0 <= share <= 1.0 for share in (args.later_turn_share, args.repeat_share, args.stray_share)):
        p.error("--later-turn-share, --repeat-share and --stray-share must be in [0, 1]")
    try:
        args.shares = parse_shares(args.shares)
        args.history_shares = parse_shares(args.history_shares, "--history-shares")
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    log_path = os.path.join(args.out, "variants_log.jsonl" if args.variants_only else "warm_start_log.jsonl")
    log_file = open(log_path, "w")

    def log(line: str) -> None:
        print(line, flush=True)
        log_file.write(line + "\n")
        log_file.flush()

    root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tasks")
    all_tasks = tasks_module.load_builtin(root, device=args.harness_device)  # the references the harness judges
    train_tasks = select_tasks(all_tasks, args.tasks)
    heldout = select_tasks(all_tasks, args.heldout) if args.heldout else []
    for task in train_tasks:  # fail now, not after training, if a variant cannot be made
        for variant in VARIANTS:
            variant_code(task.solutions[args.language], variant, args.language)
    if args.variants_only:
        path = os.path.join(args.out, "variants.json")   # the training reads it meanwhile: never half a file
        with open(path + ".tmp", "w") as f:
            json.dump(judge_variants(train_tasks, args, log), f, indent=1)
        os.replace(path + ".tmp", path)
        return 0
    device = torch.device(args.device)
    tokenizer = build_tokenizer(all_tasks, args.vocab_size, args.max_token_length)
    model = build_model(tokenizer, args)
    n_params = sum(p.numel() for p in model.parameters())
    log(json.dumps({"event": "start", "params": n_params, "vocab": len(tokenizer),
                    "tasks": [t.task_id for t in train_tasks], "heldout": [t.task_id for t in heldout],
                    "args": vars(args)}))
    history = train(model, train_tasks, tokenizer, args, device, log)
    model.to(torch.float32)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    losses = [h for h in history if "loss" in h]
    summary = {"params": n_params, "final_loss": losses[-1]["loss"], "steps": losses[-1]["step"] + 1,
               "train_seconds": losses[-1]["seconds"], "tasks": [t.task_id for t in train_tasks],
               "checks": [h for h in history if "on_distribution" in h], "args": vars(args)}
    if args.check_samples:
        summary["final_check"] = on_distribution(model, tokenizer, train_tasks, args)
        log(json.dumps(dict(summary["final_check"], event="final check")))
    if args.eval_samples > 0:
        summary["train_tasks_eval"] = judge_samples(model, tokenizer, train_tasks, args, device, log)
        if heldout:
            summary["heldout_eval"] = judge_samples(model, tokenizer, heldout, args, device, log,
                                                    n=args.heldout_samples)
    with open(os.path.join(args.out, "warm_start.json"), "w") as f:
        json.dump(summary, f, indent=1)
    log(json.dumps({"event": "done", "out": args.out,
                    "correct_rate": summary.get("train_tasks_eval", {}).get("correct_rate"),
                    "heldout_correct_rate": summary.get("heldout_eval", {}).get("correct_rate")}))
    log_file.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
