"""Tests for rollout.py: engines (HF on a tiny random model, OpenAI over a local HTTP server,
oracle, vLLM weight sync against a fake LLM), FSDP2 generation on CPU, the multi-turn rollout
and its samples; and one slow end-to-end run on real C++ kernels with the oracle engine."""
import http.server
import json
import math
import os
import socket
import threading
from dataclasses import dataclass

import pytest
import torch
import torch.multiprocessing as mp

import rollout
import summarize

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


def test_hf_ids_exact_cut_at_eos_and_logprobs_match_unpadded_forward(tokenizer):
    model = tiny_model(eos_logit=2.0)
    engine = rollout.HFEngine(model, tokenizer, max_batch_rows=5)
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


def test_hf_greedy_batch_with_left_padding_equals_one_at_a_time(tokenizer):
    model = tiny_model(seed=3)
    engine = rollout.HFEngine(model, tokenizer, max_batch_rows=8)
    prompts = [engine.encode_prompt(t) for t in ("x", "a longer prompt than x", "mid size")]
    batched = engine.generate(prompts, n=1, max_new_tokens=12, temperature=0.0)
    for prompt, group in zip(prompts, batched):
        alone = engine.generate([prompt], n=1, max_new_tokens=12, temperature=0.0)[0][0]
        assert group[0].token_ids == alone.token_ids


def test_hf_stop_string_ends_completion_at_first_occurrence(tokenizer):
    model = tiny_model(seed=5, favoured={byte_id("Z"): 2.5})
    engine = rollout.HFEngine(model, tokenizer)
    torch.manual_seed(0)
    groups = engine.generate([engine.encode_prompt("go")], n=6, max_new_tokens=40,
                             temperature=1.0, stop=("Z",))
    stopped = [c for c in groups[0] if c.finish_reason == "stop" and c.token_ids[-1] != EOS]
    assert stopped, "the favoured stop character should end some completions"
    for c in stopped:
        assert c.token_ids[-1] == byte_id("Z") and byte_id("Z") not in c.token_ids[:-1]
        assert len(c.logprobs) == len(c.token_ids)


def test_render_prompt_falls_back_without_chat_template(tokenizer):
    ids = rollout.render_prompt(tokenizer, "hé")
    assert tokenizer.decode(ids) == rollout.PLAIN_CHAT_TEMPLATE.format(prompt="hé")
    assert EOS not in ids  # no special tokens added behind the template's back


# ------------------------------------------------------------------------- FSDP2 on CPU


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fsdp_worker(rank: int, world: int, port: int, device_type: str, results):
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
        prompt = rollout.render_prompt(tokenizer, ["short", "a different prompt"][rank % 2])
        max_new = 6 + 7 * rank
        got = rollout.HFEngine(model, tokenizer).generate([prompt], n=1, max_new_tokens=max_new, temperature=0.0)
        want = rollout.HFEngine(reference, tokenizer).generate([prompt], n=1, max_new_tokens=max_new, temperature=0.0)
        resharded = all(isinstance(p, DTensor) for p in model.parameters())
        full = dict(rollout.iter_full_weights(model))
        weights_equal = all(torch.equal(full[k], v) for k, v in reference.state_dict().items())
        ids = torch.tensor([[5, 6, 7, 8]], device=device)
        loss = model(ids, labels=ids).loss
        loss.backward()
        results[rank] = (got[0][0].token_ids == want[0][0].token_ids, resharded, weights_equal,
                         math.isfinite(float(loss.detach())))
    finally:
        dist.destroy_process_group()


def _run_fsdp_ranks(world: int, device_type: str) -> dict:
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_fsdp_worker, args=(world, _free_port(), device_type, results), nprocs=world)
    return dict(results)


@pytest.mark.slow
def test_fsdp2_generation_on_two_gloo_ranks():
    # (same tokens as the unsharded model, params sharded again, full weights, training works)
    assert _run_fsdp_ranks(2, "cpu") == {0: (True, True, True, True), 1: (True, True, True, True)}


