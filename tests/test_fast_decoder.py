"""Tests for fast_decoder.py: the decoder against transformers generate (engines.HFEngine with
fast=False) on a tiny random model, its sampler against the distribution written out, its
grouped-query attention against attention with repeated heads, and its compiled parts against
their eager forms. GPU versions (CUDA graphs) skip cleanly without CUDA. HFEngine's contract
through this decoder is tested in tests/test_engines.py."""
import pytest
import torch

import engines
import fast_decoder

pytest.importorskip("transformers")
from transformers import ByT5Tokenizer  # noqa: E402
from test_engines import EOS, byte_id, naive_top_p, tiny_model  # noqa: E402

PROMPTS = ("a longer prompt than x", "x", "mid size", "x")


@pytest.fixture(scope="module")
def tokenizer():
    return ByT5Tokenizer()


def decoder_for(model, tokenizer, **settings) -> fast_decoder.FastDecoder:
    """A FastDecoder sampling from engines' distribution, as HFEngine builds it."""
    return fast_decoder.FastDecoder(model, tokenizer, eos_ids={EOS}, pad_id=tokenizer.pad_token_id,
                                    distribution=engines.sampling_scores, **settings)


def assert_equal_to_generate(got, want, atol=1e-4):
    """Decoded rows against generate's Completions: the same ids, cuts and log-probs."""
    for want_group, got_group in zip(want, got):
        assert len(got_group) == len(want_group)
        for w, g in zip(want_group, got_group):
            assert (g.token_ids, g.stopped) == (w.token_ids, w.finish_reason == "stop")
            assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=atol)


def test_greedy_equals_plain_generate(tokenizer):
    """Greedy: the fast decoder (shared prefill, static cache grown while decoding, rows
    bucketed by prompt length, a prompt's copies split across batches) gives generate's
    tokens, cuts and log-probs."""
    model = tiny_model(seed=5, eos_logit=0.15)   # greedy rows end at different steps, or not at all
    plain = engines.HFEngine(model, tokenizer, fast=False)
    fast = decoder_for(model, tokenizer, check_every=5, initial_cache_tokens=3)   # grows 3 -> 6 -> 12 -> 20
    prompts = [plain.encode_prompt(t) for t in PROMPTS]
    want = plain.generate(prompts, n=2, max_new_tokens=20, temperature=0.0)
    got = fast.generate(prompts, n=2, max_new_tokens=20, temperature=0.0, max_batch_rows=3)
    assert_equal_to_generate(got, want)
    assert {c.finish_reason for g in want for c in g} == {"stop", "length"}, "pick eos_logit so both occur"


def test_samples_of_one_prompt_differ(tokenizer):
    fast = decoder_for(tiny_model(seed=4), tokenizer)
    torch.manual_seed(0)
    group = fast.generate([engines.render_prompt(tokenizer, "same prompt")], n=6, max_new_tokens=12)[0]
    assert len({tuple(row.token_ids) for row in group}) == 6


def test_samples_from_the_distribution_it_is_given(tokenizer):
    """The distribution is the caller's: one that leaves a single token possible gives that
    token at every step, with log-prob 0, whatever the model prefers."""
    only = byte_id("q")

    def one_token(logits, temperature, top_p):
        return torch.full(logits.shape, float("-inf")).index_fill(-1, torch.tensor([only]), 0.0)

    fast = fast_decoder.FastDecoder(tiny_model(seed=4, eos_logit=5.0), tokenizer, eos_ids={EOS}, pad_id=0,
                                    distribution=one_token)
    rows = fast.generate([engines.render_prompt(tokenizer, t) for t in ("a", "bc")], n=2, max_new_tokens=9,
                         temperature=1.0)
    for row in (r for group in rows for r in group):
        assert row.token_ids == [only] * 9 and row.logprobs == [0.0] * 9 and not row.stopped


