"""The kevin preset at QwQ-32B's width on one GPU: measured memory against train.py's plan.

QwQ-32B's own config (examples/qwq-32b/config.json: hidden 5120, 40 / 8 heads, intermediate
27,648, vocabulary 152,064, untied head) with num_hidden_layers cut to --layers, random bf16
weights written as a Hugging Face folder (safetensors shards, a byte-level tokenizer of the real
vocabulary size, all offline), then through train.py exactly as a user runs it:

    run 1: --preset kevin (small counts), 1 step, a checkpoint, the export
    run 2: the same with --resume --steps 2: loads the checkpoint, 1 more step, checkpoint, export

and prints, per phase, the plan's GPU peak (memory_plan.plan_for for the same flags), the measured peak
allocated (metrics.jsonl's gpu_peak_*), their ratio, the seconds, and generation tokens/s; the
host peak at load the same way. One device call:

    python bench/rehearsal.py --layers 2 --work /tmp/rehearsal --out $OUT
    python bench/rehearsal.py --report docs/kevin_rehearsal/rehearsal.json   # a kept run against today's plan
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def make_checkpoint(folder: str, layers: int) -> None:
    """Random bf16 weights of QwQ-32B's config cut to `layers`, and a tokenizer of its vocabulary size."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast
    config = AutoConfig.from_pretrained(os.path.join(ROOT, "examples", "qwq-32b"))
    config.num_hidden_layers = layers
    config.max_window_layers = layers
    if getattr(config, "layer_types", None):   # transformers 5 checks one type per layer
        config.layer_types = config.layer_types[:layers]
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder, max_shard_size="2GB")
    del model
    # Byte-level tokens first, then Qwen's three specials, then fillers up to the vocabulary: a random
    # policy samples any of them, and each decodes to text.
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {token: i for i, token in enumerate(alphabet + specials)}
    vocab.update({f"<|filler_{i}|>": i for i in range(len(vocab), config.vocab_size)})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                          "{% endfor %}<|im_start|>assistant\n")
    fast.save_pretrained(folder)


def run(argv: list[str], log: str, limit: float) -> tuple[int, str, float]:
    start = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *argv], stdout=f,
                              stderr=subprocess.STDOUT, timeout=limit, cwd=ROOT)
    return proc.returncode, open(log).read(), time.perf_counter() - start


def compare(plan, report: dict) -> list:
    """(phase, planned bytes, measured bytes) per phase: GPU peaks from metrics.jsonl and the load line,
    the host's growth at load from the load line."""
    import memory_plan
    rows = []
    for phase in memory_plan.PHASES:
        if phase == "load":
            got = [float(r["load"][2]) * 1e9 for r in report["runs"] if r["load"] and r["load"][2]]
        else:
            got = [m.get(f"gpu_peak_{phase}") for m in report["metrics"] if m.get(f"gpu_peak_{phase}")]
        rows.append((phase, plan.peak(phase), max(got) if got else None))
    host_got = [float(r["load"][1]) * 1e9 for r in report["runs"] if r["load"]]
    return rows + [("load (host)", plan.peak("load", "host"), max(host_got) if host_got else None)]


def print_comparison(rows: list) -> None:
    print(f"\n{'phase':<12} {'plan GB':>8} {'measured GB':>12} {'measured/plan':>14}")
    for phase, planned, measured in rows:
        ratio = f"{measured / planned:.2f}" if measured and planned else "-"
        print(f"{phase:<12} {planned / 1e9:>8.1f} {(measured or 0) / 1e9:>12.1f} {ratio:>14}")


