"""The fast decoder's attention, timed per way of computing it, side by side in one run: one
decoding step's, and one prefill chunk's.

The fast decoder's step reads every row's cached keys and values once per layer; at batch 256
that read is most of the step. The rows are left-padded prompts followed by the tokens decoded
so far, so each row attends to a window [width - prompt_length, width + step] of its cache.
Ways timed (microseconds per call, one layer, Qwen2-1.5B's heads: 12 query heads over 2 KV
heads of 128):
  sdpa_mask        scaled_dot_product_attention with the additive mask, query heads grouped
                   per KV head (engines.grouped_query_attention: torch picks the backend)
  efficient_mask   the same, forced to the memory-efficient backend
  matmul           two batched matmuls and a float32 softmax
  matmul_compiled  the same through torch.compile
  flash_window     torch's flash-attention op over the packed cache, each row's window given by
                   where it starts (cum_seq_k) and how many keys it uses (seqused_k): no mask
  flash_window_sK  the same with num_splits=K (split-KV decoding), where this torch has it
  flex_score_bias  torch's flex_attention (compiled), the mask as a score_mod
  flex_block_mask  the same, the window as a block mask
  kernel           decode_attention.py's Triton kernel (what the fast decoder runs)
A prefill chunk's ways: grouped_mask (the query groups as rows, the mask repeated per group),
repeat_kv_mask (transformers' sdpa: K and V copied per query head), gqa_mask (SDPA's
enable_gqa; what the fast decoder runs), flex_block_mask, and causal_gqa (no mask: right only
when no row is padded, a lower bound).
Each is checked against float32 math on the same inputs (max abs difference printed).

  python bench/attention.py                       # CUDA only
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import decode_attention  # noqa: E402

MASKED = torch.finfo(torch.float16).min


def inputs(batch, kv_heads, group, dim, width, cache, step, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, kv_heads * group, 1, dim, device="cuda", generator=g, dtype=torch.bfloat16)
    k = torch.randn(batch, kv_heads, cache, dim, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn(batch, kv_heads, cache, dim, device="cuda", generator=g, dtype=torch.bfloat16)
    lengths = torch.randint(width // 2, width + 1, (batch,), device="cuda", generator=g)
    position = torch.arange(cache, device="cuda")
    allowed = (position >= width - lengths[:, None]) & (position <= width + step)
    bias = torch.zeros(batch, 1, 1, cache, device="cuda", dtype=torch.bfloat16).masked_fill(~allowed[:, None, None], MASKED)
    return q, k, v, lengths, bias


def reference(q, k, v, bias):
    batch, heads, _, dim = q.shape
    group = heads // k.shape[1]
    kf, vf = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    scores = q.float() @ kf.transpose(-1, -2) / dim ** 0.5 + bias.float()
    return scores.softmax(-1) @ vf


def grouped(q, k):
    batch, heads, _, dim = q.shape
    return q.reshape(batch, k.shape[1], heads // k.shape[1], dim)


def sdpa_mask(q, k, v, bias):
    return F.scaled_dot_product_attention(grouped(q, k), k, v, attn_mask=bias).reshape(q.shape)


def efficient_mask(q, k, v, bias):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
        return sdpa_mask(q, k, v, bias)


def matmul(q, k, v, bias):
    scores = (grouped(q, k) @ k.transpose(-1, -2)).float() * q.shape[-1] ** -0.5 + bias
    return (scores.softmax(-1).to(v.dtype) @ v).reshape(q.shape)


def flash_window(q, k, v, starts, used, num_splits=None):
    """Flash attention over the cache as stored, (batch, kv_heads, cache, dim): viewed as packed
    tokens (stride dim) with the head stride cache * dim, row r's keys start at
    r * kv_heads * cache + its first prompt position and run for `used[r]` keys."""
    batch, heads, _, dim = q.shape
    kv_heads, cache = k.shape[1], k.shape[2]
    total = batch * kv_heads * cache - (kv_heads - 1) * cache
    packed_k = k.as_strided((total, kv_heads, dim), (dim, cache * dim, 1))
    packed_v = v.as_strided((total, kv_heads, dim), (dim, cache * dim, 1))
    cum_q = torch.arange(batch + 1, device=q.device, dtype=torch.int32)
    extra = {} if num_splits is None else {"num_splits": num_splits}
    out = torch.ops.aten._flash_attention_forward(
        q.reshape(batch, heads, dim), packed_k, packed_v, cum_q, starts, 1, cache, 0.0, False, False,
        scale=dim ** -0.5, seqused_k=used, **extra)[0]
    return out.reshape(q.shape)


def flex_ways(q, k, v, bias, width, lengths, step):
    """flex_attention (torch.compile'd, grouped-query heads native): the additive mask as a
    score_mod, and the window as a block mask (blocks past the last written key skipped)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    compiled = torch.compile(flex_attention, dynamic=False)
    bias_rows = bias[:, 0, 0]
    starts = width - lengths
    end = width + step

    def add_bias(score, b, h, q_idx, kv_idx):
        return score + bias_rows[b, kv_idx]

    def window(b, h, q_idx, kv_idx):
        return (kv_idx >= starts[b]) & (kv_idx <= end)

    block = create_block_mask(window, q.shape[0], None, 1, k.shape[2], device="cuda")
    return {"flex_score_bias": lambda: compiled(q, k, v, score_mod=add_bias, enable_gqa=True),
            "flex_block_mask": lambda: compiled(q, k, v, block_mask=block, enable_gqa=True),
            "create_block_mask": lambda: create_block_mask(window, q.shape[0], None, 1, k.shape[2], device="cuda")}


def prefill(args):
    """One prefill chunk's attention per layer (rows x width, left-padded), each way ending in
    the (rows, width, heads, dim) layout the model's o_proj reads."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    compiled = torch.compile(flex_attention, dynamic=False)
    rows, width, kv_heads, group, dim = args.prefill_rows, args.width, 2, 6, 128
    heads = kv_heads * group
    for padded in (False, True):
        g = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(rows, heads, width, dim, device="cuda", generator=g, dtype=torch.bfloat16)
        k = torch.randn(rows, kv_heads, width, dim, device="cuda", generator=g, dtype=torch.bfloat16)
        v = torch.randn(rows, kv_heads, width, dim, device="cuda", generator=g, dtype=torch.bfloat16)
        lengths = (torch.randint(width // 2, width + 1, (rows,), device="cuda", generator=g) if padded
                   else torch.full((rows,), width, device="cuda"))
        starts = width - lengths
        position = torch.arange(width, device="cuda")
        allowed = ((position[None, :, None] >= position[None, None, :])
                   & (position[None, None, :] >= starts[:, None, None]))[:, None]
        bias = torch.zeros(allowed.shape, device="cuda", dtype=torch.bfloat16).masked_fill(~allowed, MASKED)
        real_q = (position[None, :] >= starts[:, None])       # query rows that attend something

        def grouped_mask():   # engines.grouped_query_attention as it is
            mask = bias.repeat(1, 1, group, 1)
            out = F.scaled_dot_product_attention(q.reshape(rows, kv_heads, group * width, dim), k, v, attn_mask=mask)
            return out.reshape(rows, heads, width, dim).transpose(1, 2).contiguous()

        def repeat_kv_mask():   # transformers' sdpa: K and V copied per query head
            out = F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), attn_mask=bias)
            return out.transpose(1, 2).contiguous()

        def gqa_mask():
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=True)
            return out.transpose(1, 2).contiguous()

        def causal_gqa():   # no padding mask at all: right only when no row is padded
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            return out.transpose(1, 2).contiguous()

        def causal_from(b, h, q_idx, kv_idx):
            return (q_idx >= kv_idx) & (kv_idx >= starts[b])

        block = create_block_mask(causal_from, rows, None, width, width, device="cuda")

        def flex_block():
            return compiled(q, k, v, block_mask=block, enable_gqa=True).transpose(1, 2).contiguous()

        kf, vf = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
        expected = torch.cat([((q[i:i + 16].float() @ kf[i:i + 16].transpose(-1, -2)) / dim ** 0.5
                               + bias[i:i + 16].float()).softmax(-1) @ vf[i:i + 16] for i in range(0, rows, 16)])
        expected = expected.transpose(1, 2)
        ways = {"grouped_mask": grouped_mask, "repeat_kv_mask": repeat_kv_mask, "gqa_mask": gqa_mask,
                "flex_block_mask": flex_block,
                "create_block_mask": lambda: create_block_mask(causal_from, rows, None, width, width, device="cuda")}
        if not padded:
            ways["causal_gqa"] = causal_gqa
        print(f"prefill, {rows} rows x {width} tokens, {'left-padded' if padded else 'no padding'}:")
        time_ways(ways, args.ways, 20, lambda out: (out.float() - expected).abs().amax(dim=(2, 3))[real_q].max().item())


def time_ways(ways: dict, prefixes: str | None, repeats: int, error_of) -> None:
    """Print each way's microseconds per call (time_us) and its error, error_of(its output), for
    the ways whose names start with one of the comma-separated `prefixes` (None: all); a way that
    returns no tensor (it builds a mask) has no error, and one that fails prints why."""
    for name, fn in ways.items():
        if prefixes and not name.startswith(tuple(prefixes.split(","))):
            continue
        try:
            out = fn()
            error = error_of(out) if torch.is_tensor(out) else float("nan")
            print(f"  {name:18s} {time_us(fn, repeats):8.1f} us   ({error:.2e})", flush=True)
        except (RuntimeError, TypeError, ValueError) as e:
            print(f"  {name:18s} failed: {str(e).splitlines()[0][:200]}", flush=True)


def time_us(fn, repeats):
    """Microseconds per call on the device: fn captured once in a CUDA graph and replayed, so the
    host's launch cost (Python, Triton's launcher, op dispatch) is not counted; a way that cannot
    be captured is timed eagerly, back to back."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
        call = graph.replay
    except RuntimeError:
        torch.cuda.synchronize()
        call = fn
    call()
    torch.cuda.synchronize()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / repeats


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--width", type=int, default=512, help="prompt width (left-padded)")
    parser.add_argument("--cache", type=int, default=768, help="cache positions")
    parser.add_argument("--step", type=int, default=200, help="decoding step (keys up to width + step)")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--sweep", action="store_true", help="also time the kernel's launch settings")
    parser.add_argument("--no-prefill", action="store_true")
    parser.add_argument("--ways", help="comma-separated name prefixes: time only the ways that match")
    parser.add_argument("--prefill-rows", type=int, default=128, help="rows of one prefill chunk")
    args = parser.parse_args()
    kv_heads, group, dim = 2, 6, 128
    schema = str(torch.ops.aten._flash_attention_forward.default._schema)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; flash op: {schema}")
    has_splits = "num_splits" in schema
    compiled = torch.compile(matmul, dynamic=False)
    print(f"width {args.width}, cache {args.cache}, step {args.step}; microseconds per call (max abs error vs fp32)")
    if not args.no_prefill:
        prefill(args)
    for batch in map(int, args.batches.split(",")):
        q, k, v, lengths, bias = inputs(batch, kv_heads, group, dim, args.width, args.cache, args.step)
        rows = torch.arange(batch, device="cuda")
        starts = torch.cat([rows * kv_heads * args.cache + args.width - lengths,
                            torch.tensor([batch * kv_heads * args.cache], device="cuda")]).to(torch.int32)
        used = (lengths + args.step + 1).to(torch.int32)
        expected = reference(q, k, v, bias)
        ways = {"sdpa_mask": lambda: sdpa_mask(q, k, v, bias),
                "efficient_mask": lambda: efficient_mask(q, k, v, bias),
                "matmul": lambda: matmul(q, k, v, bias),
                "matmul_compiled": lambda: compiled(q, k, v, bias),
                "flash_window": lambda: flash_window(q, k, v, starts, used)}
        ways.update(flex_ways(q, k, v, bias, args.width, lengths, args.step))
        ways["kernel"] = lambda: decode_attention.decode_attention(q, k, v, bias, dim ** -0.5).transpose(1, 2)
        if args.sweep:   # the kernel's launch settings
            for block_n, warps, stages in [(16, 4, 3), (32, 4, 2), (32, 4, 4), (32, 2, 3), (32, 8, 3),
                                           (64, 4, 3), (64, 4, 2), (64, 2, 3), (128, 4, 3), (128, 8, 2)]:
                ways[f"kernel_n{block_n}_w{warps}_s{stages}"] = (
                    lambda b=block_n, w=warps, s=stages: decode_attention.launch(
                        q, k, v, bias, dim ** -0.5, block_n=b, num_warps=w, num_stages=s).transpose(1, 2))
        if has_splits:
            for splits in (1, 2, 4, 8):
                ways[f"flash_window_s{splits}"] = lambda s=splits: flash_window(q, k, v, starts, used, s)
        bytes_read = 2 * batch * kv_heads * args.cache * dim * 2
        print(f"batch {batch}: K and V are {bytes_read / 1e6:.0f} MB, {bytes_read / 4.8e12 * 1e6:.0f} us at 4.8 TB/s")
        time_ways(ways, args.ways, args.repeats, lambda out: (out.float() - expected).abs().max().item())


if __name__ == "__main__":
    main()