@pytest.mark.slow
def test_compiled_decode_step_gives_plain_generates_tokens_across_batch_shapes(tokenizer):
    """compile_decode: the decode step, its sampling and the prefill's norms and MLPs through
    torch.compile (dynamic shapes) give generate's greedy tokens, cuts and log-probs, over
    batches of 3 and 2 rows, prefills of one and of two distinct prompts, and a cache that
    grows 3 -> 6 -> 12 -> 20 (shapes one compile of each must serve)."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()   # so the compiles below are counted even if another test compiled first
    model = tiny_model(seed=5, eos_logit=0.15)
    plain = engines.HFEngine(model, tokenizer, fast=False)
    compiled = decoder_for(model, tokenizer, check_every=5, initial_cache_tokens=3, compile_decode=True)
    prompts = [plain.encode_prompt(t) for t in PROMPTS]
    want = plain.generate(prompts, n=2, max_new_tokens=20, temperature=0.0)
    # inside the stance train.py rolls out in (it keeps its per-layer training compile off the
    # decoding shapes): a decoder asked to compile its step still does
    with torch.compiler.set_stance("force_eager"):
        got = compiled.generate(prompts, n=2, max_new_tokens=20, temperature=0.0, max_batch_rows=3)
    assert_equal_to_generate(got, want)
    assert {c.finish_reason for g in want for c in g} == {"stop", "length"}
    # then more shapes: other widths, 3-row batches, sampling at T=1 with a nucleus
    other = [plain.encode_prompt(t) for t in ("another prompt, longer than the first of them", "yz")]
    with torch.compiler.set_stance("force_eager"):
        compiled.generate(other, n=3, max_new_tokens=12, temperature=0.0, max_batch_rows=3)
        compiled.generate(other + prompts, n=1, max_new_tokens=7, temperature=1.0, top_p=0.9, max_batch_rows=3)
    # a handful of compiles over three calls of different shapes, not one per call (that would
    # be a compile per generate call in training, and past torch's recompile limit a silent
    # fall back to eager): the step, the sampling (greedy; T=1 and top-p), the norm and MLP
    # classes and the rotary embedding, with the prefill's few specializations (torch
    # specializes a size of 1, and sizes equal to another when first seen)
    assert 6 <= counters["frames"]["ok"] <= 12, dict(counters["frames"])
    # and the modules' own forwards and the modeling module's rotary function are back
    assert not any("forward" in m.__dict__ for m in fast_decoder.norms_and_mlps(model))
    import transformers.models.llama.modeling_llama as modeling
    assert modeling.apply_rotary_pos_emb.__module__ == modeling.__name__


@pytest.mark.slow
def test_compiled_pick_token_equals_pick_token():
    """The fused sampling the compiled decoder uses picks the same tokens from the same noise,
    with the same log-probs, as pick_token eager (nucleus, full distribution, greedy)."""
    torch.manual_seed(0)
    logits = torch.randn(6, 50) * 3
    noise = torch.empty(6, 50).exponential_(1.0)
    compiled = torch.compile(fast_decoder.pick_token, dynamic=True)
    for temperature, top_p in ((0.7, 0.8), (1.0, 1.0), (0.0, 1.0)):
        draws = noise if temperature > 0 else None
        want_token, want_logprob = fast_decoder.pick_token(logits, draws, temperature, top_p, engines.sampling_scores)
        got_token, got_logprob = compiled(logits, draws, temperature, top_p, engines.sampling_scores)
        assert torch.equal(got_token, want_token), (temperature, top_p)
        assert torch.allclose(got_logprob, want_logprob, atol=1e-6), (temperature, top_p)


@pytest.mark.parametrize("q_len", [1, 5])
def test_grouped_query_attention_equals_attention_with_repeated_heads(q_len):
    torch.manual_seed(0)
    batch, q_heads, kv_heads, kv_len, dim = 3, 6, 2, 9, 4
    query = torch.randn(batch, q_heads, q_len, dim, dtype=torch.float64)
    key, value = (torch.randn(batch, kv_heads, kv_len, dim, dtype=torch.float64) for _ in range(2))
    allowed = torch.rand(batch, 1, q_len, kv_len) > 0.3
    allowed[..., 0] = True
    bias = torch.zeros(allowed.shape, dtype=torch.float64).masked_fill(~allowed, torch.finfo(torch.float64).min)
    got, _ = fast_decoder.grouped_query_attention(None, query, key, value, bias, scaling=0.5)
    # Naive: every query head h against KV head h // (q_heads // kv_heads), softmax written out.
    heads = torch.arange(q_heads) // (q_heads // kv_heads)
    scores = query @ key[:, heads].transpose(-1, -2) * 0.5 + bias
    want = (scores.softmax(-1) @ value[:, heads]).transpose(1, 2)
    assert got.shape == (batch, q_len, q_heads, dim)
    assert torch.allclose(got, want, atol=1e-10)


def test_sample_from_logits_draws_from_the_nucleus_distribution_it_reports():
    """The sampler against the distribution written out: 40,000 rows of the same logits;
    frequencies within 0.01 of softmax(top_p(logits / T)), nothing outside the nucleus, and
    each reported log-prob that distribution's."""
    torch.manual_seed(0)
    logits = torch.tensor([2.0, 1.5, 1.0, 0.2, -1.0, -3.0])
    temperature, top_p = 0.7, 0.8
    want = naive_top_p((logits / temperature)[None], top_p).softmax(-1)[0]
    token, logprob = fast_decoder.sample_from_logits(logits.expand(40_000, -1), temperature, top_p,
                                                     engines.sampling_scores)
    frequencies = torch.bincount(token, minlength=len(logits)).double() / len(token)
    assert torch.allclose(frequencies, want.double(), atol=0.01)
    assert bool((want[token] > 0).all())
    assert torch.allclose(logprob, want.log()[token], atol=1e-5)
    greedy, greedy_logprob = fast_decoder.sample_from_logits(logits[None], 0.0, 1.0, engines.sampling_scores)
    assert int(greedy) == 0 and torch.allclose(greedy_logprob, logits.log_softmax(-1)[:1])


