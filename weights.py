"""weights.py: a Hugging Face checkpoint into FSDP2 shards and back out, never whole in one host.

`from_pretrained` on every rank holds the whole model in host memory once per rank (QwQ-32B in
fp32: 130 GB a rank, ~1 TB on an 8-GPU node) before anything is sharded. Here instead:

1. `empty_model(config)`: the model built with its parameters on the meta device (no memory;
   accelerate's `init_empty_weights`), its buffers real (RoPE's inv_freq is computed, not read);
2. the caller shards it with `fully_shard` (FSDP2 shards meta parameters as well as real ones);
3. `materialize(model, device)`: each rank allocates its own shards (`to_empty`), buffers restored;
4. `load_own_rows(model, folder)`: each rank reads, for every parameter, only its own rows of dim 0
   (FSDP2's `Shard(0)`: rank r holds rows [r*c, (r+1)*c), c = ceil(rows / world)) through
   safetensors' `get_slice`, one tensor at a time, and copies them into its shard in the shard's
   dtype. A rank's host memory holds one slice at a time, not the model.

Why each rank reads its own rows rather than rank 0 reading and broadcasting (FSDP2's
`set_model_state_dict(..., broadcast_from_rank0=True)`): no rank ever holds a whole tensor (a
152k x 5120 embedding is 3 GB in fp32), no collective runs during the load, the ranks read in
parallel, and the CPU-offload layout (shards in host memory) loads the same way. The price: every
rank must see the checkpoint's files (one node, or a shared file system).

`save_streaming(model, tokenizer, folder)` is the way back: every rank walks the parameters in
the same order and all-gathers one at a time (`full_tensor`, a collective); rank 0 casts it to the
checkpoint's dtype, keeps it in host memory until a safetensors shard of `max_shard_bytes` is full
and writes it, then writes the index, config and tokenizer: a Hugging Face folder that
`from_pretrained` and vLLM read, with at most one shard file's bytes in rank 0's host memory.
"""
from __future__ import annotations

import contextlib
import copy
import json
import functools
import math
import os
from typing import Iterator

import torch
import torch.distributed as dist

import memory_plan

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


