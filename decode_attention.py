"""Decoding attention: one new query per row against that row's KV cache, in one Triton kernel.

At each decoding step every row (one trajectory) has a single new query per head, and
attends to the keys and values it has cached:

    out_h = softmax(q_h . K^T * scale + bias) V          over the row's cache positions

with grouped-query heads (GQA): query head h reads KV head h // group. The additive `bias` is
0 where a key is attended and HIDDEN_BIAS (or lower) where it is hidden: the left padding of
a short prompt, and the cache positions not written yet. At large batches this read of the
cache is the largest part of a decoding step, and a memory-bound one, so the kernel's measure
is the bandwidth it reaches (bench/attention.py; docs/PERFORMANCE.md). It is FlashAttention's
decoding loop (Dao et al., 2022; "Flash-Decoding", 2023) written for this case:

  - one program per (row, KV head) holds the `group` query heads of that KV head as the rows of
    one tile (padded to the 16 rows a tensor-core dot needs), so each key and value is read
    from memory once per step, not once per query head;
  - it first reads the row's mask (2 bytes per position) to find the first and last attended
    position, and streams only the K and V blocks between them: a short prompt's padding and
    the unwritten end of the cache cost no reads;
  - the softmax is computed online (a running max and sum per query head, in float32), so the
    scores are never written to memory.

`decode_attention` takes and returns SDPA's layout and is a torch custom op, so torch.compile
and CUDA graphs treat it as one opaque call. It runs where Triton runs (CUDA; Triton's CPU
interpreter for the tests, `TRITON_INTERPRET=1`, which has no bfloat16).
"""
import os

import torch

try:
    import triton
    import triton.language as tl
except ImportError:   # no Triton here (not on PyPI for macOS; CPU builds of torch do not bring it)
    triton = None

# A key whose bias is at or below this is hidden (fast_decoder.MASKED_SCORE, float16's minimum):
# its softmax weight, exp(score + bias - max), is exactly 0 in float32 for any real score.
HIDDEN_BIAS = torch.finfo(torch.float16).min
# Triton's interpreter runs kernels on the CPU (numpy), for the tests
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def available(query: torch.Tensor) -> bool:
    """Whether decode_attention can run on `query`'s device here."""
    return triton is not None and (query.is_cuda or INTERPRETED)


