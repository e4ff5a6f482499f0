"""weights.py: two gloo ranks load a safetensors checkpoint through the scale path (meta build, FSDP2,
each rank its own rows): every parameter equals from_pretrained's, each rank's host memory grows by its
shard and a slice (<= 60% of the model's fp32 size, and within 10% of the memory plan), and the streaming
export reloads to the same logits."""
import json
import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

import memory_plan
import weights

transformers = pytest.importorskip("transformers")

# 8 layers of ~16M parameters (512 MB in fp32), a small vocabulary: no single tensor is a large share of the
# model, so a rank's growth at load is its shard (half the model at 2 ranks) plus one slice; building the
# modules costs ~10 MB of Python objects besides, which the plan does not count
MODEL = dict(vocab_size=1024, hidden_size=1024, intermediate_size=4096, num_hidden_layers=8, num_attention_heads=8,
             num_key_value_heads=4, max_position_embeddings=256, tie_word_embeddings=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _checkpoint(folder, dtype=torch.float32, tied=False) -> None:
    from transformers import ByT5Tokenizer, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{**MODEL, "tie_word_embeddings": tied})).to(dtype)
    model.save_pretrained(folder, max_shard_size="100MB")   # several files and an index
    ByT5Tokenizer().save_pretrained(folder)


def _rank(rank, port, folder, out, world):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, ByT5Tokenizer
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from transformers import LlamaForCausalLM  # noqa: F401  (imports are not the load: done before measuring)
        import accelerate  # noqa: F401
        before = memory_plan.reset_host_peak()
        model = weights.empty_model(AutoConfig.from_pretrained(folder))
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        weights.materialize(model, torch.device("cpu"))
        weights.load_own_rows(model, folder)
        growth = memory_plan.host_peak() - before
        full = {name: t.full_tensor() for name, t in model.state_dict().items()}
        ids = torch.tensor([[3, 17, 200, 5, 9]])
        logits = model(input_ids=ids).logits   # FSDP2 gathers for the forward: a plain tensor
        os.makedirs(os.path.join(out, "export"), exist_ok=True)
        dist.barrier()
        weights.save_streaming(model, ByT5Tokenizer(), os.path.join(out, "export"), rank, max_shard_bytes=100 << 20)
        dist.barrier()
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump({"growth": growth}, f)
        if rank == 0:
            torch.save({"state": full, "logits": logits.detach()}, os.path.join(out, "loaded.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_load_their_own_rows_and_export_streams(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM
    folder = str(tmp_path / "model")
    _checkpoint(folder)
    mp.spawn(_rank, args=(_free_port(), folder, str(tmp_path), 2), nprocs=2)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    loaded = torch.load(tmp_path / "loaded.pt")
    assert loaded["state"].keys() == reference.state_dict().keys()
    for name, tensor in reference.state_dict().items():
        assert torch.equal(loaded["state"][name], tensor), name
    fp32_bytes = 4 * sum(p.numel() for p in reference.parameters())
    shape = memory_plan.model_shape(AutoConfig.from_pretrained(folder))
    planned = memory_plan.make_plan(shape, memory_plan.Settings(nproc=2, device="cpu")).peak("load", "host")
    for rank in range(2):
        growth = json.load(open(tmp_path / f"rank{rank}.json"))["growth"]
        assert growth <= 0.6 * fp32_bytes, (rank, growth, fp32_bytes)
        assert abs(growth - planned) <= 0.1 * growth, (rank, growth, planned)
    # the export: several safetensors files, reloading to the same weights and logits
    export = tmp_path / "export"
    index = json.load(open(export / weights.INDEX_FILE))
    assert len(set(index["weight_map"].values())) > 1
    reloaded = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name
    ids = torch.tensor([[3, 17, 200, 5, 9]])
    torch.testing.assert_close(reloaded(input_ids=ids).logits, reference(input_ids=ids).logits)
    torch.testing.assert_close(loaded["logits"], reference(input_ids=ids).logits)


def test_a_bf16_checkpoint_loads_into_fp32_shards_and_exports_in_bf16(tmp_path):
    """One process (a world of one): the file's bf16 values, upcast exactly; the export keeps the
    checkpoint's dtype; a tied head is read once and written once."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM, ByT5Tokenizer
    folder = str(tmp_path / "model")
    _checkpoint(folder, dtype=torch.bfloat16, tied=True)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        model = weights.empty_model(AutoConfig.from_pretrained(folder))
        fully_shard(model)
        weights.materialize(model, torch.device("cpu"))
        weights.load_own_rows(model, folder)
        reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
        for name, tensor in reference.state_dict().items():
            got = model.state_dict()[name].full_tensor()
            assert got.dtype == torch.float32 and torch.equal(got, tensor.float()), name
        os.makedirs(tmp_path / "export")
        weights.save_streaming(model, ByT5Tokenizer(), str(tmp_path / "export"), 0)
    finally:
        dist.destroy_process_group()
    from safetensors import safe_open
    with safe_open(str(tmp_path / "export" / weights.SINGLE_FILE), "pt") as f:
        keys = set(f.keys())
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16
    assert "lm_head.weight" not in keys and "model.embed_tokens.weight" in keys


def test_a_checkpoint_that_lacks_a_weight_or_has_another_shape_is_refused_by_name(tmp_path):
    import torch.distributed as dist
    from safetensors.torch import load_file, save_file
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig
    folder = tmp_path / "model"
    _checkpoint(str(folder))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        model = weights.empty_model(AutoConfig.from_pretrained(folder))
        fully_shard(model)
        weights.materialize(model, torch.device("cpu"))
        index = json.load(open(folder / weights.INDEX_FILE))
        file = folder / index["weight_map"]["model.norm.weight"]
        tensors = load_file(file)
        tensors["model.norm.weight"] = torch.ones(7)
        save_file(tensors, file)
        with pytest.raises(ValueError, match=r"model.norm.weight: the checkpoint's shape \[7\] is not the model's \[1024\]"):
            weights.load_own_rows(model, str(folder))
        del index["weight_map"]["model.norm.weight"]
        json.dump(index, open(folder / weights.INDEX_FILE, "w"))
        with pytest.raises(KeyError, match="lacks 1 of the model's weights, e.g. \\['model.norm.weight'\\]"):
            weights.load_own_rows(model, str(folder))
    finally:
        dist.destroy_process_group()
    with pytest.raises(FileNotFoundError, match="no model.safetensors or model.safetensors.index.json"):
        weights.weight_files(str(tmp_path))
