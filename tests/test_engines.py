"""Tests for engines.py: the HF engine on a tiny random model (plain generate and the fast
decoder, each checked against a fresh forward pass written out here), engines.py copied alone,
FSDP2 generation on CPU, the vLLM engine against a fake module and (VLLM_SOURCE set) every call
it makes against vLLM's own source, the OpenAI engine over a local HTTP server, the oracle and
its corruption of solutions. GPU versions run in bf16 and skip cleanly without CUDA. The fast
decoder's own tests are in tests/test_fast_decoder.py."""
import ast
import http.server
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import threading
import types
from dataclasses import dataclass

import pytest
import torch
import torch.multiprocessing as mp

import engines
import summarize
import weights

transformers = pytest.importorskip("transformers")
from transformers import ByT5Tokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

EOS = 1  # ByT5Tokenizer: pad 0, eos 1, unk 2, bytes 3..258


def byte_id(ch: str) -> int:
    return ord(ch) + 3


def tiny_model(seed: int = 0, eos_logit: float = 0.0, favoured: dict[int, float] | None = None):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=384, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=16384, eos_token_id=EOS, pad_token_id=0,
                         bos_token_id=None)
    model = LlamaForCausalLM(config)
    # A bias on the output layer makes chosen tokens (EOS, a stop character) likely enough
    # that the paths which depend on them are exercised.
    with torch.no_grad():
        head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=True)
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        for token, logit in {EOS: eos_logit, **(favoured or {})}.items():
            head.bias[token] = logit
    model.lm_head = head
    # Checkpoint defaults that must NOT leak into the sampling distribution.
    model.generation_config.top_k = 5
    model.generation_config.repetition_penalty = 1.5
    model.generation_config.temperature = 0.3
    model.eval()
    return model


@pytest.fixture(scope="module")
def tokenizer():
    return ByT5Tokenizer()


# ------------------------------------------------------------------------- HF engine


def naive_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Row by row, token by token: keep the most likely tokens until their mass reaches top_p."""
    out = torch.full_like(logits, float("-inf"))
    probs = logits.softmax(-1)
    for row in range(logits.shape[0]):
        mass = 0.0
        for token in sorted(range(logits.shape[1]), key=lambda t: -float(probs[row, t])):
            out[row, token] = logits[row, token]
            mass += float(probs[row, token])
            if mass >= top_p:
                break
    return out


@pytest.mark.parametrize("fast", [False, True])
def test_hf_ids_exact_cut_at_eos_and_logprobs_match_unpadded_forward(tokenizer, fast):
    model = tiny_model(eos_logit=2.0)
    engine = engines.HFEngine(model, tokenizer, max_batch_rows=5, fast=fast, check_every=3, initial_cache_tokens=5)
    prompts = [engine.encode_prompt("hi"), engine.encode_prompt("a much longer prompt, padded less")]
    torch.manual_seed(1)
    temperature, top_p, max_new = 0.8, 0.9, 24
    groups = engine.generate(prompts, n=4, max_new_tokens=max_new, temperature=temperature, top_p=top_p)
    assert [len(g) for g in groups] == [4, 4]
    reasons = set()
    for prompt, group in zip(prompts, groups):
        for c in group:
            reasons.add(c.finish_reason)
            assert c.text == tokenizer.decode(c.token_ids, skip_special_tokens=True)
            assert 0 not in c.token_ids  # no padding inside a completion
            if c.finish_reason == "stop":
                assert c.token_ids[-1] == EOS and EOS not in c.token_ids[:-1]
            else:
                assert len(c.token_ids) == max_new and EOS not in c.token_ids
            # The same model on the unpadded sequence, temperature and top-p applied by hand.
            with torch.no_grad():
                logits = model(torch.tensor([prompt + c.token_ids])).logits[0].float()
            steps = logits[len(prompt) - 1:len(prompt) - 1 + len(c.token_ids)] / temperature
            expected = naive_top_p(steps, top_p).log_softmax(-1)
            expected = expected.gather(1, torch.tensor(c.token_ids)[:, None]).squeeze(1)
            assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-4)
    assert reasons == {"stop", "length"}, "pick eos_logit so that both endings occur"


@pytest.mark.parametrize("fast", [False, True])
def test_hf_greedy_batch_with_left_padding_equals_one_at_a_time(tokenizer, fast):
    model = tiny_model(seed=3)
    engine = engines.HFEngine(model, tokenizer, max_batch_rows=8, fast=fast)
    prompts = [engine.encode_prompt(t) for t in ("x", "a longer prompt than x", "mid size")]
    batched = engine.generate(prompts, n=1, max_new_tokens=12, temperature=0.0)
    for prompt, group in zip(prompts, batched):
        alone = engine.generate([prompt], n=1, max_new_tokens=12, temperature=0.0)[0][0]
        assert group[0].token_ids == alone.token_ids


@pytest.mark.parametrize("fast", [False, True])
def test_hf_stop_string_ends_completion_at_first_occurrence(tokenizer, fast):
    model = tiny_model(seed=5, favoured={byte_id("Z"): 2.5})
    engine = engines.HFEngine(model, tokenizer, fast=fast, check_every=4)
    torch.manual_seed(0)
    groups = engine.generate([engine.encode_prompt("go")], n=6, max_new_tokens=40,
                             temperature=1.0, stop=("Z",))
    stopped = [c for c in groups[0] if c.finish_reason == "stop" and c.token_ids[-1] != EOS]
    assert stopped, "the favoured stop character should end some completions"
    for c in stopped:
        assert c.token_ids[-1] == byte_id("Z") and byte_id("Z") not in c.token_ids[:-1]
        assert len(c.logprobs) == len(c.token_ids)


@pytest.mark.parametrize("fast", [False, True])
def test_multi_token_stop_string_cuts_right_after_it_completes(tokenizer, fast):
    model = tiny_model(seed=6, favoured={byte_id("Z"): 4.5})
    engine = engines.HFEngine(model, tokenizer, fast=fast, check_every=7)
    torch.manual_seed(2)
    groups = engine.generate([engine.encode_prompt("go"), engine.encode_prompt("again")], n=4,
                             max_new_tokens=30, temperature=1.0, stop=("ZZ",))
    completions = [c for g in groups for c in g]
    stopped = [c for c in completions if c.finish_reason == "stop" and c.token_ids[-1] != EOS]
    assert stopped, "the favoured character should complete the stop string in some rows"
    for c in completions:
        before_last = tokenizer.decode(c.token_ids[:-1], skip_special_tokens=False)
        assert "ZZ" not in before_last   # never cut late
        if c in stopped:
            assert tokenizer.decode(c.token_ids, skip_special_tokens=False).endswith("ZZ")


def test_render_prompt_falls_back_without_chat_template(tokenizer):
    ids = engines.render_prompt(tokenizer, "hé")
    assert tokenizer.decode(ids) == engines.PLAIN_CHAT_TEMPLATE.format(prompt="hé")
    assert EOS not in ids  # no special tokens added behind the template's back


# ------------------------------------------------------------------------- engines.py alone

ALONE = """
import sys, types, warnings
import torch
import engines
from transformers import ByT5Tokenizer, LlamaConfig, LlamaForCausalLM

