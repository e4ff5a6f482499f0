"""Tests for kernel_sandbox: the framed channel, tensor memory files and their seals, the device
lock, the environment allowlist, and workers that die with their evaluation (spawned or forked
from a zygote, whatever they do to escape). The workers here run a tiny entry script of their own,
not kernel_eval: the sandbox knows nothing of verdicts."""
import contextlib
import json
import mmap
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

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
    if mode == "look":  # behind the boundary: print what it sees (report: JSON of paths to try)
        print(json.dumps(look(json.loads(report))), flush=True)
        return
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

def look(paths):
    import socket
    status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)

    def attempt(fn):
        try:
            return fn() or "ok"
        except OSError as e:
            return e.__class__.__name__ + ":" + str(e.errno)

    seen = {{"pid": os.getpid(), "ppid": os.getppid(), "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
            "caps": [int(status[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")],
            "no_new_privs": status["NoNewPrivs"].strip(), "procs": sorted(p for p in os.listdir("/proc") if p.isdigit()),
            "interfaces": [n for _, n in socket.if_nameindex()], "cwd": os.getcwd(),
            "home": sorted(os.listdir(os.environ["HOME"]))}}
    import fcntl, struct
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0)))[1]  # SIOCGIFFLAGS
    seen["lo_up"] = bool(flags & 1)

    def connect():
        with socket.create_connection(("127.0.0.1", paths["port"]), timeout=2):
            pass
    seen["connect"] = attempt(connect)
    seen["read"] = {{p: attempt(lambda p=p: open(p).read()[:40]) for p in paths["read"]}}
    seen["write"] = {{p: attempt(lambda p=p: open(p, "w").write("from the worker") and None) for p in paths["write"]}}
    seen["signal_parent"] = attempt(lambda: os.kill(paths["parent"], 0))
    return seen


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


def test_worker_environment_is_an_allowlist(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("KERNEL_EVAL_TEST_X", "1")
    env = sandbox.worker_env({"EXTRA": "2"})
    assert "OPENAI_API_KEY" not in env and env["KERNEL_EVAL_TEST_X"] == "1" and env["EXTRA"] == "2"
    assert env["PATH"] == os.environ["PATH"]


# ----------------------------------------------------------------------------- the boundary

BOUNDARY_PROBLEM = sandbox.boundary_problem()
needs_namespaces = pytest.mark.skipif(bool(BOUNDARY_PROBLEM), reason=f"no namespaces here: {BOUNDARY_PROBLEM}")


@contextlib.contextmanager
def listening():
    """A TCP port on 127.0.0.1 and the list of connections it accepted."""
    import socket
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.1)
    accepted, done = [], threading.Event()

    def serve():
        while not done.is_set():
            with contextlib.suppress(OSError):
                conn, _ = server.accept()
                accepted.append(conn.recv(64))
                conn.close()

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        yield server.getsockname()[1], accepted
    finally:
        done.set()
        thread.join()
        server.close()


def looked(entry, tmp_path, monkeypatch, forked: bool) -> tuple:
    """A confined worker's view (the entry's `look`), with a key planted in $HOME, a read-only and a
    writable bind, and paths it tries to read and write; returns (what it saw, the paths)."""
    os.chmod(tmp_path, 0o755)  # the entry's directory (pytest makes it 0700): the worker's uid runs the entry
    home = tmp_path / "home"
    home.mkdir()
    (home / ".key").write_text("planted-key")
    monkeypatch.setenv("HOME", str(home))
    shared = tmp_path / "shared"  # a stand-in for the build cache: only what is bound is visible
    (shared / "ro").mkdir(parents=True)
    (shared / "rw").mkdir()
    (shared / "other").mkdir()
    (shared / "other" / "record").write_text("another's")
    (shared / "ro" / "lib").write_text("library")
    os.chmod(shared / "rw", 0o777)
    scratch = tmp_path / "w"
    paths = {"read": [str(home / ".key"), str(shared / "ro" / "lib"), str(shared / "other" / "record"),
                      os.path.join(ROOT, "kernel_sandbox.py")],
             "write": [str(shared / "ro" / "new"), str(shared / "rw" / "new"), str(scratch / "mine"),
                       "/tmp/keval-test-leftover", "/dev/shm/keval-test-leftover", str(home / "new"),
                       os.path.join(ROOT, "keval-test-leftover"), str(shared / "other" / "record")],
             "parent": os.getpid()}
    plan = sandbox.confinement(str(scratch), binds=[(str(shared / "ro"), str(shared / "ro"), False),
                                                    (str(shared / "rw"), str(shared / "rw"), True)],
                               hide=[str(shared)])
    zygotes = sandbox.Zygotes() if forked else None
    with listening() as (port, accepted):
        paths["port"] = port
        worker = sandbox.Worker("look", [json.dumps(paths)], str(scratch), {}, entry=entry, fsize=1 << 30,
                                output_bytes=1 << 20, message_bytes=1 << 20, zygotes=zygotes, confine=plan)
        try:
            worker.proc.wait(timeout=120)
            out = open(worker.stdout).read()
            assert out.strip(), worker.tail()
            seen = json.loads(out.strip().splitlines()[-1])
        finally:
            worker.stop()
            if zygotes:
                zygotes.close()
    seen["accepted"] = accepted
    return seen, paths, scratch, shared, home


