"""Tests for train.py: one-line refusals of bad input, the FSDP2 gradient over 2 gloo ranks against
a single process, and an exact resume (timing off, so scores are exact)."""
import dataclasses
import json
import os
import re
import shutil
import socket

import pytest
import torch
import torch.multiprocessing as mp

import checkpoint
import grpo
import launch
import rollout
import train
import weights

transformers = pytest.importorskip("transformers")


def test_bad_inputs_fail_with_one_line_that_names_the_problem(tmp_path, capsys):
    for argv, reason in [
        (["--model", str(tmp_path / "nope")], "no such directory"),
        (["--task-ids", "builtin/level9/none"], "--task-ids not in the selected tasks: builtin/level9/none"),
        (["--task-ids", "", "--heldout", "48"], "no tasks selected"),   # every task held out
        (["--temperature", "0"], "--temperature must be > 0"),
        (["--top-p", "1.5"], "--top-p 1.5: must be in (0, 1]"),
        (["--max-new-tokens", "100"], "longest oracle answer"),
        (["--levels", "one"], "--levels 'one': expected comma-separated level numbers"),
        (["--turns", "0"], "--turns 0: must be at least 1"),
        (["--lr", "-1"], "--lr -1.0: must be > 0"),
        (["--generation-batch-rows", "-2"], "--generation-batch-rows -2: must be >= 0"),
        (["--device", "bogus"], "--device bogus: expected cpu, cuda or cuda:N"),
    ]:
        with pytest.raises(SystemExit) as info:
            train.main(argv + ["--out", str(tmp_path / "out")])
        message = str(info.value)
        assert message.startswith("train.py: ") and reason in message and "\n" not in message, message
    # argparse's refusals: one line (not the usage block) and exit 2; its wording varies with Python
    (tmp_path / "a_file").write_text("")
    a_file = tmp_path / "a_file"
    for argv, words in [
        (["--sampler", "bogus"], ["--sampler: invalid choice: 'bogus'", "uniform", "prioritized"]),
        (["--aggregation", "bogus"], ["--aggregation: invalid choice: 'bogus'", "dr_grpo", "token_mean", "seq_mean"]),
        (["--return-mode", "bogus"], ["--return-mode: invalid choice: 'bogus'", "sum", "max"]),
        (["--engine", "bogus"], ["--engine: invalid choice: 'bogus'", "hf", "vllm"]),
        (["--steps", "two"], ["--steps: invalid int value: 'two'"]),
        (["--out", str(a_file)], [f"--out {a_file}: {a_file} is a file, not a folder"]),
        (["--out", str(a_file / "run")], [f"--out {a_file / 'run'}: {a_file} is a file, not a folder"]),
    ]:
        capsys.readouterr()
        with pytest.raises(SystemExit) as info:
            train.main(argv)
        err = capsys.readouterr().err
        assert info.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("train.py: "), err
        assert all(w in err for w in words), err


def test_every_flag_has_a_one_line_help_with_its_default_and_its_choices(capsys):
    with pytest.raises(SystemExit) as info:
        train.main(["--help"])
    assert info.value.code == 0
    text = capsys.readouterr().out
    entries = re.split(r"\n  (?=-)", text.split("\noptions:\n", 1)[1])   # one per flag, its wrapped help joined
    helps = {entry.split()[0].rstrip(","): " ".join(entry.split()) for entry in entries}
    flags = ["--preset"] + ["--" + f.name.replace("_", "-") for f in dataclasses.fields(train.Config)]
    assert sorted(helps) == sorted(flags + ["-h"])
    for flag in flags:
        assert "(default: " in helps[flag], helps[flag]
    assert helps["--max-new-tokens"].endswith("(default: 2560; --preset kevin: 16384)")
    assert helps["--sampler"].startswith("--sampler {uniform,prioritized} ")
    assert helps["--speedup-cap"].endswith("(default: none)")


