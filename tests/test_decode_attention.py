"""decode_attention's kernel against attention written out (float64), on the CPU through
Triton's interpreter and on CUDA.

Triton reads TRITON_INTERPRET when a kernel is defined, so on the CPU each check runs in a
fresh Python process with it set (run_interpreted); on CUDA the same checks run in this one.
"""
import os
import subprocess
import sys

import pytest
import torch

import decode_attention

pytest.importorskip("triton")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def naive(query, key, value, bias, scale):
    """softmax(q . K^T * scale + bias) V per query head, KV head h // group, in float64;
    returned as (rows, 1, q_heads, dim)."""
    group = query.shape[1] // key.shape[1]
    keys = key.double().repeat_interleave(group, 1)
    values = value.double().repeat_interleave(group, 1)
    scores = query.double() @ keys.transpose(-1, -2) * scale + bias.double()
    return (scores.softmax(-1) @ values).transpose(1, 2)


def random_case(rows, kv_heads, group, dim, length, dtype, device, seed):
    """Each row attends a span [start, end] of its cache (left padding before, unwritten
    positions after), and every third row also has a hidden hole inside its span."""
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(rows, kv_heads * group, 1, dim, generator=g).to(device, dtype)
    key, value = (torch.randn(rows, kv_heads, length, dim, generator=g).to(device, dtype) for _ in range(2))
    allowed = torch.zeros(rows, length, dtype=torch.bool)
    for r in range(rows):
        start = int(torch.randint(0, length // 2, (1,), generator=g))
        end = int(torch.randint(length // 2, length, (1,), generator=g))
        allowed[r, start:end + 1] = True
        if r % 3 == 2 and end - start > 10:
            allowed[r, start + 3:start + 8] = False
    bias = torch.zeros(rows, 1, 1, length).masked_fill(~allowed[:, None, None], decode_attention.HIDDEN_BIAS)
    return query, key, value, bias.to(device, dtype)


SHAPES = [  # rows, kv_heads, group, dim, length
    (5, 2, 6, 16, 100),    # Qwen2's grouping, a length that is not a multiple of the block
    (3, 1, 1, 8, 64),      # one head, no grouping, dim below the 16 a dot needs
    (4, 3, 4, 24, 130),    # a head dim that is not a power of 2
    (2, 2, 20, 32, 200),   # more query heads per KV head than 16
]


def check_equals_naive(device):
    dtypes = [(torch.float32, 1e-5), (torch.float16, 2e-3)]
    if device == "cuda":
        dtypes.append((torch.bfloat16, 1.6e-2))
    for dtype, atol in dtypes:
        for i, (rows, kv_heads, group, dim, length) in enumerate(SHAPES):
            query, key, value, bias = random_case(rows, kv_heads, group, dim, length, dtype, device, seed=i)
            got = decode_attention.decode_attention(query, key, value, bias, dim ** -0.5)
            want = naive(query, key, value, bias, dim ** -0.5)
            assert got.shape == (rows, 1, kv_heads * group, dim) and got.dtype == dtype
            error = (got.double() - want).abs().max().item()
            assert error < atol, (dtype, SHAPES[i], error)


def check_strided_inputs_compile_and_refusals(device):
    """The model's query is a transposed view and the cache a prefix of a longer buffer: the
    kernel follows their strides. Under torch.compile the op is one opaque call with the same
    result. A prefill's query (2 positions) is refused, with the reason."""
    rows, kv_heads, group, dim, length = 4, 2, 6, 16, 90
    query, key, value, bias = random_case(rows, kv_heads, group, dim, 128, torch.float32, device, seed=7)
    query = query.transpose(1, 2).contiguous().transpose(1, 2)          # (rows, heads, 1, dim) view
    key, value, bias = key[:, :, :length], value[:, :, :length], bias[..., :length]
    bias[..., length - 1] = 0.0                                           # every row attends something
    want = naive(query, key, value, bias, 0.3)
    got = decode_attention.decode_attention(query, key, value, bias, 0.3)
    assert (got.double() - want).abs().max().item() < 1e-5
    compiled = torch.compile(lambda q, k, v, b: decode_attention.decode_attention(q, k, v, b, 0.3) * 2)
    assert torch.allclose(compiled(query, key, value, bias), 2 * got, atol=1e-6)
    two = torch.cat([query, query], dim=2)
    try:
        decode_attention.decode_attention(two, key, value, bias, 0.3)
    except ValueError as error:
        assert "one query per row" in str(error)
    else:
        raise AssertionError("a query of 2 positions was not refused")


def check_engine_uses_kernel_with_sdpa_results(device):
    """HFEngine's fast decoder with the kernel (left-padded prompts of three lengths, n=2)
    gives the greedy tokens and the log-probs of the same decoder with SDPA, and the kernel ran
    at every decoding step of every layer (counted in Python: no CUDA graph, whose replays
    would not pass through it; tests/test_fast_decoder.py runs the graphs with the kernel)."""
    sys.path.insert(0, HERE)
    import engines
    from test_engines import tiny_model
    from transformers import ByT5Tokenizer
    tokenizer = ByT5Tokenizer()
    model = tiny_model(seed=5).to(device)
    prompts = [engines.render_prompt(tokenizer, t) for t in ("a longer prompt than x", "x", "mid size")]
    calls = []
    launch = decode_attention.launch
    decode_attention.launch = lambda *args, **kwargs: calls.append(1) or launch(*args, **kwargs)
    results = {}
    try:   # on CUDA this runs in the test process: put launch back whatever happens
        for kernel in (True, False):
            engine = engines.HFEngine(model, tokenizer, fast=True, decode_kernel=kernel, max_batch_rows=6,
                                      cuda_graph=False)
            results[kernel] = [c for g in engine.generate(prompts, n=2, max_new_tokens=12, temperature=0.0)
                               for c in g]
    finally:
        decode_attention.launch = launch
    layers = model.config.num_hidden_layers
    assert len(calls) == layers * 11                   # 12 tokens: the prefill's and 11 steps
    for with_kernel, with_sdpa in zip(results[True], results[False]):
        assert with_kernel.token_ids == with_sdpa.token_ids
        assert torch.allclose(torch.tensor(with_kernel.logprobs), torch.tensor(with_sdpa.logprobs), atol=1e-5)


CHECKS = ["check_equals_naive", "check_strided_inputs_compile_and_refusals",
          "check_engine_uses_kernel_with_sdpa_results"]


@pytest.mark.parametrize("check", CHECKS)
def test_interpreted_on_cpu(check):
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([ROOT, HERE]))
    proc = subprocess.run([sys.executable, "-c", f"import test_decode_attention as t; t.{check}('cpu')"],
                          cwd=HERE, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.gpu
@pytest.mark.parametrize("check", CHECKS)
def test_on_cuda(check):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    globals()[check]("cuda")
