"""Generation throughput of the engines train.py can use, side by side in one run.

Rows (new tokens per second over the whole batch; a random model never samples EOS, so every row
runs to --new tokens):
  hf_fast                engines.HFEngine's fast decoder (static cache, shared prefill, CUDA-graph
                         decode step) on the model as loaded (bf16 on cuda)
  hf_fast_fsdp2          the same on weights.shard's FSDP2 model (one rank; bf16 compute, fp32 master
                         weights), as train.py generates: unsharded once per generation
  hf_fast_compiled       hf_fast with compile_decode (the step through torch.compile; the warm-up
                         call pays the compile)
  hf_fast_sdpa, hf_fast_compiled_sdpa   the same two with decode_kernel=False: the decoding
                         steps' attention through SDPA instead of decode_attention's kernel
  hf_plain, hf_fsdp2     the same two through transformers generate (HFEngine(fast=False))
  generate, dynamic      model.generate, sampling, no log-probs, no stop handling
  generate, static       the same with cache_implementation="static"

  python bench/generation.py --shape qwen2-8m --batches 64,128       # the learning demo's policy shape
  python bench/generation.py --shape qwen2-1.5b --batches 64,256      # docs/PERFORMANCE.md's shape
  python bench/generation.py --device cpu --shape qwen2-8m --batches 4 --prompt 32 --new 16

Each cell is timed after one warm-up call of --warmup-new tokens (kernels loaded, allocator warm;
generate_static's warm-up asks for --new tokens, the cache length its compile is for).
--split adds, per row, decode-only tokens/s: the call with 1 new token (prefill and one sample)
timed too, and taken out.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import transformers

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import engines  # noqa: E402
import train  # noqa: E402
import weights  # noqa: E402

SHAPES = {
    "qwen2-8m": dict(hidden_size=384, intermediate_size=1152, num_hidden_layers=4, num_attention_heads=6,
                     num_key_value_heads=6, vocab_size=2849, tie_word_embeddings=True),
    "qwen2-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                       num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, rope_theta=1e6),
}


class _Tokenizer:
    """What HFEngine needs of a tokenizer for token-id prompts: ids in, text out."""
    pad_token_id, eos_token_id, chat_template = 0, 1, None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))

    def batch_decode(self, rows, skip_special_tokens=False):
        return [self.decode(r) for r in rows]


def build(shape: str, device, dtype):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=8192, eos_token_id=1, pad_token_id=0, bos_token_id=1)
    with torch.device(device):
        return Qwen2ForCausalLM(config).to(dtype).eval()


def timed(fn, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def write_profile(fn, device, path: str) -> None:
    """One more call under torch.profiler: the ops by total device time (and host time), so a cell's
    time can be split into the forward's matmuls, attention, sampling and host gaps."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        seconds = timed(fn, device)
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        f.write(f"wall {seconds:.3f} s under the profiler\n")
        f.write(prof.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=90))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2-8m")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batches", default="64,128")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--warmup-new", type=int, default=16)
    parser.add_argument("--rows", default="hf_fast,hf_fast_fsdp2,generate_static,generate_dynamic,hf_plain,hf_fsdp2")
    parser.add_argument("--split", action="store_true", help="also time each cell with 1 new token (the "
                        "prefill and one sample) and add a row of decode-only tokens/s: the new tokens after "
                        "the first over the time the call took beyond that")
    parser.add_argument("--profile", metavar="DIR", help="after timing each cell, run it once more under "
                        "torch.profiler and write the ops that took the most device time to DIR/<row>_b<batch>.txt")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    plain = build(args.shape, device, dtype)
    rows = args.rows.split(",")
    # train.py's FSDP2 model only when a row asks for it (building it costs a full fp32 copy).
    fsdp = (weights.shard(build(args.shape, device, torch.float32), train.Config(device=device.type), device, 1)
            if any(row.endswith("fsdp2") for row in rows) else None)
    tokenizer = _Tokenizer()
    print(f"{args.shape} ({sum(p.numel() for p in plain.parameters()) / 1e6:.1f}M parameters), {device}, "
          f"prompts {args.prompt} tokens, {args.new} new tokens, temperature 1; new tokens per second")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}; "
          f"command: python bench/generation.py {' '.join(sys.argv[1:] if argv is None else argv)}")
    batches = [int(b) for b in args.batches.split(",")]
    print("| engine | " + " | ".join(f"batch {b}" for b in batches) + " |")
    print("|---|" + "---:|" * len(batches))
    for row in rows:
        cells, decode_cells = [], []
        for batch in batches:
            g = torch.Generator().manual_seed(batch)
            prompts = torch.randint(2, SHAPES[args.shape]["vocab_size"], (batch, args.prompt), generator=g)
            if row.startswith("hf_"):
                engine = engines.HFEngine(fsdp if row.endswith("fsdp2") else plain, tokenizer, max_batch_rows=batch,
                                          fast=row.startswith("hf_fast"),
                                          compile_decode=row.startswith("hf_fast_compiled"),
                                          decode_kernel=not row.endswith("_sdpa"))
                run = lambda new: engine.generate(prompts.tolist(), max_new_tokens=new, temperature=1.0)  # noqa: E731
            else:
                cache = {"cache_implementation": "static"} if row == "generate_static" else {}
                run = lambda new: plain.generate(  # noqa: E731
                    input_ids=prompts.to(device), attention_mask=torch.ones_like(prompts, device=device),
                    max_new_tokens=new, min_new_tokens=new, do_sample=True, top_k=0, temperature=1.0,
                    pad_token_id=0, **cache)
            # A static cache is as long as prompt + max_new_tokens and generate compiles the forward
            # for it, so its warm-up call must ask for as many tokens as the timed one (and it has
            # no split: one new token would be a new cache length, so a compile).
            static = row == "generate_static"
            run(args.new if static else args.warmup_new)
            seconds = timed(lambda: run(args.new), device)
            cells.append(f"{batch * args.new / seconds:,.0f}")
            if args.split and not static:
                first = timed(lambda: run(1), device)
                decode_cells.append(f"{batch * (args.new - 1) / (seconds - first):,.0f} "
                                    f"(prefill + 1 token: {first:.2f} s)" if seconds > first else "n/a")
            if args.profile:
                write_profile(lambda: run(args.new), device, os.path.join(args.profile, f"{row}_b{batch}.txt"))
        print(f"| {row} | " + " | ".join(cells) + " |", flush=True)
        if decode_cells:
            print(f"| {row}, decode only | " + " | ".join(decode_cells) + " |", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