def test_every_rollout_setting_has_a_flag_that_reaches_the_rollout():
    given = {"n_trajectories": (["--trajectories", "3"], 3), "n_turns": (["--turns", "5"], 5),
             "max_new_tokens": (["--max-new-tokens", "77"], 77),
             "max_prompt_tokens": (["--max-prompt-tokens", "99"], 99),
             "temperature": (["--temperature", "0.7"], 0.7), "top_p": (["--top-p", "0.9"], 0.9),
             "stop": (["--stop", "</a>", "--stop", "###"], ("</a>", "###")), "gamma": (["--gamma", "0.5"], 0.5),
             "return_mode": (["--return-mode", "max"], "max"),
             "correctness_weight": (["--correctness-weight", "0.1"], 0.1),
             "speedup_cap": (["--speedup-cap", "4"], 4.0), "mask_truncated": (["--mask-truncated"], True),
             "expected_thinking_opening": (["--expected-thinking-opening", "Hmm"], "Hmm"),
             "overlap_turns": (["--no-overlap-turns"], False)}
    # language follows --device (C++ kernels on the CPU, CUDA kernels on a GPU)
    assert set(given) == {f.name for f in dataclasses.fields(rollout.RolloutConfig)} - {"language"}
    built = train.rollout_config(train.parse_config([a for argv, _ in given.values() for a in argv]), "cpp")
    assert {name: getattr(built, name) for name in given} == {name: value for name, (_, value) in given.items()}
    assert built.language == "cpp"


def test_the_update_takes_its_temperature_from_the_rollout_settings(tmp_path):
    """The log-prob contract: the loss's log-probs use the temperature the samples were drawn at, which
    is the RolloutConfig's; Config.temperature only builds it. Seen in the gradient norm."""
    import copy
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model, _ = weights.load_policy(train.Config())
        samples, advantages = _problem()

        def grad_norms(config_temperature, sampling_temperature):
            config = train.Config(temperature=config_temperature)
            sampling = rollout.RolloutConfig(temperature=sampling_temperature, max_new_tokens=8)
            copied = copy.deepcopy(model)
            optimizer = torch.optim.AdamW(copied.parameters(), lr=1e-3)
            return train.update(copied, [optimizer], samples, advantages, config, sampling, 0, 0,
                                torch.device("cpu"), 1)["grad_norm"]
        assert grad_norms(1.0, 0.5) == grad_norms(3.0, 0.5)   # Config's temperature is not read
        assert grad_norms(1.0, 0.5) != grad_norms(0.5, 1.0)   # the rollout's is
    finally:
        dist.destroy_process_group()


def test_resume_of_a_finished_run_has_nothing_to_do_and_keeps_its_export(tmp_path, capsys):
    """A run that ended: its last checkpoint (step 2 of --steps 2), then its export."""
    last = tmp_path / "checkpoints" / "step_000002"
    last.mkdir(parents=True)
    (last / "trainer_state.json").write_text(json.dumps({"step": 2, "success": {}}))
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "config.json").write_text("{}")
    before = os.stat(tmp_path / "export" / "config.json").st_mtime_ns
    train.main(["--out", str(tmp_path), "--resume"])
    assert capsys.readouterr().out.splitlines() == [
        f"train.py: {tmp_path} has finished its 2 steps and exported its model; nothing to do (a larger --steps "
        "trains on)"]
    assert os.stat(tmp_path / "export" / "config.json").st_mtime_ns == before and not (tmp_path / "export.tmp").exists()
    assert checkpoint.finished_steps(str(tmp_path)) == 2
    # trained on after that export (step 3 checkpointed, then stopped): not finished, the export is old
    os.utime(tmp_path / "export" / "config.json", ns=(before - 10**9, before - 10**9))
    assert checkpoint.finished_steps(str(tmp_path)) == 0


def test_ranks_of_a_node_get_disjoint_cpu_shares():
    """Each rank's share (in a fresh process: the binding is for the process's life)."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    allowed = sorted(os.sched_getaffinity(0))
    shares = []
    for rank in range(2):
        code = f"import os, launch; launch.bind_rank_cpus({rank}, 2); print(sorted(os.sched_getaffinity(0)))"
        out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
        shares.append(json.loads(out.stdout))
    half = len(allowed) // 2
    assert shares == [allowed[:half], allowed[half:2 * half]]


def test_builds_at_once_keep_every_build_cpu_busy_and_split_cpu_ranks(monkeypatch):
    """The harness's own count (a cuda rank's CPUs are already its share); ranks on cpu share the node's."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    import kernel_eval
    config = kernel_eval.EvalConfig()
    kept = config.timing_cpus
    assert launch.builds_at_once("cuda:0", 1) == (16 - kept) // config.build_jobs  # 7 on a 16-core H200 node
    assert launch.builds_at_once("cuda:0", 4) == launch.builds_at_once("cuda:0", 1)
    assert [launch.builds_at_once("cpu", n) for n in (1, 2, 32)] == [16, 8, 1]


