"""checkpoint.py: a training run's out directory survives a kill -9 at any moment.

What a run writes, and why each write cannot be half done:

- checkpoints/step_N: torch.distributed.checkpoint (DCP) shards of the model and optimizer from
  every rank, each rank's RNG state, and trainer_state.json (step, sampler statistics). All of it
  goes into step_N.tmp first; rank 0 renames it to step_N once every rank has written, so a
  checkpoint exists whole or not at all, and a leftover .tmp is ignored and overwritten.
- metrics.jsonl: one line per step, appended; on resume, lines of steps after the checkpoint
  (work that is redone) are dropped by rewriting the file under a temp name and renaming it.
- export/: safetensors weights streamed from the shards one tensor at a time (weights.py), the
  config and the tokenizer, which transformers and vLLM load back; written to export.tmp, then renamed.

Every checkpoint function is called on every rank (DCP's save and load and the full state dict
are collectives); rank 0 alone touches the shared files.

The project's two file writers live here too, for every file a crash must not leave half
written, in a run's out directory or elsewhere (eval.py's records and summaries, tasks.py's
exports, train_log's plot): `atomic_write` (a file whole or not at all) and `append_synced`
(lines added in one write, on disk when it returns). torch is imported inside the checkpoint
functions only, so the writers cost a module that needs nothing but the standard library.
"""
from __future__ import annotations

import json
import os
import random
import shutil


def atomic_write(path: str, data: str | bytes) -> None:
    """`path` holds `data` whole, or what it held before: the bytes go to a temp file beside it,
    are fsynced, and the temp file is renamed over `path` (atomic on POSIX); then the folder is
    fsynced, so the rename itself survives a power cut. Missing folders are made."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:   # a failed write (disk full, interrupted) leaves no temp file behind
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_folder(folder)


def append_synced(path: str, text: str) -> None:
    """Append `text` (whole lines) in one write and fsync it: a kill leaves at most the last line
    cut, which the readers of these files drop."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync_folder(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(model, optimizer, out: str, step: int, state: dict, rank: int, keep: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    final = os.path.join(out, "checkpoints", f"step_{step:06d}")
    tmp = final + ".tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    dist.barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=tmp)
    rng = {"torch": torch.get_rng_state(), "python": random.getstate(),
           "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}
    torch.save(rng, os.path.join(tmp, f"rng_rank{rank}.pt"))
    dist.barrier()
    if rank == 0:
        with open(os.path.join(tmp, "trainer_state.json"), "w") as f:
            json.dump({**state, "step": step}, f)
        os.replace(tmp, final)
        for old in complete(out)[:-keep]:
            shutil.rmtree(old)
    dist.barrier()


def complete(out: str) -> list[str]:
    """The whole checkpoints in out, oldest first."""
    root = os.path.join(out, "checkpoints")
    names = sorted(n for n in os.listdir(root) if not n.endswith(".tmp")) if os.path.isdir(root) else []
    return [os.path.join(root, n) for n in names]


def load(model, optimizer, path: str, rank: int) -> dict:
    """Restore model, optimizer and this rank's RNG in place; returns trainer_state.json."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    rng = torch.load(os.path.join(path, f"rng_rank{rank}.pt"), weights_only=False)
    torch.set_rng_state(rng["torch"])
    random.setstate(rng["python"])
    if rng["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    with open(os.path.join(path, "trainer_state.json")) as f:
        return json.load(f)


def start(model, optimizer, out: str, resume: bool, rank: int) -> tuple[int, dict]:
    """(first step, trainer state) of a run in out. With resume and a checkpoint: the last one is
    loaded and metrics.jsonl cut back to it. Without resume: step 0, an old metrics.jsonl removed,
    and an out that holds checkpoints refused (a fresh run would mix its checkpoints with them)."""
    found = complete(out)
    if found and not resume:
        raise SystemExit(f"train.py: --out {out} holds checkpoints; pass --resume or choose another --out")
    if found:
        state = load(model, optimizer, found[-1], rank)
        if rank == 0:
            write_metrics(out, {}, keep_through=state["step"])
        return state["step"], state
    if rank == 0 and os.path.exists(os.path.join(out, "metrics.jsonl")):
        os.remove(os.path.join(out, "metrics.jsonl"))
    return 0, {}


def write_metrics(out: str, record: dict, keep_through: int | None = None) -> None:
    """Append one step's line; with keep_through, first drop the lines of later steps."""
    path = os.path.join(out, "metrics.jsonl")
    if keep_through is not None and os.path.exists(path):
        with open(path) as f:
            lines = [line for line in f if (step := _step_of(line)) is not None and step <= keep_through]
        atomic_write(path, "".join(lines))
    if record:
        append_synced(path, json.dumps(record) + "\n")


def _step_of(line: str) -> int | None:
    """A line's step; None for the half-written last line a kill can leave."""
    try:
        return json.loads(line)["step"]
    except json.JSONDecodeError:
        return None


def export(model, tokenizer, out: str, rank: int) -> None:
    """A Hugging Face folder in out/export (weights.save_streaming: one full tensor at a time, so no
    rank holds the model in host memory), written to export.tmp and renamed."""
    import torch.distributed as dist
    import weights
    tmp, final = os.path.join(out, "export.tmp"), os.path.join(out, "export")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    weights.save_streaming(model, tokenizer, tmp, rank)
    if rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    dist.barrier()


def finished_steps(out: str) -> int:
    """The steps of out's last whole checkpoint when the model was exported after it (a run that ended), else 0."""
    found = complete(out)
    exported = os.path.join(out, "export", "config.json")
    if not found or not os.path.exists(exported):
        return 0
    state = os.path.join(found[-1], "trainer_state.json")
    if os.path.getmtime(exported) < os.path.getmtime(state):   # trained on after its export, then stopped
        return 0
    with open(state) as f:
        return json.load(f)["step"]
