"""Engines: prompt token ids in, sampled completions out.

An engine is whatever the rollout samples from: the policy itself (HFEngine), a colocated
vLLM (VLLMEngine), a served or hosted model over HTTP (OpenAIEngine), the tasks' own
solutions (OracleEngine), or a policy with a seeded share of oracle answers mixed in
(OracleMixedEngine). All of them fit one small interface, `Engine`:

    generate(prompt_token_ids, *, n, max_new_tokens, temperature, top_p, stop)
        -> list[list[Completion]]          # n completions per prompt, in prompt order
    encode_prompt(text) -> list[int]        # one user message in the chat template, tokenised once
    count_tokens(text) -> int               # what summarize.build_prompt budgets with

The log-prob contract. A Completion's `token_ids` are exactly the ids sampled (the EOS that
ended it included, never re-tokenised), and `logprobs[i]` is log pi(token_ids[i] | prefix)
under the distribution actually sampled from:

    pi = softmax(top_p_filter(logits / temperature, top_p))     (temperature > 0)
    pi = softmax(logits)                                        (temperature 0: greedy)

so a fresh forward pass over prompt + completion, put through the same transform, gives the
same numbers (tests/test_engines.py checks every path against that naive form). Engines that
cannot report them (HTTP, oracle) give None; train.py computes its own old log-probs anyway.
A completion is cut right after the token that sampled an EOS or completed a stop string
("stop"), or at max_new_tokens ("length").

HFEngine has two decoders on the policy itself:
- the fast one (default on CUDA): each distinct prompt is prefilled once into a preallocated
  (static) KV cache and its rows copied to its n samples (the cache holds
  `initial_cache_tokens` new positions and doubles when full); each decoding step (one forward
  of the whole batch, then sampling, EOS detection and the per-row finish step, all on static
  buffers) is captured once in a CUDA graph and replayed, so a step costs the host one replay
  call; one host check every `check_every` steps decodes stop strings and asks whether every
  row has finished; the loop ends when every row has finished, and rows are
  batched by prompt length so short prompts do not carry long ones' padding. Attention
  keeps grouped-query heads grouped (`grouped_query_attention`: K and V read once, not
  copied per query head); a decoding step's attention is decode_attention's Triton kernel,
  which reads only the cache positions each row attends. With `compile_decode` the step is compiled by torch.compile first
  (dynamic shapes: one compile per process serves every batch size and cache length), which
  fuses each layer's ~20 small elementwise kernels (RMSNorm, rotary, SiLU x up, residual adds,
  casts), most of a decode step at batch 256 on the H200 (docs/PERFORMANCE.md); so are the
  sampling's passes over the logits (`pick_token`) and, in the prefill, the norms, MLPs and
  rotary embedding (`compiled_token_forwards`, `compiled_rotary_embedding`: the prefill's
  elementwise work, swapped in only while it runs); the first generate calls pay the compiles
  (a handful per process, whatever the shapes). On the CPU the same code runs without the graph (the tests use it).
- plain transformers `generate` (`fast=False`; the default on CPU): left-padded batches, our
  own temperature/top-p as the last logits processor, a stopping criterion that records
  each row's cut.
Under FSDP2 either one runs inside `unsharded_for_generation`: the model is all-gathered once
per generate call, not once per step.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import inspect
import json
import random
import re
import sys
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence

import torch

import decode_attention

# Used when a tokenizer has no chat template (e.g. ByT5Tokenizer in the tests).
PLAIN_CHAT_TEMPLATE = "User: {prompt}\nAssistant: "


@dataclass
class Completion:
    """One sampled response. `token_ids` are exactly the sampled ids (the EOS that ended it
    included); `logprobs[i]` is log p(token_ids[i]) under the engine's sampling distribution,
    or None when the engine does not report them; `finish_reason` is "stop" (EOS or a stop
    string) or "length" (cut at max_new_tokens)."""
    token_ids: list[int]
    logprobs: list[float] | None
    text: str
    finish_reason: str


class Engine(Protocol):
    """What the rollout needs of an engine (see the module docstring for the contract)."""

    def generate(self, prompt_token_ids: list[list[int]], *, n: int = 1, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0,
                 stop: Sequence[str] = ()) -> list[list[Completion]]: ...

    def encode_prompt(self, text: str) -> list[int]: ...

    def count_tokens(self, text: str) -> int: ...



# ---------------------------------------------------------------------------------------
# Prompts


def render_prompt_text(tokenizer, text: str) -> str:
    """One user message in the tokenizer's chat template, generation prompt added.
    Tokenizers without a template get PLAIN_CHAT_TEMPLATE."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return PLAIN_CHAT_TEMPLATE.format(prompt=text)


def render_prompt(tokenizer, text: str) -> list[int]:
    """`render_prompt_text`, tokenised once."""
    # The template already holds every special token the model expects.
    return list(tokenizer(render_prompt_text(tokenizer, text), add_special_tokens=False).input_ids)


