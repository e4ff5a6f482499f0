"""grpo.py against naive, obviously-correct references (values and gradients), and a learning test.

The references are written for clarity (Python loops, float64, full log_softmax); the module's
fast paths must agree with them on random inputs.
"""
import inspect
import os
import socket
import statistics
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import grpo


# ---------------------------------------------------------------- group_advantages

def naive_group_advantages(returns, keys, scale_by_std, eps):
    out = []
    for r, key in zip(returns, keys):
        group = [x for x, k in zip(returns, keys) if k == key]
        mean = sum(group) / len(group)
        std = statistics.pstdev(group)
        out.append((r - mean) / (std + eps) if scale_by_std else r - mean)
    return out


@pytest.mark.parametrize("scale_by_std", [True, False])
def test_group_advantages_matches_naive(scale_by_std):
    g = torch.Generator().manual_seed(0)
    returns = (torch.rand(40, generator=g) * 5).tolist()
    keys = [f"task{int(i)}" for i in torch.randint(0, 6, (40,), generator=g)]
    got = grpo.group_advantages(torch.tensor(returns), keys, scale_by_std=scale_by_std, eps=1e-6)
    want = naive_group_advantages(returns, keys, scale_by_std, 1e-6)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float32), rtol=1e-5, atol=1e-5)
    if scale_by_std:
        for key in set(keys):
            members = got[[k == key for k in keys]].double()
            if len(members) > 1:  # population std: exactly unit variance within each group
                assert abs(members.pow(2).mean().item() - 1.0) < 1e-4


def test_group_advantages_keys_tensor_and_tuple_and_singletons():
    returns = torch.tensor([1.0, 3.0, 2.0, 2.0, 7.0, 0.0, 4.0])
    task_turn = [("a", 0), ("a", 0), ("a", 1), ("a", 1), ("b", 0), ("a", 0), ("c", 0)]
    got = grpo.group_advantages(returns, task_turn)
    torch.testing.assert_close(got, torch.tensor(naive_group_advantages(returns.tolist(), task_turn, True, 1e-6)))
    # Equal returns in a group, and a group of one, give zero advantage (not NaN).
    assert got[2] == 0 and got[3] == 0 and got[4] == 0 and got[6] == 0
    ids = torch.tensor([5, 5, 9, 9, 2, 5, 11])
    torch.testing.assert_close(grpo.group_advantages(returns, ids), got)
    # Per-task grouping over all turns differs from per-(task, turn) grouping.
    per_task = grpo.group_advantages(returns, [k[0] for k in task_turn])
    assert not torch.allclose(per_task, got)


def test_group_advantages_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="group_ids"):
        grpo.group_advantages(torch.zeros(3), ["a", "b"])


# ---------------------------------------------------------------- token log-probs

