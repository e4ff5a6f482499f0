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

The distribution is one function, `sampling_scores`, and both of HFEngine's decoders sample from
it: the fast decoder (fast_decoder.py, default on CUDA, imported only when used) and plain
transformers `generate` (`fast=False`, the default on CPU). Under FSDP2 either runs inside
`unsharded_for_generation`: the model is all-gathered once per generate call.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import json
import random
import re
import urllib.error
import urllib.request
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol, Sequence

import torch

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


def sampling_scores(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """The scores whose softmax is pi, the distribution of the log-prob contract (module
    docstring), in float32 as generate computes them: top_p_filter(logits / temperature,
    top_p), or the logits themselves when temperature is 0 (greedy). Both decoders sample
    from this one function."""
    scores = logits.float()
    if temperature > 0:
        scores = top_p_filter(scores / temperature, top_p)
    return scores


class _SamplingDistribution:
    """The last logits processor: sampling_scores, applied by us rather than by transformers,
    so the distribution sampled from is exactly the one whose log-probs we keep (custom
    processors run before transformers' own warpers, which we switch off)."""

    def __init__(self, temperature: float, top_p: float):
        self.temperature = temperature
        self.top_p = top_p
        self.log_probs: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = sampling_scores(scores, self.temperature, self.top_p)
        self.log_probs = scores.log_softmax(dim=-1)
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
    """The policy itself, through fast_decoder.py's FastDecoder (`fast`, default on CUDA when
    that file is importable) or transformers `generate` (left padding, our own
    sampling_scores as the last logits processor). Either way the returned log-probs are
    those of the distribution actually sampled from. `max_batch_rows` rows are decoded
    together. The fast decoder's own settings (`cuda_graph`, `grouped_attention`,
    `decode_kernel`, `check_every`, `initial_cache_tokens`, `compile_decode`,
    `prefill_chunk_tokens`) are passed to it as they are: see fast_decoder.FastDecoder."""

    def __init__(self, model, tokenizer, *, max_batch_rows: int = 64,
                 reshard_after_forward: bool = True, fast: bool | None = None,
                 cuda_graph: bool = True, grouped_attention: bool = True, check_every: int = 16,
                 initial_cache_tokens: int = 1024, compile_decode: bool = False,
                 prefill_chunk_tokens: int = 1 << 16, decode_kernel: bool = True,
                 for_generation: Callable | None = None, progress: bool = False):
        self.model = model
        self.progress = progress   # a bar of rows decoded and tokens/s on stderr
        # model -> a context manager giving the model to decode with: the FSDP2 model unsharded by
        # default; train.py's offload_for_generation passes a bf16 copy (weights.generation_copy)
        self.for_generation = for_generation or functools.partial(
            unsharded_for_generation, reshard_after_forward=reshard_after_forward)
        self.tokenizer = tokenizer
        self.max_batch_rows = max_batch_rows
        self.reshard_after_forward = reshard_after_forward
        self.eos_ids = _eos_ids(tokenizer, model)
        if not self.eos_ids:
            raise ValueError("HFEngine: the tokenizer and the model's generation_config name no eos_token_id")
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else min(self.eos_ids)
        self.prompt_opens_thinking = template_opens_thinking(tokenizer)
        # The fast decoder by default on CUDA; plain generate on the CPU, when asked, or when
        # fast_decoder.py is not there (engines.py copied alone).
        on_cuda = model.get_input_embeddings().weight.device.type == "cuda"
        fast_decoder = _import_fast_decoder(required=bool(fast)) if (on_cuda if fast is None else fast) else None
        self.decoder = None if fast_decoder is None else fast_decoder.FastDecoder(
            model, tokenizer, eos_ids=self.eos_ids, pad_id=self.pad_id, distribution=sampling_scores,
            cuda_graph=cuda_graph, grouped_attention=grouped_attention, decode_kernel=decode_kernel,
            check_every=check_every, initial_cache_tokens=initial_cache_tokens,
            compile_decode=compile_decode, prefill_chunk_tokens=prefill_chunk_tokens)
        self.fast = self.decoder is not None

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
            with self.for_generation(self.model) as model:
                if self.decoder is not None:
                    self.decoder.model = model
                    try:
                        return self._generate_fast(prompt_token_ids, n, max_new_tokens, temperature, top_p, stop)
                    finally:
                        self.decoder.model = self.model   # a copy must not outlive its generation
                for start in range(0, len(rows), self.max_batch_rows):
                    completions += self._generate_rows(model, rows[start:start + self.max_batch_rows],
                                                       max_new_tokens, temperature, top_p, stop)
        finally:
            self.model.train(was_training)
        return [completions[i * n:(i + 1) * n] for i in range(len(prompt_token_ids))]

    def _generate_rows(self, model, rows, max_new_tokens, temperature, top_p, stop) -> list[Completion]:
        from transformers import GenerationConfig, LogitsProcessorList, StoppingCriteriaList
        device = model.get_input_embeddings().weight.device
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
        sequences = model.generate(
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
        from tqdm import tqdm
        bar = tqdm(total=len(prompts) * n, desc="generating", unit="row", disable=not self.progress, leave=False)
        tokens = 0

        def on_batch(rows: int, new_tokens: int) -> None:
            nonlocal tokens
            tokens += new_tokens
            bar.update(rows)
            bar.set_postfix_str(f"{tokens / max(bar.format_dict['elapsed'], 1e-9):,.0f} tok/s")
        try:
            groups = self.decoder.generate(prompts, n=n, max_new_tokens=max_new_tokens, temperature=temperature,
                                           top_p=top_p, stop=stop, max_batch_rows=self.max_batch_rows,
                                           on_batch=on_batch)
        finally:
            bar.close()
        return [[Completion(token_ids=row.token_ids, logprobs=row.logprobs,
                            text=self.tokenizer.decode(row.token_ids, skip_special_tokens=True),
                            finish_reason="stop" if row.stopped else "length") for row in group]
                for group in groups]


def _import_fast_decoder(required: bool):
    """fast_decoder, or None with a warning when the file is not beside this one (and not
    `required`: then a clear error). Any other failure inside it is raised as it is."""
    try:
        import fast_decoder
    except ModuleNotFoundError as error:
        if error.name != "fast_decoder":
            raise
        message = ("fast_decoder.py is not importable: copy it (and decode_attention.py) beside "
                   "engines.py for HFEngine's fast decoder")
        if required:
            raise ModuleNotFoundError(f"HFEngine(fast=True): {message}, or pass fast=False",
                                      name="fast_decoder") from error
        warnings.warn(f"HFEngine: {message}; decoding through transformers generate instead")
        return None
    return fast_decoder


# ---------------------------------------------------------------------------------------
# vLLM engine (never run: vLLM cannot be installed on the project's machines; written against
# vLLM 0.34.0's source, which tests/test_engines.py reads when VLLM_SOURCE names it)

# What VLLMEngine asks of vllm.LLM besides the model, the memory budget, the length, the dtype
# and the seed. The calls it makes are those of VLLMEngine's methods; the tests check every
# keyword against vLLM's source.
VLLM_SETTINGS = {
    # One in-process engine per torchrun rank (it reads RANK and LOCAL_RANK): the weight sync
    # hands tensors to vLLM's worker in this process, and each rank samples its own tasks.
    "distributed_executor_backend": "external_launcher",
    # sleep() and wake_up(): vLLM allocates weights and KV cache from its cuMem pool, which it
    # can unmap while the trainer holds the GPU.
    "enable_sleep_mode": True,
    # Log-probs of the distribution sampled from (logits / temperature, top_p), the log-prob
    # contract; vLLM's default is those of the raw logits.
    "logprobs_mode": "processed_logprobs",
    # The extensible KV cache (vLLM's default on CUDA) caps this process's torch allocator when
    # it sizes itself (set_per_process_memory_fraction), and the cap outlives sleep: FSDP's
    # update could not grow into the memory vLLM frees.
    "enable_extensible_kv_cache": False,
    # The first sleep discards the weights and every refresh replaces them with the policy's,
    # so none are read from disk (the model's files give the architecture and tokenizer).
    "load_format": "dummy",
}

# Level 2 discards the weights (each refresh replaces them) and the KV cache. Level 1 would keep
# a host copy of the weights per rank (65 GB for a 32B model) and copy the stale weights back
# to the GPU before every sync overwrites them.
VLLM_SLEEP_LEVEL = 2

# vLLM's finish reasons (FINISH_REASON_STRINGS in vllm/v1/engine/__init__.py) as a Completion's:
# "stop" is an EOS, a stop token id or a stop string; "length" is max_tokens or max_model_len.
VLLM_FINISH_REASONS = {"stop": "stop", "length": "length"}
# The others end a completion that no sampling rule ended: refused, so it is never trained on as
# if the policy had stopped there.
VLLM_REFUSED_FINISH_REASONS = {
    "abort": "the request was aborted (the engine slept or shut down mid-generation)",
    "error": "vLLM failed the request (a request-level internal error)",
    "repetition": "vLLM's repetition detection ended it, which this engine never asks for",
}

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


def vllm_max_model_len(tokenizer, max_prompt_tokens: int, max_new_tokens: int) -> int:
    """The longest sequence a run asks of vLLM: the chat template's own tokens around a message,
    a message of max_prompt_tokens (summarize.build_prompt counts the message alone) and the
    longest response. vLLM checks at start-up that one such request fits its KV cache."""
    return len(render_prompt(tokenizer, "")) + max_prompt_tokens + max_new_tokens


class VLLMEngine:
    """A colocated vLLM per torchrun rank, asleep while the trainer holds the GPU. One step:

        engine.refresh(model)          # wake the weights, sync them from the policy, wake the KV cache
        samples, stats = rollout(...)  # engine.generate inside
        engine.sleep()                 # then the optimizer steps

    `gpu_memory_utilization` is vLLM's whole share of the GPU while awake (its weights in
    `dtype`, activations, CUDA graphs, then the KV cache from what is left), checked against
    the memory free when it starts; `max_model_len` is the longest prompt + response
    (vllm_max_model_len); `device` is this rank's GPU, where the policy's shards are gathered
    before they are sent. `seed`: a different one per rank, else ranks sample alike.
    VLLM_SETTINGS says what else is asked of vLLM and why; `llm_kwargs` go to vllm.LLM as
    they are (e.g. enforce_eager) but may not change a setting."""

    def __init__(self, model_path: str, tokenizer, *, max_model_len: int, gpu_memory_utilization: float,
                 device: torch.device | str, dtype: torch.dtype = torch.bfloat16, seed: int = 0, **llm_kwargs):
        clash = sorted(VLLM_SETTINGS.keys() & llm_kwargs.keys())
        if clash:
            raise ValueError(f"VLLMEngine: {', '.join(clash)} is set by the engine (VLLM_SETTINGS)")
        import vllm  # optional dependency: imported only when this engine is used
        self._vllm = vllm
        self.tokenizer = tokenizer
        self.dtype = dtype
        self.device = device
        self.max_model_len = max_model_len
        self.prompt_opens_thinking = template_opens_thinking(tokenizer)
        self.llm = vllm.LLM(model=model_path, gpu_memory_utilization=gpu_memory_utilization,
                            max_model_len=max_model_len, dtype=str(dtype).removeprefix("torch."),
                            seed=seed, **VLLM_SETTINGS, **llm_kwargs)

    def encode_prompt(self, text: str) -> list[int]:
        return render_prompt(self.tokenizer, text)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False).input_ids)

    def generate(self, prompt_token_ids: list[list[int]], *, n: int = 1, max_new_tokens: int,
                 temperature: float = 1.0, top_p: float = 1.0,
                 stop: Sequence[str] = ()) -> list[list[Completion]]:
        longest = max((len(ids) for ids in prompt_token_ids), default=0)
        if longest + max_new_tokens > self.max_model_len:  # vLLM would end it early, as "length"
            raise ValueError(f"VLLMEngine.generate: a prompt of {longest} tokens and max_new_tokens "
                             f"{max_new_tokens} exceed max_model_len {self.max_model_len}")
        # logprobs=0: the sampled token's own log-prob, no alternatives.
        params = self._vllm.SamplingParams(n=n, temperature=temperature, top_p=top_p,
                                           max_tokens=max_new_tokens, logprobs=0, stop=list(stop) or None)
        prompts = [{"prompt_token_ids": list(ids)} for ids in prompt_token_ids]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return [[_completion_from_vllm(c, self.tokenizer) for c in out.outputs] for out in outputs]

    def sleep(self) -> None:
        """Free the GPU for training (VLLM_SLEEP_LEVEL)."""
        self.llm.sleep(level=VLLM_SLEEP_LEVEL)

    def refresh(self, model: torch.nn.Module) -> None:
        """Wake with the training model's current weights: the weights' memory first (vLLM
        restores its other state with it), filled by the sync while the KV cache is still
        freed, then the KV cache. Every rank calls this (the sync's all-gathers)."""
        self.llm.wake_up(tags=["weights"])
        self.sync_weights(model)
        self.llm.wake_up(tags=["kv_cache"])

    def sync_weights(self, model: torch.nn.Module) -> int:
        """Stream the training model's full tensors into vLLM in self.dtype, one at a time;
        then drop the prefix cache, whose KV entries were computed by the old weights. Every
        rank calls this (the FSDP2 all-gathers are collectives). Returns the tensors sent."""
        return sync_weights_into(self.llm, model, self.dtype, self.device)