def template_opens_thinking(tokenizer) -> bool:
    """Whether the chat template ends the prompt inside <think> (QwQ, Qwen3): then a
    completion starts in the middle of its reasoning (summarize.parse_response's thinking_open)."""
    return render_prompt_text(tokenizer, "x").rstrip().endswith("<think>")


def _eos_ids(tokenizer, model=None) -> set[int]:
    ids: set[int] = set()
    for source in (getattr(tokenizer, "eos_token_id", None),
                   getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif source is not None:
            ids.update(int(i) for i in source)
    return ids


# ---------------------------------------------------------------------------------------
# HF engine


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filtering: keep the smallest set of most likely tokens whose probability
    reaches top_p (the most likely token always kept); the rest get -inf."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


class _SamplingDistribution:
    """The last logits processor: temperature and top-p, applied by us rather than by
    transformers, so the distribution sampled from is exactly the one whose log-probs we
    keep (custom processors run before transformers' own warpers, which we switch off)."""

    def __init__(self, temperature: float, top_p: float):
        self.temperature = temperature
        self.top_p = top_p
        self.log_probs: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.temperature > 0:
            scores = top_p_filter(scores / self.temperature, self.top_p)
        self.log_probs = scores.float().log_softmax(dim=-1)
        return scores


class _FinishRecorder:
    """A stopping criterion that records, per row, how many tokens were sampled when the row
    finished (EOS or a stop string), and the log-prob of each sampled token. The cut is what
    generate itself did, so nothing is inferred afterwards from pad ids. Without stop strings
    it stays on the device (no host sync per step)."""

    def __init__(self, prompt_width: int, n_rows: int, eos_ids: set[int], stop: Sequence[str],
                 tokenizer, distribution: _SamplingDistribution, device):
        self.prompt_width = prompt_width
        self.eos_ids = torch.tensor(sorted(eos_ids), dtype=torch.long, device=device)
        self.stop = [s for s in stop if s]
        # A character is at most 4 tokens (byte-level vocabularies split UTF-8), so a stop
        # string completed by the last token lies within this many trailing tokens.
        self.tail_tokens = 4 * max((len(s) for s in self.stop), default=0) + 4
        self.tokenizer = tokenizer
        self.distribution = distribution
        self.length = torch.full((n_rows,), -1, dtype=torch.long, device=device)
        self.step_logprobs: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores=None, **kwargs) -> torch.Tensor:
        last = input_ids[:, -1]
        self.step_logprobs.append(self.distribution.log_probs.gather(1, last[:, None]).squeeze(1))
        hit = torch.isin(last, self.eos_ids)
        if self.stop:
            start = max(self.prompt_width, input_ids.shape[1] - self.tail_tokens)
            tails = self.tokenizer.batch_decode(input_ids[:, start:].tolist(), skip_special_tokens=False)
            hit |= torch.tensor([any(s in t for s in self.stop) for t in tails], device=hit.device)
        newly = hit & (self.length < 0)
        self.length = torch.where(newly, input_ids.shape[1] - self.prompt_width, self.length)
        return self.length >= 0


@contextlib.contextmanager
def unsharded_for_generation(model: torch.nn.Module, reshard_after_forward: bool = True):
    """Hold an FSDP2 model's full parameters for the duration of a generation.

    Without this every decoding step all-gathers every layer and frees it again; worse,
    ranks that finish decoding at different steps would wait on each other's all-gathers
    forever. So: switch off resharding after forward, unshard every FSDP module once, decode
    locally, reshard. On exit non-root modules get `reshard_after_forward` back (what
    train.py gave fully_shard) and the root gets False, FSDP2's own default for the root.
    A model without FSDP2 modules passes through untouched."""
    from torch.distributed.fsdp import FSDPModule
    fsdp_modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not fsdp_modules:
        yield model
        return
    for module in fsdp_modules:
        module.set_reshard_after_forward(False, recurse=False)
    handles = [module.unshard(async_op=True) for module in fsdp_modules]
    for handle in handles:
        handle.wait()
    try:
        yield model
    finally:
        for module in fsdp_modules:
            module.reshard()
            is_root = module is fsdp_modules[0] and module is model
            module.set_reshard_after_forward(False if is_root else reshard_after_forward,
                                             recurse=False)