@pytest.mark.gpu
def test_fsdp2_generation_on_two_cuda_ranks():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    assert _run_fsdp_ranks(2, "cuda") == {0: (True, True, True, True), 1: (True, True, True, True)}


@pytest.mark.gpu
def test_hf_engine_on_cuda_matches_unpadded_forward(tokenizer):
    model = tiny_model(eos_logit=2.0).cuda()
    engine = rollout.HFEngine(model, tokenizer)
    prompts = [engine.encode_prompt("hi"), engine.encode_prompt("a much longer prompt, padded less")]
    torch.manual_seed(1)
    groups = engine.generate(prompts, n=4, max_new_tokens=24, temperature=0.8, top_p=0.9)
    for prompt, group in zip(prompts, groups):
        for c in group:
            with torch.no_grad():
                logits = model(torch.tensor([prompt + c.token_ids], device="cuda")).logits[0].float().cpu()
            steps = logits[len(prompt) - 1:len(prompt) - 1 + len(c.token_ids)] / 0.8
            expected = naive_top_p(steps, 0.9).log_softmax(-1)
            expected = expected.gather(1, torch.tensor(c.token_ids)[:, None]).squeeze(1)
            assert torch.allclose(torch.tensor(c.logprobs), expected, atol=1e-3)
            if c.finish_reason == "stop":
                assert c.token_ids[-1] == EOS and EOS not in c.token_ids[:-1]


# ------------------------------------------------------------------------- vLLM pieces


def test_vllm_weight_name_strips_wrappers():
    assert rollout.vllm_weight_name("_orig_mod.model.layers.0.mlp.up_proj.weight") == "model.layers.0.mlp.up_proj.weight"
    assert rollout.vllm_weight_name("model._fsdp_wrapped_module.layers.1._checkpoint_wrapped_module.self_attn.q_proj.weight") == "model.layers.1.self_attn.q_proj.weight"
    assert rollout.vllm_weight_name("module.lm_head.weight") == "lm_head.weight"
    assert rollout.vllm_weight_name("model.embed_tokens.weight") == "model.embed_tokens.weight"


class _FakeVLLMModel:
    def __init__(self, log):
        self.log = log

    def load_weights(self, weights):
        weights = list(weights)
        self.log.append(("load", [(n, t.clone()) for n, t in weights]))


class _FakeLLM:
    """Only the attributes sync_weights_into touches, in vLLM's V1 layout."""

    def __init__(self):
        self.log = []
        runner = type("Runner", (), {"model": _FakeVLLMModel(self.log)})()
        worker = type("Worker", (), {"model_runner": None, "worker": type("W", (), {"model_runner": runner})()})()
        executor = type("Executor", (), {"driver_worker": worker})()
        self.llm_engine = type("Engine", (), {"model_executor": executor})()

    def reset_prefix_cache(self):
        self.log.append(("reset", None))


