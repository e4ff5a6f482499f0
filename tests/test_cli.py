"""The command lines as a newcomer meets them (issues 18 and 37): every bad input is one line on stderr
that names the problem, a non-zero exit and no traceback; a verdict, whatever it is, exits 0; Ctrl-C
stops kernel_eval.py and task_check.py within seconds, exit 130, with no process of theirs left,
and train.py and eval.py then print the command that continues the run. The rows of issue 37's table
that need a process of their own are here; the others are in test_train.py, test_eval.py and
test_train_log.py.

Each case runs the CLI as a subprocess, as a user would. The SIGINT tests interrupt a real build
(a fresh cache, so there is one) and find leftovers by a marker in the environment, which every
worker, build and compiler of the evaluation inherits (kernel_eval passes KERNEL_EVAL_* through)."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
REFERENCE = os.path.join(HERE, "adversarial", "reference.py")
BENIGN = os.path.join(HERE, "adversarial", "cpp", "benign.py")
NO_CUDA = not torch.cuda.is_available()


def run(args, tmp_path, timeout=300, **kw):
    env = dict(os.environ, KERNEL_EVAL_CACHE=str(tmp_path / "ke_cache"), KERNEL_RL_CACHE=str(tmp_path / "rl_cache"))
    return subprocess.run([sys.executable] + args, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=tmp_path, **kw)


def one_line_refusal(proc, message: str) -> None:
    assert proc.returncode != 0, proc.stdout
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [message], proc.stderr


def kernel_eval(tmp_path, candidate_src: str, *extra, reference: str = REFERENCE):
    cand = tmp_path / "candidate.py"
    cand.write_text(candidate_src)
    return run([os.path.join(ROOT, "kernel_eval.py"), reference, str(cand), *extra], tmp_path)


# ----------------------------------------------------------------------------- bad arguments

def test_kernel_eval_bad_device_is_one_line(tmp_path):
    proc = kernel_eval(tmp_path, "", "--device", "bogus")
    one_line_refusal(proc, "kernel_eval.py: --device bogus: expected cpu, cuda or cuda:N")
    assert proc.returncode == 1


@pytest.mark.skipif(not NO_CUDA, reason="needs a machine without CUDA")
def test_kernel_eval_cuda_without_cuda_is_one_line(tmp_path):
    proc = kernel_eval(tmp_path, "", "--device", "cuda")
    one_line_refusal(proc, f"kernel_eval.py: --device cuda: torch sees no CUDA device "
                           f"(torch {torch.__version__} was built without CUDA); use --device cpu"
                     if torch.version.cuda is None else
                     "kernel_eval.py: --device cuda: torch sees no CUDA device (no GPU is visible); use --device cpu")


def test_kernel_eval_trials_must_be_positive(tmp_path):
    one_line_refusal(kernel_eval(tmp_path, "", "--trials", "0"), "kernel_eval.py: --trials 0: must be at least 1")


def test_kernel_eval_unreadable_files_are_one_line_and_exit_2(tmp_path):
    """A candidate or reference that is not UTF-8, a directory, or missing: one line naming it, exit 2."""
    binary = tmp_path / "binary.py"
    binary.write_bytes(b"import torch\n\xff\xfe\x00 not text\n")
    cases = [
        ([REFERENCE, str(binary)], f"kernel_eval.py: {binary}: not UTF-8 text (byte 0xff at offset 13)"),
        ([str(binary), BENIGN], f"kernel_eval.py: {binary}: not UTF-8 text (byte 0xff at offset 13)"),
        ([REFERENCE, str(tmp_path)], f"kernel_eval.py: {tmp_path}: is a directory"),
        ([REFERENCE, str(tmp_path / "missing.py")], f"kernel_eval.py: {tmp_path / 'missing.py'}: no such file or directory"),
        ([str(tmp_path / "missing.py"), BENIGN], f"kernel_eval.py: {tmp_path / 'missing.py'}: no such file or directory"),
    ]
    for files, message in cases:
        proc = run([os.path.join(ROOT, "kernel_eval.py"), *files, "--device", "cpu"], tmp_path)
        one_line_refusal(proc, message)
        assert proc.returncode == 2, (files, proc.returncode)


def test_tasks_export_bad_levels_is_one_line(tmp_path):
    proc = run([os.path.join(ROOT, "tasks.py"), "export", "--levels", "one", "--out", str(tmp_path / "t.jsonl")], tmp_path)
    one_line_refusal(proc, "tasks.py export: --levels 'one': expected comma-separated level numbers, e.g. 1,2")
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.skipif(not NO_CUDA, reason="needs a machine without CUDA")
def test_task_check_cuda_without_cuda_is_one_line(tmp_path):
    proc = run([os.path.join(ROOT, "task_check.py"), "--device", "cuda"], tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "CUDA_HOME" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("task_check.py: --device cuda: torch sees no CUDA device")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


# ----------------------------------------------------------------------------- verdicts exit 0

@pytest.mark.skipif(not NO_CUDA, reason="the default device is cuda here")
def test_kernel_eval_syntax_error_is_a_verdict_with_its_line_and_the_device_is_said(tmp_path):
    proc = kernel_eval(tmp_path, "import torch\n\nclass ModelNew(torch.nn.Module:\n    pass\n", "--json", "--no-time")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "kernel_eval.py: --device not given: using cpu (torch sees no CUDA device)" in proc.stderr.splitlines()
    verdict = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (verdict["status"], verdict["compiled"]) == ("runtime_error", False)
    assert verdict["message"].startswith("candidate failed during load: line 3: SyntaxError: "), verdict
    assert verdict["message"].endswith(": class ModelNew(torch.nn.Module:") and "^" not in verdict["message"]


def test_kernel_eval_empty_candidate_has_no_class_and_compiled_nothing(tmp_path):
    proc = kernel_eval(tmp_path, "", "--json", "--no-time", "--device", "cpu")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    verdict = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (verdict["status"], verdict["compiled"], verdict["message"]) == (
        "runtime_error", False, "candidate failed during load: the code defines no class ModelNew")


def test_kernel_eval_reference_that_is_not_a_task_is_the_tasks_fault(tmp_path):
    reference = tmp_path / "not_a_task.py"
    reference.write_text("print('hello')\n")
    candidate = ("import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
                 "        return x\n")
    proc = kernel_eval(tmp_path, candidate, "--json", "--no-time", "--device", "cpu", reference=str(reference))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    verdict = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (verdict["status"], verdict["correct"], verdict["message"]) == (
        "reference_error", False,
        "the task's fault, not the candidate's: reference failed during load: the code defines no class Model")


@pytest.mark.slow
def test_kernel_eval_compile_error_points_at_the_line_of_the_py_file(tmp_path):
    candidate = ('import torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n'
                 'source = """\ntorch::Tensor f(torch::Tensor x) {\n    return undefined_thing(x);\n}\n"""\n'
                 'ext = load_inline(name="ext", cpp_sources=source, functions=["f"])\n\n\n'
                 'class ModelNew(nn.Module):\n    def forward(self, x):\n        return ext.f(x)\n')
    proc = kernel_eval(tmp_path, candidate, "--json", "--device", "cpu")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    verdict = json.loads(proc.stdout.strip().splitlines()[-1])
    assert verdict["status"] == "compile_error" and not verdict["compiled"], verdict
    assert "line 6 (main.cpp:" in verdict["message"] and "was not declared" in verdict["message"], verdict


# ----------------------------------------------------------------------------- Ctrl-C

def marked(mark: str) -> list:
    """(pid, command name) of every live process whose initial environment carries the marker."""
    needle = f"KERNEL_EVAL_TEST_MARK={mark}".encode()
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/comm") as f:
                found.append((int(entry), f.read().strip()))
        except OSError:
            continue
    return found


def interrupt_when(args, tmp_path, ready) -> subprocess.CompletedProcess:
    """Start the CLI, wait until ready(mark, stdout lines so far), SIGINT the CLI alone (its workers are
    in sessions of their own), and require: exit 130 within 10 s, no traceback, nothing left."""
    mark = uuid.uuid4().hex
    env = dict(os.environ, KERNEL_EVAL_TEST_MARK=mark, KERNEL_EVAL_CACHE=str(tmp_path / "ke_cache"),
               KERNEL_RL_CACHE=str(tmp_path / "rl_cache"))
    proc = subprocess.Popen([sys.executable] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=tmp_path, start_new_session=True)
    out, err = [], []   # read as they come, so neither pipe fills up
    readers = [threading.Thread(target=lambda pipe=pipe, lines=lines: lines.extend(iter(pipe.readline, "")),
                                daemon=True) for pipe, lines in ((proc.stdout, out), (proc.stderr, err))]
    for reader in readers:
        reader.start()
    try:
        deadline = time.monotonic() + 180
        while not ready(mark, list(out)):
            assert proc.poll() is None and time.monotonic() < deadline, ("not ready", "".join(err)[-2000:])
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        proc.wait(timeout=10)
        took = time.monotonic() - t0
        for reader in readers:
            reader.join(timeout=5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = "".join(err)
    assert proc.returncode == 130 and took < 10, (proc.returncode, took, err[-2000:])
    assert "Traceback" not in err, err
    deadline = time.monotonic() + 3  # SIGKILLed processes vanish once reaped
    while marked(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marked(mark) == []
    return subprocess.CompletedProcess(args, proc.returncode, "".join(out), err)


def interrupt_mid_build(args, tmp_path) -> subprocess.CompletedProcess:
    """SIGINT once a compiler of the CLI's runs (a fresh cache, so there is a build)."""
    return interrupt_when(args, tmp_path, lambda mark, _: any(name in ("cc1plus", "c++", "g++", "ninja")
                                                              for _, name in marked(mark)))


