"""GRPO's optimisation core: group advantages, memory-light token log-probs, the clipped policy loss.

Torch only, no project imports: this file can be copied alone into another project.

The objective maximised (GRPO, Shao et al. 2024, "DeepSeekMath", arXiv 2402.03300, eq. 3, with
the variants named below):

    J(θ) = 1/Z Σ_i Σ_t [ min( ρ_it A_i , clip(ρ_it, 1 - ε_low, 1 + ε_high) A_i ) - β KL3_it ]
    ρ_it = π_θ(o_it | q_i, o_i,<t) / π_old(o_it | q_i, o_i,<t)

- A_i, `group_advantages`: sample i's return minus the mean return of its group, divided by the
  group's standard deviation (GRPO) or not (Dr. GRPO, Liu et al. 2025, arXiv 2503.20783, which
  shows the division weights questions by their difficulty).
- ε_low < ε_high, `policy_loss`: DAPO's clip-higher (Yu et al. 2025, arXiv 2503.14476, §3.1): a
  larger upper clip lets unlikely tokens gain probability, which keeps entropy from collapsing.
- Z, `policy_loss(aggregation=...)`: "seq_mean" = G · |o_i| (GRPO: mean over each sequence's
  tokens, then over sequences), "token_mean" = Σ_i |o_i| (DAPO §3.3: every token weighs the same),
  "dr_grpo" = G · max_tokens (Dr. GRPO: a constant, so neither short correct answers nor long
  wrong ones are favoured). Z is the one for the whole optimizer step, not per micro-batch.
- KL3, `policy_loss(kl_coef=β)`: Schulman's k3 estimator of KL(π_θ || π_ref)
  (http://joschu.net/blog/kl-approx.html), exp(ref - logp) - (ref - logp) - 1: unbiased, >= 0.

log π_θ(o_it) comes from `token_logprobs` (logits already materialised, e.g. by
`completion_logprobs`, which runs a model's LM head over completion positions only) or
`linear_token_logprobs` (hidden states and the LM head weight: the full logits never exist). Both work in chunks of tokens, in fp32, and keep no fp32 copy
of the (tokens x vocab) logits for backward: they save log-sum-exp (one float per token) and
recompute the softmax chunk by chunk in backward.
"""
import torch

# Tokens per chunk default to this many fp32 elements per chunk (64 MiB): about 110 tokens at
# Qwen's 152k vocabulary. One chunk is the only fp32 (tokens x vocab) buffer alive at a time, so
# the extra memory is 64 MiB, 1.4% of the 4.6 GiB of bf16 logits of 16k tokens.
CHUNK_ELEMENTS = 1 << 24

AGGREGATIONS = ("dr_grpo", "token_mean", "seq_mean")


def group_advantages(returns, group_ids, scale_by_std=True, eps=1e-6) -> torch.Tensor:
    """A_i = (R_i - mean_g R) / (std_g R + eps), or A_i = R_i - mean_g R with scale_by_std=False.

    g is the group of sample i: GRPO (DeepSeekMath §4.1.2) normalises within the G outputs of one
    question; Kevin-32B groups all trajectories x turns of one task (pass the task id per sample);
    a per-(task, turn) grouping is the key (task_id, turn). Dr. GRPO (arXiv 2503.20783)
    drops the division by std (scale_by_std=False).

    std is the population std (divide by n, not n - 1): the group is the whole set being
    normalised, not a sample of a larger one, so the advantages come out with unit variance in each
    group; and a group of one gives A = 0 rather than the NaN of a sample std.

    returns: shape (n,) numbers. group_ids: n hashable keys (str, int, tuple) or an integer tensor.
    Returns a tensor of shape (n,), float32 unless `returns` is a floating tensor of another dtype.
    """
    returns = torch.as_tensor(returns)
    if returns.dim() != 1:
        raise ValueError(f"group_advantages: returns must be 1-D, got shape {tuple(returns.shape)}")
    if isinstance(group_ids, torch.Tensor):
        if group_ids.shape != returns.shape:
            raise ValueError(f"group_advantages: group_ids shape {tuple(group_ids.shape)} "
                             f"!= returns shape {tuple(returns.shape)}")
        _, group_index = torch.unique(group_ids, return_inverse=True)
    else:
        group_ids = list(group_ids)
        if len(group_ids) != returns.numel():
            raise ValueError(f"group_advantages: {len(group_ids)} group_ids for {returns.numel()} returns")
        index_of = {}
        group_index = torch.tensor([index_of.setdefault(key, len(index_of)) for key in group_ids], dtype=torch.long)
    out_dtype = returns.dtype if returns.is_floating_point() else torch.float32
    if returns.numel() == 0:
        return torch.zeros(0, dtype=out_dtype, device=returns.device)
    group_index = group_index.to(returns.device)
    # float64 so that large returns (uncapped speedups) lose nothing to the subtraction of the mean.
    r = returns.to(torch.float64)
    n_groups = int(group_index.max()) + 1
    zeros = torch.zeros(n_groups, dtype=torch.float64, device=r.device)
    count = zeros.index_add(0, group_index, torch.ones_like(r))
    mean = zeros.index_add(0, group_index, r) / count
    centred = r - mean[group_index]
    if scale_by_std:
        std = (zeros.index_add(0, group_index, centred * centred) / count).sqrt()
        centred = centred / (std[group_index] + eps)
    return centred.to(out_dtype)


