"""checkpoint.py: a leftover .tmp is never a checkpoint, old ones are pruned, a save restores
model, optimizer and RNG exactly, and metrics.jsonl drops the steps a resume redoes (and the
half-written line a kill can leave); the file writers leave a file whole or as it was."""
import json
import os
import random
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import checkpoint


@pytest.fixture
def world_of_one():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_save_then_load_restores_weights_optimizer_and_rng(tmp_path, world_of_one):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_exp_avg = optimizer.state[model.weight]["exp_avg"].clone()
    os.makedirs(tmp_path / "checkpoints" / "step_000009.tmp")   # a save killed half way
    for step in (1, 2, 3):
        checkpoint.save(model, optimizer, str(tmp_path), step, {"success": {"t": [1, 2]}}, rank=0, keep=2)
    assert [os.path.basename(p) for p in checkpoint.complete(str(tmp_path))] == ["step_000002", "step_000003"]
    expected_draw = (torch.rand(1), random.random())
    with torch.no_grad():
        model.weight.zero_()
    optimizer.state[model.weight]["exp_avg"].zero_()
    torch.rand(5)
    state = checkpoint.load(model, optimizer, checkpoint.complete(str(tmp_path))[-1], rank=0)
    assert state == {"success": {"t": [1, 2]}, "step": 3}
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    assert torch.equal(optimizer.state[model.weight]["exp_avg"], saved_exp_avg)
    assert (torch.rand(1), random.random()) == expected_draw


def test_write_metrics_keeps_the_steps_up_to_the_checkpoint(tmp_path):
    for step in (1, 2, 3):
        checkpoint.write_metrics(str(tmp_path), {"step": step, "loss": step / 10})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "lo')   # killed in the middle of a write
    checkpoint.write_metrics(str(tmp_path), {}, keep_through=2)
    checkpoint.write_metrics(str(tmp_path), {"step": 3, "loss": 0.5})
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert rows == [{"step": 1, "loss": 0.1}, {"step": 2, "loss": 0.2}, {"step": 3, "loss": 0.5}]


def test_export_writes_a_tied_head_once_and_reloads_to_the_same_logits(tmp_path, world_of_one):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, ByT5Tokenizer, Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                         num_key_value_heads=1, vocab_size=300, tie_word_embeddings=True))
    checkpoint.export(model, ByT5Tokenizer(), str(tmp_path), rank=0)
    with safe_open(str(tmp_path / "export" / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys
    ids = torch.tensor([[5, 6, 7, 8]])
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "export")
    torch.testing.assert_close(reloaded(ids).logits, model(ids).logits)


def test_start_resumes_from_the_last_checkpoint_and_a_fresh_run_refuses_one(tmp_path, world_of_one):
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    out = str(tmp_path)
    checkpoint.write_metrics(out, {"step": 1})
    assert checkpoint.start(model, optimizer, out, resume=True, rank=0) == (0, {})   # nothing to resume
    assert not os.path.exists(tmp_path / "metrics.jsonl")   # a fresh run's metrics start empty
    for step in (1, 2):
        checkpoint.write_metrics(out, {"step": step})
        checkpoint.save(model, optimizer, out, step, {"success": {"t": [1, 2]}}, rank=0, keep=2)
    checkpoint.write_metrics(out, {"step": 3})   # a step after the last checkpoint: redone on resume
    with pytest.raises(SystemExit, match="holds checkpoints; pass --resume"):
        checkpoint.start(model, optimizer, out, resume=False, rank=0)
    step, state = checkpoint.start(model, optimizer, out, resume=True, rank=0)
    assert step == 2 and state["success"] == {"t": [1, 2]}
    assert [json.loads(line)["step"] for line in open(tmp_path / "metrics.jsonl")] == [1, 2]


def test_atomic_write_leaves_the_whole_old_file_or_the_whole_new_one(tmp_path, monkeypatch):
    path = tmp_path / "new_folder" / "summary.json"
    checkpoint.atomic_write(str(path), "old\n")
    checkpoint.atomic_write(str(path), b"\x89PNG\r\n")   # bytes as well as text
    assert path.read_bytes() == b"\x89PNG\r\n"

    def cut(src, dst):
        raise OSError("no space left on device")
    monkeypatch.setattr(os, "replace", cut)
    with pytest.raises(OSError, match="no space left"):
        checkpoint.atomic_write(str(path), "half of a new file")
    monkeypatch.undo()
    assert path.read_bytes() == b"\x89PNG\r\n" and os.listdir(path.parent) == ["summary.json"]


def test_append_synced_adds_lines_and_the_writers_need_no_torch(tmp_path):
    path = str(tmp_path / "runs" / "records.jsonl")
    checkpoint.append_synced(path, "a\n")
    checkpoint.append_synced(path, "b\nc\n")
    assert open(path).read() == "a\nb\nc\n"
    # tasks.py writes its exports through this file: importing it must not cost torch
    code = ("import sys; sys.path.insert(0, %r); import checkpoint, tasks; assert 'torch' not in sys.modules; "
            "checkpoint.atomic_write(%r, 'x')") % (os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                   str(tmp_path / "x.txt"))
    subprocess.run([sys.executable, "-c", code], check=True)
    assert (tmp_path / "x.txt").read_text() == "x"