def naive_token_logprobs(logits, targets):
    return torch.log_softmax(logits.double(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def naive_entropy(logits):
    logp = torch.log_softmax(logits.double(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


def float64_grad(logits, targets):
    """d Σ log p / d logits in float64, from the same (possibly bf16) logit values."""
    logits64 = logits.detach().double().requires_grad_()
    grad, = torch.autograd.grad(naive_token_logprobs(logits64, targets).sum(), logits64)
    return grad


@pytest.mark.parametrize("chunk_size", [1, 7, None, 1000])
def test_token_logprobs_values_and_grads_match_naive(chunk_size):
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(3, 11, 97, generator=g) * 4).requires_grad_()
    untouched = logits.detach().clone()
    targets = torch.randint(0, 97, (3, 11), generator=g)
    weights = torch.randn(3, 11, generator=g)
    got, entropy = grpo.token_logprobs(logits, targets, chunk_size=chunk_size, return_entropy=True)
    assert torch.equal(logits, untouched)  # fp32 logits: the in-place chunk math must work on a copy
    want = naive_token_logprobs(logits, targets)
    assert got.dtype == torch.float32 and got.shape == targets.shape
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy.double(), naive_entropy(logits).detach(), rtol=1e-5, atol=1e-5)
    assert not entropy.requires_grad
    grad_got, = torch.autograd.grad((got * weights).sum(), logits)
    grad_want, = torch.autograd.grad((want * weights.double()).sum(), logits)
    torch.testing.assert_close(grad_got, grad_want.float(), rtol=1e-5, atol=1e-6)
    assert torch.equal(logits, untouched)


def test_token_logprobs_chunked_equals_unchunked():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(50, 300, generator=g).requires_grad_()
    targets = torch.randint(0, 300, (50,), generator=g)
    whole = grpo.token_logprobs(logits, targets, chunk_size=50)
    grad_whole, = torch.autograd.grad(whole.sum(), logits)
    for chunk_size in (1, 3, 16, 49):
        part = grpo.token_logprobs(logits, targets, chunk_size=chunk_size)
        grad_part, = torch.autograd.grad(part.sum(), logits)
        torch.testing.assert_close(part, whole, rtol=0, atol=1e-6)
        torch.testing.assert_close(grad_part, grad_whole, rtol=0, atol=1e-7)


def test_token_logprobs_bf16_logits_give_fp32_exact_result():
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(64, 1000, generator=g) * 5).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, 1000, (64,), generator=g)
    got = grpo.token_logprobs(logits, targets, chunk_size=10)
    assert got.dtype == torch.float32
    want = naive_token_logprobs(logits, targets)  # float64 from the same bf16 values
    torch.testing.assert_close(got.double(), want, rtol=0, atol=2e-5)
    # A bf16 log_softmax would be off by ~1e-2: the fp32 path is what makes ratios near 1 meaningful.
    bf16_naive = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(1)
    assert (bf16_naive.double() - want).abs().max() > 100 * (got.double() - want).abs().max()
    grad_got, = torch.autograd.grad(got.sum(), logits)
    assert grad_got.dtype == torch.bfloat16
    torch.testing.assert_close(grad_got.double(), float64_grad(logits, targets), rtol=2 ** -7, atol=1e-6)


def test_token_logprobs_rejects_shape_mismatch():
    with pytest.raises(ValueError, match="targets shape"):
        grpo.token_logprobs(torch.zeros(4, 5, 10), torch.zeros(4, 6, dtype=torch.long))


@pytest.mark.parametrize("chunk_size", [1, 5, None])
def test_linear_token_logprobs_matches_naive(chunk_size):
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(2, 9, 16, generator=g, dtype=torch.float64).requires_grad_()
    weight = torch.randn(120, 16, generator=g, dtype=torch.float64).requires_grad_()
    targets = torch.randint(0, 120, (2, 9), generator=g)
    weights = torch.randn(2, 9, generator=g, dtype=torch.float64)
    got, entropy = grpo.linear_token_logprobs(hidden, weight, targets, chunk_size=chunk_size, return_entropy=True)
    logits = hidden @ weight.t()
    want = naive_token_logprobs(logits, targets)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy.double(), naive_entropy(logits).detach(), rtol=1e-5, atol=1e-5)
    grads_got = torch.autograd.grad((got.double() * weights).sum(), (hidden, weight))
    grads_want = torch.autograd.grad((want * weights).sum(), (hidden, weight))
    for a, b in zip(grads_got, grads_want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_linear_token_logprobs_bf16_matches_token_logprobs_of_bf16_logits():
    g = torch.Generator().manual_seed(5)
    hidden = torch.randn(40, 32, generator=g).to(torch.bfloat16).requires_grad_()
    weight = torch.randn(500, 32, generator=g).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, 500, (40,), generator=g)
    fused = grpo.linear_token_logprobs(hidden, weight, targets, chunk_size=8)
    unfused = grpo.token_logprobs(hidden @ weight.t(), targets, chunk_size=8)
    assert fused.dtype == torch.float32
    torch.testing.assert_close(fused, unfused, rtol=0, atol=1e-5)
    grad_fused = torch.autograd.grad(fused.sum(), (hidden, weight))
    grad_unfused = torch.autograd.grad(unfused.sum(), (hidden, weight))
    for a, b in zip(grad_fused, grad_unfused):
        assert a.dtype == torch.bfloat16
        # Both round the per-token logits gradient to bf16; the fused path accumulates the weight
        # gradient over chunks in fp32, the unfused one in one bf16 matmul.
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-2)