# ------------------------------------------------------------------------- CUDA graphs


@pytest.mark.gpu
def test_sampling_captured_in_a_cuda_graph_draws_afresh_on_every_replay():
    """The decoder samples inside its captured step: every replay must draw new noise from the
    same distribution (torch's CUDA generator advances by the graph's draws on each replay),
    not repeat the draws of the capture."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.2, -1.0, -3.0], device="cuda").expand(4_000, -1).contiguous()
    temperature, top_p = 0.7, 0.8
    want = naive_top_p((logits[:1].cpu() / temperature), top_p).softmax(-1)[0]
    fast_decoder.sample_from_logits(logits, temperature, top_p, engines.sampling_scores)   # warm-up, off the graph
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        token, logprob = fast_decoder.sample_from_logits(logits, temperature, top_p, engines.sampling_scores)
    draws = []
    for _ in range(10):
        graph.replay()
        draws.append(token.clone())
    draws = torch.stack(draws).cpu()
    assert len({tuple(d.tolist()) for d in draws}) == 10
    frequencies = torch.bincount(draws.flatten(), minlength=6).double() / draws.numel()
    assert torch.allclose(frequencies, want.double(), atol=0.01)
    assert torch.allclose(logprob.cpu(), want.log()[draws[-1]], atol=1e-5)


@pytest.mark.gpu
def test_cuda_graph_decode_equals_eager_decode_and_plain_generate(tokenizer):
    """fp32 greedy on CUDA: the graph-replayed step, compiled or not, gives the eager step's
    tokens and log-probs, and the same tokens as with the model's own attention and as generate."""
    model = tiny_model(seed=5, eos_logit=0.15).cuda()
    prompts = [engines.render_prompt(tokenizer, t) for t in PROMPTS[:3]]
    results = {}
    # (the graph is captured again each time the cache grows: 8 -> 16 -> 32 -> 40 new positions)
    for name, settings in {"graph": dict(initial_cache_tokens=8),
                           "compiled_graph": dict(initial_cache_tokens=8, compile_decode=True),
                           "eager": dict(cuda_graph=False, initial_cache_tokens=8),
                           "own_attention": dict(grouped_attention=False)}.items():
        fast = decoder_for(model, tokenizer, **settings)
        results[name] = [row for g in fast.generate(prompts, n=2, max_new_tokens=40, temperature=0.0, max_batch_rows=4)
                         for row in g]
    plain = engines.HFEngine(model, tokenizer, fast=False, max_batch_rows=4)
    results["plain"] = [c for g in plain.generate(prompts, n=2, max_new_tokens=40, temperature=0.0) for c in g]
    for g, c, e, o, p in zip(results["graph"], results["compiled_graph"], results["eager"],
                             results["own_attention"], results["plain"]):
        assert g.token_ids == c.token_ids == e.token_ids == o.token_ids == p.token_ids
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(e.logprobs), atol=1e-5)
        # inductor's fused kernels sum in another order: fp32 rounding apart, no more
        assert torch.allclose(torch.tensor(c.logprobs), torch.tensor(e.logprobs), atol=1e-4)