@needs_namespaces
@pytest.mark.parametrize("forked", [False, True])
def test_a_confined_worker_sees_no_other_process_and_no_network_and_runs_unprivileged(entry, tmp_path, monkeypatch,
                                                                                    forked):
    seen, paths, *_ = looked(entry, tmp_path, monkeypatch, forked)
    assert seen["pid"] == 1 and seen["ppid"] == 0 and seen["procs"] == ["1"], seen  # pid 1 of its own namespace
    assert seen["signal_parent"].startswith("ProcessLookupError"), seen  # the harness's pid names nothing there
    assert seen["uid"] == seen["gid"] == sandbox.UNPRIVILEGED_ID and seen["groups"] == [], seen
    assert seen["caps"] == [0, 0, 0, 0, 0] and seen["no_new_privs"] == "1", seen
    assert seen["interfaces"] == ["lo"] and not seen["lo_up"], seen
    assert seen["connect"].startswith("OSError") and seen["accepted"] == [], seen


@needs_namespaces
@pytest.mark.parametrize("forked", [False, True])
def test_a_confined_worker_reads_and_writes_only_what_it_is_given_and_leaves_nothing(entry, tmp_path, monkeypatch,
                                                                                    forked):
    seen, paths, scratch, shared, home = looked(entry, tmp_path, monkeypatch, forked)
    read, write = seen["read"], seen["write"]
    assert read[str(home / ".key")].startswith("FileNotFoundError") and seen["home"] == [], seen  # $HOME: empty
    assert read[str(shared / "other" / "record")].startswith("FileNotFoundError"), seen  # hidden beside the binds
    assert read[str(shared / "ro" / "lib")] == "library", seen
    assert read[os.path.join(ROOT, "kernel_sandbox.py")].startswith('"""kernel_sandbox'), seen  # the code it runs
    assert write[str(shared / "ro" / "new")] == "OSError:30" and not (shared / "ro" / "new").exists()  # EROFS
    assert write[os.path.join(ROOT, "keval-test-leftover")] == "OSError:30"  # everything else is read-only
    assert write[str(shared / "rw" / "new")] == "ok" and (shared / "rw" / "new").read_text() == "from the worker"
    assert seen["cwd"] == str(scratch) and write[str(scratch / "mine")] == "ok", seen  # its scratch is its own
    # what it wrote in its scratch, /tmp, /dev/shm and its home was on its own tmpfs: gone with it
    for path in ("/tmp/keval-test-leftover", "/dev/shm/keval-test-leftover", str(home / "new")):
        assert write[path] == "ok" and not os.path.exists(path), (path, seen)
    assert not (scratch / "mine").exists() and (shared / "other" / "record").read_text() == "another's"


@needs_namespaces
def test_confinement_hides_home_and_temp_and_never_the_system(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "lib").mkdir()
    monkeypatch.setattr(sys, "path", [str(tmp_path), str(tmp_path / "lib"), *sys.path])  # as a harness run from $HOME
    plan = sandbox.confinement(str(tmp_path / "w"))
    hidden = [path for path, _ in plan["hide"]]
    assert str(tmp_path) in hidden and "/tmp" in hidden and "/root" in hidden
    bound = [target for _, target, _ in plan["binds"]]
    assert str(tmp_path / "lib") in bound and str(tmp_path) not in bound  # what Python imports, never $HOME itself
    monkeypatch.setenv("HOME", "/")  # some containers: hiding it would hide everything
    hidden = [path for path, _ in sandbox.confinement(str(tmp_path / "w"), hide=["/usr", "/usr/lib/.."])["hide"]]
    assert not {"/", "/usr"} & set(hidden)


@needs_namespaces
def test_the_probe_says_when_the_gpu_devices_are_closed_to_the_unprivileged_uid(monkeypatch):
    if not os.path.exists("/etc/shadow") or os.stat("/etc/shadow").st_mode & 0o006:
        pytest.skip("needs a file only root may open: /etc/shadow")
    monkeypatch.setattr(sandbox, "_GPU_DEVICES", ("/etc/shadow",))  # a device node only root may open
    monkeypatch.setattr(sandbox, "_boundary_problem", None)  # probe again
    monkeypatch.setattr(sandbox, "_warned", False)
    assert sandbox.boundary_problem() == "" and sandbox.boundary_for("auto") == "namespaces"  # CPU work: confined
    assert sandbox.boundary_problem(gpu=True) == f"uid {sandbox.UNPRIVILEGED_ID} cannot open /etc/shadow"
    with pytest.raises(sandbox.BoundaryUnavailable, match="cannot open /etc/shadow"):
        sandbox.boundary_for("require", gpu=True)