def test_tokenizer_without_eos_is_refused(tmp_path):
    from transformers import ByT5Tokenizer, LlamaConfig, LlamaForCausalLM
    config = train.Config(model=str(tmp_path / "m"))
    LlamaForCausalLM(LlamaConfig(**weights.TINY_MODELS["tiny-llama"])).save_pretrained(config.model)
    tokenizer = ByT5Tokenizer()
    tokenizer.save_pretrained(config.model)
    path = os.path.join(config.model, "tokenizer_config.json")
    with open(path) as f:
        saved = json.load(f)
    saved["eos_token"] = None
    with open(path, "w") as f:
        json.dump(saved, f)
    with pytest.raises(SystemExit, match="has no eos_token_id"):
        weights.load_policy(config)


def _sample(prompt, completion, ret):
    return rollout.Sample("t", 0, 0, prompt, completion, [0] * len(prompt) + [1] * len(completion), None, "",
                          False, "correct", ret, ret, 0.0, None, "")


def _problem():
    g = torch.Generator().manual_seed(0)
    samples = [_sample(torch.randint(3, 300, (n,), generator=g).tolist(),
                       torch.randint(3, 300, (m,), generator=g).tolist(), float(r))
               for n, m, r in [(5, 3, 1.0), (7, 2, 0.0), (4, 6, 2.0), (6, 4, 0.5)]]
    return samples, torch.tensor([0.5, -1.0, 1.5, -1.0])


def _gradient(model, samples, advantages, total, world, device=torch.device("cpu")):
    for batch in rollout.micro_batches(samples, 0, 1 << 20, device):
        logp, mask = grpo.completion_logprobs(model, batch, temperature=0.7)
        loss, _ = grpo.policy_loss(logp, logp.detach(), advantages[batch["rows"]].to(device), mask,
                                   max_tokens=8, total=total.to(device))
        (loss * world).backward()


def _rank(rank, port, out, world=2, device_type="cpu"):
    """One rank of `world` (gloo on CPU, NCCL on CUDA): weights.shard's FSDP2 model, this rank's rows
    of _problem with Z over all four, the full gradient saved by rank 0."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model, _ = weights.load_policy(train.Config())
        model = weights.shard(model.to(device), train.Config(), device, world)
        samples, advantages = _problem()
        mine = list(range(rank, 4, world))   # each rank its own rows, Z over all four
        _gradient(model, [samples[i] for i in mine], advantages[mine], torch.tensor(4.0 * 8), world, device)
        grads = {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).float().cpu()
                 for n, p in model.named_parameters()}
        if rank == 0:
            torch.save(grads, out)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_fsdp2_gradient_on_two_gloo_ranks_equals_one_process(tmp_path):
    torch.manual_seed(0)
    model, _ = weights.load_policy(train.Config())
    samples, advantages = _problem()
    _gradient(model, samples, advantages, torch.tensor(4.0 * 8), 1)
    mp.spawn(_rank, args=(_free_port(), str(tmp_path / "g.pt")), nprocs=2)
    sharded = torch.load(tmp_path / "g.pt")
    assert any(float(p.grad.abs().max()) > 0 for p in model.parameters())
    for name, p in model.named_parameters():
        torch.testing.assert_close(sharded[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)
    # control: without the global Z (each rank normalising by its own rows) the gradient differs
    model.zero_grad()
    _gradient(model, samples[:1], advantages[:1], torch.tensor(1.0 * 8), 1)
    assert not all(torch.allclose(sharded[n], p.grad) for n, p in model.named_parameters())



@pytest.mark.gpu
def test_fsdp2_gradient_on_two_nccl_ranks_equals_one_rank_in_bf16(tmp_path):
    """Issue 19: the same batch on 1 and on 2 CUDA ranks (bf16 compute, fp32 gradient reduction).
    Tolerance: each parameter's gradient within 2% of its largest entry (bf16 keeps 8 bits of
    mantissa, 0.4% per rounding; the two runs' micro-batches pad to different widths)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    mp.spawn(_rank, args=(_free_port(), str(tmp_path / "one.pt"), 1, "cuda"), nprocs=1)
    mp.spawn(_rank, args=(_free_port(), str(tmp_path / "two.pt"), 2, "cuda"), nprocs=2)
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert any(float(g.abs().max()) > 0 for g in one.values())
    for name, g in one.items():
        assert float((two[name] - g).abs().max()) <= 0.02 * float(g.abs().max()) + 1e-8, name


