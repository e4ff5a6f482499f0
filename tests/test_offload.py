"""offload.py: one AdamW per FSDP2 unit steps exactly as one AdamW over every parameter, with or without
the moments' trips; the decoding copy is the policy in bf16, and the policy is whole after it. (On the
CPU the trips are to the same device: what the GPU adds, the moves themselves, ran in
bench/rehearsal.py on an H100.)"""
import copy
import socket

import pytest
import torch
import torch.distributed as dist

import offload

transformers = pytest.importorskip("transformers")


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                        num_attention_heads=4, num_key_value_heads=2))


def _steps(model, optimizers, offload_moments):
    for step in range(3):
        ids = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(step))
        model(input_ids=ids, labels=ids).loss.backward()
        offload.optimizer_step(optimizers, offload_moments, torch.device("cpu"))


def test_one_optimizer_per_unit_steps_as_one_optimizer():
    whole, units = _model(), _model()
    optimizers = offload.make_optimizers(units, lr=1e-2, weight_decay=0.1, per_unit=True)
    assert len(optimizers) == 3 + 1   # each layer, then the embedding, head and norm
    covered = [id(p) for o in optimizers for g in o.param_groups for p in g["params"]]
    assert sorted(covered) == sorted(id(p) for p in units.parameters())   # every parameter once
    _steps(whole, offload.make_optimizers(whole, lr=1e-2, weight_decay=0.1, per_unit=False), False)
    _steps(units, optimizers, True)
    for (name, a), b in zip(whole.named_parameters(), units.parameters()):
        assert torch.equal(a, b), name
    assert all(p.grad is None for p in units.parameters())   # cleared after each step


def test_decoding_copy_is_the_policy_in_bf16_and_gives_it_back():
    from torch.distributed.fsdp import fully_shard
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        model = _model()
        reference = copy.deepcopy(model)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        optimizers = offload.make_optimizers(model, lr=1e-2, weight_decay=0.0, per_unit=True)
        with offload.decoding_copy(model, optimizers, torch.device("cpu"), moments_on_gpu=False) as decoding:
            assert not any(isinstance(p, torch.distributed.tensor.DTensor) for p in decoding.parameters())
            for name, tensor in reference.state_dict().items():
                assert decoding.state_dict()[name].dtype == torch.bfloat16
                assert torch.equal(decoding.state_dict()[name], tensor.to(torch.bfloat16)), name
        ids = torch.tensor([[1, 2, 3, 4]])
        torch.testing.assert_close(model(input_ids=ids).logits, reference(input_ids=ids).logits)
    finally:
        dist.destroy_process_group()
