"""memory_plan.py and train.py --plan: QwQ-32B counted from its config.json alone, each category the
formula of the module docstring, generation rows chosen to fit, and a plan that cannot fit refused in
one line that names the phase and what would make it fit. (The plan against measured memory: the load
in tests/test_weights.py on two gloo ranks, every phase on a GPU in bench/rehearsal.py.)"""
import dataclasses
import os

import pytest

import memory_plan
import train

pytest.importorskip("transformers")
QWQ = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "qwq-32b")


@pytest.fixture(scope="module")
def qwq():
    return memory_plan.model_shape(memory_plan.read_config(QWQ))


def test_qwq_32b_is_counted_from_its_config(qwq):
    hidden, inter, vocab, kv = 5120, 27648, 152064, 8 * 128
    layer = (hidden * hidden + hidden) + 2 * (hidden * kv + kv) + hidden * hidden + 3 * hidden * inter + 2 * hidden
    assert qwq.layer_params == layer
    assert qwq.params == 64 * layer + 2 * vocab * hidden + hidden   # untied head, final norm
    assert qwq.kv_bytes_per_token == 256 * 1024                     # DESIGN.md: 256 KiB a token
    assert qwq.dtype_bytes == 2 and qwq.largest_param == vocab * hidden


def test_each_category_is_its_formula(qwq):
    s = memory_plan.Settings(nproc=8, gpu_bytes=141 * 10**9, rows=4, prompt_tokens=8192, new_tokens=16384,
                             micro_batch_tokens=32768, offload_optimizer=True)
    plan = memory_plan.make_plan(qwq, s)
    P = qwq.params
    assert plan.gpu["backward"]["fp32 shards"] == 4 * P // 8 and plan.gpu["backward"]["gradients"] == 4 * P // 8
    assert plan.host["backward"]["AdamW moments"] == 8 * P // 8 and plan.gpu["generation"]["AdamW moments"] == 0
    assert plan.gpu["optimizer"]["AdamW moments"] == 8 * qwq.root_params // 8   # one unit's at a time: the largest
    assert plan.gpu["generation"]["KV cache"] == 4 * (8192 + 16384) * 256 * 1024
    assert plan.gpu["generation"]["generation copy (bf16)"] == 2 * P
    assert plan.gpu["backward"]["saved layer inputs"] == 64 * (8192 + 16384) * 5120 * 2   # one whole row a micro-batch
    on_host = memory_plan.make_plan(qwq, dataclasses.replace(s, offload_for_generation=True))
    assert "fp32 shards" not in on_host.gpu["generation"] and on_host.host["generation"]["fp32 shards"] == 4 * P // 8
    # a micro-batch holds at least one row: fewer tokens than a row change nothing
    assert memory_plan.make_plan(qwq, dataclasses.replace(s, micro_batch_tokens=1024)).gpu["backward"] == \
        memory_plan.make_plan(qwq, dataclasses.replace(s, micro_batch_tokens=24576)).gpu["backward"]


def test_rows_that_fit_are_the_most_that_fit(qwq):
    s = memory_plan.Settings(nproc=8, gpu_bytes=141 * 10**9, prompt_tokens=8192, new_tokens=22528,
                             micro_batch_tokens=32768, offload_optimizer=True, offload_for_generation=True)
    rows = memory_plan.rows_that_fit(qwq, s, 16)
    assert 1 <= rows < 16
    fits = lambda r: memory_plan.make_plan(qwq, dataclasses.replace(s, rows=r)).peak("generation") <= 0.95 * s.gpu_bytes
    assert fits(rows) and not fits(rows + 1)


def test_plan_flag_prints_the_table_and_exits_by_whether_it_fits(capsys):
    train.main(["--preset", "kevin", "--plan", "--model", QWQ, "--nproc", "8", "--gpu-memory-gb", "141"])
    out = capsys.readouterr().out
    assert all(f"\n{phase} " in out for phase in memory_plan.PHASES)
    assert out.splitlines()[-1].endswith(": fits (5% of the GPU kept free)") and "32.76B parameters" in out
    with pytest.raises(SystemExit) as info:
        train.main(["--preset", "kevin", "--plan", "--model", QWQ, "--nproc", "8", "--gpu-memory-gb", "40"])
    message = str(info.value)
    assert "\n" not in message and message.startswith("train.py: the memory plan does not fit: ")
    assert "of 40.0 GB a GPU at 8 ranks; no offload or batch flag makes it fit" in message
    # without the preset's offloads and its rows chosen to fit, the flags that make it fit are named
    with pytest.raises(SystemExit) as info:
        train.main(["--preset", "kevin", "--plan", "--model", QWQ, "--nproc", "8", "--gpu-memory-gb", "141",
                    "--no-offload-optimizer", "--no-offload-for-generation", "--generation-batch-rows", "16"])
    assert "it fits with --offload-optimizer" in str(info.value)


def test_plan_of_a_missing_model_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match=r"--model .*nope: no such directory$"):
        train.main(["--plan", "--model", str(tmp_path / "nope")])