@pytest.mark.slow
def test_resume_after_step_2_gives_the_uninterrupted_step_3(tmp_path, capsys):
    common = ["--task-ids", "builtin/level1/01_relu", "--tasks-per-step", "1", "--trajectories", "2",
              "--turns", "1", "--max-new-tokens", "1100", "--no-time-kernels", "--steps", "3",
              "--keep-checkpoints", "3"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    train.main(common + ["--out", str(whole)])
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"train.py: done after 3 of 3 steps; metrics.jsonl, plots/, checkpoints/ and the exported model (export/) "
        f"are in {whole}")
    # The same run killed after step 2's checkpoint: step 3's checkpoint and metrics never written.
    shutil.copytree(whole, cut)
    shutil.rmtree(cut / "checkpoints" / "step_000003")
    shutil.rmtree(cut / "export")
    with pytest.raises(SystemExit, match="pass --resume"):
        train.main(common + ["--out", str(cut)])
    train.main(common + ["--out", str(cut), "--resume"])
    lines = {name: [json.loads(x) for x in open(d / "metrics.jsonl")] for name, d in (("whole", whole), ("cut", cut))}
    assert [r["step"] for r in lines["cut"]] == [1, 2, 3]
    drop = ("seconds_generation", "seconds_evaluation", "seconds_training", "seconds_step", "seconds_logprobs",
            "seconds_backward", "seconds_optimizer")
    same = [{k: v for k, v in r.items() if k not in drop} for r in lines["whole"]]
    assert same == [{k: v for k, v in r.items() if k not in drop} for r in lines["cut"]]
    assert sum(r["status_counts"].get("correct", 0) for r in lines["whole"]) >= 1, lines["whole"]
    from transformers import AutoModelForCausalLM
    a = AutoModelForCausalLM.from_pretrained(whole / "export").state_dict()
    b = AutoModelForCausalLM.from_pretrained(cut / "export").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the finished run resumed: nothing to do, its export left as it is
    exported = {p.name: p.stat().st_mtime_ns for p in (whole / "export").iterdir()}
    train.main(common + ["--out", str(whole), "--resume"])
    assert capsys.readouterr().out.splitlines()[-1].endswith("has finished its 3 steps and exported its model; "
                                                             "nothing to do (a larger --steps trains on)")
    assert {p.name: p.stat().st_mtime_ns for p in (whole / "export").iterdir()} == exported


def test_candidates_the_harness_could_not_judge_are_counted_apart_in_the_metrics(tmp_path, monkeypatch, capsys):
    """harness_error is no verdict: not a sample, not a zero reward; metrics.jsonl counts it apart.
    Every answer is the built-in solution; the stand-in harness judges every other one correct (speedup 1,
    score 1.3) and cannot judge the rest."""
    import kernel_eval
    judged = []

    def second_trajectory_unjudged(pairs, **_):
        verdicts = []
        for _ in pairs:
            judged.append(len(judged) % 2 == 0)
            verdicts.append(kernel_eval.EvalResult(status="correct", compiled=True, correct=True, speedup=1.0)
                            if judged[-1] else kernel_eval.EvalResult(status="harness_error", message="out of memory"))
        return verdicts
    monkeypatch.setattr(kernel_eval, "evaluate_batch", second_trajectory_unjudged)
    train.main(["--oracle-share", "1", "--steps", "1", "--turns", "1", "--trajectories", "4", "--task-ids",
                "builtin/level1/01_relu", "--tasks-per-step", "1", "--max-new-tokens", "1100", "--out", str(tmp_path)])
    assert judged == [True, False, True, False]
    (record,) = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert record["harness_errors"] == 2 and record["status_counts"] == {"correct": 2}
    assert record["reward_mean"] == pytest.approx(1.3)   # as a zero reward it would be 0.65
    assert record["correct_rate"] == 1.0 and record["correct_rate_per_turn"] == [1.0]
    assert "harness_error 2 (no verdict)" in capsys.readouterr().out


