"""The fast decoder: sampling many completions from a Hugging Face causal LM on static buffers.

A call decodes rows (each prompt's n samples) in batches of at most `max_batch_rows`, ordered by
prompt length. A batch of W-wide (left-padded) prompts runs in three parts:

- Shared prefill: each distinct prompt goes through the model once (mask: k <= q and k one of the
  prompt's tokens, positions over its own tokens); its keys and values are copied to the cache
  rows of its n samples.
- Static KV cache: per layer, (rows, kv_heads, W + capacity, head_dim), written in place; the
  capacity starts at `initial_cache_tokens` and doubles when full.
- Decoding step: one forward of the batch on the tokens just sampled, then sampling, EOS
  detection and each row's finish step on device buffers; on CUDA captured once in a CUDA graph
  and replayed. Every `check_every` steps the host checks stop strings and whether all finished.

Sampling: `distribution(logits, temperature, top_p)` gives the scores whose softmax p is sampled
(engines.sampling_scores); token = argmax_i p_i / E_i with E_i ~ Exp(1) draws from p exactly,
with no host sync, and its log p is recorded. Temperature 0 is greedy.

Grouped-query heads stay grouped (K and V read once per KV head): a decoding step's attention is
decode_attention's Triton kernel, a prefill's SDPA with `enable_gqa`. `compile_decode` runs the
step, the sampling (`pick_token`) and the prefill's token-wise parts through torch.compile with
dynamic shapes (a handful of compiles per process). On the CPU the same code runs without the
graph. What each part buys: docs/PERFORMANCE.md, "Generation tokens per second".
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch

import decode_attention

# A distribution to sample from: (logits, temperature, top_p) -> the scores whose softmax it is.
Distribution = Callable[[torch.Tensor, float, float], torch.Tensor]


@dataclass
class Decoded:
    """One sampled row: the ids (the EOS that ended it included), the log-prob of each under
    the distribution sampled from, and whether it stopped (an EOS or a stop string) rather
    than ran to max_new_tokens."""
    token_ids: list[int]
    logprobs: list[float]
    stopped: bool


class FastDecoder:
    """The fast decoder of one model (see the module docstring). `eos_ids` end a row, `pad_id`
    left-pads prompts, `tokenizer` decodes stop strings; `cuda_graph` False keeps the step
    eager on CUDA, `grouped_attention` False keeps the model's own attention, `decode_kernel`
    False keeps decoding steps off decode_attention's kernel. The compiles (`compile_decode`)
    are made on first use and shared by every batch of this decoder. The caller puts the model
    in eval mode (and, under FSDP2, unshards it once: engines.unsharded_for_generation)."""

    def __init__(self, model, tokenizer, *, eos_ids: Iterable[int], pad_id: int,
                 distribution: Distribution, cuda_graph: bool = True, grouped_attention: bool = True,
                 decode_kernel: bool = True, check_every: int = 16, initial_cache_tokens: int = 1024,
                 compile_decode: bool = False, prefill_chunk_tokens: int = 1 << 16):
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = set(eos_ids)
        self.pad_id = pad_id
        self.distribution = distribution
        self.cuda_graph = cuda_graph
        self.grouped_attention = grouped_attention   # grouped_query_attention
        self.decode_kernel = decode_kernel   # ... with decode_attention's kernel for decoding steps
        self.check_every = check_every     # decoding steps between host checks
        self.initial_cache_tokens = initial_cache_tokens   # new positions first allocated
        # prompt tokens per prefill forward (bounds its activations, and keeps the compiled
        # kernels' element counts under 2^31, where they index in 32 bits)
        self.prefill_chunk_tokens = prefill_chunk_tokens
        # the decode step through torch.compile, shared by every batch (dynamo keys its cache
        # on the code; shapes are dynamic)
        self.compiled_step = torch.compile(_DecodingBatch._step, dynamic=True) if compile_decode else None
        # ... its sampling's passes over the logits, fused (what sample_from_logits calls)
        self.pick = (functools.partial(run_compiled, torch.compile(pick_token, dynamic=True))
                     if compile_decode else pick_token)
        # ... and the prefill's norms and MLPs (compiled_token_forwards; one compile per class)
        # and rotary embedding (compiled_rotary_embedding; one per modeling module, made on use)
        self.compiled_module = torch.compile(module_forward, dynamic=True) if compile_decode else None
        self.compiled_rotaries: dict[str, Callable] = {}

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], *, n: int = 1, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, stop: Sequence[str] = (), max_batch_rows: int = 64,
                 on_batch: Callable[[int, int], None] | None = None) -> list[list[Decoded]]:
        """n samples of each prompt, in prompt order. Rows are ordered by prompt length and
        decoded max_batch_rows at a time; a prompt's samples share its prefill. `on_batch(rows,
        tokens)` hears of each decoded batch (a progress bar)."""
        by_length = sorted(range(len(prompts)), key=lambda p: len(prompts[p]))
        rows = [p for p in by_length for _ in range(n)]
        out: list[list[Decoded]] = [[] for _ in prompts]
        for start in range(0, len(rows), max_batch_rows):
            batch = rows[start:start + max_batch_rows]
            decoding = _DecodingBatch(self, prompts, batch, max_new_tokens, temperature, top_p, stop)
            attention = (grouped_attention_for(self.model, kernel=self.decode_kernel) if self.grouped_attention
                         else contextlib.nullcontext())
            with attention:
                token_rows, logprob_rows, finish = decoding.decode()
            for p, ids, logprobs, finished in zip(batch, token_rows, logprob_rows, finish):
                out[p].append(Decoded(ids, logprobs, finished >= 0))
            if on_batch is not None:
                on_batch(len(batch), sum(len(ids) for ids in token_rows))
        return out


class _DecodingBatch:
    """One batch of rows (each row a prompt index) decoded with the static cache, under a
    FastDecoder's settings. See the module docstring; `decode` returns (tokens, log-probs,
    finish lengths) on the host."""

    def __init__(self, decoder: FastDecoder, prompts: list[list[int]], row_prompts: list[int],
                 max_new_tokens: int, temperature: float, top_p: float, stop: Sequence[str]):
        self.decoder = decoder
        self.model = decoder.model
        self.device = self.model.get_input_embeddings().weight.device
        self.dtype = self.model.get_input_embeddings().weight.dtype
        self.prompts = prompts
        self.row_prompt_list = list(row_prompts)
        self.rows = len(row_prompts)
        self.width = max(len(prompts[p]) for p in set(row_prompts))
        self.max_new_tokens = max_new_tokens
        self.temperature, self.top_p = temperature, top_p
        self.stop = [s for s in stop if s]
        # A character is at most 4 tokens (byte-level vocabularies split UTF-8), so a stop
        # string completed by the last token lies within this many trailing tokens.
        self.tail_tokens = 4 * max((len(s) for s in self.stop), default=0) + 4
        self.eos_ids = torch.tensor(sorted(decoder.eos_ids), device=self.device)
        self.call = _forward_kwargs(self.model)
        # The cache starts at `initial_cache_tokens` new positions and doubles when full, so
        # a max_new_tokens far above what rows actually sample costs neither memory nor the
        # attention reads over never-written positions.
        self.cache = _StaticKVCache(self.rows, self.width + min(max_new_tokens, decoder.initial_cache_tokens))

    def _forward(self, cache: _StaticKVCache, input_ids, bias, position_ids) -> torch.Tensor:
        kwargs = {self.call["cache_name"]: cache}
        if self.call["wants_cache_position"]:
            kwargs["cache_position"] = cache.write_positions
        out = self.model(input_ids=input_ids, attention_mask=bias, position_ids=position_ids,
                         use_cache=True, logits_to_keep=1, **kwargs)
        return out.logits[:, -1]

    def _prefill(self) -> torch.Tensor:
        """Prefill every distinct prompt once (left-padded to the batch width) and copy its
        cache rows to each of its samples; return the last prompt position's logits per row."""
        distinct = sorted(set(self.row_prompt_list))
        # Prefill in sub-batches of at most prefill_chunk_tokens tokens, whose (rows x width x
        # width) mask stays near 2^27 entries.
        per_chunk = max(1, min((1 << 27) // (self.width * self.width),
                               self.decoder.prefill_chunk_tokens // self.width))
        logits_per_row = None
        for start in range(0, len(distinct), per_chunk):
            chunk = distinct[start:start + per_chunk]
            ids = torch.full((len(chunk), self.width), self.decoder.pad_id, dtype=torch.long)
            real = torch.zeros((len(chunk), self.width), dtype=torch.bool)
            for i, p in enumerate(chunk):
                ids[i, self.width - len(self.prompts[p]):] = torch.tensor(self.prompts[p])
                real[i, self.width - len(self.prompts[p]):] = True
            ids, real = ids.to(self.device), real.to(self.device)
            causal = torch.ones(self.width, self.width, dtype=torch.bool, device=self.device).tril()
            allowed = (causal[None] & real[:, None, :])[:, None]           # (chunk, 1, q, k)
            positions = (real.long().cumsum(1) - 1).clamp(min=0)
            prefill = _StaticKVCache(len(chunk), self.width)
            prefill.write_positions = torch.arange(self.width, device=self.device)
            logits = self._forward(prefill, ids, _attention_bias(allowed, self.dtype), positions)
            if not self.cache.keys:
                self.cache.allocate_like(prefill)
                logits_per_row = logits.new_empty(self.rows, logits.shape[-1])
            local = {p: i for i, p in enumerate(chunk)}
            targets = [r for r, p in enumerate(self.row_prompt_list) if p in local]
            sources = torch.tensor([local[self.row_prompt_list[r]] for r in targets], device=self.device)
            targets = torch.tensor(targets, device=self.device)
            self.cache.copy_prefix_rows(prefill, sources, targets)
            logits_per_row[targets] = logits[sources]
        return logits_per_row

    def _compiled_prefill(self) -> contextlib.ExitStack:
        """With the decoder's compile: the prefill's norms, MLPs and rotary embedding fused (its
        elementwise work)."""
        stack = contextlib.ExitStack()
        if self.decoder.compiled_module is not None:
            stack.enter_context(compiled_token_forwards(norms_and_mlps(self.model), self.decoder.compiled_module))
            stack.enter_context(compiled_rotary_embedding(self.model, self.decoder.compiled_rotaries))
        return stack

    def decode(self) -> tuple[list[list[int]], list[list[float]], list[int]]:
        lengths = [len(self.prompts[p]) for p in self.row_prompt_list]
        steps = self.max_new_tokens
        if steps == 0:
            return [[] for _ in lengths], [[] for _ in lengths], [-1] * self.rows
        with self._compiled_prefill():   # swapped in once for all the prefill's chunks
            logits = self._prefill()
        # The step's state, on the device and updated in place, so a captured graph sees it:
        # what was sampled, each row's finish step (-1: not yet), the step being sampled.
        self.tokens = torch.zeros(self.rows, steps, dtype=torch.long, device=self.device)
        self.logprobs = torch.zeros(self.rows, steps, dtype=torch.float32, device=self.device)
        self.finish = torch.full((self.rows,), -1, dtype=torch.long, device=self.device)
        self.step_index = torch.zeros(1, dtype=torch.long, device=self.device)
        prompt_real = torch.zeros(self.rows, self.cache.length, dtype=torch.bool)
        for r, n in enumerate(lengths):
            prompt_real[r, self.width - n:self.width] = True
        self.bias = _attention_bias(prompt_real.to(self.device)[:, None, None, :], self.dtype)
        self.next_ids = torch.zeros(self.rows, 1, dtype=torch.long, device=self.device)
        self.positions = torch.tensor(lengths, device=self.device)[:, None]
        self.cache.write_positions = torch.full((1,), self.width, dtype=torch.long, device=self.device)
        self.cache.write_positions_host = self.width     # the same, known without a sync
        self._sample(logits)                             # step 0, from the prefill's last position
        step_fn = None
        checked, done = 0, 1
        while True:
            if done % self.decoder.check_every == 0 or done == steps:
                self._check_stops(checked, done)
                checked = done
                if bool((self.finish >= 0).all()):
                    break
            if done == steps:
                break
            if self.cache.write_positions_host >= self.cache.length:
                self._grow(min(self.width + steps, self.width + 2 * (self.cache.length - self.width)))
                step_fn = None                           # a graph reads the buffers it was captured on
            if step_fn is None:
                step_fn = self._captured_step()
            step_fn()
            self.cache.write_positions_host += 1
            done += 1
        finish_host = self.finish.tolist()
        cut = [f if f >= 0 else done for f in finish_host]
        token_rows, logprob_rows = self.tokens[:, :done].tolist(), self.logprobs[:, :done].tolist()
        return ([row[:n] for row, n in zip(token_rows, cut)],
                [row[:n] for row, n in zip(logprob_rows, cut)], finish_host)

    def _grow(self, length: int) -> None:
        """A longer cache and mask; the new positions hidden until written."""
        old_length = self.cache.length
        self.cache.grow(length)
        hidden = torch.full((self.rows, 1, 1, length - old_length), MASKED_SCORE, dtype=self.bias.dtype,
                            device=self.device)
        self.bias = torch.cat([self.bias, hidden], dim=3)

    def _sample(self, logits: torch.Tensor) -> None:
        """Sample step `step_index` from `logits` and record it: token, log-prob, the finish
        step of rows that sampled an EOS, the next step's input ids. On the device, no sync."""
        token, logprob = sample_from_logits(logits, self.temperature, self.top_p, self.decoder.distribution,
                                            self.decoder.pick)
        self.tokens.index_copy_(1, self.step_index, token[:, None])
        self.logprobs.index_copy_(1, self.step_index, logprob[:, None])
        ended = (token[:, None] == self.eos_ids).any(dim=1) & (self.finish < 0)
        self.finish.copy_(torch.where(ended, self.step_index + 1, self.finish))
        self.next_ids.copy_(token[:, None])
        self.step_index += 1

    def _step(self) -> torch.Tensor:
        """The model's part of a decoding step: unmask the position being written, run the
        model on the last sampled tokens, return the next logits."""
        self.bias.index_fill_(3, self.cache.write_positions, 0.0)
        return self._forward(self.cache, self.next_ids, self.bias, self.positions)

    def _decode_step(self) -> None:
        """One decoding step on the static buffers: the forward (through torch.compile when the
        decoder asks for it, `compile_decode`; run_compiled), then the next sample."""
        compiled = self.decoder.compiled_step
        logits = self._step() if compiled is None else run_compiled(compiled, self)
        self.cache.write_positions += 1
        self.positions += 1
        self._sample(logits)

    def _captured_step(self) -> Callable[[], None]:
        """The decode step, sampling included, as a CUDA graph replay (on CUDA with
        `cuda_graph`), else eager. Each replay draws fresh random numbers: torch's CUDA
        generator advances its offset by the graph's draws on every replay."""
        if self.device.type != "cuda" or not self.decoder.cuda_graph:
            return self._decode_step
        # Warm up on a side stream (as torch.cuda.graphs asks; with compile_decode this call
        # compiles), then put back the state that step advanced: the first replay writes the
        # same cache slot, mask column and sample slot again, from the same inputs.
        advanced = (self.cache.write_positions, self.positions, self.next_ids, self.finish, self.step_index)
        saved = [t.clone() for t in advanced]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._decode_step()
        torch.cuda.current_stream().wait_stream(side)
        for t, before in zip(advanced, saved):
            t.copy_(before)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                self._decode_step()
        except RuntimeError as error:  # a model whose forward cannot be captured: run eager
            warnings.warn(f"fast_decoder: CUDA graph capture failed, decoding eagerly: {error}")
            torch.cuda.synchronize()
            return self._decode_step
        return graph.replay

    def _check_stops(self, checked: int, done: int) -> None:
        """The host check: stop strings completed in steps (checked, done], each row cut at the
        first step where an EOS was sampled or a stop string completed (as _FinishRecorder).
        A row already cut at or before `checked` has nothing left to scan."""
        if not self.stop:
            return
        finish_host = self.finish.tolist()
        offset = max(0, checked + 1 - self.tail_tokens)
        recent = self.tokens[:, offset:done].tolist()
        tokenizer = self.decoder.tokenizer
        for r in range(self.rows):
            last = finish_host[r] if finish_host[r] >= 0 else done
            for s in range(checked + 1, last + 1):
                tail = tokenizer.decode(recent[r][max(0, s - self.tail_tokens) - offset:s - offset],
                                        skip_special_tokens=False)
                if any(stop in tail for stop in self.stop):
                    finish_host[r] = s
                    break
        self.finish.copy_(torch.tensor(finish_host))



class _StaticKVCache:
    """A preallocated KV cache: per layer keys and values of shape (rows, kv_heads, length,
    head_dim), written in place at `write_positions` (a device tensor the decoder sets before
    each forward). The attention layers call `update` (the transformers Cache method) and
    get the whole buffer back; the 4-D attention mask the decoder passes hides what is not
    written yet. Written here rather than taken from transformers' StaticCache because that
    one finds its write position from a `cache_position` argument that transformers 5.2x
    removed, and cannot have its rows filled from another cache (the shared prefill)."""

    def __init__(self, rows: int, length: int):
        self.rows = rows
        self.length = length
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.write_positions: torch.Tensor | None = None
        self.write_positions_host = 0     # the first write position, on the host (decoding)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_idx == len(self.keys):  # first write of this layer: allocate it
            rows, heads, _, dim = key_states.shape
            self.keys.append(key_states.new_zeros(rows, heads, self.length, dim))
            self.values.append(value_states.new_zeros(rows, heads, self.length, dim))
        self.keys[layer_idx].index_copy_(2, self.write_positions, key_states)
        self.values[layer_idx].index_copy_(2, self.write_positions, value_states)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0  # positions are always passed explicitly; nothing reads this

    def allocate_like(self, other: "_StaticKVCache") -> None:
        """Allocate every layer with `other`'s head count, head size and dtype."""
        for keys in other.keys:
            shape = (self.rows, keys.shape[1], self.length, keys.shape[3])
            self.keys.append(keys.new_zeros(shape))
            self.values.append(keys.new_zeros(shape))

    def grow(self, length: int) -> None:
        """Reallocate every layer at `length` positions, the written ones copied over."""
        for layer in range(len(self.keys)):
            for buffers in (self.keys, self.values):
                old = buffers[layer]
                buffers[layer] = old.new_zeros(old.shape[0], old.shape[1], length, old.shape[3])
                buffers[layer][:, :, :self.length] = old
        self.length = length

    def copy_prefix_rows(self, source: "_StaticKVCache", source_rows: torch.Tensor,
                         target_rows: torch.Tensor) -> None:
        """Copy source rows (their first source.length positions) into target rows: one
        prefilled prompt shared by its n samples."""
        width = source.length
        for layer in range(len(self.keys)):
            self.keys[layer][target_rows, :, :width] = source.keys[layer][source_rows]
            self.values[layer][target_rows, :, :width] = source.values[layer][source_rows]



# ---------------------------------------------------------------------------------------
# Sampling


def sample_from_logits(logits: torch.Tensor, temperature: float, top_p: float, distribution: Distribution,
                       pick: Callable | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(token, log-prob of that token) per row, sampled on the device with no host sync, from
    softmax(distribution(logits, temperature, top_p)). Sampling is argmax(p / E) with E ~ Exp(1)
    per entry, which draws from p exactly. The noise is drawn here, eagerly (torch's generator,
    which a CUDA graph replays afresh), and `pick` (pick_token, or a decoder's compiled
    pick_token) does the rest."""
    noise = (torch.empty(logits.shape, dtype=torch.float32, device=logits.device).exponential_(1.0)
             if temperature > 0 else None)
    return (pick or pick_token)(logits, noise, temperature, top_p, distribution)


def pick_token(logits: torch.Tensor, noise: torch.Tensor | None, temperature: float, top_p: float,
               distribution: Distribution) -> tuple[torch.Tensor, torch.Tensor]:
    """sample_from_logits given its Exp(1) noise (None when greedy): a pure function of its
    inputs, so torch.compile can fuse its passes over the (rows, vocab) logits into a few.
    Greedy (temperature 0) picks the argmax of the distribution's scores."""
    scores = distribution(logits, temperature, top_p)
    log_probs = scores.log_softmax(dim=-1)
    if temperature > 0:
        # Clamped above 0: a draw of exactly 0 would make 0 / 0 = NaN on a token outside the
        # nucleus, and argmax picks NaN.
        token = (log_probs.exp() / noise.clamp(min=torch.finfo(torch.float32).tiny)).argmax(dim=-1)
    else:
        token = scores.argmax(dim=-1)
    return token, log_probs.gather(1, token[:, None]).squeeze(1)


# ---------------------------------------------------------------------------------------
# Attention


GROUPED_ATTENTION = "kernel_rl_grouped_sdpa"


def grouped_query_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                            kernel: bool = True, **kwargs) -> tuple[torch.Tensor, None]:
    """Attention with grouped-query heads kept grouped: K and V are read once per KV head, never
    copied once per query head (transformers' sdpa copies them whenever a mask is given on
    CUDA, which multiplies a decoding step's largest memory read by the group). A transformers
    attention function (AttentionInterface): query (batch, q_heads, q_len, dim), key and value
    (batch, kv_heads, kv_len, dim), an additive 4-D mask; returns (batch, q_len, q_heads, dim).
    A decoding step (q_len 1) runs decode_attention's kernel (`kernel`, where Triton runs), or
    SDPA with the query heads that share a KV head as extra query rows of that head; a prefill
    runs SDPA with enable_gqa (faster there than either copy: docs/PERFORMANCE.md)."""
    batch, q_heads, q_len, dim = query.shape
    kv_heads = key.shape[1]
    mask = attention_mask[:, :, :, :key.shape[-2]].to(query.dtype)
    scale = dim ** -0.5 if scaling is None else scaling
    if q_len == 1 and kernel and decode_attention.available(query):
        return decode_attention.decode_attention(query, key, value, mask, scale), None
    if q_len == 1:
        # Query head h uses KV head h // group (transformers' repeat_kv), so splitting the head
        # axis into (kv_heads, group) makes the group the query rows of its KV head.
        grouped = query.reshape(batch, kv_heads, q_heads // kv_heads, dim)
        out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=mask, scale=scale)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scale,
                                                               enable_gqa=True)
    return out.reshape(batch, q_heads, q_len, dim).transpose(1, 2).contiguous(), None


@contextlib.contextmanager
def grouped_attention_for(model, kernel: bool = True):
    """Run `model` with grouped_query_attention (its decoding kernel if `kernel`) while inside,
    when that is a like-for-like swap: its attention is sdpa or eager and no layer has a
    sliding window (which the function ignores). Anything else keeps its own attention."""
    config = model.config
    swappable = (config._attn_implementation in ("sdpa", "eager")
                 and not any(getattr(m, "sliding_window", None) for m in model.modules()))
    if not swappable:
        yield
        return
    from transformers import AttentionInterface
    AttentionInterface.register(GROUPED_ATTENTION, functools.partial(grouped_query_attention, kernel=kernel))
    previous = config._attn_implementation
    config._attn_implementation = GROUPED_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = previous


# Added to the attention scores of hidden positions: finite in fp16, bf16 and fp32 alike (an
# FSDP2 model may cast the mask to its compute dtype; fp32's minimum would become -inf in
# bf16), and far enough below any real score that exp() of it is exactly 0.
MASKED_SCORE = torch.finfo(torch.float16).min


def _attention_bias(allowed: torch.Tensor, dtype) -> torch.Tensor:
    """An additive 4-D mask (0 where attended, MASKED_SCORE elsewhere): finite, so a query
    that may attend nothing (a left-pad position) gives no NaN."""
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return bias.masked_fill(~allowed, MASKED_SCORE)


# ---------------------------------------------------------------------------------------
# The model's forward and its compiled parts


def _forward_kwargs(model) -> dict:
    """The cache keyword of this transformers version (`cache` from 5.2x, `past_key_values`
    before); older versions also want `cache_position`, which our cache ignores."""
    parameters = inspect.signature(model.forward).parameters
    return {"cache_name": "cache" if "cache" in parameters else "past_key_values",
            "wants_cache_position": "cache_position" in parameters}


def run_compiled(compiled: Callable, *args, **kwargs):
    """Call a torch.compile'd function whatever the caller's compiler stance: train.py rolls
    out under "force_eager" to keep its per-layer training compile off the decoding shapes,
    which would otherwise turn the decoder's own compiles off too."""
    with torch.compiler.set_stance("default"):
        return compiled(*args, **kwargs)


def norms_and_mlps(model) -> list[torch.nn.Module]:
    """Each decoder layer's two norms and MLP, and the final norm (the Llama family's names):
    a prefill's elementwise work (float32 RMSNorm passes, SiLU x up) lives in these, and each
    maps every token's hidden state on its own, so a compile of each class serves every layer
    and prompt shape (compiled_token_forwards; torch adds one for a size of 1 and the like)."""
    decoder = model.get_decoder()
    names = ("input_layernorm", "post_attention_layernorm", "mlp")
    found = [getattr(layer, name) for layer in getattr(decoder, "layers", ()) for name in names
             if isinstance(getattr(layer, name, None), torch.nn.Module)]
    return found + ([decoder.norm] if isinstance(getattr(decoder, "norm", None), torch.nn.Module) else [])


def module_forward(module: torch.nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    """The forward of `module`'s class (what compiled_token_forwards compiles, once per class)."""
    return type(module).forward(module, hidden_states)


@contextlib.contextmanager
def compiled_token_forwards(modules: Sequence[torch.nn.Module], compiled: Callable):
    """While inside, each module runs through `compiled`, a torch.compile (dynamic shapes) of
    module_forward (run_compiled); hooks still run eagerly around it. The instance attribute
    that does this shadows the class's forward and is removed (or a previous one put back) on
    exit."""
    previous = [module.__dict__.get("forward") for module in modules]
    for module in modules:
        module.forward = functools.partial(run_compiled, compiled, module)
    try:
        yield
    finally:
        for module, before in zip(modules, previous):
            if before is None:
                del module.forward
            else:
                module.forward = before


@contextlib.contextmanager
def compiled_rotary_embedding(model, compiled: dict[str, Callable]):
    """While inside, the rotary embedding of `model`'s attention runs through torch.compile
    (dynamic shapes; run_compiled): in the Llama family it is `apply_rotary_pos_emb`, a
    function of the modeling module that the attention looks up by name, so it is swapped
    there and put back on exit. `compiled` keeps one compile per modeling module across
    calls. A model without that function is left as it is."""
    layers = getattr(model.get_decoder(), "layers", ())
    attention = getattr(layers[0], "self_attn", None) if len(layers) else None
    modeling = sys.modules.get(type(attention).__module__) if attention is not None else None
    original = getattr(modeling, "apply_rotary_pos_emb", None)
    if not callable(original):
        yield
        return
    if modeling.__name__ not in compiled:
        compiled[modeling.__name__] = torch.compile(original, dynamic=True)
    modeling.apply_rotary_pos_emb = functools.partial(run_compiled, compiled[modeling.__name__])
    try:
        yield
    finally:
        modeling.apply_rotary_pos_emb = original