def sync_weights_into(llm, model: torch.nn.Module, dtype: torch.dtype | None = None,
                      device: torch.device | str | None = None) -> int:
    """vLLM's own weight update (Worker.reload_weights, reached through collective_rpc: in
    process under the external launcher, so tensors are handed over, not serialised): it
    loads Hugging Face names through the model's load_weights, which stacks q/k/v and
    gate/up itself, then redoes what it derives from the weights."""
    import weights   # here: engines.py alone (no vLLM) needs no other file of the project
    sent = []

    def full_weights():
        for name, tensor in weights.full_tensors(model, device, dtype):   # every rank in step
            sent.append(name)
            yield vllm_weight_name(name), tensor

    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": full_weights(), "is_checkpoint_format": True})
    llm.reset_prefix_cache()
    return len(sent)


def _completion_from_vllm(output, tokenizer) -> Completion:
    reason = output.finish_reason
    if reason not in VLLM_FINISH_REASONS:
        why = VLLM_REFUSED_FINISH_REASONS.get(reason, "a finish reason this engine does not know")
        raise RuntimeError(f"VLLMEngine: vLLM ended a completion with finish_reason {reason!r}: {why}")
    ids = list(output.token_ids)
    logprobs = None
    if output.logprobs is not None:
        logprobs = [step[token].logprob for step, token in zip(output.logprobs, ids)]
    # Decoded from the ids, as HFEngine does: vLLM cuts its own text at the end of a stop
    # string while the ids keep the whole token that completed it.
    return Completion(token_ids=ids, logprobs=logprobs, text=tokenizer.decode(ids, skip_special_tokens=True),
                      finish_reason=VLLM_FINISH_REASONS[reason])


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
_WRITABLE_POINTER = re.compile(r"(?<!const )\b(" + _POINTEE + r")\s*\*\s*(?:__restrict__\s+)?(\w+)")
_VECTOR_TYPES = ("float2", "float4", "double2")  # CUDA's vector structs: no `+ 1` on them
_OUTPUT_LIKE = r"\w*(?:out|result|dst|y)\w*"