@pytest.mark.parametrize("groups", ["task", "task_turn"])
def test_advantages_are_grouped_per_task_or_per_task_and_turn(tmp_path, monkeypatch, groups):
    """--advantage-groups task (Kevin's) normalises over a task's G*T samples; task_turn over each turn's G."""
    import grpo
    import kernel_eval
    seen = []
    real = grpo.group_advantages
    monkeypatch.setattr(grpo, "group_advantages", lambda returns, ids, **kw: seen.append(list(ids)) or real(returns, ids, **kw))
    monkeypatch.setattr(kernel_eval, "evaluate_batch", lambda pairs, **_: [
        kernel_eval.EvalResult(status="correct", compiled=True, correct=True, speedup=1.0) for _ in pairs])
    train.main(["--oracle-share", "1", "--steps", "1", "--turns", "2", "--trajectories", "2", "--task-ids",
                "builtin/level1/01_relu", "--tasks-per-step", "1", "--max-new-tokens", "1100", "--out", str(tmp_path),
                "--advantage-groups", groups])
    task = "builtin/level1/01_relu"
    assert sorted(seen[0], key=str) == ([task] * 4 if groups == "task" else [(task, 0), (task, 0), (task, 1), (task, 1)])


def test_seconds_lost_to_timeouts_are_summed_in_the_metrics(tmp_path, monkeypatch):
    """metrics.jsonl's timeout_seconds is the sum of the verdicts' timeout_seconds (the stand-in
    harness: every other candidate a timeout that waited 6.5 s, the rest correct)."""
    import kernel_eval
    n = [0]

    def every_other_timed_out(pairs, **_):
        verdicts = []
        for _ in pairs:
            n[0] += 1
            verdicts.append(kernel_eval.EvalResult(status="correct", compiled=True, correct=True, speedup=1.0)
                            if n[0] % 2 else kernel_eval.EvalResult(status="timeout", compiled=True, timeout_seconds=6.5,
                                                                     message="candidate timed out during check"))
        return verdicts
    monkeypatch.setattr(kernel_eval, "evaluate_batch", every_other_timed_out)
    train.main(["--oracle-share", "1", "--steps", "1", "--turns", "1", "--trajectories", "4", "--task-ids",
                "builtin/level1/01_relu", "--tasks-per-step", "1", "--max-new-tokens", "1100", "--out", str(tmp_path)])
    (record,) = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert record["status_counts"] == {"correct": 2, "timeout": 2} and record["timeout_seconds"] == 13.0
    assert record["timeout_messages"] == ["candidate timed out during check"]  # the two, one message


@pytest.mark.parametrize("reuse", [False, True])
def test_metrics_count_builds_compiled_and_reused_and_verdicts_reused(tmp_path, monkeypatch, capsys, reuse):
    """Two steps of 4 identical answers (the built-in solution) through a stand-in harness that builds a
    batch's distinct kernels once and finds them in its cache afterwards (as kernel_eval does): step 1
    compiles one kernel, step 2 none. With --reuse-verdicts the harness sees one candidate in step 1 (3
    verdicts reused) and none in step 2 (4 reused); without, it judges all 4 each step (step 2: 1 cache hit)."""
    import kernel_eval
    cache, batches = set(), []

    def caching_harness(pairs, **_):
        batches.append(len(pairs))
        before = set(cache)
        cache.update(code for _, code in pairs)
        return [kernel_eval.EvalResult(status="correct", compiled=True, correct=True, speedup=1.0,
                                       build_reused=code in before) for _, code in pairs]
    monkeypatch.setattr(kernel_eval, "evaluate_batch", caching_harness)
    train.main(["--oracle-share", "1", "--steps", "2", "--turns", "1", "--trajectories", "4", "--task-ids",
                "builtin/level1/01_relu", "--tasks-per-step", "1", "--max-new-tokens", "1100", "--out", str(tmp_path),
                "--no-time-kernels", "--reuse-verdicts" if reuse else "--no-reuse-verdicts"])
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    counts = [(r["kernels_compiled"], r["builds_reused"], r["verdicts_reused"]) for r in records]
    if reuse:
        assert batches == [1] and counts == [(1, 0, 3), (0, 0, 4)]
    else:
        assert batches == [4, 4] and counts == [(1, 0, 0), (0, 1, 0)]
    assert all(r["status_counts"] == {"correct": 4} for r in records)
    assert f"compiled 0, cached {0 if reuse else 1}, verdicts reused {4 if reuse else 0}" in capsys.readouterr().out