def test_ctrl_c_stops_kernel_eval_mid_build(tmp_path):
    done = interrupt_mid_build([os.path.join(ROOT, "kernel_eval.py"), REFERENCE, BENIGN, "--device", "cpu"], tmp_path)
    assert done.stderr.strip().splitlines()[-1] == "kernel_eval.py: interrupted; every worker and build of the evaluation was stopped"


def test_ctrl_c_stops_task_check_mid_build_and_keeps_partial_results(tmp_path):
    out = tmp_path / "partial.json"
    done = interrupt_mid_build([os.path.join(ROOT, "task_check.py"), "--device", "cpu", "--root",
                                os.path.join(ROOT, "tasks"), "--json", str(out)], tmp_path)
    assert done.stderr.strip().splitlines()[-1].startswith("task_check.py: interrupted after 0/"), done.stderr
    assert json.loads(out.read_text()) == []  # readable: nothing was checked yet


# ----------------------------------------------------------------------------- issue 37's newcomer table

TRAIN, EVAL = os.path.join(ROOT, "train.py"), os.path.join(ROOT, "eval.py")


@pytest.mark.parametrize("script", [TRAIN, EVAL])
def test_out_that_is_a_file_is_one_line_exit_2(tmp_path, script):
    (tmp_path / "taken").write_text("")
    proc = run([script, "--out", "taken", *(["--policy", "oracle"] if script == EVAL else [])], tmp_path)
    one_line_refusal(proc, f"{os.path.basename(script)}: --out taken: taken is a file, not a folder")
    assert proc.returncode == 2


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"}, {"HF_ENDPOINT": "http://127.0.0.1:9"}],
                         ids=["HF_HUB_OFFLINE", "hub_unreachable"])