def test_sync_weights_streams_full_tensors_one_at_a_time_then_resets_cache():
    inner = tiny_model(seed=2)
    wrapped = torch.nn.Module()
    wrapped._orig_mod = inner  # what torch.compile's wrapper looks like
    llm = _FakeLLM()
    sent = rollout.sync_weights_into(llm, wrapped)
    expected = inner.state_dict()
    loads = [entry for kind, entry in llm.log if kind == "load"]
    assert sent == len(expected) == len(loads)
    assert all(len(batch) == 1 for batch in loads)
    assert llm.log[-1] == ("reset", None) and [k for k, _ in llm.log].count("reset") == 1
    for (name, tensor), in loads:
        assert torch.equal(tensor, expected[name])


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
        engine = rollout.OpenAIEngine(f"http://127.0.0.1:{server.server_port}/v1", "tiny",
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


# ------------------------------------------------------------------------- the rollout


@dataclass
class FakeTask:
    task_id: str
    reference_src: str
    solutions: dict


TASK_A = FakeTask("t/a", "class Model:  # task A\n    pass\n", {"cpp": "A"})
TASK_B = FakeTask("t/b", "class Model:  # task B\n    pass\n", {"cpp": "B"})


def response(thinking: str, code: str | None, summary: str) -> str:
    body = f"```python\n{code}\n```\n" if code is not None else ""
    return f"<think>\n{thinking}\n</think>\n{body}{summary}"


def kernel(tag: str) -> str:
    # Enough to pass rewards.check_format for cpp: a load_inline kernel and ModelNew.
    return ("import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"
            f"src = 'torch::Tensor f(torch::Tensor x) {{ return x; }} // {tag}'\n"
            "ext = load_inline(name='e', cpp_sources=src, functions=['f'])\n"
            "class ModelNew(nn.Module):\n    def forward(self, x):\n        return ext.f(x)\n")


class ScriptedEngine:
    """Answers from a script keyed by (task marker, trajectory order, turn); ids from the
    real ByT5 tokenizer, EOS appended as a sampled token, so masks can be checked."""

    def __init__(self, tokenizer, script, truncate_at=None):
        self.tokenizer, self.script, self.truncate_at = tokenizer, script, truncate_at
        self.turn, self.calls = 0, []
        self.prompt_opens_thinking = True   # as QwQ's template, which ends the prompt in <think>

    def encode_prompt(self, text):
        return rollout.render_prompt(self.tokenizer, text)

    def count_tokens(self, text):
        return len(self.tokenizer(text, add_special_tokens=False).input_ids)

    def generate(self, prompt_token_ids, *, n, max_new_tokens, temperature, top_p, stop):
        self.calls.append((len(prompt_token_ids), n))
        out, seen = [], {}
        for ids in prompt_token_ids:
            task = "A" if "task A" in self.tokenizer.decode(ids) else "B"
            group = []
            for _ in range(n):
                k = seen.get(task, 0)
                seen[task] = k + 1
                text = self.script[(task, k, self.turn)]
                ids_out = self.tokenizer(text, add_special_tokens=False).input_ids + [EOS]
                finish = "stop"
                if self.truncate_at is not None and len(ids_out) > self.truncate_at:
                    ids_out, finish = ids_out[:self.truncate_at], "length"
                group.append(rollout.Completion(ids_out, None, self.tokenizer.decode(ids_out, skip_special_tokens=True), finish))
            out.append(group)
        self.turn += 1
        return out


def fake_evaluator(verdicts):
    """Verdict by the tag in the code's source; records every batch it was given."""
    batches = []

    def evaluate_batch(pairs):
        batches.append(pairs)
        out = []
        for _, code in pairs:
            tag = code.split("// ")[1].split("'")[0]
            status, speedup = verdicts[tag]
            out.append({"status": status, "correct": status == "correct", "compiled": True,
                        "speedup": speedup, "ref_ms": 1.0, "candidate_ms": 1.0,
                        "message": f"verdict for {tag}"})
        return out
    return evaluate_batch, batches


def test_rollout_samples_prompts_returns_and_stats(tokenizer):
    script = {}
    for task in "AB":
        script[(task, 0, 0)] = response("Okay, plan A0.", kernel(f"{task}00"), f"summary {task}00")
        script[(task, 0, 1)] = response("SECRET thinking.", kernel(f"{task}01"), f"summary {task}01")
        script[(task, 0, 2)] = response("Okay.", kernel(f"{task}02"), f"summary {task}02")
        script[(task, 1, 0)] = response("Hmm, no code this time.", None, "forgot the code")
        script[(task, 1, 1)] = response("Okay.", kernel(f"{task}11"), f"summary {task}11")
        script[(task, 1, 2)] = response("Okay.", kernel(f"{task}12"), f"summary {task}12")
    verdicts = {}
    for task in "AB":
        verdicts.update({f"{task}00": ("correct", 1.0), f"{task}01": ("incorrect", 0.0),
                         f"{task}02": ("correct", 2.0), f"{task}11": ("compile_error", 0.0),
                         f"{task}12": ("correct", 0.5)})
    engine = ScriptedEngine(tokenizer, script)
    evaluate_batch, batches = fake_evaluator(verdicts)
    config = rollout.RolloutConfig(n_trajectories=2, n_turns=3, max_new_tokens=4096,
                                   max_prompt_tokens=100_000, language="cpp")
    samples, stats = rollout.rollout([TASK_A, TASK_B], engine, evaluate_batch, config)

    # One batched generate per turn; turn 0 sends each task's prompt once with n=G.
    assert engine.calls == [(2, 2), (4, 1), (4, 1)]
    # One batched harness call per turn, without the response that had no code.
    assert [len(b) for b in batches] == [2, 4, 4]
    assert len(samples) == 2 * 2 * 3
    by_key = {(s.task_id, s.trajectory, s.turn): s for s in samples}
    for s in samples:
        assert s.input_ids == s.prompt_ids + s.completion_ids
        assert s.loss_mask == [0] * len(s.prompt_ids) + [1] * len(s.completion_ids)
        assert s.completion_ids[-1] == EOS and not s.truncated
        assert tokenizer.decode(s.completion_ids, skip_special_tokens=True) == s.text
    # Returns, by hand: scores of trajectory 0 are 1.3, 0, 2.3; gamma 0.4, sum.
    r = [by_key[("t/a", 0, t)].discounted_return for t in range(3)]
    assert r == pytest.approx([1.3 + 0.4 * 0.92, 0.92, 2.3])
    # Trajectory 1: no code (format_error, 0), compile error (0), correct at 0.5x (0.8).
    s10 = by_key[("t/b", 1, 0)]
    assert (s10.status, s10.score, s10.code) == ("format_error", 0.0, None)
    assert [by_key[("t/b", 1, t)].discounted_return for t in range(3)] == pytest.approx([0.128, 0.32, 0.8])
    # Turn 2's prompt shows turn 1's code, summary and feedback, and none of its thinking.
    prompt = tokenizer.decode(by_key[("t/a", 0, 2)].prompt_ids)
    turn1 = by_key[("t/a", 0, 1)]
    assert kernel("A01").strip() in prompt and "summary A01" in prompt
    assert turn1.feedback in prompt and "verdict for A01" in turn1.feedback
    assert "SECRET" not in prompt and "plan A0" not in prompt
    assert "task A" in prompt and "task B" not in prompt
    # Per-turn stats.
    assert stats[0]["status_counts"] == {"correct": 2, "format_error": 2}
    assert stats[0]["mean_score"] == pytest.approx(1.3 / 2)
    assert stats[0]["not_okay_ratio"] == pytest.approx(0.5)   # the "Hmm" responses
    assert stats[1]["not_okay_ratio"] == pytest.approx(0.5)   # the "SECRET" ones
    assert stats[2]["best_speedup"] == 2.0 and stats[2]["correct_rate"] == 1.0


def test_rollout_drops_a_task_whose_reference_failed_and_reports_it(tokenizer):
    # Task B's reference fails in the harness at turn 0 (kernel_eval's "reference_error"): its
    # candidates are not judged again, none of its samples is trained on (a group of zeros would
    # teach the policy that every answer to B is bad), the stats name it, on_turn still shows it.
    script = {}
    for task in "AB":
        for g in range(2):
            for t in range(2):
                script[(task, g, t)] = response("Okay.", kernel(f"{task}{g}{t}"), f"summary {task}{g}{t}")
    verdicts = {f"A{g}{t}": ("correct", 1.0) for g in range(2) for t in range(2)}
    verdicts.update({f"B{g}{t}": ("reference_error", 0.0) for g in range(2) for t in range(2)})
    engine = ScriptedEngine(tokenizer, script)
    evaluate_batch, batches = fake_evaluator(verdicts)
    config = rollout.RolloutConfig(n_trajectories=2, n_turns=2, max_new_tokens=4096,
                                   max_prompt_tokens=100_000, language="cpp")
    seen = []
    samples, stats = rollout.rollout([TASK_A, TASK_B], engine, evaluate_batch, config,
                                     on_turn=lambda turn, ss: seen.extend(ss))
    assert {s.task_id for s in samples} == {"t/a"} and len(samples) == 2 * 2
    assert [len(b) for b in batches] == [4, 2]  # turn 1 does not send B's candidates again
    assert [st["reference_error_tasks"] for st in stats] == [["t/b"], ["t/b"]]
    assert stats[0]["status_counts"] == {"correct": 2, "reference_error": 2}
    b_seen = [s for s in seen if s.task_id == "t/b"]
    assert len(b_seen) == 4 and all(s.status == "reference_error" and s.score == 0.0 for s in b_seen)
    assert "reference failed" in b_seen[0].feedback


def test_rollout_keeps_truncated_completions_and_collates_without_masking_by_pad(tokenizer):
    script = {(t, k, turn): response("Okay, " + "long " * 40, kernel(f"{t}{k}{turn}"), "s")
              for t in "AB" for k in range(2) for turn in range(2)}
    engine = ScriptedEngine(tokenizer, script, truncate_at=50)
    evaluate_batch, batches = fake_evaluator({})
    for mask_truncated in (False, True):
        engine.turn = 0
        config = rollout.RolloutConfig(n_trajectories=2, n_turns=2, max_new_tokens=50,
                                       max_prompt_tokens=100_000, language="cpp",
                                       mask_truncated=mask_truncated)
        samples, stats = rollout.rollout([TASK_A, TASK_B], engine, evaluate_batch, config)
        assert not batches  # cut inside the thinking: nothing to evaluate
        for s in samples:
            assert s.truncated and len(s.completion_ids) == 50
            assert (s.status, s.score) == ("format_error", 0.0)
            assert s.loss_mask == [0] * len(s.prompt_ids) + [0 if mask_truncated else 1] * 50
        assert stats[0]["truncated_rate"] == 1.0

    # Collation: pad id equal to EOS; a completion's own final EOS stays in the loss.
    short = rollout.Sample("t", 0, 0, [5, 6], [7, EOS], [0, 0, 1, 1], None, "", False,
                           "correct", 1.3, 1.3, 1.0, "", "")
    long = rollout.Sample("t", 1, 0, [5, 6, 7], [8, 9, 10, EOS], [0, 0, 0, 1, 1, 1, 1], None,
                          "", False, "correct", 0.3, 0.3, 0.0, "", "")
    batch = rollout.collate_samples([short, long], pad_token_id=EOS)
    assert batch["input_ids"].tolist() == [[5, 6, 7, EOS, EOS, EOS, EOS], [5, 6, 7, 8, 9, 10, EOS]]
    assert batch["loss_mask"].tolist() == [[0, 0, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1, 1]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 1, 0, 0, 0], [1] * 7]