@pytest.mark.parametrize("fused", [False, True])
def test_completion_logprobs_of_right_padded_rows_equal_a_full_forward_of_each_row_alone(fused):
    """completion_logprobs runs without a padding mask (right padding under the causal mask) and
    its LM head only on trained positions: each row's log-probs equal log_softmax(logits / T) of
    a plain full forward over the row alone, at its completion tokens, and are 0 elsewhere; the same
    with the head fused with the log-probs, whose gradient equals the unfused one's."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, pad_token_id=0, eos_token_id=1, bos_token_id=None))
    g = torch.Generator().manual_seed(0)
    rows = [(torch.randint(3, 300, (n,), generator=g).tolist(), torch.randint(3, 300, (m,), generator=g).tolist())
            for n, m in [(5, 3), (7, 2), (4, 6), (6, 4)]]
    width = max(len(p) + len(c) for p, c in rows)
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)   # pad id 0, on the right
    loss_mask = torch.zeros(len(rows), width, dtype=torch.long)
    for r, (prompt, completion) in enumerate(rows):
        input_ids[r, :len(prompt) + len(completion)] = torch.tensor(prompt + completion)
        loss_mask[r, len(prompt):len(prompt) + len(completion)] = 1
    batch = {"input_ids": input_ids, "loss_mask": loss_mask}
    logp, mask = grpo.completion_logprobs(model, batch, temperature=0.7, fused=fused)
    assert logp.shape == mask.shape == (len(rows), width - 1)
    weights = torch.randn(logp.shape, generator=g)
    grads = []
    for fuse in (False, True):
        model.zero_grad()
        (grpo.completion_logprobs(model, batch, temperature=0.7, fused=fuse)[0] * weights).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for unfused, fused_grad in zip(*grads):
        torch.testing.assert_close(fused_grad, unfused, rtol=1e-4, atol=1e-6)
    assert "forward" not in vars(model.get_output_embeddings())   # the head is the model's own again
    assert bool((logp[~mask.bool()] == 0).all())
    for r, (prompt, completion) in enumerate(rows):
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            naive = torch.log_softmax(model(input_ids=ids).logits.float() / 0.7, dim=-1)[0, :-1]
        want = naive.gather(1, ids[0, 1:, None])[len(prompt) - 1:, 0]
        assert int(mask[r].sum()) == len(completion)
        torch.testing.assert_close(logp[r][mask[r].bool()], want, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- policy_loss

def naive_policy_loss(logprobs, old, adv, mask, clip_low, clip_high, aggregation, max_tokens, kl_coef, ref):
    """One token at a time, straight from the formulas in grpo.policy_loss's docstring."""
    n_seq, n_tok = logprobs.shape
    seq_sums, seq_counts = [], []
    for i in range(n_seq):
        s, c = 0.0, 0
        for t in range(n_tok):
            if not mask[i, t]:
                continue
            a = adv[i] if adv.dim() == 1 else adv[i, t]
            ratio = torch.exp(logprobs[i, t] - old[i, t])
            clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
            loss = -torch.minimum(ratio * a, clipped * a)
            if kl_coef > 0:
                d = ref[i, t] - logprobs[i, t]
                loss = loss + kl_coef * (torch.exp(d) - d - 1)
            s, c = s + loss, c + 1
        seq_sums.append(s)
        seq_counts.append(c)
    if aggregation == "dr_grpo":
        return sum(seq_sums) / (n_seq * max_tokens)
    if aggregation == "token_mean":
        return sum(seq_sums) / sum(seq_counts)
    return sum(s / max(c, 1) for s, c in zip(seq_sums, seq_counts)) / n_seq


def random_batch(seed, n_seq=6, n_tok=8, per_token_adv=False):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n_seq, n_tok, generator=g, dtype=torch.float64) * 3
    logprobs = (old + torch.randn(n_seq, n_tok, generator=g, dtype=torch.float64) * 0.3).requires_grad_()
    ref = old + torch.randn(n_seq, n_tok, generator=g, dtype=torch.float64) * 0.2
    adv = torch.randn(n_seq, n_tok, generator=g) if per_token_adv else torch.randn(n_seq, generator=g)
    lengths = torch.randint(0, n_tok + 1, (n_seq,), generator=g)
    lengths[0] = n_tok
    mask = torch.arange(n_tok)[None, :] < lengths[:, None]
    return logprobs, old, adv.double(), mask, ref