def test_eval_unknown_model_offline_is_one_line_at_once(tmp_path, env):
    """No hub client's retries (about 48 s), whether or not the user said they are offline."""
    clean = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_ENDPOINT")}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, EVAL, "--policy", "nosuchmodel", "--device", "cpu", "--out", "out"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=dict(clean, HF_HOME=str(tmp_path / "hf"), **env))
    assert time.monotonic() - start < 30
    expected = ("eval.py: --policy nosuchmodel: no such folder, and not in the Hugging Face cache "
                "(HF_HUB_OFFLINE is set)" if "HF_HUB_OFFLINE" in env else
                "eval.py: --policy nosuchmodel: no such folder, not in the Hugging Face cache, and the hub cannot be "
                "reached (ConnectError: ")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith(expected), proc.stderr
    assert not (tmp_path / "out").exists()


def test_ctrl_c_of_train_gives_the_command_that_continues_it(tmp_path):
    args = ["--out", "run", "--steps", "1", "--task-ids", "builtin/level1/01_relu", "--tasks-per-step", "1",
            "--trajectories", "2", "--turns", "1", "--max-new-tokens", "1100", "--no-time-kernels"]
    done = interrupt_when([TRAIN, *args], tmp_path, lambda _, lines: any(" tasks, 1 rank(s) on " in x for x in lines))
    assert done.stderr.strip().splitlines()[-1] == (
        f"train.py: interrupted; continue with: python {os.path.relpath(TRAIN, tmp_path)} {' '.join(args)} --resume")


def test_ctrl_c_of_eval_gives_the_command_that_continues_it(tmp_path):
    args = ["--policy", "oracle", "--device", "cpu", "--task-ids", "builtin/level1/01_relu", "--trajectories", "1",
            "--turns", "1", "--no-progress", "--out", "run"]
    done = interrupt_mid_build([EVAL, *args], tmp_path)
    assert done.stderr.strip().splitlines()[-1] == (
        "eval.py: interrupted; the turns judged so far are in --out's records.jsonl; continue with: "
        f"python {os.path.relpath(EVAL, tmp_path)} {' '.join(args)} --resume")
