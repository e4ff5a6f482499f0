"""examples/learning_rl.py: one GRPO update moves probability towards the rewarded completion."""
import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import rollout  # noqa: E402
import learning_rl  # noqa: E402


def _sample(trajectory: int, completion: list[int], ret: float) -> rollout.Sample:
    prompt = [5, 6, 7, 8]
    return rollout.Sample(
        task_id="t", trajectory=trajectory, turn=0, prompt_ids=prompt, completion_ids=completion,
        loss_mask=[0] * len(prompt) + [1] * len(completion), logprobs=None, text="",
        truncated=False, status="correct" if ret else "incorrect", score=ret,
        discounted_return=ret, speedup=0.0, code=None, feedback="")


def _completion_logprob(model, sample) -> float:
    ids = torch.tensor([sample.input_ids])
    logp = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
    targets = ids[0, 1:]
    start = len(sample.prompt_ids) - 1
    return float(logp[start:].gather(-1, targets[start:, None]).sum().detach())


def test_grpo_update_raises_the_rewarded_completion_and_lowers_the_other():
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=2, tie_word_embeddings=True))
    good, bad = _sample(0, [9, 10, 11, 1], 0.3), _sample(1, [12, 13, 14, 1], 0.0)
    samples = [good, bad, _sample(2, [9, 10, 11, 1], 0.3), _sample(3, [12, 13, 14, 1], 0.0)]
    args = argparse.Namespace(micro_batch=2, optimizer_steps=2, max_new_tokens=8, temperature=1.0,
                              clip_low=0.2, clip_high=0.28, grad_clip=1.0, seed=0)
    before = (_completion_logprob(model, good), _completion_logprob(model, bad))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    metrics = learning_rl.grpo_update(model, optimizer, samples, args, torch.device("cpu"))
    after = (_completion_logprob(model, good), _completion_logprob(model, bad))
    assert after[0] > before[0] and after[1] < before[1]
    assert metrics["advantage_nonzero"] == 1.0


def test_all_equal_returns_change_nothing():
    # Zero advantages everywhere: the loss and its gradient are exactly zero (AdamW without
    # weight decay then leaves every parameter as it was).
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=2, tie_word_embeddings=True))
    samples = [_sample(0, [9, 10, 1], 0.0), _sample(1, [12, 13, 1], 0.0)]
    args = argparse.Namespace(micro_batch=2, optimizer_steps=1, max_new_tokens=8, temperature=1.0,
                              clip_low=0.2, clip_high=0.28, grad_clip=1.0, seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    learning_rl.grpo_update(model, optimizer, samples, args, torch.device("cpu"))
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