task = types.SimpleNamespace(task_id="t", reference_src="REF", solutions={"cpp": "out[i] = 1;"})
oracle = engines.OracleEngine([task])
(answer,), = oracle.generate([oracle.encode_prompt("... REF ...")], n=1, max_new_tokens=10_000)
assert "out[i] = 1;" in answer.text and answer.finish_reason == "stop", answer

tokenizer = ByT5Tokenizer()
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=384, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, eos_token_id=1,
                                     pad_token_id=0, bos_token_id=None)).eval()
engine = engines.HFEngine(model, tokenizer)
(plain,), = engine.generate([engine.encode_prompt("hi")], n=1, max_new_tokens=5, temperature=0.0)
assert len(plain.token_ids) == len(plain.logprobs) > 0

try:
    engines.HFEngine(model, tokenizer, fast=True)
except ModuleNotFoundError as error:
    assert "fast_decoder.py" in str(error) and "fast=False" in str(error), error
else:
    raise AssertionError("fast=True without fast_decoder.py was not refused")

# On CUDA the fast decoder is the default: without its file, a warning and generate instead.
cuda_weight = types.SimpleNamespace(weight=types.SimpleNamespace(device=torch.device("cuda")))
model.get_input_embeddings = lambda: cuda_weight
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    engine = engines.HFEngine(model, tokenizer)
assert any("fast_decoder.py" in str(w.message) and "generate" in str(w.message) for w in caught), caught
del model.get_input_embeddings
(fallback,), = engine.generate([engine.encode_prompt("hi")], n=1, max_new_tokens=5, temperature=0.0)
assert fallback.token_ids == plain.token_ids
assert "fast_decoder" not in sys.modules and "decode_attention" not in sys.modules
print("alone:", engines.__file__)
"""


def test_engines_py_copied_alone_imports_and_its_engines_work(tmp_path):
    """engines.py alone in an empty folder (no fast_decoder.py, no decode_attention.py): it
    imports; the oracle answers; HFEngine decodes through generate, refuses fast=True with the
    reason, and on a CUDA model falls back to generate with a warning."""
    shutil.copy(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "engines.py"), tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", ALONE], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert f"alone: {tmp_path / 'engines.py'}" in proc.stdout


# ------------------------------------------------------------------------- FSDP2 on CPU


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fsdp_worker(rank: int, world: int, port: int, device_type: str, decoder: str, results):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cpu") if device_type == "cpu" else torch.device("cuda", rank)
    if device_type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if device_type == "cpu" else "nccl", rank=rank, world_size=world)
    try:
        tokenizer = ByT5Tokenizer()
        reference = tiny_model(seed=7).to(device)
        model = tiny_model(seed=7).to(device)
        mesh = init_device_mesh(device_type, (world,))
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        # Each rank decodes a different prompt for a different number of steps: with
        # per-step all-gathers this would hang; unsharded once, it cannot.
        prompt = engines.render_prompt(tokenizer, ["short", "a different prompt"][rank % 2])
        max_new = 6 + 7 * rank
        engine = engines.HFEngine(model, tokenizer, fast=decoder != "plain", compile_decode=decoder == "compiled")
        got = engine.generate([prompt], n=1, max_new_tokens=max_new, temperature=0.0)
        want = engines.HFEngine(reference, tokenizer, fast=False).generate([prompt], n=1, max_new_tokens=max_new, temperature=0.0)
        resharded = all(isinstance(p, DTensor) for p in model.parameters())
        full = dict(weights.full_tensors(model))
        half = dict(weights.full_tensors(model, device, torch.bfloat16))
        weights_equal = all(torch.equal(full[k], v) and torch.equal(half[k], v.to(torch.bfloat16))
                            for k, v in reference.state_dict().items())
        ids = torch.tensor([[5, 6, 7, 8]], device=device)
        loss = model(ids, labels=ids).loss
        loss.backward()
        results[rank] = (got[0][0].token_ids == want[0][0].token_ids, resharded, weights_equal,
                         math.isfinite(float(loss.detach())))
    finally:
        dist.destroy_process_group()


def _run_fsdp_ranks(world: int, device_type: str, decoder: str) -> dict:
    """decoder: "plain" (generate), "fast", or "compiled" (the fast one with compile_decode)."""
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_fsdp_worker, args=(world, _free_port(), device_type, decoder, results), nprocs=world)
    return dict(results)


@pytest.mark.slow
@pytest.mark.parametrize("decoder", ["plain", "fast", "compiled"])
def test_fsdp2_generation_on_two_gloo_ranks(decoder):
    # (same tokens as the unsharded model, params sharded again, full weights, training works);
    # "compiled": the compiled step, sampling and prefill modules on FSDP2's wrapped layers
    assert _run_fsdp_ranks(2, "cpu", decoder) == {0: (True, True, True, True), 1: (True, True, True, True)}


@pytest.mark.gpu
def test_fsdp2_generation_on_two_cuda_ranks():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    assert _run_fsdp_ranks(2, "cuda", "fast") == {0: (True, True, True, True), 1: (True, True, True, True)}


@pytest.mark.gpu
def test_fsdp2_fast_generation_on_one_cuda_rank():
    # the fast decoder (CUDA graph step) on an FSDP2 model unsharded once, as train.py runs it
    assert _run_fsdp_ranks(1, "cuda", "fast") == {0: (True, True, True, True)}


@pytest.mark.gpu
@pytest.mark.parametrize("fast,dtype,top_p,atol", [
    (False, torch.float32, 0.9, 1e-3), (True, torch.float32, 0.9, 1e-3),
    # bf16: a batched, padded forward and an unpadded one round differently, so a log-prob
    # agrees to 0.1 only; top_p 1 so a token at the nucleus edge cannot fall out of it.
    (False, torch.bfloat16, 1.0, 0.1), (True, torch.bfloat16, 1.0, 0.1)])
def test_hf_engine_on_cuda_matches_unpadded_forward(tokenizer, fast, dtype, top_p, atol):
    model = tiny_model(eos_logit=2.0).to("cuda", dtype)
    engine = engines.HFEngine(model, tokenizer, fast=fast)
    prompts = [engine.encode_prompt("hi"), engine.encode_prompt("a much longer prompt, padded less")]
    torch.manual_seed(1)
    groups = engine.generate(prompts, n=4, max_new_tokens=24, temperature=0.8, top_p=top_p)
    for prompt, group in zip(prompts, groups):
        for c in group:
            with torch.no_grad():
                logits = model(torch.tensor([prompt + c.token_ids], device="cuda")).logits[0].float().cpu()
            steps = logits[len(prompt) - 1:len(prompt) - 1 + len(c.token_ids)] / 0.8
            expected = naive_top_p(steps, top_p).log_softmax(-1)
            expected = expected.gather(1, torch.tensor(c.token_ids)[:, None]).squeeze(1)
            assert torch.allclose(torch.tensor(c.logprobs), expected, atol=atol)
            if c.finish_reason == "stop":
                assert c.token_ids[-1] == EOS and EOS not in c.token_ids[:-1]


# ------------------------------------------------------------------------- vLLM engine


def test_vllm_weight_name_strips_wrappers():
    assert engines.vllm_weight_name("_orig_mod.model.layers.0.mlp.up_proj.weight") == "model.layers.0.mlp.up_proj.weight"
    assert engines.vllm_weight_name("model._fsdp_wrapped_module.layers.1._checkpoint_wrapped_module.self_attn.q_proj.weight") == "model.layers.1.self_attn.q_proj.weight"
    assert engines.vllm_weight_name("module.lm_head.weight") == "lm_head.weight"
    assert engines.vllm_weight_name("model.embed_tokens.weight") == "model.embed_tokens.weight"


class _FakeVLLM:
    """Stands in for the `vllm` module (it cannot be installed here) and records every call the
    engine makes as (callee, positional args, keyword args), in the order made. LLM's
    collective_rpc runs the named method of a worker with vLLM 0.34.0's signature, in process as
    under the external launcher; `replies` are the CompletionOutput-like records generate
    returns for every prompt."""

    def __init__(self, replies=()):
        self.calls = []
        self.received = []   # (name, tensor) as the worker's reload_weights took them
        self.replies = list(replies)
        fake = self

        class Worker:
            def reload_weights(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True):
                fake.received += [(name, tensor.clone()) for name, tensor in weights_iterator]

        class LLM:
            def __init__(self, *args, **kwargs):
                fake.calls.append(("LLM", args, kwargs))

            def generate(self, *args, **kwargs):
                fake.calls.append(("generate", args, kwargs))
                return [types.SimpleNamespace(outputs=list(fake.replies)) for _ in args[0]]

            def sleep(self, *args, **kwargs):
                fake.calls.append(("sleep", args, kwargs))

            def wake_up(self, *args, **kwargs):
                fake.calls.append(("wake_up", args, kwargs))

            def reset_prefix_cache(self, *args, **kwargs):
                fake.calls.append(("reset_prefix_cache", args, kwargs))

            def collective_rpc(self, *args, **kwargs):
                fake.calls.append(("collective_rpc", args, kwargs))
                method, rpc_args, rpc_kwargs = args[0], kwargs.get("args", ()), kwargs.get("kwargs") or {}
                fake.calls.append((method, rpc_args, rpc_kwargs))   # what the worker is called with
                return [getattr(Worker(), method)(*rpc_args, **rpc_kwargs)]

        class SamplingParams:
            def __init__(self, *args, **kwargs):
                fake.calls.append(("SamplingParams", args, kwargs))

        self.LLM, self.SamplingParams = LLM, SamplingParams

    def kwargs_of(self, callee: str) -> list[dict]:
        return [kwargs for name, _, kwargs in self.calls if name == callee]


def _vllm_output(ids, text, finish_reason, logprobs=None):
    """A vLLM CompletionOutput as generate returns it: logprobs one {token id: Logprob} per step."""
    steps = None if logprobs is None else [{t: types.SimpleNamespace(logprob=lp)} for t, lp in zip(ids, logprobs)]
    return types.SimpleNamespace(token_ids=ids, text=text, finish_reason=finish_reason, logprobs=steps)


def _vllm_engine(monkeypatch, tokenizer, replies=(), **kwargs) -> tuple[engines.VLLMEngine, _FakeVLLM]:
    fake = _FakeVLLM(replies)
    monkeypatch.setitem(sys.modules, "vllm", fake)
    settings = dict(max_model_len=64, gpu_memory_utilization=0.4, seed=3, device="cpu", **kwargs)
    return engines.VLLMEngine("/models/tiny", tokenizer, **settings), fake


def test_vllm_engine_asks_for_its_budget_length_dtype_and_processed_logprobs(monkeypatch, tokenizer):
    engine, fake = _vllm_engine(monkeypatch, tokenizer, enforce_eager=True)
    [llm] = fake.kwargs_of("LLM")
    assert llm == dict(model="/models/tiny", gpu_memory_utilization=0.4, max_model_len=64, dtype="bfloat16",
                       seed=3, enforce_eager=True, distributed_executor_backend="external_launcher",
                       enable_sleep_mode=True, logprobs_mode="processed_logprobs",
                       enable_extensible_kv_cache=False, load_format="dummy")
    with pytest.raises(ValueError, match="logprobs_mode is set by the engine"):
        _vllm_engine(monkeypatch, tokenizer, logprobs_mode="raw_logprobs")


def test_vllm_max_model_len_holds_the_template_the_prompt_budget_and_the_response(tokenizer):
    template = len(engines.render_prompt(tokenizer, ""))
    assert template > 0
    assert engines.vllm_max_model_len(tokenizer, 100, 30) == template + 130
    # the budget counts the message alone: a message of exactly 100 tokens fits with its response
    message = "x" * 100
    assert len(engines.render_prompt(tokenizer, message)) + 30 == engines.vllm_max_model_len(tokenizer, 100, 30)


def test_vllm_sleeps_at_level_2_and_syncs_bf16_weights_after_waking_them(monkeypatch, tokenizer):
    engine, fake = _vllm_engine(monkeypatch, tokenizer)
    inner = tiny_model(seed=2)
    policy = torch.nn.Module()
    policy._orig_mod = inner  # what torch.compile's wrapper looks like
    engine.sleep()
    engine.refresh(policy)
    assert [name for name, _, _ in fake.calls] == ["LLM", "sleep", "wake_up", "collective_rpc", "reload_weights",
                                                   "reset_prefix_cache", "wake_up"]
    assert fake.kwargs_of("sleep") == [{"level": 2}]
    assert fake.kwargs_of("wake_up") == [{"tags": ["weights"]}, {"tags": ["kv_cache"]}]
    assert fake.kwargs_of("reload_weights")[0]["is_checkpoint_format"] is True
    expected = inner.state_dict()
    assert [name for name, _ in fake.received] == list(expected)   # Hugging Face names, wrappers stripped
    for name, tensor in fake.received:
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, expected[name].to(torch.bfloat16))


def test_vllm_completion_ids_text_logprobs_and_finish_reasons(monkeypatch, tokenizer):
    stop_ids = [byte_id(c) for c in "ab END!"]   # the last token runs past the stop string "END"
    replies = [_vllm_output(stop_ids, "ab END", "stop", [-0.5] * len(stop_ids)),
               _vllm_output([byte_id("q"), EOS], "q", "stop", [-1.0, -2.0]),
               _vllm_output([byte_id("z")] * 4, "zzzz", "length", [-0.25] * 4)]
    engine, fake = _vllm_engine(monkeypatch, tokenizer, replies)
    prompt = engine.encode_prompt("hi")
    [group] = engine.generate([prompt], n=3, max_new_tokens=4, temperature=0.9, top_p=0.95, stop=["END"])
    assert fake.kwargs_of("SamplingParams") == [dict(n=3, temperature=0.9, top_p=0.95, max_tokens=4,
                                                     logprobs=0, stop=["END"])]
    assert fake.calls[-1][1][0] == [{"prompt_token_ids": prompt}]
    for completion, reply in zip(group, replies):
        assert completion.token_ids == reply.token_ids   # exactly the ids sampled, EOS included
        assert completion.text == tokenizer.decode(reply.token_ids, skip_special_tokens=True)
        assert completion.logprobs == [step[t].logprob for step, t in zip(reply.logprobs, reply.token_ids)]
    assert group[0].text == "ab END!"   # the whole token that completed the stop string, as its id
    assert [c.finish_reason for c in group] == ["stop", "stop", "length"]


@pytest.mark.parametrize("reason,why", [("abort", "aborted"), ("error", "request-level internal error"),
                                        ("repetition", "never asks for"), ("cancelled", "does not know")])
def test_vllm_completion_that_no_sampling_rule_ended_is_refused(monkeypatch, tokenizer, reason, why):
    engine, _ = _vllm_engine(monkeypatch, tokenizer, [_vllm_output([byte_id("a")], "a", reason, [-1.0])])
    with pytest.raises(RuntimeError, match=f"finish_reason '{reason}': .*{why}"):
        engine.generate([engine.encode_prompt("hi")], max_new_tokens=4)


def test_vllm_generate_refuses_a_request_longer_than_max_model_len(monkeypatch, tokenizer):
    engine, fake = _vllm_engine(monkeypatch, tokenizer)
    prompt = list(range(3, 3 + 60))
    with pytest.raises(ValueError, match="a prompt of 60 tokens and max_new_tokens 5 exceed max_model_len 64"):
        engine.generate([prompt], max_new_tokens=5)
    assert "generate" not in [name for name, _, _ in fake.calls]


def _offloaded_weights_worker(rank: int, world: int, port: int, results):
    """FSDP2 with train.py's --cpu-offload over NCCL: the shards live on the CPU."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    try:
        reference = tiny_model(seed=7).state_dict()
        model = tiny_model(seed=7)
        mesh = init_device_mesh("cuda", (world,))
        for module in [*model.model.layers, model]:
            fully_shard(module, mesh=mesh, offload_policy=CPUOffloadPolicy())
        on_cpu = all(p.to_local().device.type == "cpu" for p in model.parameters())
        sent = list(weights.full_tensors(model, device, torch.bfloat16))
        results[rank] = (on_cpu, [name for name, _ in sent] == list(reference),
                         all(t.device == device and t.dtype == torch.bfloat16
                             and torch.equal(t, reference[name].to(device, torch.bfloat16)) for name, t in sent))
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
def test_vllm_sync_gathers_cpu_offloaded_shards_on_the_gpu_in_bf16():
    world = min(torch.cuda.device_count(), 2)
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_offloaded_weights_worker, args=(world, _free_port(), results), nprocs=world)
    assert dict(results) == {rank: (True, True, True) for rank in range(world)}


