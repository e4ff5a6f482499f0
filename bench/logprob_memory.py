"""Peak memory and time of forward + backward through per-token log-probs, naive vs chunked vs fused.

The question: how much memory beyond the inputs and the gradients that must exist anyway does it
cost to turn LM-head output into fp32 log-probs of the sampled tokens, for a long completion batch
(16k tokens) at Qwen's vocabulary (151,936)? Goal (issue 5): the chunked path's extra memory is at
most 0.1x the bf16 logits tensor.

Methods, on logits (the logits tensor, bf16, is the input; d loss / d logits is a required output):
  naive           torch.log_softmax(logits.float(), -1).gather(-1, targets)
  chunked         grpo.token_logprobs(logits, targets)
and from hidden states + LM head weight (inputs: hidden, weight; required outputs: their grads):
  naive_linear    logits = hidden @ weight.T, then naive
  chunked_linear  logits = hidden @ weight.T, then grpo.token_logprobs
  fused_linear    grpo.linear_token_logprobs(hidden, weight, targets): no full logits ever

Columns: "peak above inputs" = max_memory_allocated during forward + backward minus what was
allocated before (the inputs); "extra" = that minus the bytes of the required gradients; "extra /
logits" = extra over the bytes of the bf16 logits tensor; the last column is the median wall time
of forward + backward. On CPU the peak comes from the profiler's memory events (the CPU
allocator keeps no statistics), measured in a separate run from the timed ones.

Run:  python bench/logprob_memory.py                        (CUDA, 16384 x 151936, hidden 5120)
      python bench/logprob_memory.py --device cpu --tokens 1024 --vocab 32000 --hidden 64 --repeats 1
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo  # noqa: E402


def naive_logprobs(logits, targets):
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def make_methods(chunk_size):
    """name -> (uses hidden+weight, function of the inputs returning the fp32 log-probs)."""
    return {
        "naive": (False, lambda logits, targets: naive_logprobs(logits, targets)),
        "chunked": (False, lambda logits, targets: grpo.token_logprobs(logits, targets, chunk_size)),
        "naive_linear": (True, lambda hidden, weight, targets: naive_logprobs(hidden @ weight.t(), targets)),
        "chunked_linear": (True, lambda hidden, weight, targets: grpo.token_logprobs(hidden @ weight.t(), targets, chunk_size)),
        "fused_linear": (True, lambda hidden, weight, targets: grpo.linear_token_logprobs(hidden, weight, targets, chunk_size)),
    }


def forward_backward(fn, inputs, targets, grad_out):
    logp = fn(*inputs, targets)
    return torch.autograd.grad(logp, inputs, grad_outputs=grad_out)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cpu_peak_above(run):
    """Peak of CPU bytes allocated minus freed during run(), from the profiler's memory events
    (the CPU allocator keeps no peak statistics). What run() returns is freed before the end."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = run()
        del result
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"), key=lambda e: e.start_ns())
    current = peak = 0
    for event in events:
        current += event.nbytes()
        peak = max(peak, current)
    return peak


def measure(name, linear, fn, tensors, targets, device, repeats):
    inputs = (tensors["hidden"], tensors["weight"]) if linear else (tensors["logits"],)
    grad_out = torch.randn(targets.shape, device=device, dtype=torch.float32)
    grads = forward_backward(fn, inputs, targets, grad_out)  # warm-up (kernels, allocator)
    grad_bytes = sum(g.numel() * g.element_size() for g in grads)
    del grads
    if device.type == "cuda":
        sync(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        grads = forward_backward(fn, inputs, targets, grad_out)
        sync(device)
        peak_above = torch.cuda.max_memory_allocated(device) - before
        del grads
    else:
        peak_above = cpu_peak_above(lambda: forward_backward(fn, inputs, targets, grad_out))
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        grads = forward_backward(fn, inputs, targets, grad_out)
        sync(device)
        times.append(time.perf_counter() - start)
        del grads
    return {"method": name, "peak_above": peak_above, "grad_bytes": grad_bytes, "ms": 1000 * statistics.median(times)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--vocab", type=int, default=151936, help="Qwen2/2.5 vocabulary")
    parser.add_argument("--hidden", type=int, default=5120, help="Qwen2.5-32B / QwQ-32B hidden size")
    parser.add_argument("--chunk-size", type=int, default=None, help="tokens per chunk; default grpo.CHUNK_ELEMENTS / vocab")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--methods", default="naive,chunked,naive_linear,chunked_linear,fused_linear")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: no CUDA device visible to torch (use --device cpu for a small smoke run)")
    device = torch.device(args.device)
    torch.manual_seed(0)
    logits_bytes = args.tokens * args.vocab * 2
    targets = torch.randint(0, args.vocab, (args.tokens,), device=device)
    hidden = torch.randn(args.tokens, args.hidden, device=device, dtype=torch.bfloat16).requires_grad_()
    weight = (torch.randn(args.vocab, args.hidden, device=device, dtype=torch.bfloat16) * args.hidden ** -0.5).requires_grad_()
    with torch.no_grad():
        logits = (hidden @ weight.t()).requires_grad_()
    tensors = {"hidden": hidden, "weight": weight, "logits": logits}
    rows = args.chunk_size or max(1, grpo.CHUNK_ELEMENTS // args.vocab)
    print(f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}; "
          f"{args.tokens} tokens x {args.vocab} vocab, hidden {args.hidden}, chunk {rows} tokens; "
          f"bf16 logits {logits_bytes / 2**20:.0f} MiB, weight {weight.numel() * 2 / 2**20:.0f} MiB")
    methods = make_methods(args.chunk_size)
    rows_out = []
    for name in args.methods.split(","):
        if name not in methods:
            sys.exit(f"--methods: unknown method {name!r}; known: {', '.join(methods)}")
        linear, fn = methods[name]
        rows_out.append(measure(name, linear, fn, tensors, targets, device, args.repeats))
        if device.type == "cuda":
            torch.cuda.empty_cache()

    mib = 2 ** 20
    print()
    print("| method | inputs | required grads MiB | peak above inputs MiB | extra MiB | extra / logits | fwd+bwd ms |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows_out:
        inputs = "hidden, weight" if methods[r["method"]][0] else "logits"
        peak = f"{r['peak_above'] / mib:.0f}"
        extra_bytes = r["peak_above"] - r["grad_bytes"]
        extra, ratio = f"{extra_bytes / mib:.0f}", f"{extra_bytes / logits_bytes:.3f}"
        print(f"| {r['method']} | {inputs} | {r['grad_bytes'] / mib:.0f} | {peak} | {extra} | {ratio} | {r['ms']:.1f} |")


if __name__ == "__main__":
    main()