def local_folder(model: str) -> str:
    """A local folder as it is; a hub id: its snapshot folder (downloaded into the Hugging Face cache
    if it is not there yet, config, tokenizer and safetensors files only)."""
    path = os.path.expanduser(model)
    if os.path.isdir(path):
        return path
    if model.startswith((".", "/", "~")):
        raise FileNotFoundError(f"{model}: no such directory")
    from huggingface_hub import snapshot_download
    return snapshot_download(model, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken"])


def weight_files(folder: str) -> dict[str, str]:
    """Parameter name -> the safetensors file that holds it."""
    index = os.path.join(folder, INDEX_FILE)
    if os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        return {name: os.path.join(folder, file) for name, file in weight_map.items()}
    single = os.path.join(folder, SINGLE_FILE)
    if not os.path.exists(single):
        raise FileNotFoundError(f"{folder}: no {SINGLE_FILE} or {INDEX_FILE} (only safetensors checkpoints load at scale)")
    from safetensors import safe_open
    with safe_open(single, "pt") as f:
        return {name: single for name in f.keys()}


def empty_model(config, dtype: torch.dtype = torch.float32):
    """The causal LM of `config` with meta parameters and real buffers."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM
    saved_as = checkpoint_dtype(config)   # from_config overwrites config.dtype with `dtype`
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()   # from_config leaves a tied head untied (from_pretrained ties it)
    model.checkpoint_dtype = saved_as   # what an export writes back
    return model


def materialize(model, device: torch.device) -> None:
    """Allocate every rank's shards on `device` (uninitialised; load_own_rows fills them); the real
    buffers, which to_empty would also leave uninitialised, are put back."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    model.to_empty(device=device)
    with torch.no_grad():
        for name, b in model.named_buffers():
            b.copy_(buffers[name])


def load_sharded(folder: str, config, shard, device: torch.device):
    """Steps 1-4 above: the model of `config` built empty, sharded by `shard(model) -> model` (fully_shard
    per layer, then the root), its shards allocated on `device` and filled from `folder`."""
    model = empty_model(config)
    model.config.use_cache = False   # the training forward keeps no KV cache
    model = shard(model)
    materialize(model, device)
    load_own_rows(model, folder)
    return model


def own_rows(param) -> tuple[torch.Tensor, int]:
    """(this rank's local tensor, its first global row): FSDP2's Shard(0) on a one-dimensional mesh
    gives rank r the rows [r*c, r*c + local rows), c = ceil(rows / world); a plain tensor is all rows."""
    from torch.distributed.tensor import DTensor, Shard
    if not isinstance(param, DTensor):
        return param.data, 0
    if param.device_mesh.ndim != 1 or tuple(param.placements) != (Shard(0),):
        raise ValueError(f"load_own_rows reads Shard(0) on a 1-D mesh, not {param.placements}")
    world, rank = param.device_mesh.size(), param.device_mesh.get_local_rank()
    local = param.to_local()
    first = rank * math.ceil(param.shape[0] / world)
    expected = max(0, min(param.shape[0] - first, math.ceil(param.shape[0] / world)))
    if local.shape[0] != expected:
        raise ValueError(f"a shard of {tuple(param.shape)} on rank {rank} of {world} has {local.shape[0]} rows, "
                         f"not {expected}")
    return local, first


@torch.no_grad()
def load_own_rows(model, folder: str) -> int:
    """Fill this rank's shard of every parameter and persistent buffer from the checkpoint in `folder`.
    Returns the bytes read. A name the checkpoint lacks is an error (a tied head is not a name twice)."""
    from safetensors import safe_open
    files = weight_files(folder)
    wanted = dict(model.named_parameters())
    persistent = set(model.state_dict().keys())
    wanted.update({n: b for n, b in model.named_buffers() if n in persistent and n in files})
    missing = sorted(set(wanted) - set(files))
    if missing:
        raise KeyError(f"{folder} lacks {len(missing)} of the model's weights, e.g. {missing[:3]}")
    read = 0
    for name, param in wanted.items():
        local, first = own_rows(param)
        # Open per tensor: the memory map's pages a slice touched leave with it, so the host holds one slice
        with safe_open(files[name], "pt") as f:
            piece = f.get_slice(name)
            shape = piece.get_shape()
            if list(shape) != list(param.shape):
                raise ValueError(f"{name}: the checkpoint's shape {list(shape)} is not the model's {list(param.shape)}")
            rows = piece[first:first + local.shape[0]] if len(shape) else piece[:]
        local.copy_(rows.to(local.device))   # the upcast happens in place, on the shard's device
        read += rows.numel() * rows.element_size()
        del rows
    return read


def checkpoint_dtype(config) -> torch.dtype:
    """The dtype a config names; fp32 when it names none."""
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def export_names(model) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) of what an export writes: the state dict less a tied head (the embedding)."""
    state = model.state_dict()
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if head is not None and embed is not None and head.weight is embed.weight:
        head_name = next(n for n, m in model.named_modules() if m is head) + ".weight"
        state.pop(head_name, None)
    return list(state.items())


def full_tensors(model, device: torch.device | str | None = None, dtype: torch.dtype | None = None,
                 exported_only: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) of each state-dict entry (`exported_only`: of export_names), one at a time, on
    `device` in `dtype` (None: as stored). A DTensor's shard is moved and cast before `full_tensor()`
    all-gathers it: NCCL gathers only GPU tensors (shards may wait in host memory) and a bf16 gather moves
    half the bytes of an fp32 one. Every rank walks it in step (the all-gathers are collectives); the
    extra memory is one full tensor."""
    from torch.distributed.tensor import DTensor
    for name, tensor in export_names(model) if exported_only else model.state_dict().items():
        if isinstance(tensor, DTensor):
            local = tensor.to_local().to(device=device, dtype=dtype)
            tensor = DTensor.from_local(local, tensor.device_mesh, tensor.placements, run_check=False,
                                        shape=tensor.shape, stride=tensor.stride()).full_tensor()
        else:
            tensor = tensor.to(device=device, dtype=dtype)
        yield name, tensor.detach()


def save_streaming(model, tokenizer, folder: str, rank: int, dtype: torch.dtype | None = None,
                   max_shard_bytes: int = 4 << 30) -> None:
    """Write `model` (FSDP2-sharded or not) as a Hugging Face folder, one full tensor at a time.
    Every rank calls it (the all-gathers are collectives); only rank 0 writes."""
    from safetensors.torch import save_file
    dtype = dtype or getattr(model, "checkpoint_dtype", None) or checkpoint_dtype(model.config)
    items = export_names(model)
    # shards decided up front from the global shapes, so each file's name knows the count
    shards, size = [[]], 0
    for name, tensor in items:
        nbytes = tensor.numel() * torch.empty((), dtype=dtype).element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    if len(shards) == 1:
        names = [SINGLE_FILE]
    shard_of = {name: k for k, shard in enumerate(shards) for name in shard}
    pending, weight_map, total = {}, {}, 0
    for i, (name, full) in enumerate(full_tensors(model, dtype=dtype, exported_only=True)):
        if rank == 0:
            pending[name] = full.cpu().contiguous()
            weight_map[name] = names[shard_of[name]]
            total += pending[name].numel() * pending[name].element_size()
        del full
        last_of_shard = i + 1 == len(items) or shard_of[items[i + 1][0]] != shard_of[name]
        if rank == 0 and last_of_shard:
            save_file(pending, os.path.join(folder, names[shard_of[name]]), metadata={"format": "pt"})
            pending = {}
    if rank == 0:
        if len(shards) > 1:
            with open(os.path.join(folder, INDEX_FILE), "w") as f:
                json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
        config = copy.deepcopy(model.config)
        config.dtype, config.use_cache = dtype, True   # the training forward had switched the cache off
        config.save_pretrained(folder)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(folder)
        tokenizer.save_pretrained(folder)