# ------------------------------------------------------------------------- vLLM's own source
# With VLLM_SOURCE naming an unpacked vLLM wheel (pip download --no-deps vllm; unzip; README), the
# calls the engine really makes (recorded by _FakeVLLM) are checked against vLLM's source, read
# with ast: vLLM is never imported.

VLLM_CALLEES = {  # callee -> (file in the wheel, class, method); None: the class's fields
    "LLM": ("vllm/entrypoints/llm.py", "LLM", "__init__"),
    "generate": ("vllm/entrypoints/llm.py", "LLM", "generate"),
    "sleep": ("vllm/entrypoints/llm.py", "LLM", "sleep"),
    "wake_up": ("vllm/entrypoints/llm.py", "LLM", "wake_up"),
    "reset_prefix_cache": ("vllm/entrypoints/llm.py", "LLM", "reset_prefix_cache"),
    "collective_rpc": ("vllm/entrypoints/llm.py", "LLM", "collective_rpc"),
    "reload_weights": ("vllm/v1/worker/gpu_worker.py", "Worker", "reload_weights"),
    "SamplingParams": ("vllm/sampling_params.py", "SamplingParams", None),
}
VLLM_VALUES = {  # LLM keyword -> (file, the Literal type alias its value must be one of)
    "logprobs_mode": ("vllm/config/model.py", "LogprobsMode"),
    "dtype": ("vllm/config/model.py", "ModelDType"),
    "distributed_executor_backend": ("vllm/config/parallel.py", "DistributedExecutorBackend"),
    "load_format": ("vllm/model_executor/model_loader/__init__.py", "LoadFormats"),
}