def test_rollout_with_tiny_hf_model_end_to_end(tokenizer):
    """Random text: nothing parses, nothing is evaluated, every sample still has exact
    prompt/completion ids and masks, and truncated ones are marked."""
    model = tiny_model(seed=11, eos_logit=2.0)
    engine = rollout.HFEngine(model, tokenizer)
    evaluate_batch, batches = fake_evaluator({})
    config = rollout.RolloutConfig(n_trajectories=2, n_turns=2, max_new_tokens=16,
                                   max_prompt_tokens=100_000, language="cpp", temperature=1.0)
    torch.manual_seed(0)
    samples, stats = rollout.rollout([TASK_A, TASK_B], engine, evaluate_batch, config)
    assert len(samples) == 8 and not batches
    for s in samples:
        assert s.status == "format_error" and s.score == 0.0 and s.discounted_return == 0.0
        assert s.loss_mask == [0] * len(s.prompt_ids) + [1] * len(s.completion_ids)
        assert s.truncated == (len(s.completion_ids) == 16 and s.completion_ids[-1] != EOS)
        assert len(s.logprobs) == len(s.completion_ids)
        prompt = tokenizer.decode(s.prompt_ids)
        assert prompt.startswith("User: ") and prompt.endswith("Assistant: ")
        assert ("task A" in prompt) == (s.task_id == "t/a")
    turn2_prompt = tokenizer.decode(samples[1].prompt_ids)
    assert "Attempt 1:" in turn2_prompt and samples[0].feedback in turn2_prompt
    assert stats[1]["mean_response_tokens"] == pytest.approx(
        sum(len(s.completion_ids) for s in samples if s.turn == 1) / 4)


