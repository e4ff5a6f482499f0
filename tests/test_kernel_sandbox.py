"""Tests for kernel_sandbox: the framed channel, the device lock, the environment allowlist, and
workers that die with their evaluation (spawned or forked from a zygote, whatever they do to
escape). The workers here run a tiny entry script of their own, not kernel_eval: the sandbox knows
nothing of verdicts. The boundary's tests are in test_kernel_boundary.py, the tensor files' in
test_kernel_memory.py."""
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import kernel_sandbox as sandbox

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A worker entry as kernel_worker.py is one: it hands --_supervise and --_zygote back to the sandbox.
# Its worker writes "pid parent-pid tag-in-/proc/self/environ tag-in-os.environ" to the report file
# named by its last argument, then, as MODE says: sleeps ("report"), or leaves a fork-only
# grandchild in its own session and kills its supervisor ("escape").
ENTRY = f"""
import json, os, signal, sys, time
sys.path.insert(0, {ROOT!r})
import kernel_sandbox

def worker_main(argv):
    mode, report = argv[1], argv[-1]
    if mode == "escape":
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                open(report + ".part", "w").write(f"{{os.getpid()}}\\n")
                time.sleep(600)
            os._exit(0)
        while not (os.path.exists(report + ".part") and open(report + ".part").read().endswith("\\n")):
            time.sleep(0.01)
        os.kill(os.getppid(), signal.SIGKILL)  # the supervisor: its orphans now go to init
        os.rename(report + ".part", report)
        time.sleep(600)
    initial = dict(e.split("=", 1) for e in open("/proc/self/environ").read().split("\\0") if "=" in e)
    tag = kernel_sandbox.TAG_ENV
    open(report, "w").write(f"{{os.getpid()}} {{os.getppid()}} {{initial[tag]}} {{os.environ[tag]}}\\n")
    time.sleep(600)


if sys.argv[1] == "--_supervise":
    sys.exit(kernel_sandbox.supervise(json.load(sys.stdin)))
if sys.argv[1] == "--_zygote":
    kernel_sandbox.zygote_main(int(sys.argv[2]), int(sys.argv[3]), lambda: "", worker_main)
if sys.argv[1] == "--_worker":
    worker_main(sys.argv[1:])
"""


@pytest.fixture
def entry(tmp_path):
    path = tmp_path / "entry.py"
    path.write_text(ENTRY)
    return str(path)


def start(entry: str, mode: str, report, scratch, zygotes=None) -> sandbox.Worker:
    return sandbox.Worker(mode, [str(report)], str(scratch), {}, entry=entry, fsize=1 << 30, output_bytes=1 << 20,
                          message_bytes=1 << 20, zygotes=zygotes)


def process_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # a zombie has ended
    except OSError:
        return False


def wait_for_file(path, seconds: float = 60) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if os.path.exists(path) and open(path).read().endswith("\n"):
            return open(path).read()
        time.sleep(0.05)
    raise AssertionError(f"{path} was not written")