def corrupt_solution(code: str) -> str:
    """A solution that still compiles and runs but computes the wrong numbers: every store
    into an output array gets +1 (`out[i] = v;` -> `out[i] = (v) + 1;`, and `+=`, `-=`, `*=`
    alike), one line at a time, comment lines left alone. Output arrays are those with
    output-like names (out, result, dst, y) and every array the source declares as a
    non-const pointer (`float* __restrict__ C`, `float* cr = cp + i * N`), so accumulating
    stores (`c[j] += a * b[j];`) and scratch buffers are corrupted too: more wrong, never
    less. A CUDA vector struct (`float4* y4`) takes no `+ 1`, so its store gets +1 on its
    first component instead (`y4[i] = v;` -> `y4[i] = v; y4[i].x += 1;`): it still compiles.
    Raises when there is no such store, rather than hand back something that may still be right."""
    pointers = {m.group(2): m.group(1) for m in _WRITABLE_POINTER.finditer(code)}
    vectors = {n for n, pointee in pointers.items() if pointee in _VECTOR_TYPES}
    target = _OUTPUT_LIKE + "".join(f"|{re.escape(n)}" for n in sorted(pointers))
    store = re.compile(r"(\b(" + target + r")\s*\[[^\]\n]+\])(\s*[-+*]?=(?!=))\s*([^;\n]+);", re.I)

    def corrupt(match: re.Match) -> str:
        element, name, assign, value = match.groups()
        if name in vectors and assign.strip() == "=":
            return f"{element}{assign} {value}; {element}.x += 1;"
        return f"{element}{assign} ({value}) + 1;"

    lines, count = [], 0
    for line in code.split("\n"):
        if not line.lstrip().startswith(("//", "#")):
            line, n = store.subn(corrupt, line)
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