def _rows_per_chunk(chunk_size, width) -> int:
    if chunk_size is None:
        return max(1, CHUNK_ELEMENTS // width)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1 token, got {chunk_size}")
    return int(chunk_size)


def _chunk_logprobs(x, targets, entropy_out=None):
    """(log p[target], logsumexp) per row of the fp32 chunk x, which it overwrites: the chunk is
    the only (rows x vocab) buffer alive, where torch.logsumexp would allocate a second one.
    lse = m + log Σ exp(x - m) with m the row max; entropy -Σ p log p into entropy_out if given."""
    target_logit = x.gather(1, targets.unsqueeze(1)).squeeze(1)
    row_max = x.amax(dim=-1, keepdim=True)
    x.sub_(row_max).exp_()
    sum_exp = x.sum(dim=-1, keepdim=True)
    lse = (row_max + sum_exp.log()).squeeze(1)
    if entropy_out is not None:
        # entr(p) = -p log p with entr(0) = 0, so a p that underflows gives 0, not NaN.
        entropy_out.copy_(torch.special.entr(x.div_(sum_exp), out=x).sum(-1))
    return target_logit - lse, lse


class _ChunkedTokenLogprobs(torch.autograd.Function):
    """log p_t = x_t - logsumexp(x), chunk by chunk; d log p_t / d x = onehot(t) - softmax(x)."""

    @staticmethod
    def forward(ctx, logits, targets, rows, want_entropy):
        n = logits.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)
        entropy = torch.empty(n if want_entropy else 0, dtype=torch.float32, device=logits.device)
        for start in range(0, n, rows):
            end = min(start + rows, n)
            # copy=True: for fp32 logits .float() would return the input itself, and the in-place
            # ops of _chunk_logprobs would overwrite it.
            x = logits[start:end].to(torch.float32, copy=True)
            entropy_out = entropy[start:end] if want_entropy else None
            logp[start:end], lse[start:end] = _chunk_logprobs(x, targets[start:end], entropy_out)
            del x  # before the next chunk is allocated, or two chunks are alive at once
        ctx.save_for_backward(logits, targets, lse)
        ctx.rows = rows
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        logits, targets, lse = ctx.saved_tensors
        grad_logits = torch.empty_like(logits)
        g = grad_logp.float()
        for start in range(0, logits.shape[0], ctx.rows):
            end = min(start + ctx.rows, logits.shape[0])
            g_chunk = g[start:end].unsqueeze(1)
            p = logits[start:end].to(torch.float32, copy=True).sub_(lse[start:end].unsqueeze(1)).exp_()
            p.mul_(-g_chunk).scatter_add_(1, targets[start:end].unsqueeze(1), g_chunk)
            grad_logits[start:end] = p
            del p
        return grad_logits, None, None, None