def test_rollout_refuses_an_empty_task_list(tokenizer):
    engine = ScriptedEngine(tokenizer, {})
    with pytest.raises(ValueError, match="task list is empty"):
        rollout.rollout([], engine, fake_evaluator({})[0], rollout.RolloutConfig(language="cpp"))


def test_rollout_takes_no_code_from_a_completion_cut_inside_thinking_the_template_opened(tokenizer):
    # The template opened <think>; the completion is all reasoning with a draft kernel in it.
    script = {(t, 0, 0): f"Okay, a draft:\n```python\n{kernel(t)}\n```\nstill thinking" for t in "AB"}
    engine = ScriptedEngine(tokenizer, script)
    evaluate_batch, batches = fake_evaluator({"A": ("correct", 1.0), "B": ("correct", 1.0)})
    config = rollout.RolloutConfig(n_trajectories=1, n_turns=1, max_new_tokens=4096,
                                   max_prompt_tokens=100_000, language="cpp")
    open_samples, _ = rollout.rollout([TASK_A, TASK_B], engine, evaluate_batch, config)
    assert batches == [] and {s.status for s in open_samples} == {"format_error"}
    assert all("</think>" in s.feedback for s in open_samples)
    engine.prompt_opens_thinking, engine.turn = False, 0   # a template that does not open it
    closed_samples, _ = rollout.rollout([TASK_A, TASK_B], engine, evaluate_batch, config)
    assert {s.status for s in closed_samples} == {"correct"}