@pytest.mark.parametrize("aggregation", ["dr_grpo", "token_mean", "seq_mean"])
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_policy_loss_matches_naive(aggregation, kl_coef, per_token_adv):
    logprobs, old, adv, mask, ref = random_batch(10, per_token_adv=per_token_adv)
    kwargs = dict(clip_low=0.2, clip_high=0.28, aggregation=aggregation, max_tokens=12, kl_coef=kl_coef)
    loss, metrics = grpo.policy_loss(logprobs, old, adv, mask, ref_logprobs=ref, **kwargs)
    want = naive_policy_loss(logprobs, old, adv, mask, 0.2, 0.28, aggregation, 12, kl_coef, ref)
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)
    grad_got, = torch.autograd.grad(loss, logprobs)
    grad_want, = torch.autograd.grad(want, logprobs)
    torch.testing.assert_close(grad_got.double(), grad_want, rtol=1e-4, atol=1e-7)
    assert (grad_got[~mask] == 0).all()
    assert metrics["tokens"] == int(mask.sum())
    ratio = torch.exp(logprobs - old).detach()[mask]
    assert metrics["ratio_mean"] == pytest.approx(ratio.mean().item(), rel=1e-5)
    assert metrics["approx_kl_old"] == pytest.approx((ratio - 1 - ratio.log()).mean().item(), rel=1e-4)
    d = (ref - logprobs).detach()[mask]
    assert metrics["kl_ref"] == pytest.approx((d.exp() - d - 1).mean().item(), rel=1e-4)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_policy_loss_ignores_nonfinite_values_outside_the_mask(bad):
    logprobs, old, adv, mask, ref = random_batch(11)
    clean_loss, clean_metrics = grpo.policy_loss(logprobs, old, adv, mask, max_tokens=8, kl_coef=0.1, ref_logprobs=ref)
    clean_grad, = torch.autograd.grad(clean_loss, logprobs)
    garbage, old_garbage, ref_garbage = (x.detach().clone() for x in (logprobs, old, ref))
    for x in (garbage, old_garbage, ref_garbage):
        x[~mask] = bad
    garbage.requires_grad_()
    loss, metrics = grpo.policy_loss(garbage, old_garbage, adv, mask, max_tokens=8, kl_coef=0.1, ref_logprobs=ref_garbage)
    grad, = torch.autograd.grad(loss, garbage)
    assert loss.item() == clean_loss.item() and torch.equal(grad, clean_grad)
    assert metrics == clean_metrics


def test_policy_loss_clip_fraction_counts():
    ratios = torch.tensor([[0.5, 0.79, 0.81, 1.0, 1.27, 1.29, 2.0, 0.5]], dtype=torch.float64)
    old = torch.full_like(ratios, -1.0)
    logprobs = old + ratios.log()
    mask = torch.tensor([[True] * 7 + [False]])
    # A < 0: tokens below 0.8 are clipped low (0.5, 0.79), those above 1.28 are not clipped.
    _, m = grpo.policy_loss(logprobs, old, torch.tensor([-1.0]), mask, max_tokens=8)
    assert m["clip_frac_low"] == pytest.approx(2 / 7) and m["clip_frac_high"] == 0
    # A > 0: tokens above 1.28 are clipped high (1.29, 2.0); masked 0.5 is not counted.
    _, m = grpo.policy_loss(logprobs, old, torch.tensor([1.0]), mask, max_tokens=8)
    assert m["clip_frac_high"] == pytest.approx(2 / 7) and m["clip_frac_low"] == 0
    # And the clipped tokens get zero gradient, the others do not.
    lp = logprobs.clone().requires_grad_()
    loss, _ = grpo.policy_loss(lp, old, torch.tensor([1.0]), mask, max_tokens=8)
    loss.backward()
    assert (lp.grad[0, [5, 6, 7]] == 0).all() and (lp.grad[0, :5] != 0).all()