def test_max_minutes_stops_before_a_step_and_still_exports(tmp_path, capsys):
    train.main(["--max-minutes", "0.0001", "--out", str(tmp_path)])
    captured = capsys.readouterr()
    assert "stopping before step 1: --max-minutes" in captured.out + captured.err
    assert not os.path.exists(tmp_path / "metrics.jsonl")
    assert os.path.exists(tmp_path / "export" / "config.json")
    # the last line says where the run went and how to continue it
    assert captured.out.splitlines()[-1] == (
        f"train.py: stopped after 0 of 2 steps; metrics.jsonl, plots/, checkpoints/ and the exported model (export/) "
        f"are in {tmp_path}; continue with: python {os.path.relpath(train.__file__)} --max-minutes 0.0001 "
        f"--out {tmp_path} --resume")


def test_top_p_below_1_is_taken_and_said_to_break_the_log_prob_contract(tmp_path, capsys):
    train.main(["--top-p", "0.9", "--max-minutes", "0.0001", "--out", str(tmp_path)])
    assert ("train.py: --top-p 0.9: samples come from the nucleus, the loss's log-probs from the whole "
            "softmax(logits / temperature): the log-prob contract holds at 1 only") in capsys.readouterr().err.splitlines()


def test_vllm_engine_is_woken_synced_and_put_to_sleep_around_each_rollout(tmp_path, monkeypatch, capsys):
    """vLLM cannot be installed here: a fake `vllm` module records what train.py asks of it."""
    import sys
    import types
    from transformers import ByT5Tokenizer, LlamaConfig, LlamaForCausalLM
    import engines
    log = []
    tokenizer = ByT5Tokenizer()
    model_dir = str(tmp_path / "model")
    LlamaForCausalLM(LlamaConfig(**weights.TINY_MODELS["tiny-llama"], eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)

    class FakeLLM:
        def __init__(self, model, **kwargs):
            log.append(("init", model, kwargs))

        def generate(self, prompts, params, use_tqdm=False):
            log.append(("generate", len(prompts), params.n))
            done = types.SimpleNamespace(token_ids=[tokenizer.eos_token_id], logprobs=None, text="", finish_reason="stop")
            return [types.SimpleNamespace(outputs=[done] * params.n) for _ in prompts]

        def sleep(self, level):
            log.append(("sleep", level))

        def wake_up(self, tags=None):
            log.append(("wake", tags))

        def collective_rpc(self, method, kwargs=None):   # the worker's reload_weights, in process
            log.extend(("load", name, tensor.dtype) for name, tensor in kwargs["weights_iterator"])

        def reset_prefix_cache(self):
            log.append(("reset",))

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=FakeLLM, SamplingParams=types.SimpleNamespace))
    monkeypatch.setenv("RANK", "0")   # what torchrun sets
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    train.main(["--engine", "vllm", "--model", model_dir, "--oracle-share", "0", "--steps", "2", "--turns", "1",
                "--trajectories", "2", "--task-ids", "builtin/level1/01_relu", "--tasks-per-step", "1",
                "--max-new-tokens", "300", "--late-max-new-tokens", "400", "--vllm-gpu-memory", "0.45",
                "--no-time-kernels", "--out", str(tmp_path / "out")])
    assert "--engine vllm has never run" in capsys.readouterr().out
    (_, model, kwargs), *rest = log
    assert model == model_dir and kwargs["seed"] == 0 and kwargs["gpu_memory_utilization"] == 0.45
    assert kwargs["max_model_len"] == engines.vllm_max_model_len(tokenizer, 8192, 400) and kwargs["dtype"] == "bfloat16"
    n_weights = len(LlamaForCausalLM.from_pretrained(model_dir).state_dict())
    one_step = ["wake"] + ["load"] * n_weights + ["reset", "wake", "generate", "sleep"]
    assert [entry[0] for entry in rest] == ["sleep"] + one_step * 2, rest
    assert {entry[1] for entry in rest if entry[0] == "sleep"} == {2}
    assert [entry[1] for entry in rest if entry[0] == "wake"] == [["weights"], ["kv_cache"]] * 2
    assert {entry[2] for entry in rest if entry[0] == "load"} == {torch.bfloat16}


def test_vllm_engine_is_refused_in_one_line_without_torchrun_or_without_vllm(tmp_path, monkeypatch):
    import sys
    argv = ["--engine", "vllm", "--model", "/models/any", "--out", str(tmp_path / "out")]
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit, match="^train.py: --engine vllm runs under torchrun "):
        train.main(argv)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.setenv(name, "0")
    monkeypatch.setitem(sys.modules, "vllm", None)   # `import vllm` fails as when it is not installed
    with pytest.raises(SystemExit, match=r"^train.py: --engine vllm needs vLLM \(pip install vllm\): "):
        train.main(argv)
