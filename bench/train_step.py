"""The training phase's speed: train.update (old log-probs, then optimizer_steps clipped-loss
updates) on synthetic rollout batches of a randomly initialised Qwen2-shaped model, and the
step-time split of a real train.py run.

MFU = model flops / seconds / peak, with train_log.forward_flops's count (decoder-layer parameters,
the LM head on trained tokens only, causal attention) times 4: the old log-probs' forward, then
forward + backward. Recomputation under activation checkpointing is not model flops (it lowers
MFU, as it should). Padding is not model flops either. Peak: --peak-tflops (H200/H100 SXM dense
bf16 by the datasheet: 989).

  python bench/train_step.py --make-model runs/qwen2_1p5b        # writes a random model + tokenizer
  python bench/train_step.py --model runs/qwen2_1p5b             # the MFU table (CUDA, one GPU)
  python bench/train_step.py --from-run runs/h200 --model runs/qwen2_1p5b   # a train.py run's split
  python bench/train_step.py --model tiny-llama --device cpu --rows 4 --prompt 64 --completion 32 --budgets 512
"""
import argparse
import itertools
import json
import os
import random
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
import grpo  # noqa: E402
import rollout  # noqa: E402
import train  # noqa: E402
import weights  # noqa: E402
import train_log  # noqa: E402

QWEN2_1P5B = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1e6,
                  tie_word_embeddings=True)


def make_model(path: str) -> None:
    """A Qwen2-1.5B-shaped model, random weights, and the offline byte-level BPE of
    examples/warm_start.py. Its vocabulary is far smaller than the model's 151,936 (Qwen's, kept
    so the LM head costs what it costs in Qwen2-1.5B): a random model samples ids past it, which
    decode to nothing."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    import tasks
    import warm_start
    tokenizer = warm_start.build_tokenizer(tasks.load_builtin(), vocab_size=8192, max_token_length=16)
    config = Qwen2Config(**QWEN2_1P5B, bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, dtype="bfloat16")
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    print(f"wrote {path}: {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters, "
          f"tokenizer of {len(tokenizer)} tokens")


def synthetic_samples(rows: int, prompt: int, completion: int, vocab: int, seed: int = 0) -> list:
    """Rows of a rollout batch: lengths drawn around the given ones (so micro-batches carry padding
    as real ones do), random token ids, returns that give non-zero advantages."""
    rng = random.Random(seed)
    samples = []
    for i in range(rows):
        p, c = rng.randint(prompt * 3 // 4, prompt * 5 // 4), rng.randint(completion // 2, completion)
        ids = [rng.randrange(3, vocab) for _ in range(p + c)]
        samples.append(rollout.Sample(f"task{i % 8}", i, 0, ids[:p], ids[p:], [0] * p + [1] * c, None, "", False,
                                      "correct", float(i % 3), float(i % 3), 0.0, None, ""))
    return samples


def measure(model, layer_params, samples, config, device, repeats: int) -> tuple[float, float, float]:
    """(seconds per update, model flops per update, peak GiB) of train.update on samples."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-7)
    advantages = grpo.group_advantages([s.discounted_return for s in samples], [s.task_id for s in samples])
    flops = 4 * train_log.forward_flops(layer_params, model.config, samples)
    times = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for i in range(repeats + 1):   # the first is warm-up (allocator, kernels' autotuning)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        train.update(model, [optimizer], samples, advantages, config, 0, 1 << 20, 0, device, 1)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    del optimizer
    return min(times[1:]), flops, peak


def from_run(run: str, model_path: str, peak_tflops: float) -> None:
    rows = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
    print(f"train.py run {run}: model {model_path}")
    print("| step | GPUs | generation s | evaluation s | training s | step s | train TFLOP/s (all GPUs) | training MFU |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        rate, gpus = r["train_flops"] / r["seconds_training"] / 1e12, r.get("ranks", 1)   # older runs: one rank
        print(f"| {r['step']} | {gpus} | {r['seconds_generation']:.1f} | {r['seconds_evaluation']:.1f} | "
              f"{r['seconds_training']:.1f} | {r['seconds_step']:.1f} | {rate:.0f} | {rate / (gpus * peak_tflops):.1%} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--make-model", help="write a random Qwen2-1.5B-shaped model and tokenizer here, then stop")
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--from-run", help="print a train.py run's step-time split and MFU instead")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--rows", type=int, default=64, help="samples per update (Kevin: 8 x 16 x 4 = 512)")
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--completion", type=int, default=1024)
    parser.add_argument("--budgets", default="16384,32768", help="micro-batch padded-token budgets")
    parser.add_argument("--checkpointing", default="off,on")
    parser.add_argument("--compile", default="off", help="off, on or off,on: train.py's --compile")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    args = parser.parse_args(argv)
    if args.make_model:
        return make_model(args.make_model)
    if args.from_run:
        return from_run(args.from_run, args.model, args.peak_tflops)
    device = torch.device(args.device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    print(f"model {args.model}; {args.rows} rows, prompts ~{args.prompt} tokens (+-25%), completions "
          f"{args.completion // 2}-{args.completion}; FSDP2 on one {device.type} device, bf16 compute on cuda; "
          f"MFU against {args.peak_tflops:.0f} TFLOP/s")
    print("| micro-batch tokens | activation ckpt | compile | s / update | model TFLOP/s | MFU | peak GiB |")
    print("|---:|---|---|---:|---:|---:|---:|")
    for checkpointing, compiled, budget in itertools.product(args.checkpointing.split(","), args.compile.split(","),
                                                              [int(b) for b in args.budgets.split(",")]):
        config = train.Config(model=args.model, device=device.type, micro_batch_tokens=budget,
                              activation_checkpointing=checkpointing == "on", compile=compiled == "on", lr=1e-7)
        torch.manual_seed(0)
        model, _ = weights.load_policy(config)
        layer_params = sum(p.numel() for p in model.model.layers.parameters())
        model = weights.shard(model.to(device), config, device, 1)
        samples = synthetic_samples(args.rows, args.prompt, args.completion, model.config.vocab_size)
        try:
            seconds, flops, peak = measure(model, layer_params, samples, config, device, args.repeats)
            rate = flops / seconds / 1e12
            print(f"| {budget} | {checkpointing} | {compiled} | {seconds:.2f} | {rate:.0f} | {rate / args.peak_tflops:.1%} | "
                  f"{peak:.1f} |", flush=True)
        except torch.OutOfMemoryError:
            print(f"| {budget} | {checkpointing} | {compiled} | out of memory | | | |", flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