@pytest.fixture(scope="module")
def vllm_source():
    root = os.environ.get("VLLM_SOURCE")
    if not root:
        pytest.skip("VLLM_SOURCE is not set: it names an unpacked vLLM wheel (README, 'The vLLM engine')")
    metadata = [os.path.join(root, d, "METADATA") for d in os.listdir(root) if d.endswith(".dist-info")]
    assert metadata, f"VLLM_SOURCE={root} holds no *.dist-info: not an unpacked wheel"
    with open(metadata[0]) as f:
        version = next(line.split(":", 1)[1].strip() for line in f if line.startswith("Version:"))
    print(f"vLLM source checked: {version} ({root})")
    trees = {}

    def tree(path):
        if path not in trees:
            with open(os.path.join(root, path)) as f:
                trees[path] = ast.parse(f.read())
        return trees[path]
    return types.SimpleNamespace(version=version, root=root, tree=tree)


def _class(tree, name):
    found = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name]
    assert found, f"no class {name}"
    return found[0]


def _method(cls, name):
    found = [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
    assert found, f"{cls.name} has no method {name}"
    return found[0]


def _fields(cls) -> set[str]:
    return {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _constants(tree, name) -> set:
    """The constants in what the module assigns to `name`: a Literal alias's values, a tuple's items."""
    for node in ast.walk(tree):
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value:
            return {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)}
    raise AssertionError(f"no module-level {name}")


def _recorded_calls(monkeypatch, tokenizer) -> _FakeVLLM:
    """Every vLLM call of a run's life: start, sleep, refresh, generate (with stop strings)."""
    engine, fake = _vllm_engine(monkeypatch, tokenizer, [_vllm_output([EOS], "", "stop", [0.0])])
    engine.sleep()
    engine.refresh(tiny_model())
    engine.generate([engine.encode_prompt("hi")], n=2, max_new_tokens=4, temperature=0.9, stop=["END"])
    return fake


def test_vllm_calls_exist_in_vllm_source_with_the_keywords_passed(vllm_source, monkeypatch, tokenizer):
    version, tree = vllm_source.version, vllm_source.tree
    fake = _recorded_calls(monkeypatch, tokenizer)
    engine_args = _fields(_class(tree("vllm/engine/arg_utils.py"), "EngineArgs"))
    for callee, args, kwargs in fake.calls:
        path, cls_name, method_name = VLLM_CALLEES[callee]
        cls = _class(tree(path), cls_name)
        if method_name is None:
            accepted, positional = _fields(cls), []
        else:
            spec = _method(cls, method_name).args
            positional = [a.arg for a in spec.posonlyargs + spec.args][1:]   # self left out
            accepted = set(positional) | {a.arg for a in spec.kwonlyargs}
            if spec.kwarg is not None:
                assert callee == "LLM", f"{callee} takes **{spec.kwarg.arg}: the check would prove nothing"
                accepted |= engine_args   # LLM hands the rest to EngineArgs
        assert len(args) <= len(positional), f"vLLM {version}: {callee} takes {len(positional)} positional arguments"
        unknown = sorted(set(kwargs) - accepted)
        assert not unknown, f"vLLM {version}: {cls_name}.{method_name or '__init__'} has no keyword {unknown}"
    [llm] = fake.kwargs_of("LLM")
    for keyword, (path, alias) in VLLM_VALUES.items():
        assert llm[keyword] in _constants(tree(path), alias), \
            f"vLLM {version}: {keyword}={llm[keyword]!r} is not a {alias}"


def test_vllm_reaches_its_worker_in_process_and_knows_every_finish_reason(vllm_source, monkeypatch, tokenizer):
    version, tree = vllm_source.version, vllm_source.tree
    fake = _recorded_calls(monkeypatch, tokenizer)
    # the weight sync: LLM.collective_rpc -> the external launcher's executor, whose collective_rpc
    # runs the method on its driver worker in this process -> the wrapper hands it to the Worker
    assert fake.calls[[n for n, _, _ in fake.calls].index("collective_rpc")][1] == ("reload_weights",)
    executors = tree("vllm/v1/executor/uniproc_executor.py")
    assert "UniProcExecutor" in [b.id for b in _class(executors, "ExecutorWithExternalLauncher").bases]
    rpc = _method(_class(executors, "UniProcExecutor"), "collective_rpc")
    assert any(isinstance(c, ast.Call) and getattr(c.func, "id", "") == "run_method"
               and ast.unparse(c.args[0]) == "self.driver_worker" for c in ast.walk(rpc)), \
        f"vLLM {version}: UniProcExecutor.collective_rpc no longer runs the method in process"
    forward = _method(_class(tree("vllm/v1/worker/worker_base.py"), "WorkerWrapperBase"), "__getattr__")
    assert "self.worker" in ast.unparse(forward)
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" in ast.unparse(tree("vllm/config/parallel.py")), \
        f"vLLM {version}: the external launcher no longer turns multiprocessing off"
    # wake_up's tags are those a partial wake may name; the prompt and output fields the engine uses
    tags = _constants(tree("vllm/device_allocator/__init__.py"), "DEFERRABLE_TAGS")
    assert {t for kwargs in fake.kwargs_of("wake_up") for t in kwargs["tags"]} <= tags
    assert "prompt_token_ids" in _fields(_class(tree("vllm/inputs/llm.py"), "TokensPrompt"))
    assert {"token_ids", "logprobs", "finish_reason"} <= _fields(_class(tree("vllm/outputs.py"), "CompletionOutput"))
    assert "outputs" in [a.arg for a in _method(_class(tree("vllm/outputs.py"), "RequestOutput"), "__init__").args.args]
    assert "logprob" in _fields(_class(tree("vllm/logprobs.py"), "Logprob"))
    reasons = _constants(tree("vllm/v1/engine/__init__.py"), "FINISH_REASON_STRINGS")
    assert reasons == engines.VLLM_FINISH_REASONS.keys() | engines.VLLM_REFUSED_FINISH_REASONS.keys(), \
        f"vLLM {version} finishes with {sorted(reasons)}"


def test_vllm_source_bears_out_the_engines_memory_settings(vllm_source):
    version, tree = vllm_source.version, vllm_source.tree
    # level 2 is the level at which the worker discards the parameters rather than copy them out
    sleep = ast.unparse(_method(_class(tree("vllm/v1/worker/gpu_worker.py"), "Worker"), "sleep"))
    assert engines.VLLM_SLEEP_LEVEL == 2 and "level == 2" in sleep and "_discardable_parameters" in sleep
    # the one place vLLM caps this process's torch allocator is the extensible KV cache, which is off
    capped = []
    for folder, _, files in os.walk(os.path.join(vllm_source.root, "vllm")):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name)) as f:
                    if "set_per_process_memory_fraction" in f.read():
                        capped.append(os.path.relpath(os.path.join(folder, name), vllm_source.root))
    assert capped == ["vllm/v1/worker/extensible_kv_cache.py"], f"vLLM {version}: {capped}"
    assert engines.VLLM_SETTINGS["enable_extensible_kv_cache"] is False


