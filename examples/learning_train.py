"""train.py for the learning demo: `train.main` unchanged, plus three things train.py lacks.

    python examples/learning_train.py --model WARM_START_DIR --out runs/rl_seed0 ... (train.py's flags)

The GRPO step is train.py's, line for line; nothing here changes a loss, an advantage, a
sample or a verdict. What this wrapper adds, each by wrapping a module function that train.py
looks up at call time (examples/learning_run.sh says why each matters):

1. A verdict memo (env VERDICT_MEMO=1, the default; 0 switches it off): `kernel_eval.evaluate_batch`
   judges each distinct (reference, code) pair once per process, and identical candidates,
   in this step or a later one, share that verdict. A memorising 8.8M-parameter policy writes
   the same few kernels over and over (the H200 run of 2026-12-01: 13-22 distinct codes in 128
   samples); kernel_eval shares their compile but starts a fresh process per candidate, ~4 s
   of run slot each, which would make the harness most of a step. The reward is correctness
   only (no timing), so a repeat tells nothing new, except for a kernel that is only sometimes
   correct (a race): its first verdict then stands for all its copies. train.py has no such
   option (kernel_eval, rightly, judges every candidate it is given).
2. A time budget (env DEADLINE, seconds since the epoch): no new step starts unless the longest
   of the last three steps fits before DEADLINE, so the run ends by itself, writes its export,
   and `timeout` (learning_run.sh's backstop) rarely has to cut a step. train.py only has
   --steps. Done by giving train.py's `for step in tqdm(...)` a tqdm whose iterator stops.
3. OUT/extra.jsonl, diagnostics train.py's metrics.jsonl does not hold, one line per event with
   the step it belongs to (1-based, as metrics.jsonl): "harness" (pairs sent, pairs judged by
   kernel_eval, seconds), "advantages" (share of samples with a nonzero advantage: 0 means the
   step cannot learn), "update" (per loss call: tokens, approx_kl_old = k3 KL(old || new) per
   token, clip fractions; on the second mini-batch it measures how far the first optimizer
   step moved the policy: 1.1-1.5 nats/token in the collapsed lr 3e-4 run). Rank 0 only.
   examples/learning_report.py folds it into its table.
"""
from __future__ import annotations

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import grpo  # noqa: E402
import kernel_eval  # noqa: E402
import train  # noqa: E402


class Recorder:
    """Counts steps (one grpo.group_advantages call per step) and appends extra.jsonl lines."""

    def __init__(self, path: str | None):
        self.path = path
        self.advantage_calls = 0

    def write(self, record: dict) -> None:
        if self.path:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")


def memo_evaluate(evaluate_batch, recorder: Recorder, enabled: bool = True):
    """evaluate_batch that judges each distinct (reference, code) pair once (when enabled)."""
    verdicts: dict = {}

    def evaluate(pairs, **kwargs):
        start = time.monotonic()
        if enabled:
            todo = sorted({pair for pair in pairs if pair not in verdicts})
            if todo:
                verdicts.update(zip(todo, evaluate_batch(todo, **kwargs)))
            results = [verdicts[pair] for pair in pairs]
        else:
            todo = pairs
            results = evaluate_batch(pairs, **kwargs)
        recorder.write({"step": recorder.advantage_calls + 1, "event": "harness", "pairs": len(pairs),
                        "judged": len(todo), "seconds": round(time.monotonic() - start, 3)})
        return results
    return evaluate


def recording_advantages(group_advantages, recorder: Recorder):
    def wrapped(*args, **kwargs):
        advantages = group_advantages(*args, **kwargs)
        recorder.advantage_calls += 1
        n = int(advantages.numel())
        recorder.write({"step": recorder.advantage_calls, "event": "advantages", "n": n,
                        "nonzero": float((advantages != 0).float().mean()) if n else 0.0})
        return advantages
    return wrapped


def recording_loss(policy_loss, recorder: Recorder):
    def wrapped(*args, **kwargs):
        loss, metrics = policy_loss(*args, **kwargs)
        if metrics.get("tokens"):
            recorder.write({"step": recorder.advantage_calls, "event": "update", "tokens": metrics["tokens"],
                            **{k: round(metrics[k], 6) for k in ("approx_kl_old", "clip_frac_low", "clip_frac_high")}})
        return loss, metrics
    return wrapped


def budgeted_tqdm(tqdm_class, deadline: float, recorder: Recorder):
    """tqdm whose iteration ends before a step that would not finish by `deadline` (epoch s)."""
    class Budgeted(tqdm_class):
        def __iter__(self):
            durations, started = [], None
            for item in super().__iter__():
                now = time.time()
                if started is not None:
                    durations.append(now - started)
                need = max(durations[-3:], default=0.0)
                if now + need > deadline:
                    recorder.write({"step": recorder.advantage_calls + 1, "event": "budget",
                                    "message": f"no new step: {deadline - now:.0f} s left, last steps took "
                                               f"up to {need:.0f} s"})
                    print(f"learning_train: stopping before step {recorder.advantage_calls + 1}: "
                          f"{deadline - now:.0f} s left, a step takes up to {need:.0f} s", flush=True)
                    return
                started = now
                yield item
    return Budgeted


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    config = train.parse_config(argv)
    rank = int(os.environ.get("RANK", 0))
    os.makedirs(config.out, exist_ok=True)
    recorder = Recorder(os.path.join(config.out, "extra.jsonl") if rank == 0 else None)
    if rank == 0 and os.path.exists(recorder.path) and not config.resume:
        os.remove(recorder.path)
    kernel_eval.evaluate_batch = memo_evaluate(kernel_eval.evaluate_batch, recorder,
                                               enabled=os.environ.get("VERDICT_MEMO", "1") != "0")
    grpo.group_advantages = recording_advantages(grpo.group_advantages, recorder)
    grpo.policy_loss = recording_loss(grpo.policy_loss, recorder)
    if os.environ.get("DEADLINE"):
        import tqdm
        tqdm.tqdm = budgeted_tqdm(tqdm.tqdm, float(os.environ["DEADLINE"]), recorder)
    train.main(argv)


if __name__ == "__main__":
    sys.exit(main())