def test_template_opens_thinking_reads_the_chat_template(tokenizer):
    assert rollout.template_opens_thinking(tokenizer) is False   # plain fallback template

    class QwQLike:
        chat_template = "set"

        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            return f"<|im_start|>user\n{messages[0]['content']}<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert rollout.template_opens_thinking(QwQLike()) is True


# ------------------------------------------------------------------------- oracle


def test_oracle_answers_the_matching_task_and_corrupts_on_request():
    head = "class ModelNew:\n    src = '"
    engine = rollout.OracleEngine([
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


def test_oracle_mixed_engine_writes_oracle_answers_in_policy_tokens(tokenizer):
    solution = {"t/a": kernel("A"), "t/b": kernel("B")}
    tasks_ = [FakeTask(t.task_id, t.reference_src, {"cpp": solution[t.task_id]}) for t in (TASK_A, TASK_B)]
    policy = ScriptedEngine(tokenizer, {(t, k, 0): "policy text" for t in "AB" for k in range(8)})
    policy.prompt_opens_thinking = False
    prompts = [policy.encode_prompt(f"solve {t.reference_src}") for t in tasks_]
    for share, want_oracle in ((0.0, 0), (1.0, 16)):
        policy.turn = 0
        engine = rollout.OracleMixedEngine(policy, tokenizer, tasks_, oracle_share=share, language="cpp")
        groups = engine.generate(prompts, n=8, max_new_tokens=100_000)
        oracle = [c for g in groups for c in g if c.logprobs is None and c.text != "policy text"]
        assert len(oracle) == want_oracle
    policy.turn = 0
    engine = rollout.OracleMixedEngine(policy, tokenizer, tasks_, oracle_share=0.5, language="cpp", seed=2)
    groups = engine.generate(prompts, n=8, max_new_tokens=100_000)
    for task, group in zip(tasks_, groups):
        kinds = {c.text == "policy text" for c in group}
        assert kinds == {True, False}   # both kinds in each group at seed 2
        for c in group:
            if c.text == "policy text":
                continue
            # the oracle's text in the policy's own tokens, ended by EOS; parses to the solution
            assert c.token_ids == tokenizer(c.text, add_special_tokens=False).input_ids + [EOS]
            assert summarize.parse_response(c.text).code.strip() == task.solutions["cpp"].strip()
            assert c.finish_reason == "stop"
    cut = rollout.OracleMixedEngine(policy, tokenizer, tasks_, oracle_share=1.0, language="cpp")
    short = cut.generate(prompts[:1], n=1, max_new_tokens=12)[0][0]
    assert (short.finish_reason, len(short.token_ids)) == ("length", 12)
    with pytest.raises(ValueError, match="oracle_share"):
        rollout.OracleMixedEngine(policy, tokenizer, tasks_, oracle_share=1.5, language="cpp")


@pytest.mark.slow
@pytest.mark.parametrize("language,device", [
    ("cpp", "cpu"), pytest.param("cuda", "cuda", marks=pytest.mark.gpu)])
def test_oracle_rollout_on_real_kernels(language, device):
    """2 tasks x 2 trajectories x 2 turns through the real harness (C++ on CPU, CUDA on a
    GPU): correct solutions score > 0, corrupted ones (wrong output) score 0."""
    import kernel_eval
    import tasks as tasks_module
    wanted = ("builtin/level1/01_relu", "builtin/level2/06_bias_tanh_multiply")
    builtin = [t for t in tasks_module.load_builtin() if t.task_id in wanted]
    assert [t.task_id for t in builtin] == list(wanted)
    # seed 1 with rate 0.5 gives both kinds in these 8 answers.
    engine = rollout.OracleEngine(builtin, language=language, corrupt_rate=0.5, seed=1)

    def evaluate_batch(pairs):
        return kernel_eval.evaluate_batch(pairs, device=device)

    config = rollout.RolloutConfig(n_trajectories=2, n_turns=2, max_new_tokens=100_000,
                                   max_prompt_tokens=100_000, language=language)
    samples, stats = rollout.rollout(builtin, engine, evaluate_batch, config)
    assert len(samples) == 8
    solution = {t.task_id: summarize.parse_response(
        rollout.ORACLE_RESPONSE.format(code=t.solutions[language].strip("\n"), summary="")).code
        for t in builtin}
    seen = [(s.code != solution[s.task_id], s.status, s.score, s.feedback[:300]) for s in samples]
    assert {corrupted for corrupted, *_ in seen} == {True, False}, seen
    for corrupted, status, score, _ in seen:
        if corrupted:
            # "+1" on a float4 store does not compile in CUDA: the relu kernel's corruption
            # is a compile error there, a wrong value everywhere else.
            allowed = {"incorrect", "compile_error"} if language == "cuda" else {"incorrect"}
            assert status in allowed and score == 0.0, seen
        else:
            assert status == "correct" and score > 0.3 - 1e-9, seen
    for task in builtin:
        for g in range(2):
            s0, s1 = sorted((s for s in samples if s.task_id == task.task_id and s.trajectory == g),
                            key=lambda s: s.turn)
            assert s1.discounted_return == pytest.approx(s1.score)
            assert s0.discounted_return == pytest.approx(s0.score + 0.4 * s1.score)
    assert sum(st["status_counts"].get("correct", 0) for st in stats) == sum(
        s.code == solution[s.task_id] for s in samples)


def test_rollout_continues_from_histories_at_a_turn_offset_and_reports_each_turn(tokenizer):
    script = {}
    for task in "AB":
        for k in range(2):
            for turn in range(3):
                script[(task, k, turn)] = response("Okay.", kernel(f"{task}{k}{turn}"), f"summary {task}{k}{turn}")
    verdicts = {f"{t}{k}{turn}": (("correct", 1.5) if (k + turn) % 2 == 0 else ("incorrect", 0.0))
                for t in "AB" for k in range(2) for turn in range(3)}
    config = rollout.RolloutConfig(n_trajectories=2, n_turns=3, max_new_tokens=4096,
                                   max_prompt_tokens=100_000, language="cpp")
    seen = []
    whole, _ = rollout.rollout([TASK_A, TASK_B], ScriptedEngine(tokenizer, script),
                               fake_evaluator(verdicts)[0], config,
                               on_turn=lambda turn, samples: seen.append((turn, samples)))
    # The callback: once per turn, as judged, with that turn's samples and the verdict fields.
    assert [turn for turn, _ in seen] == [0, 1, 2]
    for turn, samples in seen:
        assert [(s.task_id, s.trajectory, s.turn) for s in samples] == [
            (t, k, turn) for t in ("t/a", "t/b") for k in range(2)]
        assert all(math.isnan(s.discounted_return) for s in samples)
    first = seen[0][1][0]
    assert (first.correct, first.ref_ms, first.candidate_ms, first.timing_ok) == (True, 1.0, 1.0, True)
    assert (first.message, first.summary) == ("verdict for A00", "summary A00")
    assert [s.correct for s in whole] == [s.status == "correct" for s in whole]

    # The first turn alone, then the other two from its histories at turn offset 1.
    head, _ = rollout.rollout([TASK_A, TASK_B], ScriptedEngine(tokenizer, script),
                              fake_evaluator(verdicts)[0], rollout.RolloutConfig(
                                  **{**config.__dict__, "n_turns": 1}))
    histories = [[summarize.Attempt(s.code or "", s.summary, s.feedback)] for s in head]
    engine = ScriptedEngine(tokenizer, script)
    engine.turn = 1
    tail, stats = rollout.rollout([TASK_A, TASK_B], engine, fake_evaluator(verdicts)[0],
                                  rollout.RolloutConfig(**{**config.__dict__, "n_turns": 2}),
                                  histories=histories, start_turn=1)
    assert engine.calls == [(4, 1), (4, 1)]   # continued trajectories: one prompt each
    assert [st["turn"] for st in stats] == [1, 2]
    later = [s for s in whole if s.turn >= 1]
    key = lambda s: (s.task_id, s.trajectory, s.turn)  # noqa: E731
    assert sorted(map(key, tail)) == sorted(map(key, later))
    by_key = {key(s): s for s in tail}
    for s in later:
        t = by_key[key(s)]
        assert (t.prompt_ids, t.completion_ids, t.status, t.score) == (s.prompt_ids, s.completion_ids, s.status, s.score)
    with pytest.raises(ValueError, match="3 histories for 2 tasks x 2 trajectories"):
        rollout.rollout([TASK_A, TASK_B], engine, fake_evaluator(verdicts)[0], config, histories=histories[:3])


def test_corrupt_solution_changes_every_builtin_solution_and_still_passes_the_gate():
    import ast

    import rewards
    import tasks as tasks_module
    for task in tasks_module.load_builtin():
        for language, source in task.solutions.items():
            corrupted = rollout.corrupt_solution(source)
            changed = [(a, b) for a, b in zip(source.split("\n"), corrupted.split("\n")) if a != b]
            assert changed, (task.task_id, language)
            for before, after in changed:
                assert ") + 1;" in after and after.replace(") + 1;", ";").replace("(", "") == before.replace("(", ""), (before, after)
            ast.parse(corrupted)
            assert rewards.check_format(corrupted, language) is None, (task.task_id, language)


@pytest.mark.slow
def test_corrupted_accumulating_solution_fails_the_harness():
    """The matmul solution writes its output only through `c[j] += ...` on a local alias of C
    (corrupt_solution raised on it before); corrupted, the harness finds it wrong."""
    import kernel_eval
    import tasks as tasks_module
    matmul = next(t for t in tasks_module.load_builtin() if t.task_id == "builtin/level1/09_matmul")
    corrupted = rollout.corrupt_solution(matmul.solutions["cpp"])
    assert "c[j] += (aik * b[j]) + 1;" in corrupted
    (result,) = kernel_eval.evaluate_batch([(matmul.reference_src, corrupted)], device="cpu")
    assert (result.status, result.correct) == ("incorrect", False), result.message
    assert "outside tolerance" in result.message
