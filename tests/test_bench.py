"""The bench scripts still run end to end (on the CPU, at a toy size): their figures are only
worth recording if the script that prints them works."""
import json
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_generation_bench_prints_a_row_per_engine_with_a_decode_split_and_a_profile(tmp_path):
    out = subprocess.run(
        [sys.executable, "bench/generation.py", "--device", "cpu", "--shape", "qwen2-8m", "--batches", "2",
         "--prompt", "8", "--new", "6", "--warmup-new", "2", "--rows", "hf_fast,hf_plain", "--split",
         "--profile", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| ([a-z_]+(?:, decode only)?) \| (.+) \|$", out.stdout, re.M)}
    for engine in ("hf_fast", "hf_plain"):
        assert float(rows[engine].replace(",", "")) > 0
        assert re.fullmatch(r"[\d,]+ \(prefill \+ 1 token: [\d.]+ s\)|n/a", rows[f"{engine}, decode only"])
        assert "aten::" in (tmp_path / f"{engine}_b2.txt").read_text()


def cpu_by_process(command: list) -> tuple:
    """bench/cpu_by_process.py around `command`: (the finished process, {kind: (processes, CPU s)})."""
    out = subprocess.run([sys.executable, "bench/cpu_by_process.py", "--interval", "0.05", "--", *command],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    rows = {m.group(1): (int(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"^\| (.+?) \| (\d+) \| ([\d.]+) \| [\d.]+% \|$", out.stdout, re.M)}
    return out, rows


def test_cpu_by_process_counts_a_childs_cpu_time_under_its_kind():
    """A child that burns ~1 CPU s and then sleeps is seen while alive and counted under its kind;
    the sleeping parent command is counted near zero; the exit status is the command's. The bench
    samples the whole machine, so another short-lived Python process of the same kind may be counted
    beside the child (seen in a full-suite run): the kind's CPU seconds are the child's to within 0.3."""
    burn = "import time; t = time.process_time()\nwhile time.process_time() - t < 1.0: pass\ntime.sleep(0.5)"
    out, rows = cpu_by_process(["bash", "-c", f"{sys.executable} -c '{burn}'; exit 3"])
    assert out.returncode == 3, out.stderr[-2000:]
    count, cpu_s = rows["python: other"]
    assert count >= 1 and 0.9 <= cpu_s <= 1.3, out.stdout
    assert rows.get("bash", (1, 0.0))[1] < 0.3, out.stdout


def test_cpu_by_process_counts_a_forked_worker_by_the_role_it_names():
    """A worker forked from kernel_eval's zygote keeps the zygote's command line and names its role
    in its comm (keval-cand): counted as a candidate worker, not as the zygote or 'other'."""
    burn = ("import ctypes, time; ctypes.CDLL(None).prctl(15, b'keval-cand', 0, 0, 0)\n"
            "t = time.process_time()\nwhile time.process_time() - t < 1.0: pass\ntime.sleep(0.5)")
    out, rows = cpu_by_process([sys.executable, "-c", burn])
    assert out.returncode == 0, out.stderr[-2000:]
    count, cpu_s = rows["python: candidate worker"]
    assert count >= 1 and 0.9 <= cpu_s <= 1.3, out.stdout


@pytest.mark.slow
def test_kernelbench_self_judges_the_chosen_tasks_correct_and_resumes(tmp_path):
    """Identical code is `correct`; --only picks tasks; an untimed record is judged again once timing is
    on (its new line supersedes it); then a run over the same --out judges nothing new (the records are
    the resume point) and --report-only prints the same table."""
    out = tmp_path / "kb.jsonl"
    cmd = [sys.executable, os.path.join(ROOT, "bench", "kernelbench_self.py"), "--kernelbench",
           os.path.join(ROOT, "tests", "fixtures", "kernelbench"), "--levels", "1", "--device", "cpu",
           "--trials", "3", "--only", "19_ReLU", "--out", str(out), "--cache-root", str(tmp_path / "cache")]
    first = subprocess.run(cmd + ["--no-time"], capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["task_id"] for r in records] == ["kernelbench/level1/19_ReLU"]
    assert records[0]["status"] == "correct" and records[0]["ref_ms"] == 0, records[0]
    timed = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert timed.returncode == 0 and "judging 1" in timed.stderr, timed.stderr[-2000:]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    # timed (a reference time), though a kernel this small may be too fast for the CPU clock to confirm
    assert len(records) == 2 and records[1]["status"] == "correct" and records[1]["ref_ms"] > 0, records
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "judging 0" in again.stderr, again.stderr[-2000:]
    assert len(out.read_text().splitlines()) == 2
    report = subprocess.run(cmd[:2] + ["--out", str(out), "--report-only"], capture_output=True, text=True)
    assert "| correct | 1 |" in report.stdout, report.stdout


def table_row(stdout: str, label: str) -> list:
    """The cells after `label` of the bench's markdown table row that starts with it."""
    m = re.search(rf"^\| {re.escape(label)} \|(.*)\|$", stdout, re.M)
    assert m, f"no row {label!r} in:\n{stdout[-3000:]}"
    return [cell.strip() for cell in m.group(1).split("|")]


@pytest.mark.slow
def test_harness_bench_judges_each_kernelbench_candidate_in_its_own_process(tmp_path):
    """Two cold C++ candidates, ReLU and a variant of it (the same extension name, a new source),
    through both phases of one run: the table gives throughput and p50 latency for kernel_eval and
    the KernelBench-style baseline side by side, and the baseline judged each candidate in a fresh
    process of its own (two pids, neither the bench's), which loaded the build its batch compile
    made: the variant is not rebuilt, as it would be in one process under the same name."""
    out_json = tmp_path / "bench.json"
    out = subprocess.run(
        [sys.executable, "bench/harness.py", "--device", "cpu", "--tasks", "builtin/level1/01_relu",
         "--n-candidates", "2", "--baseline-n", "0", "--stability-runs", "0",
         "--cache-root", str(tmp_path / "cache"), "--json-out", str(out_json)],
        cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "| kernel_eval | KernelBench-style (parallel builds, then a fresh process per candidate) |" in out.stdout
    for label in ("unique candidates / minute", "p50 latency, one candidate's compile start to verdict (s)"):
        kernel_eval_cell, kernelbench_cell = table_row(out.stdout, label)[:2]
        assert float(kernel_eval_cell) > 0 and float(kernelbench_cell) > 0, (label, out.stdout[-3000:])
    assert table_row(out.stdout, "processes that judged the candidates")[1] == "2"

    fig = json.loads(out_json.read_text())
    assert fig["n_candidates"] == fig["kernelbench_n"] == 2
    rows = fig["kernelbench_rows"]
    assert [r["task"] for r in rows] == ["builtin/level1/01_relu"] * 2, rows
    assert [r["status"] for r in rows] == ["correct", "correct"], rows
    pids = [r["pid"] for r in rows]
    assert len(set(pids)) == 2 and fig["pid"] not in pids, (pids, fig["pid"])
    for r in rows:  # a load, not a rebuild: a small part of what its build took
        assert r["compile_s"] < 0.5 * r["build_s"], r
        assert r["latency_s"] >= r["build_s"] + r["seconds"] - 1.0, r


@pytest.mark.slow
def test_turn_bench_judges_a_new_correct_and_a_new_broken_kernel_per_task_each_turn():
    """One task, one turn on the CPU: its two rows say what the kinds are judged (the sources are new,
    so each compiles: a latency of a build's length, not of a cache hit)."""
    out = subprocess.run([sys.executable, "bench/turn.py", "--device", "cpu", "--turns", "1",
                          "--tasks", "level1/01_relu", "--max-parallel-compiles", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("2 builds at once")
    rows = re.findall(r"^\| 1 \| ([\d.]+) \| (\w+) \| ([\w, ]+) \| ([\d.]+) \| ([\d.]+) \|$", out.stdout, re.M)
    assert [(kind, statuses) for _, kind, statuses, _, _ in rows] == [("correct", "correct"),
                                                                      ("no_compile", "compile_error")]
    for wall, _, _, compile_s, latency_s in rows:
        assert 1.0 < float(compile_s) <= float(latency_s) <= float(wall)


def test_zygotes_bench_refuses_a_task_without_a_solution_in_one_line():
    out = subprocess.run([sys.executable, "bench/zygotes.py", "--device", "cpu", "--task", "level1/no_such_task"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.strip() == "bench/zygotes.py: no built-in cpp solution for level1/no_such_task"


def test_cpu_verdict_bench_refuses_a_task_without_a_solution_in_one_line():
    out = subprocess.run([sys.executable, "bench/cpu_verdict.py", "--tasks", "level1/01_relu,level1/no_such_task"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.strip() == "bench/cpu_verdict.py: no built-in cpp solution for level1/no_such_task"


def test_cpu_verdict_bench_refuses_a_checkout_without_the_harness_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "bench/cpu_verdict.py", "--root", ".", "--root", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.strip() == f"bench/cpu_verdict.py: --root {tmp_path}: no kernel_eval.py there"


def test_timeout_limit_bench_refuses_an_unknown_task_in_one_line():
    out = subprocess.run([sys.executable, "bench/timeout_limit.py", "--device", "cpu",
                          "--tasks", "level1/01_relu,level1/no_such_task"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.strip() == "bench/timeout_limit.py: no built-in task level1/no_such_task"


@pytest.mark.slow
def test_schedule_bench_judges_a_step_in_one_harness_call_when_overlapped():
    """The scenario the overlap is for, one task on the CPU: turn by turn, two harness calls (each
    turn's new kernel); overlapped, one (both new kernels together) and one more generation round."""
    out = subprocess.run([sys.executable, "bench/schedule.py", "--device", "cpu", "--scenarios", "new in both turns"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = re.findall(r"^\| new in both turns \| ([\w ]+) \| (\d+) \| (\d+) \| [\d.]+ \| [\d.]+ \|$", out.stdout, re.M)
    assert rows == [("turn by turn", "2", "2"), ("overlapped", "1", "3")], out.stdout


def test_schedule_bench_refuses_an_unknown_scenario_in_one_line():
    out = subprocess.run([sys.executable, "bench/schedule.py", "--device", "cpu", "--scenarios", "sideways"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert out.stderr.strip().startswith("bench/schedule.py: no scenario 'sideways' (known: new in both turns")


def test_compile_error_bench_breaks_each_solution_as_its_row_says(monkeypatch):
    monkeypatch.syspath_prepend(os.path.join(ROOT, "bench"))
    import compile_error
    import tasks
    solution = {t.task_id: t for t in tasks.load_builtin()}["builtin/level1/01_relu"].solutions["cuda"]
    variants = compile_error.early_variants(solution)
    kernel = re.search(r"__global__\s+void\s+(\w+)\(", solution).group(1)
    pasted, launched = variants["pasted"], variants["pasted, launched"]
    assert len(pasted.split("\n")) == len(solution.split("\n")) and pasted != solution
    # the pasted line kept, the kernel renamed so that its launch names nothing: one difference more
    assert launched == pasted.replace(f"void {kernel}(", f"void {kernel}_v2(", 1) != pasted
    assert f"{kernel}<<<" in launched and f"void {kernel}(" not in launched
    assert variants["pasted, launched, again"] != launched
    assert variants["pasted, launched, again"].replace("  # again", "", 1) == launched