@contextlib.contextmanager
def generation_copy(model, device: torch.device, dtype: torch.dtype = torch.bfloat16):
    """A plain (unsharded) copy of an FSDP2 model in `dtype` on `device`, filled one full tensor at a
    time (every rank walks the same order: the all-gathers are collectives). The shards may wait in
    host memory: each comes to `device` alone for its all-gather (NCCL gathers device memory). It
    exists for the body of the `with`."""
    copy = empty_model(model.config, dtype=dtype)
    materialize(copy, device)
    targets = copy.state_dict()
    with torch.no_grad():
        for name, full in full_tensors(model, device, dtype):
            targets[name].copy_(full)
            del full
    copy.eval()
    try:
        yield copy
    finally:
        del copy, targets


# ----------------------------------------------------------------------------- train.py's policy
# `config` is train.Config (its model, cpu_offload, activation_checkpointing and compile fields).

TINY_MODELS = {  # named configs, randomly initialised, with the offline ByT5 byte tokenizer
    "tiny-llama": dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768),
}


def load_policy(config):
    """(model, tokenizer) of config.model on the host, whole (a built-in tiny model, or from_pretrained);
    every failure is one line that names the problem."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, ByT5Tokenizer, LlamaConfig, LlamaForCausalLM
    if config.model in TINY_MODELS:
        tokenizer = ByT5Tokenizer()
        model = LlamaForCausalLM(LlamaConfig(**TINY_MODELS[config.model], eos_token_id=tokenizer.eos_token_id,
                                             pad_token_id=tokenizer.pad_token_id, bos_token_id=None))
    else:
        if config.model.startswith((".", "/", "~")) and not os.path.isdir(os.path.expanduser(config.model)):
            raise SystemExit(f"train.py: --model {config.model}: no such directory")
        try:
            tokenizer = AutoTokenizer.from_pretrained(config.model)
            model = AutoModelForCausalLM.from_pretrained(config.model, dtype=torch.float32)
        except OSError as error:
            raise SystemExit(f"train.py: --model {config.model}: cannot load it: {str(error).splitlines()[0]}")
    if tokenizer.eos_token_id is None:
        raise SystemExit(f"train.py: the tokenizer of {config.model} has no eos_token_id: completions could never end")
    model.config.use_cache = False  # the training forward keeps no KV cache
    return model, tokenizer


def setup_policy(config, device: torch.device, world: int):
    """(FSDP2 model, tokenizer, the host memory the weights' load took). A built-in tiny model is built whole
    and sharded; a checkpoint is built on the meta device, sharded, and each rank reads only its own rows
    (load_sharded): no rank's host memory holds the model."""
    from transformers import AutoConfig, AutoTokenizer
    before = memory_plan.reset_host_peak()
    if config.model in TINY_MODELS:
        model, tokenizer = load_policy(config)
        return shard(model.to(device), config, device, world), tokenizer, memory_plan.host_peak() - before
    try:
        if dist.get_rank() == 0:   # a hub id's files: downloaded once, then the others find them cached
            local_folder(config.model)
        dist.barrier()
        folder = local_folder(config.model)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        hf_config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError) as error:
        raise SystemExit(f"train.py: --model {config.model}: cannot load it: {str(error).splitlines()[0]}")
    if tokenizer.eos_token_id is None:
        raise SystemExit(f"train.py: the tokenizer of {config.model} has no eos_token_id: completions could never end")
    before = memory_plan.reset_host_peak()   # the weights' load alone: what the plan's load phase counts
    try:
        model = load_sharded(folder, hf_config, functools.partial(shard, config=config, device=device, world=world),
                             torch.device("cpu") if config.cpu_offload else device)
    except (KeyError, ValueError, FileNotFoundError) as error:
        raise SystemExit(f"train.py: --model {config.model}: {str(error).strip(chr(39))}")
    return model, tokenizer, memory_plan.host_peak() - before


def shard(model, config, device: torch.device, world: int):
    """FSDP2: each decoder layer its own group, then the root (torchtitan's layout)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh(device.type, (world,))
    kwargs = dict(mesh=mesh)
    if device.type == "cuda":  # bf16 compute, fp32 master weights and gradient reduction
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if config.cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    if config.activation_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):   # transformers >= 5.2x renamed it
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for layer in model.model.layers:
        if config.compile:   # fuses norms, rotary, SwiGLU; forward only, so FSDP2's hooks stay eager
            layer.forward = torch.compile(layer.forward, dynamic=True)
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def model_config(config):
    """The model's transformers config, without its weights."""
    if config.model in TINY_MODELS:
        from transformers import LlamaConfig
        return LlamaConfig(**TINY_MODELS[config.model])
    try:
        return memory_plan.read_config(config.model)
    except (OSError, ValueError) as error:
        raise SystemExit(f"train.py: --model {config.model}: {str(error).splitlines()[0]}")