if triton is not None:
    @triton.jit
    def _decode_attention_kernel(
            Q, K, V, Bias, Out, scale, length,
            stride_qb, stride_qh, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
            stride_bb, stride_ob, stride_oh,
            GROUP: tl.constexpr, GROUP_ROWS: tl.constexpr, DIM: tl.constexpr, DIM_PAD: tl.constexpr,
            BLOCK_N: tl.constexpr, HIDDEN: tl.constexpr, PRECISION: tl.constexpr):
        row = tl.program_id(0)
        kv_head = tl.program_id(1)
        heads = kv_head * GROUP + tl.arange(0, GROUP_ROWS)
        head_ok = tl.arange(0, GROUP_ROWS) < GROUP
        dims = tl.arange(0, DIM_PAD)
        dim_ok = dims < DIM
        q = tl.load(Q + row * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                    mask=head_ok[:, None] & dim_ok[None, :], other=0.0)

        # The attended span [first, last] of this row, from its mask alone.
        first = length
        last = length * 0 - 1
        for n in range(0, length, BLOCK_N):
            keys = n + tl.arange(0, BLOCK_N)
            bias = tl.load(Bias + row * stride_bb + keys, mask=keys < length, other=HIDDEN).to(tl.float32)
            seen = bias > HIDDEN
            first = tl.minimum(first, tl.min(tl.where(seen, keys, length), axis=0))
            last = tl.maximum(last, tl.max(tl.where(seen, keys, -1), axis=0))

        running_max = tl.full((GROUP_ROWS,), float("-inf"), dtype=tl.float32)
        running_sum = tl.zeros((GROUP_ROWS,), dtype=tl.float32)
        acc = tl.zeros((GROUP_ROWS, DIM_PAD), dtype=tl.float32)
        k_base = K + row * stride_kb + kv_head * stride_kh
        v_base = V + row * stride_vb + kv_head * stride_vh
        for n in range(first // BLOCK_N * BLOCK_N, last + 1, BLOCK_N):
            keys = n + tl.arange(0, BLOCK_N)
            in_span = (keys >= first) & (keys <= last)
            k = tl.load(k_base + keys[:, None] * stride_kn + dims[None, :],
                        mask=in_span[:, None] & dim_ok[None, :], other=0.0)
            bias = tl.load(Bias + row * stride_bb + keys, mask=in_span, other=HIDDEN).to(tl.float32)
            scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale + bias[None, :]
            scores = tl.where(in_span[None, :], scores, float("-inf"))
            block_max = tl.maximum(running_max, tl.max(scores, axis=1))
            rescale = tl.exp(running_max - block_max)
            weights = tl.exp(scores - block_max[:, None])
            running_sum = running_sum * rescale + tl.sum(weights, axis=1)
            v = tl.load(v_base + keys[:, None] * stride_vn + dims[None, :],
                        mask=in_span[:, None] & dim_ok[None, :], other=0.0)
            acc = acc * rescale[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=PRECISION)
            running_max = block_max

        # A row with no attended key (not one a decoder makes) gets zeros, not 0 / 0.
        out = acc / tl.maximum(running_sum, 1e-30)[:, None]
        tl.store(Out + row * stride_ob + heads[:, None] * stride_oh + dims[None, :],
                 out.to(Out.dtype.element_ty), mask=head_ok[:, None] & dim_ok[None, :])


def launch(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor, scale: float,
           *, block_n: int = 32, num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """decode_attention's work, with the kernel's tile size and launch settings exposed for
    bench/attention.py; the defaults are the fastest measured there."""
    rows, q_heads, q_len, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    if q_len != 1 or q_heads % kv_heads or bias.shape[-1] != length or bias.stride(-1) != 1:
        raise ValueError(f"decode_attention: query {tuple(query.shape)}, key {tuple(key.shape)}, "
                         f"bias {tuple(bias.shape)}: one query per row, heads in groups, a bias per key")
    if query.stride(-1) != 1 or key.stride(-1) != 1 or value.stride(-1) != 1:
        raise ValueError("decode_attention: the head dimension must be contiguous")
    group = q_heads // kv_heads
    out = query.new_empty(rows, 1, q_heads, dim)
    _decode_attention_kernel[(rows, kv_heads)](
        query, key, value, bias, out, scale, length,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), key.stride(2),
        value.stride(0), value.stride(1), value.stride(2), bias.stride(0), out.stride(0), out.stride(2),
        GROUP=group, GROUP_ROWS=max(16, triton.next_power_of_2(group)), DIM=dim,
        DIM_PAD=max(16, triton.next_power_of_2(dim)), BLOCK_N=block_n, HIDDEN=HIDDEN_BIAS,
        # float32 inputs multiply in float32 (Triton's default for them is TF32's 10-bit mantissa)
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        num_warps=num_warps, num_stages=num_stages)
    return out


@torch.library.custom_op("kernel_rl::decode_attention", mutates_args=())
def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """query (rows, q_heads, 1, dim); key and value (rows, kv_heads, length, dim), q_heads a
    multiple of kv_heads; bias (rows, 1, 1, length) additive, HIDDEN_BIAS or lower where hidden.
    Returns (rows, 1, q_heads, dim), the layout the model's output projection reads."""
    return launch(query, key, value, bias, scale)


@decode_attention.register_fake
def _(query, key, value, bias, scale):
    rows, q_heads, _, dim = query.shape
    return query.new_empty(rows, 1, q_heads, dim)