def token_logprobs(logits, targets, chunk_size=None, *, return_entropy=False):
    """log π(t | ·) = logits[t] - logsumexp(logits), in fp32, chunked over tokens.

    logits: (..., vocab), any float dtype (bf16 from the model is the intended case); only the
    positions whose next token is trained need be passed (run the LM head over completion positions
    only, e.g. Hugging Face's `logits_to_keep`). targets: (...) token ids, the tokens that follow.
    chunk_size: tokens per chunk; None picks CHUNK_ELEMENTS / vocab.

    Memory: backward keeps the input logits (no copy) and one fp32 number per token; the fp32
    temporary is one chunk (chunk_size x vocab x 4 bytes). The gradient w.r.t. the logits is
    itself a logits-sized tensor in their dtype, as for any function of materialised logits (the
    fused linear_token_logprobs avoids both). A logits tensor that cannot
    be viewed as (tokens, vocab) (a slice along the sequence with batch > 1) is copied once by
    reshape; pass a contiguous one to avoid that.

    Returns log-probs shaped like targets (fp32), and with return_entropy=True also the per-token
    entropy -Σ p log p (fp32, detached: a metric, not a loss term).
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"token_logprobs: logits shape {tuple(logits.shape)} does not match "
                         f"targets shape {tuple(targets.shape)} + (vocab,)")
    vocab = logits.shape[-1]
    logp, entropy = _ChunkedTokenLogprobs.apply(
        logits.reshape(-1, vocab), targets.reshape(-1).long(), _rows_per_chunk(chunk_size, vocab), return_entropy)
    logp = logp.view(targets.shape)
    return (logp, entropy.view(targets.shape)) if return_entropy else logp


class _ChunkedLinearTokenLogprobs(torch.autograd.Function):
    """token_logprobs(hidden @ weight.T, targets) with the logits made one chunk at a time."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, rows, want_entropy):
        n = hidden.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        entropy = torch.empty(n if want_entropy else 0, dtype=torch.float32, device=hidden.device)
        for start in range(0, n, rows):
            end = min(start + rows, n)
            # The matmul runs in the model's dtype, as the LM head would, so the result equals
            # token_logprobs(lm_head(hidden)); the upcast comes after.
            x = (hidden[start:end] @ weight.t()).float()
            entropy_out = entropy[start:end] if want_entropy else None
            logp[start:end], lse[start:end] = _chunk_logprobs(x, targets[start:end], entropy_out)
            del x  # before the next chunk is allocated, or two chunks are alive at once
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.rows = rows
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        # Backward walks the vocabulary in blocks, each block over all tokens: the weight gradient of
        # a block is then one matmul over every token (one rounding, no accumulator of the weight's
        # size), and only the hidden gradient, tokens x d, is summed over blocks, in fp32.
        hidden, weight, targets, lse = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        n, vocab = hidden.shape[0], weight.shape[0]
        block = max(1, ctx.rows * vocab // max(n, 1))  # a (tokens x block) tile as big as a forward chunk
        grad_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device) if need_hidden else None
        grad_weight = torch.empty_like(weight) if need_weight else None
        g = grad_logp.float()
        # Tokens sorted by target, so each block finds the tokens whose target it holds without a
        # device sync per block.
        order = torch.argsort(targets)
        block_starts = torch.arange(0, vocab + block, block, device=targets.device)
        bounds = torch.searchsorted(targets[order], block_starts).tolist()
        for b, v0 in enumerate(range(0, vocab, block)):
            v1 = min(v0 + block, vocab)
            w = weight[v0:v1]
            p = (hidden @ w.t()).float().sub_(lse.unsqueeze(1)).exp_()  # softmax over this block
            p.mul_(-g.unsqueeze(1))
            rows = order[bounds[b]:bounds[b + 1]]
            p.index_put_((rows, targets[rows] - v0), g[rows], accumulate=True)  # + g at the target
            grad_logits = p.to(hidden.dtype)
            del p
            if need_weight:
                grad_weight[v0:v1] = grad_logits.t() @ hidden
            if need_hidden:
                grad_hidden.add_(grad_logits @ w)
            del grad_logits
        if need_hidden:
            grad_hidden = grad_hidden.to(hidden.dtype)
        return grad_hidden, grad_weight, None, None, None


def linear_token_logprobs(hidden, weight, targets, chunk_size=None, *, return_entropy=False):
    """log π(t | ·) = (h W^T)[t] - logsumexp(h W^T), without ever materialising the full logits.

    The fused LM head + log-prob: hidden (..., d) are the final hidden states at the positions
    whose next token is trained, weight (vocab, d) the LM head weight (no bias: Llama/Qwen heads
    have none), targets (...) the next tokens. Per chunk of tokens it computes the logits, their
    log-sum-exp and the target log-prob; backward recomputes the logits one tile (all tokens x a
    block of the vocabulary) at a time. So the memory is one fp32 tile (as many elements as a token_logprobs chunk) and its bf16 copy, plus, in
    backward, an fp32 accumulator of the hidden gradient's shape (tokens x d x 4 bytes).
    The result equals token_logprobs(hidden @ weight.T).
    Under FSDP the call must run while the head's weight is unsharded (inside the root module's
    forward, or with the head not sharded on its own).

    chunk_size: tokens per chunk; None picks CHUNK_ELEMENTS / vocab. Returns like token_logprobs.
    """
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"linear_token_logprobs: hidden shape {tuple(hidden.shape)} does not match "
                         f"targets shape {tuple(targets.shape)} + (d,)")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"linear_token_logprobs: weight shape {tuple(weight.shape)} "
                         f"is not (vocab, {hidden.shape[-1]})")
    logp, entropy = _ChunkedLinearTokenLogprobs.apply(
        hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1).long(),
        _rows_per_chunk(chunk_size, weight.shape[0]), return_entropy)
    if logp.shape != targets.shape:   # no view when the shapes agree: FSDP2 warns of a module returning one
        logp = logp.view(targets.shape)
    return (logp, entropy.view(targets.shape)) if return_entropy else logp