# ------------------------------------------------------------------------- OpenAI engine


class _ChatHandler(http.server.BaseHTTPRequestHandler):
    requests: list = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.path, self.headers.get("Authorization"), body))
        text = body["messages"][0]["content"]
        # One choice per request whatever n says, as some servers do.
        reply = {"choices": [{"index": 0, "finish_reason": "length" if "cut" in text else "stop",
                              "message": {"role": "assistant", "content": f"echo: {text}",
                                          "reasoning_content": "Okay, thinking."}}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        return None


def test_openai_engine_against_local_server():
    _ChatHandler.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ChatHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        engine = engines.OpenAIEngine(f"http://127.0.0.1:{server.server_port}/v1", "tiny",
                                      api_key="k", max_workers=2)
        prompts = [engine.encode_prompt("héllo"), engine.encode_prompt("please cut")]
        groups = engine.generate(prompts, n=2, max_new_tokens=7, temperature=0.5, top_p=0.9, stop=["END"])
    finally:
        server.shutdown()
    assert len(_ChatHandler.requests) == 4  # n=2, one choice per reply
    path, auth, body = _ChatHandler.requests[0]
    assert path == "/v1/chat/completions" and auth == "Bearer k"
    assert (body["model"], body["n"], body["max_tokens"], body["temperature"], body["top_p"], body["stop"]) == ("tiny", 2, 7, 0.5, 0.9, ["END"])
    assert {b["messages"][0]["content"] for _, _, b in _ChatHandler.requests} == {"héllo", "please cut"}
    first = groups[0][0]
    assert first.text == "<think>\nOkay, thinking.\n</think>\necho: héllo"
    assert bytes(first.token_ids).decode() == first.text and first.logprobs is None
    assert [c.finish_reason for c in groups[0]] == ["stop", "stop"]
    assert [c.finish_reason for c in groups[1]] == ["length", "length"]



def test_template_opens_thinking_reads_the_chat_template(tokenizer):
    assert engines.template_opens_thinking(tokenizer) is False   # plain fallback template

    class QwQLike:
        chat_template = "set"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return f"<|im_start|>user\n{messages[0]['content']}<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert engines.template_opens_thinking(QwQLike()) is True




@dataclass
class FakeTask:
    task_id: str
    reference_src: str
    solutions: dict


# ------------------------------------------------------------------------- oracle


def test_oracle_answers_the_matching_task_and_corrupts_on_request():
    head = "class ModelNew:\n    src = '"
    engine = engines.OracleEngine([
        FakeTask("a", "REF A", {"cpp": head + "float* out; out[i] = in[i];'"}),
        FakeTask("b", "REF B", {"cpp": head + "y[j] = 2 * x[j];'"})], corrupt_rate=0.5, seed=3)
    groups = engine.generate([engine.encode_prompt("...REF B..."), engine.encode_prompt("REF A")],
                             n=8, max_new_tokens=10_000)
    codes_b = {summarize.parse_response(c.text).code for c in groups[0]}
    assert codes_b == {head + "y[j] = 2 * x[j];'\n", head + "y[j] = (2 * x[j]) + 1;'\n"}
    assert {summarize.parse_response(c.text).code for c in groups[1]} <= {
        head + "float* out; out[i] = in[i];'\n", head + "float* out; out[i] = (in[i]) + 1;'\n"}
    cut = engine.generate([engine.encode_prompt("REF A")], n=1, max_new_tokens=20)[0][0]
    assert cut.finish_reason == "length" and len(cut.token_ids) == 20
    with pytest.raises(ValueError, match="none of the tasks"):
        engine.generate([engine.encode_prompt("REF C")], n=1, max_new_tokens=10)



def test_corrupt_solution_changes_every_builtin_solution_and_still_passes_the_gate():
    import ast

    import kernel_gate
    import tasks as tasks_module
    for task in tasks_module.load_builtin():
        for language, source in task.solutions.items():
            corrupted = engines.corrupt_solution(source)
            changed = [(a, b) for a, b in zip(source.split("\n"), corrupted.split("\n")) if a != b]
            assert changed, (task.task_id, language)
            for before, after in changed:
                if ".x += 1;" in after:  # a float4 store: +1 on its first component
                    element = before.split("=")[0].strip()
                    assert after == f"{before} {element}.x += 1;", (before, after)
                else:
                    assert ") + 1;" in after and after.replace(") + 1;", ";").replace("(", "") == before.replace("(", ""), (before, after)
            ast.parse(corrupted)
            assert kernel_gate.check_format(corrupted, language) is None, (task.task_id, language)


@pytest.mark.slow
def test_corrupted_accumulating_solution_fails_the_harness():
    """The matmul solution writes its output only through `c[j] += ...` on a local alias of C
    (corrupt_solution raised on it before); corrupted, the harness finds it wrong."""
    import kernel_eval
    import tasks as tasks_module
    matmul = next(t for t in tasks_module.load_builtin(device="cpu") if t.task_id == "builtin/level1/09_matmul")
    corrupted = engines.corrupt_solution(matmul.solutions["cpp"])
    assert "c[j] += (aik * b[j]) + 1;" in corrupted
    (result,) = kernel_eval.evaluate_batch([(matmul.reference_src, corrupted)], device="cpu")
    assert (result.status, result.correct) == ("incorrect", False), result.message
    assert "outside tolerance" in result.message
