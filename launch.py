"""launch.py: a train.py rank's place in its launch: its device and CPU share, the process group, the time
budget all ranks agree on, and the command that continues a stopped run.

`python train.py` is a world of one; under torchrun each rank reads RANK, WORLD_SIZE, LOCAL_RANK and
LOCAL_WORLD_SIZE. A cuda rank takes cuda:LOCAL_RANK and its own contiguous share of the node's CPUs
(bind_rank_cpus): the harness keeps a process's last CPUs for its timing windows, so ranks that shared
the CPUs would time their kernels on the same cores at once. builds_at_once is the harness's count of
builds for that share. --max-minutes stops before a step that would end past it (out_of_time, agreed
by all ranks, whose clocks differ); resume_command is what train.py prints when it stops early.
"""
from __future__ import annotations

import datetime
import os
import shlex
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Rank:
    rank: int
    world: int
    local_rank: int
    local_world: int
    device: torch.device


def ranks() -> tuple[int, int]:
    """(rank, world) of this launch: torchrun's, or 0 of 1."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def start(device_type: str, timeout_minutes: int) -> Rank:
    """This rank's device (a cuda rank's CPU share bound, its CUDA context made) and the process group
    (nccl on cuda, gloo on cpu) with the collective timeout. destroy_process_group ends it."""
    rank, world = ranks()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")   # `python train.py` is a world of one
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    device = torch.device("cuda", local_rank) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.zeros(1, device=device)   # the CUDA context now, so that the load's measured memory is the load's
        bind_rank_cpus(local_rank, local_world)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(minutes=timeout_minutes))
    return Rank(rank, world, local_rank, local_world, device)


def bind_rank_cpus(local_rank: int, local_world: int) -> None:
    """This rank's own share of the node's CPUs (contiguous, equal), for the process's life."""
    cpus = sorted(os.sched_getaffinity(0))
    share = len(cpus) // local_world
    if local_world > 1 and share >= 1:
        os.sched_setaffinity(0, cpus[local_rank * share:(local_rank + 1) * share])


def builds_at_once(eval_device: str, local_world: int) -> int:
    """The harness's own count of builds at once, every build CPU busy: a harness call's batch ends sooner
    than with fewer (docs/PERFORMANCE.md, "A training step's evaluation"). A cuda rank's CPUs are its own
    share already (bind_rank_cpus); ranks on cpu share the node's."""
    import kernel_eval
    builds = kernel_eval.default_parallel_compiles(eval_device, kernel_eval.EvalConfig())
    return builds if eval_device != "cpu" else max(1, builds // local_world)


def out_of_time(projected_seconds: float, max_minutes: float, device) -> bool:
    """Whether the next step would end past --max-minutes, agreed by all ranks (their clocks differ)."""
    late = torch.tensor(float(projected_seconds > 60 * max_minutes), device=device)
    dist.all_reduce(late, op=dist.ReduceOp.MAX)
    return bool(late)


def resume_command(script: str, argv: list[str], out: str) -> str:
    """The command that continues this run: the same launch and flags, --out spelled out, and --resume."""
    args = [a for a in argv if a not in ("--resume", "--no-resume")]
    if not any(a == "--out" or a.startswith("--out=") for a in args):
        args += ["--out", out]
    world, local_world = ranks()[1], int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    launch = (f"python {script}" if "TORCHELASTIC_RUN_ID" not in os.environ else
              f"torchrun --nproc_per_node={local_world} {script}" if world == local_world else
              f"torchrun <the same launch options> {script}")
    return f"{launch} {shlex.join(args + ['--resume'])}"