def completion_logprobs(model, batch: dict, temperature: float, fused: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(token) under logits / temperature at every trained position of a batch of token rows,
    (rows, width - 1) with 0 elsewhere, and the mask of those positions.

    batch: "input_ids" (rows, width), right-padded, and "loss_mask" (rows, width), 1 on the tokens
    trained (the completion's). `model`: a Hugging Face causal LM (its forward and
    get_output_embeddings). The LM head runs on the trained positions only, inside the model's
    forward (where FSDP2 has gathered its weight), so prompt and pad positions never become logits.
    `fused` (a head without bias): the head fused with the log-probs (linear_token_logprobs), so the
    trained positions' logits exist one chunk at a time, not as (tokens x vocab) in bf16: the memory
    a 152k vocabulary needs at 16k-token responses, paid in time (docs/PERFORMANCE.md). No attention mask: rows are right-padded, so
    under the causal mask no real token sees a pad, and without a padding mask SDPA can take its
    flash kernel (pads' outputs are never trained)."""
    mask = batch["loss_mask"][:, 1:]   # position i predicts token i + 1
    trained = mask.bool()
    targets = batch["input_ids"][:, 1:][trained]
    head = model.get_output_embeddings()
    hook = None
    if fused and getattr(head, "bias", None) is None:
        # The head fused with the log-probs (linear_token_logprobs): the (tokens x vocab) logits never
        # exist, in forward or backward. logits / T = (h / T) W^T.
        head.forward = lambda hidden: linear_token_logprobs(hidden[:, :-1][trained] / temperature, head.weight, targets)
    else:
        hook = head.register_forward_pre_hook(lambda module, args: (args[0][:, :-1][trained],))
    try:
        out = model(input_ids=batch["input_ids"], use_cache=False).logits
    finally:
        head.__dict__.pop("forward", None)
        if hook is not None:
            hook.remove()
    logp = torch.zeros(trained.shape, dtype=torch.float32, device=out.device)
    logp[trained] = out if out.dim() == 1 else token_logprobs(out / temperature, targets)
    return logp, mask


def loss_denominator(loss_mask, aggregation="dr_grpo", max_tokens=None) -> torch.Tensor:
    """This micro-batch's share of Z, the normaliser of `policy_loss`.

    dr_grpo: sequences x max_tokens; token_mean: masked tokens; seq_mean: sequences. Sum it over
    the micro-batches of an optimizer step and all-reduce (sum) it over ranks, then pass the result
    as policy_loss(total=...): each micro-batch's loss is then its exact share of the global loss
    and the summed gradient does not depend on how the batch was split.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    n_seq = loss_mask.shape[0]
    if aggregation == "dr_grpo":
        if max_tokens is None:
            raise ValueError("aggregation='dr_grpo' needs max_tokens (the generation budget, a constant) or total=")
        return torch.tensor(float(n_seq * max_tokens), device=loss_mask.device)
    if aggregation == "token_mean":
        return loss_mask.bool().sum().to(torch.float32)
    return torch.tensor(float(n_seq), device=loss_mask.device)


def policy_loss(logprobs, old_logprobs, advantages, loss_mask, *, clip_low=0.2, clip_high=0.28,
                aggregation="dr_grpo", max_tokens=None, kl_coef=0.0, ref_logprobs=None, total=None,
                entropy=None):
    """The clipped surrogate loss -J(θ) of the module docstring, and training metrics.

    Per token:  l_it = -min(ρ_it A_i, clip(ρ_it, 1 - clip_low, 1 + clip_high) A_i) + β KL3_it,
                ρ_it = exp(logp_it - old_it),  KL3_it = exp(ref_it - logp_it) - (ref_it - logp_it) - 1.
    Aggregated: dr_grpo  L = Σ_i Σ_t m_it l_it / (G · max_tokens)          (Dr. GRPO)
                token_mean L = Σ_i Σ_t m_it l_it / Σ_i Σ_t m_it            (DAPO)
                seq_mean L = Σ_i (Σ_t m_it l_it / Σ_t m_it) / G            (GRPO)
    A sequence with no masked token adds 0 to seq_mean's numerator and still counts in G.
    total: Z for the whole optimizer step (see loss_denominator); without it Z is this call's own,
    which is right only when the whole step is this one call. With total, sum the gradients of
    every micro-batch and rank; wrappers that average over ranks (DDP, FSDP2 by default) divide by
    the world size, so multiply the loss by it or set their divide factor to 1.

    logprobs: (B, T) fp32 with grad; old_logprobs, ref_logprobs: (B, T), no grad needed;
    advantages: (B,) per sequence or (B, T) per token; loss_mask: (B, T), True where a sampled
    token is trained (the rollout's mask, not one derived from a pad id); entropy: optional (B, T)
    from token_logprobs(return_entropy=True), only reported.

    Metrics (floats, means over masked tokens of this call): clip_frac_low (ρ < 1 - clip_low with
    A < 0: the gradient is cut), clip_frac_high (ρ > 1 + clip_high with A > 0), approx_kl_old (k3
    estimate of KL(π_old || π_θ), mean of (ρ - 1) - log ρ), ratio_mean, kl_ref (when ref_logprobs is
    given), entropy (when given), tokens (masked tokens counted) and loss.
    """
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {aggregation!r}")
    if logprobs.shape != old_logprobs.shape or logprobs.shape != loss_mask.shape or logprobs.dim() != 2:
        raise ValueError(f"policy_loss: logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and "
                         f"loss_mask {tuple(loss_mask.shape)} must share one (batch, tokens) shape")
    if kl_coef > 0 and ref_logprobs is None:
        raise ValueError("policy_loss: kl_coef > 0 needs ref_logprobs")
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"policy_loss: clip_low and clip_high must be >= 0, got {clip_low}, {clip_high}")
    if advantages.shape not in (logprobs.shape[:1], logprobs.shape):
        raise ValueError(f"policy_loss: advantages shape {tuple(advantages.shape)} is neither (batch,) = "
                         f"{tuple(logprobs.shape[:1])} nor (batch, tokens) = {tuple(logprobs.shape)}")
    mask = loss_mask.bool()
    adv = advantages.to(torch.float32)
    if adv.dim() == 1:
        adv = adv.unsqueeze(1)
    # Positions outside the mask may hold anything (padding: inf, NaN). Replace them before any
    # math: a `where` applied only at the end keeps NaN out of the loss but not out of backward
    # (0 * NaN), whereas `where` on the inputs hands those positions an exact zero gradient.
    zero = torch.zeros((), dtype=torch.float32, device=logprobs.device)
    logprobs = torch.where(mask, logprobs.float(), zero)
    log_ratio = logprobs - torch.where(mask, old_logprobs.detach().float(), zero)
    ratio = torch.exp(log_ratio)
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv)
    token_loss = -surrogate
    kl_ref = None
    if ref_logprobs is not None:
        ref_minus_logp = torch.where(mask, ref_logprobs.detach().float(), zero) - logprobs
        kl_ref = torch.exp(ref_minus_logp) - ref_minus_logp - 1.0
        if kl_coef > 0:
            token_loss = token_loss + kl_coef * kl_ref
    token_loss = torch.where(mask, token_loss, zero)
    if aggregation == "seq_mean":
        numerator = (token_loss.sum(1) / mask.sum(1).clamp(min=1)).sum()
    else:
        numerator = token_loss.sum()
    if total is None:
        total = loss_denominator(mask, aggregation, max_tokens)
    if float(total) > 0:
        loss = numerator / total
    elif bool(mask.any()):
        raise ValueError(f"policy_loss: total={float(total)} but this batch has {int(mask.sum())} masked tokens")
    else:
        loss = numerator * 0.0  # nothing to train anywhere: a zero loss (and zero gradient), not 0/0

    with torch.no_grad():
        n_tokens = int(mask.sum())
        denom = max(n_tokens, 1)

        def masked_mean(x):
            return float(torch.where(mask, x.float(), zero).sum()) / denom

        metrics = {
            "loss": float(loss),
            "tokens": n_tokens,
            "clip_frac_low": masked_mean(((ratio < 1.0 - clip_low) & (adv < 0)).float()),
            "clip_frac_high": masked_mean(((ratio > 1.0 + clip_high) & (adv > 0)).float()),
            "approx_kl_old": masked_mean(ratio - 1.0 - log_ratio),
            "ratio_mean": masked_mean(ratio),
        }
        if kl_ref is not None:
            metrics["kl_ref"] = masked_mean(kl_ref)
        if entropy is not None:
            metrics["entropy"] = masked_mean(entropy)
    return loss, metrics