def all_gone(pids: list, seconds: float = 15) -> bool:
    deadline = time.monotonic() + seconds
    while any(map(process_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not any(map(process_alive, pids))


def kill_all(pids: list) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# ----------------------------------------------------------------------------- workers

def test_a_forked_worker_carries_its_own_tag_and_is_gone_when_stopped(entry, tmp_path):
    """A worker forked from a zygote carries its own evaluation's tag where the sweep looks
    (/proc/<pid>/environ: the zygote's block, rewritten in place) and in the environment its
    children inherit, and is gone once stopped, while the zygote keeps serving the batch."""
    zygotes = sandbox.Zygotes()
    try:
        worker = start(entry, "report", tmp_path / "report", tmp_path / "w", zygotes)
        pid, _, initial_tag, env_tag = wait_for_file(tmp_path / "report").split()
        [zygote] = zygotes.all()
        assert initial_tag == env_tag == worker.tag != zygote.tag
        assert open(f"/proc/{pid}/comm").read().strip() == "keval-report"  # its role, for ps
        worker.stop()
        assert not process_alive(int(pid))
        assert zygote.proc.poll() is None  # still serving the batch
    finally:
        zygotes.close()
    assert zygote.proc.poll() is not None


def test_fork_only_escapee_of_a_forked_worker_dies_with_its_evaluation(entry, tmp_path):
    """The worker kills its supervisor (no subreaper is left) and leaves a forked, never exec'd
    grandchild in its own session: only the sweep by tag can find it, and only if a fork carries
    its own evaluation's tag rather than the zygote's."""
    zygotes = sandbox.Zygotes()
    try:
        worker = start(entry, "escape", tmp_path / "escapee", tmp_path / "w", zygotes)
        escapee = int(wait_for_file(tmp_path / "escapee"))
        worker.stop()
        try:
            assert all_gone([escapee], seconds=2)  # killed by its own evaluation's sweep
        finally:
            kill_all([escapee])
        assert zygotes.all()[0].proc.poll() is None
    finally:
        zygotes.close()


def test_zygote_out_of_service_falls_back_to_spawned_workers(entry, tmp_path):
    zygotes = sandbox.Zygotes()
    try:
        first = start(entry, "report", tmp_path / "first", tmp_path / "w1", zygotes)
        pid = wait_for_file(tmp_path / "first").split()[0]
        assert open(f"/proc/{pid}/comm").read().strip() == "keval-report"  # forked
        first.stop()
        [zygote] = zygotes.all()
        zygote.proc.kill()  # a candidate can do this: same uid
        zygote.proc.wait()
        second = start(entry, "report", tmp_path / "second", tmp_path / "w2", zygotes)
        pid, _, initial_tag, _ = wait_for_file(tmp_path / "second").split()
        assert open(f"/proc/{pid}/comm").read().strip().startswith("python")  # spawned
        assert initial_tag == second.tag and "out of service" in zygote.out_of_service
        second.stop()
        assert not process_alive(int(pid))
    finally:
        zygotes.close()


@pytest.mark.parametrize("forked", [False, True])
def test_workers_die_with_the_harness(entry, tmp_path, forked):
    """A harness killed without cleanup (kill -9, a crash) leaves no worker behind: a supervisor
    sees it has been reparented and stops its worker; a zygote sees the same and exits."""
    report = tmp_path / "report"
    helper = f"""
import os, sys, time
sys.path.insert(0, {ROOT!r})
import kernel_sandbox
zygotes = kernel_sandbox.Zygotes() if {forked} else None
kernel_sandbox.Worker("report", [{str(report)!r}], {str(tmp_path / "w")!r}, {{}}, entry={entry!r}, fsize=1 << 30,
                      output_bytes=1 << 20, message_bytes=1 << 20, zygotes=zygotes)
print(zygotes.all()[0].proc.pid if zygotes else "", flush=True)
while not os.path.exists({str(report)!r}):
    time.sleep(0.05)
os._exit(0)  # no cleanup
"""
    out = subprocess.run([sys.executable, "-c", helper], check=True, timeout=120, capture_output=True, text=True)
    worker, supervisor = map(int, wait_for_file(report).split()[:2])
    pids = [int(p) for p in out.stdout.split()] + [supervisor, worker]
    try:
        assert all_gone(pids)
    finally:
        kill_all(pids)


# ----------------------------------------------------------------------------- channel and files

def test_channel_frames_deadlines_and_limits():
    r, w = os.pipe()
    r2, w2 = os.pipe()
    chan = sandbox.Channel(r, w2, max_bytes=1000)
    sandbox.child_send(w, {"hello": 1}, b"")
    sandbox.child_send(w, {"data": 2}, b"x" * 10)
    msg, data = chan.recv(time.monotonic() + 5)
    assert msg["hello"] == 1 and data == b""
    msg, data = chan.recv(time.monotonic() + 5)
    assert msg["data"] == 2 and data == b"x" * 10
    with pytest.raises(sandbox.ChannelTimeout):
        chan.recv(time.monotonic() + 0.2)
    sandbox.child_send(w, {"big": 1}, b"y" * 5000)
    with pytest.raises(sandbox.ChannelError, match="refused"):
        chan.recv(time.monotonic() + 5)
    chan.send({"cmd": "x"}, b"\x00payload", time.monotonic() + 5)
    with os.fdopen(r2, "rb") as f:
        msg, data = sandbox.child_recv(f)
    assert msg["cmd"] == "x" and data == b"\x00payload"
    os.write(w, b"not json\n")
    chan.buf.clear()
    with pytest.raises(sandbox.ChannelError, match="malformed"):
        chan.recv(time.monotonic() + 5)
    for fd in (r, w, w2):
        os.close(fd)


def test_atomic_write_leaves_the_whole_file_and_no_temp(tmp_path):
    path = tmp_path / "sub" / "record.json"
    sandbox.atomic_write(str(path), json.dumps({"a": 1}))
    sandbox.atomic_write(str(path), json.dumps({"a": 2}))
    assert sandbox.read_json(str(path)) == {"a": 2} and os.listdir(path.parent) == ["record.json"]
    assert sandbox.read_json(str(tmp_path / "missing.json")) is None


def test_source_hash_is_stable_and_separates_inputs():
    assert sandbox.source_hash("a", [1, 2]) == sandbox.source_hash("a", [1, 2])
    assert sandbox.source_hash("a", [1, 2]) != sandbox.source_hash("a", [2, 1])
    assert sandbox.source_hash("ab", "c") != sandbox.source_hash("a", "bc")


def test_device_lock_shares_checks_and_gives_timing_the_device_alone(tmp_path):
    root, events, lock = str(tmp_path), [], threading.Lock()

    def hold(kind, exclusive, seconds, started=None):
        with sandbox.DeviceLock(root, "cpu", exclusive=exclusive):
            with lock:
                events.append(("in", kind, time.monotonic()))
            if started:
                started.set()
            time.sleep(seconds)
            with lock:
                events.append(("out", kind, time.monotonic()))

    first = threading.Event()
    threads = [threading.Thread(target=hold, args=("check1", False, 0.6, first))]
    threads[0].start()
    first.wait()
    threads.append(threading.Thread(target=hold, args=("check2", False, 0.6)))  # shares with check1
    threads[1].start()
    time.sleep(0.1)
    threads.append(threading.Thread(target=hold, args=("timing", True, 0.3)))  # waits for both checks
    threads[2].start()
    time.sleep(0.1)
    threads.append(threading.Thread(target=hold, args=("check3", False, 0.1)))  # queues behind the timing
    threads[3].start()
    for t in threads:
        t.join()
    at = {(e, k): t for e, k, t in events}
    assert at[("in", "check2")] < at[("out", "check1")]  # two checks at once
    assert at[("in", "timing")] >= max(at[("out", "check1")], at[("out", "check2")])
    assert at[("in", "check3")] >= at[("out", "timing")]  # did not overtake the waiting timing


def test_sandbox_imports_only_the_standard_library():
    code = ("import sys; sys.path.insert(0, %r); import kernel_sandbox; "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))" % ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