def test_boundary_modes_say_what_they_run_under(monkeypatch):
    assert sandbox.boundary_for("off") == "process"
    with pytest.raises(ValueError, match="sandbox must be one of auto, require, off"):
        sandbox.boundary_for("on")
    monkeypatch.setattr(sandbox, "_boundary_problem", "no namespaces in this test")
    monkeypatch.setattr(sandbox, "_warned", False)
    with pytest.raises(sandbox.BoundaryUnavailable, match="cannot be confined here: no namespaces in this test"):
        sandbox.boundary_for("require")
    with pytest.warns(RuntimeWarning, match="WITHOUT a boundary.*no namespaces in this test"):
        assert sandbox.boundary_for("auto") == "process"
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per process, not per batch
        assert sandbox.boundary_for("auto") == "process"


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


def tensor_file(sets) -> int:
    fd = sandbox.memfd("test")
    sandbox.write_tensor_sets(fd, sets)
    return fd


def test_tensor_files_round_trip_every_dtype_and_value():
    sets = [[torch.randn(3, 5), torch.randn(4, dtype=torch.float64), 7, 2.5],
            [torch.randn(2, 3).to(torch.bfloat16), torch.tensor([True, False, True]), torch.tensor(3.5),
             torch.empty(0, 4), torch.arange(6, dtype=torch.int64).view(2, 3)[:, 1:],  # a non-contiguous view
             torch.randn(2, 2, dtype=torch.complex64), torch.randint(-5, 5, (3,), dtype=torch.int8)]]
    fd = tensor_file(sets)
    back = sandbox.read_tensor_sets(fd, 1 << 30)
    os.close(fd)
    assert len(back) == 2 and [len(s) for s in back] == [4, 7]
    for want, got in zip(sets[0] + sets[1], back[0] + back[1]):
        if isinstance(want, torch.Tensor):
            assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want.contiguous())
        else:
            assert got == want


def test_sealed_tensor_file_cannot_be_changed_by_any_holder():
    fd = tensor_file([[torch.ones(1000)]])
    other = os.open(f"/proc/self/fd/{fd}", os.O_RDWR)  # what another process of this uid could open
    sandbox.seal(fd)
    for holder in (fd, other):
        with pytest.raises(PermissionError):
            os.pwrite(holder, b"x" * 8, 0)
        with pytest.raises(PermissionError):
            os.ftruncate(holder, 0)
        with pytest.raises(PermissionError):
            mmap.mmap(holder, 0, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    assert torch.equal(sandbox.read_tensor_sets(other, 1 << 20)[0][0], torch.ones(1000))
    os.close(other)
    os.close(fd)


def test_a_file_mapped_writable_cannot_be_sealed():
    fd = tensor_file([[torch.ones(10)]])
    live = mmap.mmap(fd, 0)  # a candidate that keeps a writable mapping could rewrite it after the check
    with pytest.raises(OSError):
        sandbox.seal(fd)
    live.close()
    sandbox.seal(fd)
    os.close(fd)


@pytest.mark.parametrize("damage", ["truncated", "magic", "offset", "size", "dtype", "index", "huge"])
def test_malformed_tensor_files_are_refused(damage):
    fd = tensor_file([[torch.arange(16, dtype=torch.float32).view(4, 4)]])
    data = bytearray(os.pread(fd, 1 << 20, 0))
    os.close(fd)
    n = int.from_bytes(data[-16:-8], "little")
    index = json.loads(data[-16 - n: -16])
    entry = index["sets"][0][0]
    if damage == "truncated":
        data = data[:-3]
    elif damage == "magic":
        data[-1:] = b"X"
    elif damage == "offset":
        entry["offset"] = len(data) * 4
    elif damage == "size":
        entry["nbytes"] = 8
    elif damage == "dtype":
        entry["dtype"] = "object"
    elif damage == "index":
        index = {"sets": "nope"}
    elif damage == "huge":
        entry["shape"] = [1 << 41, 4]
    if damage in ("offset", "size", "dtype", "index", "huge"):
        footer = json.dumps(index).encode()
        data = data[: -16 - n] + footer + len(footer).to_bytes(8, "little") + sandbox.TENSOR_FILE_MAGIC
    fd = sandbox.memfd("damaged")
    os.write(fd, bytes(data))
    with pytest.raises(ValueError):
        sandbox.read_tensor_sets(fd, 1 << 20)
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