class HFEngine:
    """The policy itself, through the fast decoder (`fast`, default on CUDA) or transformers
    `generate` (left padding, our own temperature/top-p as the last logits processor). Either
    way the returned log-probs are those of the distribution actually sampled from
    (temperature-scaled and top-p-filtered; greedy when temperature is 0). `max_batch_rows`
    rows are decoded together; `cuda_graph` False keeps the fast decoder eager on CUDA;
    `grouped_attention` False keeps the model's own attention in the fast decoder, and
    `decode_kernel` False keeps its decoding steps off decode_attention's Triton kernel."""

    def __init__(self, model, tokenizer, *, max_batch_rows: int = 64,
                 reshard_after_forward: bool = True, fast: bool | None = None,
                 cuda_graph: bool = True, grouped_attention: bool = True, check_every: int = 16,
                 initial_cache_tokens: int = 1024, compile_decode: bool = False,
                 prefill_chunk_tokens: int = 1 << 16, decode_kernel: bool = True):
        self.model = model
        # The fast decoder by default on CUDA; plain generate on the CPU or when asked.
        self.fast = (model.get_input_embeddings().weight.device.type == "cuda") if fast is None else fast
        self.cuda_graph = cuda_graph
        # fast decoder: the decode step through torch.compile, made on first use and shared by
        # every decoder of this engine (dynamo keys its cache on the code; shapes are dynamic)
        self.compiled_step = torch.compile(_FastDecoder._step, dynamic=True) if compile_decode else None
        # ... its sampling's passes over the logits, fused (what sample_from_logits calls)
        self.pick = (functools.partial(run_compiled, torch.compile(pick_token, dynamic=True))
                     if compile_decode else pick_token)
        # ... and the prefill's norms and MLPs (compiled_token_forwards; one compile per class)
        # and rotary embedding (compiled_rotary_embedding; one per modeling module, made on use)
        self.compiled_module = torch.compile(module_forward, dynamic=True) if compile_decode else None
        self.compiled_rotaries: dict[str, Callable] = {}
        # fast decoder: prompt tokens per prefill forward (bounds its activations, and keeps the
        # compiled kernels' element counts under 2^31, where they index in 32 bits)
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.grouped_attention = grouped_attention   # fast decoder: grouped_query_attention
        self.decode_kernel = decode_kernel   # ... with decode_attention's kernel for decoding steps
        self.check_every = check_every     # decoding steps between host checks (fast decoder)
        self.initial_cache_tokens = initial_cache_tokens   # new positions first allocated (fast decoder)
        self.tokenizer = tokenizer
        self.max_batch_rows = max_batch_rows
        self.reshard_after_forward = reshard_after_forward
        self.eos_ids = _eos_ids(tokenizer, model)
        if not self.eos_ids:
            raise ValueError("HFEngine: the tokenizer and the model's generation_config name no eos_token_id")
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids)
        self.prompt_opens_thinking = template_opens_thinking(tokenizer)

    def encode_prompt(self, text: str) -> list[int]:
        return render_prompt(self.tokenizer, text)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False).input_ids)

    @torch.no_grad()
    def generate(self, prompt_token_ids: list[list[int]], *, n: int = 1, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0,
                 stop: Sequence[str] = ()) -> list[list[Completion]]:
        rows = [ids for ids in prompt_token_ids for _ in range(n)]
        if any(len(ids) == 0 for ids in rows):
            raise ValueError("HFEngine.generate: empty prompt")
        was_training = self.model.training
        self.model.eval()
        completions: list[Completion] = []
        try:
            with unsharded_for_generation(self.model, self.reshard_after_forward):
                if self.fast:
                    return self._generate_fast(prompt_token_ids, n, max_new_tokens, temperature, top_p, stop)
                for start in range(0, len(rows), self.max_batch_rows):
                    completions += self._generate_rows(rows[start:start + self.max_batch_rows],
                                                       max_new_tokens, temperature, top_p, stop)
        finally:
            self.model.train(was_training)
        return [completions[i * n:(i + 1) * n] for i in range(len(prompt_token_ids))]

    def _generate_rows(self, rows, max_new_tokens, temperature, top_p, stop) -> list[Completion]:
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
        device = self.model.get_input_embeddings().weight.device
        width = max(len(ids) for ids in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, ids in enumerate(rows):
            input_ids[r, width - len(ids):] = torch.tensor(ids)
            attention_mask[r, width - len(ids):] = 1
        distribution = _SamplingDistribution(temperature, top_p)
        recorder = _FinishRecorder(width, len(rows), self.eos_ids, stop, self.tokenizer,
                                   distribution, device)
        # A complete config, so nothing from the checkpoint's generation_config.json (top_k,
        # repetition penalty, its own temperature) changes the distribution behind our back.
        sampling = {"do_sample": True, "top_k": 0} if temperature > 0 else {"do_sample": False}
        config = GenerationConfig(
            max_new_tokens=max_new_tokens, temperature=1.0, top_p=1.0, repetition_penalty=1.0,
            num_beams=1, num_return_sequences=1, eos_token_id=sorted(self.eos_ids),
            pad_token_id=self.pad_id, **sampling)
        sequences = self.model.generate(
            input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
            generation_config=config, logits_processor=LogitsProcessorList([distribution]),
            stopping_criteria=StoppingCriteriaList([recorder]))
        generated = sequences[:, width:].cpu()
        step_logprobs = torch.stack(recorder.step_logprobs, dim=1).cpu()
        lengths = recorder.length.tolist()
        out = []
        for r in range(len(rows)):
            finished = lengths[r] >= 0
            length = lengths[r] if finished else generated.shape[1]
            ids = generated[r, :length].tolist()
            out.append(Completion(
                token_ids=ids, logprobs=step_logprobs[r, :length].tolist(),
                text=self.tokenizer.decode(ids, skip_special_tokens=True),
                finish_reason="stop" if finished else "length"))
        return out

    def _generate_fast(self, prompts, n, max_new_tokens, temperature, top_p, stop) -> list[list[Completion]]:
        """Rows ordered by prompt length and decoded max_batch_rows at a time, so a batch
        carries little padding; a prompt's n samples share its prefill."""
        by_length = sorted(range(len(prompts)), key=lambda p: len(prompts[p]))
        rows = [p for p in by_length for _ in range(n)]
        out: list[list[Completion]] = [[] for _ in prompts]
        for start in range(0, len(rows), self.max_batch_rows):
            batch = rows[start:start + self.max_batch_rows]
            decoder = _FastDecoder(self, prompts, batch, max_new_tokens, temperature, top_p, stop)
            attention = (grouped_attention_for(self.model, kernel=self.decode_kernel) if self.grouped_attention
                         else contextlib.nullcontext())
            with attention:
                token_rows, logprob_rows, finish = decoder.decode()
            for p, ids, logprobs, finished in zip(batch, token_rows, logprob_rows, finish):
                out[p].append(Completion(
                    token_ids=ids, logprobs=logprobs,
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    finish_reason="stop" if finished >= 0 else "length"))
        return out


# ---------------------------------------------------------------------------------------
# HF engine, fast decoder: static KV cache, shared prefill, CUDA-graph decode step


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


def _forward_kwargs(model) -> dict:
    """The cache keyword of this transformers version (`cache` from 5.2x, `past_key_values`
    before); older versions also want `cache_position`, which our cache ignores."""
    parameters = inspect.signature(model.forward).parameters
    return {"cache_name": "cache" if "cache" in parameters else "past_key_values",
            "wants_cache_position": "cache_position" in parameters}


def sample_from_logits(logits: torch.Tensor, temperature: float, top_p: float,
                       pick: Callable | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(token, log-prob of that token) per row, sampled on the device with no host sync,
    from _SamplingDistribution's distribution (computed in fp32, as generate does).
    Sampling is argmax(p / E) with E ~ Exp(1) per entry, which draws from p exactly. The
    noise is drawn here, eagerly (torch's generator, which a CUDA graph replays afresh), and
    `pick` (pick_token, or the engine's compiled pick_token) does the rest."""
    noise = (torch.empty(logits.shape, dtype=torch.float32, device=logits.device).exponential_(1.0)
             if temperature > 0 else None)
    return (pick or pick_token)(logits, noise, temperature, top_p)


def pick_token(logits: torch.Tensor, noise: torch.Tensor | None, temperature: float,
               top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """sample_from_logits given its Exp(1) noise (None when greedy): a pure function of its
    inputs, so torch.compile can fuse its passes over the (rows, vocab) logits into a few."""
    scores = logits.float()
    if temperature > 0:
        scores = top_p_filter(scores / temperature, top_p)
    log_probs = scores.log_softmax(dim=-1)
    if temperature > 0:
        # Clamped above 0: a draw of exactly 0 would make 0 / 0 = NaN on a token outside the
        # nucleus, and argmax picks NaN.
        token = (log_probs.exp() / noise.clamp(min=torch.finfo(torch.float32).tiny)).argmax(dim=-1)
    else:
        token = scores.argmax(dim=-1)
    return token, log_probs.gather(1, token[:, None]).squeeze(1)


def run_compiled(compiled: Callable, *args, **kwargs):
    """Call a torch.compile'd function whatever the caller's compiler stance: train.py rolls
    out under "force_eager" to keep its per-layer training compile off the decoding shapes,
    which would otherwise turn the engine's own compiles off too."""
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
    there and put back on exit. `compiled` keeps one compile per
    modeling module across calls. A model without that function is left as it is."""
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


GROUPED_ATTENTION = "kernel_rl_grouped_sdpa"


def grouped_query_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                            kernel: bool = True, **kwargs) -> tuple[torch.Tensor, None]:
    """Attention with grouped-query heads kept grouped: K and V are read once per KV head, never
    copied once per query head (what transformers' sdpa does whenever a mask is given on CUDA;
    at batch 256 that copy is most of a decoding step's memory traffic). A transformers
    attention function (AttentionInterface): query (batch, q_heads, q_len, dim), key and value
    (batch, kv_heads, kv_len, dim), an additive 4-D mask; returns (batch, q_len, q_heads, dim).
    A decoding step (q_len 1) runs decode_attention's kernel (`kernel`, where Triton runs), or
    SDPA with the query heads that share a KV head as extra query rows of that head; a prefill
    runs SDPA with enable_gqa (measured faster than either copy: docs/PERFORMANCE.md)."""
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


class _FastDecoder:
    """One batch of rows (each row a prompt index) decoded with the static cache. See the
    module docstring; `decode` returns (tokens, log-probs, finish lengths) on the host."""

    def __init__(self, engine: "HFEngine", prompts: list[list[int]], row_prompts: list[int],
                 max_new_tokens: int, temperature: float, top_p: float, stop: Sequence[str]):
        self.engine = engine
        self.model = engine.model
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
        self.eos_ids = torch.tensor(sorted(engine.eos_ids), device=self.device)
        self.call = _forward_kwargs(self.model)
        # The cache starts at `initial_cache_tokens` new positions and doubles when full, so
        # a max_new_tokens far above what rows actually sample costs neither memory nor the
        # attention reads over never-written positions.
        self.cache = _StaticKVCache(self.rows, self.width + min(max_new_tokens, engine.initial_cache_tokens))

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
                               self.engine.prefill_chunk_tokens // self.width))
        logits_per_row = None
        for start in range(0, len(distinct), per_chunk):
            chunk = distinct[start:start + per_chunk]
            ids = torch.full((len(chunk), self.width), self.engine.pad_id, dtype=torch.long)
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
        """With the engine's compile: the prefill's norms, MLPs and rotary embedding fused (its
        elementwise work, ~0.4 s of a 0.95 s prefill of 256 x 512 tokens on the H200)."""
        stack = contextlib.ExitStack()
        if self.engine.compiled_module is not None:
            stack.enter_context(compiled_token_forwards(norms_and_mlps(self.model), self.engine.compiled_module))
            stack.enter_context(compiled_rotary_embedding(self.model, self.engine.compiled_rotaries))
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
            if done % self.engine.check_every == 0 or done == steps:
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
        token, logprob = sample_from_logits(logits, self.temperature, self.top_p, self.engine.pick)
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
        engine asks for it, `compile_decode`; run_compiled), then the next sample."""
        compiled = self.engine.compiled_step
        logits = self._step() if compiled is None else run_compiled(compiled, self)
        self.cache.write_positions += 1
        self.positions += 1
        self._sample(logits)

    def _captured_step(self) -> Callable[[], None]:
        """The decode step, sampling included, as a CUDA graph replay (on CUDA with
        `cuda_graph`), else eager. Each replay draws fresh random numbers: torch's CUDA
        generator advances its offset by the graph's draws on every replay."""
        if self.device.type != "cuda" or not self.engine.cuda_graph:
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
            warnings.warn(f"HFEngine: CUDA graph capture failed, decoding eagerly: {error}")
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
        tokenizer = self.engine.tokenizer
        for r in range(self.rows):
            last = finish_host[r] if finish_host[r] >= 0 else done
            for s in range(checked + 1, last + 1):
                tail = tokenizer.decode(recent[r][max(0, s - self.tail_tokens) - offset:s - offset],
                                        skip_special_tokens=False)
                if any(stop in tail for stop in self.stop):
                    finish_host[r] = s
                    break
        self.finish.copy_(torch.tensor(finish_host))


# ---------------------------------------------------------------------------------------
# vLLM engine (not run: vLLM cannot be installed on the project's machines)

# Path components that wrappers insert into parameter names: torch.compile, FSDP1,
# activation checkpointing. vLLM's loaders expect the plain Hugging Face names.
WRAPPER_NAME_PARTS = ("_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module")


def vllm_weight_name(name: str) -> str:
    """The Hugging Face parameter name vLLM's `load_weights` expects, from a training-side
    name that may carry wrapper components ("_orig_mod.model.layers.0..." -> "model.layers.0...")
    and DDP's leading "module."."""
    parts = [p for p in name.split(".") if p not in WRAPPER_NAME_PARTS]
    if parts and parts[0] == "module":
        parts = parts[1:]
    return ".".join(parts)


def iter_full_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(vLLM name, full tensor) one at a time. Under FSDP2 the state dict holds DTensor
    shards; `full_tensor()` all-gathers one parameter, so every rank must walk this iterator
    in step, and peak extra memory is one full tensor, not a full model copy."""
    from torch.distributed.tensor import DTensor
    for name, tensor in model.state_dict().items():
        if isinstance(tensor, DTensor):
            tensor = tensor.full_tensor()
        yield vllm_weight_name(name), tensor.detach()


def _vllm_model(llm):
    """The in-process model object of a colocated vllm.LLM (V0 and V1 layouts)."""
    worker = llm.llm_engine.model_executor.driver_worker
    runner = getattr(worker, "model_runner", None) or worker.worker.model_runner
    return runner.model


class VLLMEngine:
    """A colocated vLLM per rank, sleeping while the trainer holds the GPU. Under torchrun
    pass `distributed_executor_backend="external_launcher"` and `seed=rank` (else every rank
    samples the same completions) through the keyword arguments. One training step:

        engine.wake_up(["weights"]); engine.sync_weights(model); engine.wake_up(["kv_cache"])
        samples, stats = rollout(...)      # engine.generate inside
        engine.sleep()                     # then the optimizer steps

    vLLM reports log-probs of the raw model distribution unless `logprobs_mode` (vLLM >= 0.10)
    says otherwise; pass it through `llm_kwargs` to match HFEngine's processed ones."""

    def __init__(self, model_path: str, tokenizer, *, gpu_memory_utilization: float = 0.3,
                 seed: int = 0, enable_sleep_mode: bool = True, **llm_kwargs):
        import vllm  # optional dependency: imported only when this engine is used
        self._vllm = vllm
        self.tokenizer = tokenizer
        self.llm = vllm.LLM(model=model_path, enable_sleep_mode=enable_sleep_mode,
                            gpu_memory_utilization=gpu_memory_utilization, seed=seed,
                            **llm_kwargs)
        self.prompt_opens_thinking = template_opens_thinking(tokenizer)

    def encode_prompt(self, text: str) -> list[int]:
        return render_prompt(self.tokenizer, text)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False).input_ids)

    def generate(self, prompt_token_ids: list[list[int]], *, n: int = 1, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0,
                 stop: Sequence[str] = ()) -> list[list[Completion]]:
        params = self._vllm.SamplingParams(
            n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens, logprobs=0,
            stop=list(stop) or None,
            # Keep the text equal to the decoded ids: vLLM's token_ids include the tokens
            # that completed a stop string.
            include_stop_str_in_output=True)
        prompts = [{"prompt_token_ids": list(ids)} for ids in prompt_token_ids]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [[_completion_from_vllm(c) for c in out.outputs] for out in outputs]

    def sleep(self) -> None:
        """Free the GPU for training: level 1 offloads weights to CPU, drops the KV cache."""
        self.llm.sleep(level=1)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Waking the weights alone first lets sync_weights run before the KV cache returns."""
        if tags:
            self.llm.wake_up(tags=tags)
        else:
            self.llm.wake_up()

    def refresh(self, model: torch.nn.Module) -> None:
        """Wake from sleep with the training model's current weights: the weights first, synced
        while the KV cache is still freed (the sync needs no cache memory), then the cache."""
        self.wake_up(["weights"])
        self.sync_weights(model)
        self.wake_up(["kv_cache"])

    def sync_weights(self, model: torch.nn.Module) -> int:
        """Stream the training model's full tensors into vLLM, one at a time; then drop the
        prefix cache, whose KV entries were computed by the old weights. Every rank calls
        this (the FSDP2 all-gathers are collectives). Returns the number of tensors sent."""
        return sync_weights_into(self.llm, model)


def sync_weights_into(llm, model: torch.nn.Module) -> int:
    target = _vllm_model(llm)
    count = 0
    for name, tensor in iter_full_weights(model):
        target.load_weights([(name, tensor)])
        count += 1
    llm.reset_prefix_cache()
    return count


def _completion_from_vllm(output) -> Completion:
    ids = list(output.token_ids)
    logprobs = None
    if output.logprobs is not None:
        logprobs = [step[token].logprob for step, token in zip(output.logprobs, ids)]
    return Completion(token_ids=ids, logprobs=logprobs, text=output.text,
                      finish_reason="length" if output.finish_reason == "length" else "stop")


# ---------------------------------------------------------------------------------------
# OpenAI-compatible HTTP engine (evaluation and baselines)


def utf8_ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def utf8_text(ids: Iterable[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


class OpenAIEngine:
    """Chat completions over HTTP (urllib only). The server applies its own chat template and
    tokenizer, so this engine's "token ids" are the UTF-8 bytes of the message and of the
    returned text (the one engine whose ids are not the model's: never train on them).
    A reasoning field (`reasoning_content` / `reasoning`, as vLLM's and DeepSeek's servers
    send) is put back in front of the answer as <think>...</think>.
    `count_tokens` counts bytes unless given a counter: a safe over-estimate for the budget."""

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None,
                 timeout_s: float = 600.0, max_workers: int = 8,
                 count_tokens: Callable[[str], int] | None = None,
                 extra_body: dict | None = None):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_workers = max_workers
        self._count_tokens = count_tokens
        self.extra_body = dict(extra_body or {})

    def encode_prompt(self, text: str) -> list[int]:
        return utf8_ids(text)

    def count_tokens(self, text: str) -> int:
        return self._count_tokens(text) if self._count_tokens else len(utf8_ids(text))

    def generate(self, prompt_token_ids: list[list[int]], *, n: int = 1, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0,
                 stop: Sequence[str] = ()) -> list[list[Completion]]:
        def one_prompt(ids):
            body = {"model": self.model, "messages": [{"role": "user", "content": utf8_text(ids)}],
                    "n": n, "max_tokens": max_new_tokens, "temperature": temperature,
                    "top_p": top_p, **self.extra_body}
            if stop:
                body["stop"] = list(stop)
            completions: list[Completion] = []
            # Some servers ignore n; ask again until there are n answers.
            while len(completions) < n:
                reply = self._post(body)
                choices = reply.get("choices")
                if not choices:
                    raise RuntimeError(f"OpenAIEngine: reply from {self.url} has no 'choices': {str(reply)[:300]}")
                completions += [_completion_from_choice(c) for c in choices]
            return completions[:n]

        with concurrent.futures.ThreadPoolExecutor(self.max_workers) as pool:
            return list(pool.map(one_prompt, prompt_token_ids))

    def _post(self, body: dict) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as error:
            detail = error.read()[:500].decode("utf-8", errors="replace")
            raise RuntimeError(f"OpenAIEngine: {self.url} answered HTTP {error.code}: {detail}") from error


def _completion_from_choice(choice: dict) -> Completion:
    message = choice.get("message") or {}
    content = message.get("content") or ""
    reasoning = message.get("reasoning_content") or message.get("reasoning") or ""
    text = f"<think>\n{reasoning}\n</think>\n{content}" if reasoning else content
    return Completion(token_ids=utf8_ids(text), logprobs=None, text=text,
                      finish_reason="length" if choice.get("finish_reason") == "length" else "stop")


# ---------------------------------------------------------------------------------------
# Oracle engine (the loop with real kernels and no model)

ORACLE_RESPONSE = ("<think>\nOkay, the oracle answers with the task's own solution.\n</think>\n"
                   "```python\n{code}\n```\n{summary}")


# Element types of the arrays a kernel writes through: a non-const pointer of one of these
# names an output (or a scratch buffer the output is computed from).
_POINTEE = (r"(?:float|double|half|__half|__nv_bfloat16|at::Half|at::BFloat16|c10::Half|"
            r"scalar_t|int|int32_t|int64_t|long|float2|float4|double2)")
_WRITABLE_POINTER = re.compile(r"(?<!const )\b" + _POINTEE + r"\s*\*\s*(?:__restrict__\s+)?(\w+)")
_OUTPUT_LIKE = r"\w*(?:out|result|dst|y)\w*"


def corrupt_solution(code: str) -> str:
    """A solution that still compiles and runs but computes the wrong numbers: every store
    into an output array gets +1 (`out[i] = v;` -> `out[i] = (v) + 1;`, and `+=`, `-=`, `*=`
    alike), one line at a time, comment lines left alone. Output arrays are those with
    output-like names (out, result, dst, y) and every array the source declares as a
    non-const pointer (`float* __restrict__ C`, `float* cr = cp + i * N`), so accumulating
    stores (`c[j] += a * b[j];`) and scratch buffers are corrupted too: more wrong, never
    less. A store of a vector type (`float4`) gets `+ 1` it cannot take, so that kernel fails
    to compile instead: a failure all the same. Raises when there is no such store, rather
    than hand back something that may still be right."""
    names = {m.group(1) for m in _WRITABLE_POINTER.finditer(code)}
    target = _OUTPUT_LIKE + "".join(f"|{re.escape(n)}" for n in sorted(names))
    store = re.compile(r"(\b(?:" + target + r")\s*\[[^\]\n]+\]\s*[-+*]?=(?!=))\s*([^;\n]+);", re.I)
    lines, count = [], 0
    for line in code.split("\n"):
        if not line.lstrip().startswith(("//", "#")):
            line, n = store.subn(r"\1 (\2) + 1;", line)
            count += n
        lines.append(line)
    if count == 0:
        raise ValueError("corrupt_solution: found no output store like `out[i] = ...;` to corrupt")
    return "\n".join(lines)


class OracleEngine:
    """Answers every prompt with the solution of the task whose reference source the prompt
    contains. With `corrupt_rate` > 0 a seeded share of answers is corrupted. Token ids are
    UTF-8 bytes (there is no model). `tasks` need `.reference_src` and `.solutions`
    ({"cuda": src, "cpp": src}); Task records from tasks.py fit."""

    def __init__(self, tasks: Sequence[Any], *, language: str = "cpp", corrupt_rate: float = 0.0,
                 corrupt: Callable[[str], str] = corrupt_solution, seed: int = 0):
        self.answers: list[tuple[str, str]] = []
        for task in tasks:
            if language not in task.solutions:
                raise ValueError(f"OracleEngine: task {getattr(task, 'task_id', '?')} has no '{language}' solution")
            self.answers.append((task.reference_src.strip(), task.solutions[language]))
        self.corrupt_rate = corrupt_rate
        self.corrupt = corrupt
        self.rng = random.Random(seed)

    def encode_prompt(self, text: str) -> list[int]:
        return utf8_ids(text)

    def count_tokens(self, text: str) -> int:
        return len(utf8_ids(text))

    def solution_for(self, prompt_text: str) -> str:
        matches = [(len(ref), code) for ref, code in self.answers if ref in prompt_text]
        if not matches:
            raise ValueError("OracleEngine: the prompt contains none of the tasks' reference sources")
        return max(matches)[1]

    def answer_text(self, solution: str, corrupted: bool) -> str:
        """The oracle's response for a solution, in the policy's format."""
        code = self.corrupt(solution) if corrupted else solution
        summary = "I changed the output on purpose." if corrupted else "I used the task's reference solution."
        return ORACLE_RESPONSE.format(code=code.strip("\n"), summary=summary)

    def generate(self, prompt_token_ids: list[list[int]], *, n: int = 1, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0,
                 stop: Sequence[str] = ()) -> list[list[Completion]]:
        out = []
        for ids in prompt_token_ids:
            solution = self.solution_for(utf8_text(ids))
            group = []
            for _ in range(n):
                ids_out = utf8_ids(self.answer_text(solution, self.rng.random() < self.corrupt_rate))
                finish = "length" if len(ids_out) > max_new_tokens else "stop"
                ids_out = ids_out[:max_new_tokens]
                group.append(Completion(ids_out, None, utf8_text(ids_out), finish))
            out.append(group)
        return out


class OracleMixedEngine:
    """A policy engine of which a seeded share of answers is replaced by the task's built-in
    solution, written in the policy's own tokens (the oracle's text, tokenised once, then the
    EOS): the smoke run's engine. A randomly initialised model only ever breaks the format
    (every score 0, every advantage 0); with oracle answers in each group the advantages, the
    loss, the gradient and the checkpoint all see real work on real kernels. The oracle
    answers are off-policy tokens, trained on like sampled ones: a test of the machinery,
    never a way to train a real policy. `logprobs` of oracle answers are None (train.py
    computes its own old log-probs). `oracle_share` 0 is the policy alone."""

    def __init__(self, policy, tokenizer, tasks: Sequence[Any], *, oracle_share: float,
                 language: str, corrupt_rate: float = 0.0, seed: int = 0):
        if not 0.0 <= oracle_share <= 1.0:
            raise ValueError(f"OracleMixedEngine: oracle_share must be in [0, 1], got {oracle_share}")
        self.policy = policy
        self.tokenizer = tokenizer
        self.oracle = OracleEngine(tasks, language=language, corrupt_rate=corrupt_rate, seed=seed)
        self.oracle_share = oracle_share
        self.rng = random.Random(f"oracle-mixed:{seed}")
        self.eos_id = min(_eos_ids(tokenizer))
        self.prompt_opens_thinking = getattr(policy, "prompt_opens_thinking", False)

    def encode_prompt(self, text: str) -> list[int]:
        return self.policy.encode_prompt(text)

    def count_tokens(self, text: str) -> int:
        return self.policy.count_tokens(text)

    def generate(self, prompt_token_ids: list[list[int]], *, n: int = 1, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0,
                 stop: Sequence[str] = ()) -> list[list[Completion]]:
        from_oracle = [[self.rng.random() < self.oracle_share for _ in range(n)] for _ in prompt_token_ids]
        policy_rows = [ids for ids, picks in zip(prompt_token_ids, from_oracle) for pick in picks if not pick]
        # Called even with no rows: under FSDP2 a generation unshards the model, a collective
        # every rank must join.
        sampled = iter([group[0] for group in self.policy.generate(
            policy_rows, n=1, max_new_tokens=max_new_tokens, temperature=temperature,
            top_p=top_p, stop=stop)])
        out = []
        for ids, picks in zip(prompt_token_ids, from_oracle):
            prompt_text = self.tokenizer.decode(ids, skip_special_tokens=True)
            out.append([self._oracle_answer(prompt_text, max_new_tokens) if pick else next(sampled)
                        for pick in picks])
        return out

    def longest_answer_tokens(self) -> int:
        """The policy-token length (EOS included) of the longest uncorrupted oracle answer: a
        max_new_tokens below it cuts that answer into a format error."""
        return max(len(self._answer_ids(self.oracle.answer_text(solution, False)))
                   for _, solution in self.oracle.answers)

    def _answer_ids(self, text: str) -> list[int]:
        if self.prompt_opens_thinking:  # the template already opened <think>
            text = text.removeprefix("<think>\n")
        return list(self.tokenizer(text, add_special_tokens=False).input_ids) + [self.eos_id]

    def _oracle_answer(self, prompt_text: str, max_new_tokens: int) -> Completion:
        text = self.oracle.generate([utf8_ids(prompt_text)], n=1, max_new_tokens=1 << 30)[0][0].text
        ids = self._answer_ids(text)
        finish = "length" if len(ids) > max_new_tokens else "stop"
        ids = ids[:max_new_tokens]
        return Completion(ids, None, self.tokenizer.decode(ids, skip_special_tokens=True), finish)


