"""offload.py: where the training state waits while it is not used: Kevin's memory recipe for FSDP2.

A 32B policy's fp32 training state is 16 bytes a parameter: shards (4), gradients (4) and AdamW's
two moments (8), divided by the ranks. Two moves keep the GPU for what each phase needs:

- optimizer offload (Kevin-32B trained with DeepSpeed ZeRO-3 and its optimizer state offloaded):
  the moments live in host memory. There is one AdamW per FSDP2 unit (each decoder layer, then the
  root's embedding, head and norm), and `optimizer_step` brings one unit's moments to the GPU, steps
  it there, and sends them back: the step's GPU peak holds one unit's moments, not all of them, and
  the arithmetic stays on the GPU (DeepSpeed runs it on the CPU instead);
- offload for generation (verl's offload for rollout): `decoding_copy` sends the fp32 shards and
  the moments to host memory, then builds a bf16 copy of the policy on the GPU for the engine to
  decode with (weights.generation_copy); afterwards the copy is freed and the shards come back.
  The generation phase then holds the bf16 copy and the KV cache alone.

Every function is called on every rank in the same order (the copy's all-gathers are collectives).
memory_plan.py counts what each leaves on the GPU; docs/PERFORMANCE.md what each costs in seconds.
"""
from __future__ import annotations

import contextlib
import functools

import torch

import weights


def make_optimizers(model, lr: float, weight_decay: float, per_unit: bool) -> list:
    """[AdamW], or with `per_unit` one AdamW per FSDP2 unit: each decoder layer, then the rest."""
    adamw = functools.partial(torch.optim.AdamW, lr=lr, weight_decay=weight_decay)
    if not per_unit:
        return [adamw(model.parameters())]
    units = [list(layer.parameters()) for layer in model.model.layers]
    in_units = {id(p) for unit in units for p in unit}
    return [adamw(unit) for unit in units + [[p for p in model.parameters() if id(p) not in in_units]]]


def move_moments(optimizers: list, device) -> None:
    """Every state tensor of the optimizers (AdamW's exp_avg, exp_avg_sq) to `device`; the step count
    stays a host scalar."""
    for optimizer in optimizers:
        for state in optimizer.state.values():
            for key, value in state.items():
                if torch.is_tensor(value) and key != "step":
                    state[key] = value.to(device, non_blocking=True)


def optimizer_step(optimizers: list, offload: bool, device: torch.device) -> None:
    """Step every optimizer and clear its gradients; with `offload` each unit's moments come to `device`
    for its own step only."""
    for optimizer in optimizers:
        if offload:
            move_moments([optimizer], device)
        optimizer.step()
        if offload:
            move_moments([optimizer], "cpu")
        optimizer.zero_grad(set_to_none=True)


@contextlib.contextmanager
def decoding_copy(model, optimizers: list, device: torch.device, moments_on_gpu: bool):
    """The training state in host memory and a bf16 copy of the policy on `device` for the body of the
    `with`; then the copy freed and the shards (and the moments, if `moments_on_gpu`) back on `device`."""
    model.to("cpu")   # FSDP2's _apply reshards first and re-points its shards
    move_moments(optimizers, "cpu")
    try:
        with weights.generation_copy(model, device) as copy:
            try:
                yield copy
            finally:
                del copy
    finally:
        torch.cuda.empty_cache()
        model.to(device)
    if moments_on_gpu:
        move_moments(optimizers, device)
