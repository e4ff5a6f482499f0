"""Tests for kernel_boundary: what a confined worker sees (pid 1 of its own namespace, no network,
uid 65534 without capabilities, only what it is given to read and write, nothing left behind),
what the plan hides, the environment every worker gets (an allowlist), and the probe and modes
that choose the boundary. The workers here run a tiny entry script of their own through
kernel_sandbox, not kernel_eval."""
import contextlib
import json
import os
import sys
import threading

import pytest

import kernel_boundary as boundary
import kernel_sandbox as sandbox

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A worker entry as kernel_worker.py is one (it hands --_supervise and --_zygote back to the
# sandbox), whose worker prints what it sees behind the boundary as JSON: its ids, capabilities,
# processes, network, and what it could read and write of the paths (JSON) in its last argument.
ENTRY = f"""
import json, os, sys
sys.path.insert(0, {ROOT!r})
import kernel_sandbox

def worker_main(argv):
    print(json.dumps(look(json.loads(argv[-1]))), flush=True)

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
            "no_new_privs": status["NoNewPrivs"].strip(),
            "procs": sorted(p for p in os.listdir("/proc") if p.isdigit()),
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


BOUNDARY_PROBLEM = boundary.boundary_problem()
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
                      os.path.join(ROOT, "kernel_boundary.py")],
             "write": [str(shared / "ro" / "new"), str(shared / "rw" / "new"), str(scratch / "mine"),
                       "/tmp/keval-test-leftover", "/dev/shm/keval-test-leftover", str(home / "new"),
                       os.path.join(ROOT, "keval-test-leftover"), str(shared / "other" / "record")],
             "parent": os.getpid()}
    plan = boundary.confinement(str(scratch), binds=[(str(shared / "ro"), str(shared / "ro"), False),
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
    assert seen["uid"] == seen["gid"] == boundary.UNPRIVILEGED_ID and seen["groups"] == [], seen
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
    assert read[os.path.join(ROOT, "kernel_boundary.py")].startswith('"""kernel_boundary'), seen  # the code it runs
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
    plan = boundary.confinement(str(tmp_path / "w"))
    hidden = [path for path, _ in plan["hide"]]
    assert str(tmp_path) in hidden and "/tmp" in hidden and "/root" in hidden
    bound = [target for _, target, _ in plan["binds"]]
    assert str(tmp_path / "lib") in bound and str(tmp_path) not in bound  # what Python imports, never $HOME itself
    monkeypatch.setenv("HOME", "/")  # some containers: hiding it would hide everything
    hidden = [path for path, _ in boundary.confinement(str(tmp_path / "w"), hide=["/usr", "/usr/lib/.."])["hide"]]
    assert not {"/", "/usr"} & set(hidden)


@needs_namespaces
def test_the_probe_says_when_the_gpu_devices_are_closed_to_the_unprivileged_uid(monkeypatch):
    if not os.path.exists("/etc/shadow") or os.stat("/etc/shadow").st_mode & 0o006:
        pytest.skip("needs a file only root may open: /etc/shadow")
    monkeypatch.setattr(boundary, "_GPU_DEVICES", ("/etc/shadow",))  # a device node only root may open
    monkeypatch.setattr(boundary, "_boundary_problem", None)  # probe again
    monkeypatch.setattr(boundary, "_warned", False)
    assert boundary.boundary_problem() == "" and boundary.boundary_for("auto") == "namespaces"  # CPU work: confined
    assert boundary.boundary_problem(gpu=True) == f"uid {boundary.UNPRIVILEGED_ID} cannot open /etc/shadow"
    with pytest.raises(boundary.BoundaryUnavailable, match="cannot open /etc/shadow"):
        boundary.boundary_for("require", gpu=True)


def test_boundary_modes_say_what_they_run_under(monkeypatch):
    assert boundary.boundary_for("off") == "process"
    with pytest.raises(ValueError, match="sandbox must be one of auto, require, off"):
        boundary.boundary_for("on")
    monkeypatch.setattr(boundary, "_boundary_problem", "no namespaces in this test")
    monkeypatch.setattr(boundary, "_warned", False)
    with pytest.raises(boundary.BoundaryUnavailable, match="cannot be confined here: no namespaces in this test"):
        boundary.boundary_for("require")
    with pytest.warns(RuntimeWarning, match="WITHOUT a boundary.*no namespaces in this test"):
        assert boundary.boundary_for("auto") == "process"
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per process, not per batch
        assert boundary.boundary_for("auto") == "process"



def test_boundary_imports_only_the_standard_library():
    import subprocess
    code = ("import sys; sys.path.insert(0, %r); import kernel_boundary; "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))" % ROOT)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_worker_environment_is_an_allowlist(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("KERNEL_EVAL_TEST_X", "1")
    env = boundary.worker_env({"EXTRA": "2"})
    assert "OPENAI_API_KEY" not in env and env["KERNEL_EVAL_TEST_X"] == "1" and env["EXTRA"] == "2"
    assert env["PATH"] == os.environ["PATH"]