def report_only(path: str) -> None:
    """A kept rehearsal's measurements against the plan train.py makes today for the same settings."""
    import memory_plan
    report = json.load(open(path))
    settings = memory_plan.Settings(**report["plan"]["settings"])
    config = memory_plan.read_config(os.path.join(ROOT, "examples", "qwq-32b"))
    config.num_hidden_layers = report["layers"]
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:report["layers"]]
    plan = memory_plan.make_plan(memory_plan.model_shape(config), settings)
    print(f"{report['device']}, {report['layers']} layers of QwQ-32B's width")
    print(memory_plan.table(plan))
    print_comparison(compare(plan, report))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--work", default="/tmp/rehearsal", help="the checkpoint folder and the run go here")
    parser.add_argument("--run-out", default="", help="the run's --out (default: WORK/run); checkpoints are large")
    parser.add_argument("--out", default="", help="where the report (rehearsal.json, logs) is copied")
    parser.add_argument("--trajectories", type=int, default=4)
    parser.add_argument("--tasks-per-step", type=int, default=2)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=16384)
    parser.add_argument("--limit", type=float, default=400, help="seconds each train.py run may take")
    parser.add_argument("--report", default="", help="print a kept rehearsal.json against today's plan, run nothing")
    args = parser.parse_args()
    if args.report:
        return report_only(args.report)
    import torch
    import memory_plan
    import train
    import weights
    folder = os.path.join(args.work, "qwq-32b-cut")
    run_out = args.run_out or os.path.join(args.work, "run")
    shutil.rmtree(run_out, ignore_errors=True)
    if not os.path.exists(os.path.join(folder, "config.json")):
        start = time.perf_counter()
        make_checkpoint(folder, args.layers)
        print(f"checkpoint of {args.layers} layers written in {time.perf_counter() - start:.0f} s", flush=True)
    flags = ["--preset", "kevin", "--model", folder, "--tasks", "builtin", "--heldout", "0", "--device", "cuda",
             "--tasks-per-step", str(args.tasks_per_step), "--trajectories", str(args.trajectories),
             "--turns", str(args.turns), "--max-new-tokens", str(args.max_new_tokens), "--late-max-new-tokens", "0",
             "--out", run_out, "--save-every", "1", "--keep-checkpoints", "1", "--sandbox", "off"]
    config = train.parse_config(flags)
    plan, _ = memory_plan.plan_for(config, 1, weights.model_config(config))
    print(memory_plan.table(plan), flush=True)
    report = {"layers": args.layers, "device": torch.cuda.get_device_name(), "plan": json.loads(memory_plan.plan_json(plan)),
              "runs": []}
    for name, extra in (("run1", ["--steps", "1"]), ("run2", ["--steps", "2", "--resume"])):
        rc, text, seconds = run(flags + extra, os.path.join(args.work, f"{name}.log"), args.limit)
        loaded = re.search(r"loaded in ([\d.]+) s: host peak \+([\d.]+) GB(?:, GPU peak ([\d.]+) GB)?", text)
        report["runs"].append({"name": name, "rc": rc, "seconds": seconds,
                               "load": loaded.groups() if loaded else None, "tail": text[-3000:]})
        print(f"{name}: exit {rc} in {seconds:.0f} s", flush=True)
        if rc != 0:
            print(text[-3000:])
            break
        if name == "run1":   # room on the disk for run 2's checkpoint beside run 1's
            shutil.rmtree(os.path.join(run_out, "export"), ignore_errors=True)
    metrics = [json.loads(line) for line in open(os.path.join(run_out, "metrics.jsonl"))] \
        if os.path.exists(os.path.join(run_out, "metrics.jsonl")) else []
    report["metrics"] = metrics
    report["comparison"] = compare(plan, report)
    print_comparison(report["comparison"])
    for m in metrics:
        tokens = m["response_tokens_mean"] * sum(m["status_counts"].values())
        m["generation_tokens_per_s"] = tokens / max(m["seconds_generation"], 1e-9)
        print(f"step {m['step']}: {tokens:.0f} tokens generated at {m['generation_tokens_per_s']:.0f} tok/s; "
              + ", ".join(f"{k} {v:.1f}" for k, v in m.items() if k.startswith("seconds_") and isinstance(v, (int, float))))
    export = os.path.join(run_out, "export")
    if os.path.exists(os.path.join(export, "config.json")):
        from safetensors import safe_open
        index = os.path.join(export, "model.safetensors.index.json")
        files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
        names = 0
        for file in files:
            with safe_open(os.path.join(export, file), "pt") as f:
                names += len(list(f.keys()))
        report["export"] = {"files": files, "tensors": names}
        print(f"export: {len(files)} files, {names} tensors")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "rehearsal.json"), "w") as f:
            json.dump(report, f, indent=1, default=str)
        for name in ("run1.log", "run2.log"):
            if os.path.exists(os.path.join(args.work, name)):
                shutil.copy(os.path.join(args.work, name), args.out)


if __name__ == "__main__":
    main()