def test_policy_loss_ratio_one_is_reinforce_with_group_baseline():
    g = torch.Generator().manual_seed(12)
    logprobs = (-torch.rand(8, 5, generator=g, dtype=torch.float64) * 2).requires_grad_()
    mask = torch.rand(8, 5, generator=g) < 0.8
    returns = torch.rand(8, generator=g, dtype=torch.float64)
    groups = [0, 0, 0, 0, 1, 1, 1, 1]
    adv = grpo.group_advantages(returns, groups, scale_by_std=False)
    loss, m = grpo.policy_loss(logprobs, logprobs.detach(), adv, mask, aggregation="token_mean")
    assert m["ratio_mean"] == 1.0 and m["clip_frac_low"] == 0 and m["clip_frac_high"] == 0
    baseline = torch.tensor([returns[:4].mean(), returns[4:].mean()]).repeat_interleave(4)
    reinforce = -(((returns - baseline)[:, None] * logprobs) * mask).sum() / mask.sum()
    grad_got, = torch.autograd.grad(loss, logprobs)
    grad_want, = torch.autograd.grad(reinforce, logprobs)
    torch.testing.assert_close(grad_got.double(), grad_want, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(loss.double(), -((returns - baseline)[:, None] * mask).sum() / mask.sum())


def test_policy_loss_errors_name_the_problem():
    logprobs, old, adv, mask, _ = random_batch(13)
    with pytest.raises(ValueError, match="max_tokens"):
        grpo.policy_loss(logprobs, old, adv, mask, aggregation="dr_grpo")
    with pytest.raises(ValueError, match="ref_logprobs"):
        grpo.policy_loss(logprobs, old, adv, mask, max_tokens=8, kl_coef=0.1)
    with pytest.raises(ValueError, match="aggregation"):
        grpo.policy_loss(logprobs, old, adv, mask, aggregation="mean")
    with pytest.raises(ValueError, match="advantages shape"):
        grpo.policy_loss(logprobs, old, adv[:3], mask, max_tokens=8)
    with pytest.raises(ValueError, match="total"):
        grpo.policy_loss(logprobs, old, adv, mask, aggregation="token_mean", total=0.0)


def test_policy_loss_with_no_masked_token_is_zero_not_nan():
    logprobs, old, adv, mask, _ = random_batch(14)
    loss, metrics = grpo.policy_loss(logprobs, old, adv, torch.zeros_like(mask), aggregation="token_mean")
    grad, = torch.autograd.grad(loss, logprobs)
    assert loss.item() == 0 and (grad == 0).all() and metrics["tokens"] == 0


# ---------------------------------------------------------------- split batches: micro-batches and ranks

def split_problem():
    """A shared parameter W turns per-token hidden states into logits, so every sequence's loss
    reaches the same gradient: the gradient of the whole batch is the test's reference."""
    g = torch.Generator().manual_seed(20)
    n_seq, n_tok, d, vocab = 6, 7, 8, 30
    hidden = torch.randn(n_seq, n_tok, d, generator=g)
    targets = torch.randint(0, vocab, (n_seq, n_tok), generator=g)
    w0 = torch.randn(vocab, d, generator=g) * 0.5
    with torch.no_grad():
        old = grpo.token_logprobs(hidden @ w0.t(), targets) + torch.randn(n_seq, n_tok, generator=g) * 0.2
    adv = torch.randn(n_seq, generator=g)
    lengths = torch.tensor([7, 2, 5, 0, 6, 3])
    mask = torch.arange(n_tok)[None, :] < lengths[:, None]
    return hidden, targets, w0, old, adv, mask


def split_gradient(rows_per_part, aggregation, use_total=True):
    """Sum of the gradients of W over the parts, each normalised by the global denominator."""
    hidden, targets, w0, old, adv, mask = split_problem()
    w = w0.clone().requires_grad_()
    total = sum(grpo.loss_denominator(mask[r], aggregation, max_tokens=10) for r in rows_per_part)
    for r in rows_per_part:
        logprobs = grpo.token_logprobs(hidden[r] @ w.t(), targets[r], chunk_size=4)
        loss, _ = grpo.policy_loss(logprobs, old[r], adv[r], mask[r], aggregation=aggregation, max_tokens=10,
                                   total=total if use_total else None)
        loss.backward()
    return w.grad


@pytest.mark.parametrize("aggregation", ["dr_grpo", "token_mean", "seq_mean"])
def test_micro_batches_give_the_whole_batch_gradient(aggregation):
    whole = split_gradient([slice(0, 6)], aggregation)
    parts = split_gradient([slice(0, 1), slice(1, 4), slice(4, 6)], aggregation)
    torch.testing.assert_close(parts, whole, rtol=1e-5, atol=1e-7)
    # Without the global normaliser, token_mean and seq_mean depend on the split: the test can fail.
    if aggregation != "dr_grpo":
        local = split_gradient([slice(0, 1), slice(1, 4), slice(4, 6)], aggregation, use_total=False)
        assert not torch.allclose(local, whole, rtol=1e-3)


RANK_ROWS = {0: [slice(0, 2)], 1: [slice(2, 3), slice(3, 6)]}  # uneven, and rank 1 in two micro-batches


def _gloo_worker(rank, world_size, port, out_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        hidden, targets, w0, old, adv, mask = split_problem()
        for aggregation in grpo.AGGREGATIONS:
            w = w0.clone().requires_grad_()
            total = sum(grpo.loss_denominator(mask[r], aggregation, max_tokens=10) for r in RANK_ROWS[rank])
            dist.all_reduce(total)
            for r in RANK_ROWS[rank]:
                logprobs = grpo.token_logprobs(hidden[r] @ w.t(), targets[r])
                loss, _ = grpo.policy_loss(logprobs, old[r], adv[r], mask[r], aggregation=aggregation,
                                           max_tokens=10, total=total)
                loss.backward()
            dist.all_reduce(w.grad)  # sum over ranks, as the loss already carries the global normaliser
            if rank == 0:
                torch.save(w.grad, os.path.join(out_dir, f"{aggregation}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_ranks_give_the_whole_batch_gradient():
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(_gloo_worker, args=(2, _free_port(), out_dir), nprocs=2, join=True)
        for aggregation in grpo.AGGREGATIONS:
            got = torch.load(os.path.join(out_dir, f"{aggregation}.pt"))
            torch.testing.assert_close(got, split_gradient([slice(0, 6)], aggregation), rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------- learning test

TARGET_TOKEN, EOS, VOCAB = 5, 1, 16


def _cache_keyword(model):
    # transformers 5.x renamed forward's past_key_values to cache; 4.x knows only the old name.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


@torch.no_grad()
def sample(model, prompts, max_new_tokens):
    """Plain ancestral sampling with a KV cache. The loss mask comes from here: a position is
    trained if the sequence had not ended before it (the EOS itself is trained, the filler after
    it is not; the filler is EOS, so a pad-derived mask would be wrong)."""
    cache_kw = _cache_keyword(model)
    out = model(input_ids=prompts, use_cache=True)
    alive = torch.ones(prompts.shape[0], dtype=torch.bool)
    tokens, mask = [], []
    for _ in range(max_new_tokens):
        probs = torch.softmax(out.logits[:, -1].float(), dim=-1)
        token = torch.where(alive, torch.multinomial(probs, 1).squeeze(1), torch.full_like(alive, EOS, dtype=torch.long))
        tokens.append(token)
        mask.append(alive.clone())
        alive &= token != EOS
        out = model(input_ids=token[:, None], use_cache=True, **{cache_kw: getattr(out, cache_kw)})
    return torch.stack(tokens, 1), torch.stack(mask, 1)


def toy_reward(completion, mask):
    """Share of the target token among the sampled (masked) tokens: verifiable, in [0, 1]."""
    hits = ((completion == TARGET_TOKEN) & mask).sum(1).float()
    return hits / mask.sum(1).clamp(min=1).float()


def completion_logprobs(model, prompts, completion):
    """Log-probs of the completion tokens, running the LM head over completion positions only."""
    n_new = completion.shape[1]
    # transformers >= 4.50 calls it logits_to_keep, 4.46-4.49 num_logits_to_keep.
    keep_kw = "logits_to_keep" if "logits_to_keep" in inspect.signature(model.forward).parameters else "num_logits_to_keep"
    logits = model(input_ids=torch.cat([prompts, completion], 1), **{keep_kw: n_new + 1}).logits[:, :-1]
    return grpo.token_logprobs(logits, completion)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_learns_toy_reward(seed):
    transformers = pytest.importorskip("transformers")
    # One thread: these ops are tiny, and on a shared 2-core machine two threads ran 15x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _learn_toy_reward(transformers, seed)
    finally:
        torch.set_num_threads(threads)


def _learn_toy_reward(transformers, seed, steps=10):
    """Tiny random Llama, group sampling, group advantages, the loss, AdamW: the mean reward (share of
    one token, about 1/16 at the start) must at least double in `steps` steps (it reaches ~0.8)."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=64, bos_token_id=0, eos_token_id=EOS, pad_token_id=EOS)
    model = transformers.LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    n_prompts, group_size, prompt_len, max_new = 8, 8, 4, 12

    def mean_reward(n=256):
        prompts = torch.randint(2, VOCAB, (n, prompt_len))
        completion, mask = sample(model, prompts, max_new)
        return toy_reward(completion, mask).mean().item()

    before = mean_reward()
    for step in range(steps):
        prompts = torch.randint(2, VOCAB, (n_prompts, prompt_len)).repeat_interleave(group_size, 0)
        completion, mask = sample(model, prompts, max_new)
        advantages = grpo.group_advantages(toy_reward(completion, mask), torch.arange(n_prompts).repeat_interleave(group_size))
        with torch.no_grad():
            old = completion_logprobs(model, prompts, completion)
        for _ in range(2):  # two optimizer steps per batch, as Kevin: the second one sees ratios != 1
            loss, metrics = grpo.policy_loss(completion_logprobs(model, prompts, completion), old, advantages, mask,
                                             aggregation="dr_grpo", max_tokens=max_new)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    after = mean_reward()
    assert before > 0.02, f"degenerate start: reward {before:.3f}"
    assert after >= 2 * before, f"mean reward {before:.3f} -> {after:.3f} after {steps} steps (seed {seed})"


# ---------------------------------------------------------------- GPU

@pytest.mark.gpu
def test_token_logprobs_cuda_bf16_matches_naive():
    g = torch.Generator(device="cuda").manual_seed(30)
    logits = (torch.randn(4096, 32000, generator=g, device="cuda") * 4).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, 32000, (4096,), generator=g, device="cuda")
    got, entropy = grpo.token_logprobs(logits, targets, return_entropy=True)
    want = naive_token_logprobs(logits, targets)
    assert got.dtype == torch.float32 and got.device.type == "cuda"
    torch.testing.assert_close(got.double(), want, rtol=0, atol=5e-5)
    torch.testing.assert_close(entropy.double(), naive_entropy(logits).detach(), rtol=1e-5, atol=1e-4)
    grad_got, = torch.autograd.grad(got.sum(), logits)
    torch.testing.assert_close(grad_got.double(), float64_grad(logits, targets), rtol=2 ** -7, atol=1e-6)


@pytest.mark.gpu
def test_linear_token_logprobs_cuda_bf16_matches_unfused():
    g = torch.Generator(device="cuda").manual_seed(31)
    hidden = torch.randn(2048, 1024, generator=g, device="cuda").to(torch.bfloat16).requires_grad_()
    weight = (torch.randn(32000, 1024, generator=g, device="cuda") * 0.05).to(torch.bfloat16).requires_grad_()
    targets = torch.randint(0, 32000, (2048,), generator=g, device="cuda")
    fused = grpo.linear_token_logprobs(hidden, weight, targets)
    logits = (hidden.double() @ weight.double().t())
    want = naive_token_logprobs(logits, targets)
    # The fused matmul runs in bf16 like the model's LM head; the reference is float64 throughout.
    torch.testing.assert_close(fused.double(), want, rtol=0, atol=0.1)
    grad_fused = torch.autograd.grad(fused.sum(), (hidden, weight))
    grad_want = torch.autograd.grad(want.sum(), (hidden, weight))
    for a, b in zip(grad_fused, grad_want):
        rel = (a.double() - b).norm() / b.norm()
        assert rel < 2e-2, f"relative gradient error {rel:.3g}"
