"""kernel_sandbox: where kernel_eval runs code it does not trust, and how it talks to it.

Standard library, kernel_boundary and kernel_verdict (below it; torch, lazily, for a cuda:N device's id
and arch). It starts processes, limits and confines them, moves bytes to and from them (ask: a request,
whose failure is a kernel_verdict.Failure), and kills them.

- A worker is `python ENTRY --_worker MODE ...` (ENTRY: kernel_worker.py, whose __main__ hands
  `--_supervise` and `--_zygote` back here) under a supervisor (a child subreaper, its spec read from a
  pipe: argv is public) in its own session. The supervisor sets the limits (RLIMIT_AS, RLIMIT_FSIZE, no
  core files, nice, CPU affinity), keeps a bounded tail of stdout/stderr (a flood is killed), and on
  exit, SIGTERM or the harness's death kills the worker's process group and every orphan reparented to
  it. A confined worker (a candidate's) runs behind kernel_boundary's namespaces and uid.
- Every process of a worker carries its tag (TAG_ENV) in its initial environment, which the parent sweeps
  /proc for (kill_by_tag, stop_everything). The environment: kernel_boundary's allowlist (worker_env)
  plus worker_environment; MALLOC_PERTURB_ poisons fresh heap memory.
- Zygotes: a process that imported torch once forks supervisors and their workers, each with its own tag.
- Channel: a JSON line and raw bytes over pipes, with deadlines and size limits on the parent's side
  (serve: the worker's side); file descriptors (kernel_memory's memory files) over a Unix socket.
- device_lock (checks share a device, a timed run has it alone), scratch_dir, atomic_write, source_hash.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import kernel_boundary as boundary
from kernel_boundary import worker_env
from kernel_verdict import Failure, trim_error

# ----------------------------------------------------------------------------- environment

TAG_ENV = "KERNEL_EVAL_TAG"
POISON_MALLOC_PERTURB = "128"  # glibc fills fresh allocations with 128 ^ 0xff = 0x7f bytes


def worker_environment(device: str, arch: str, cache_root: str, build_jobs: int, compiling: bool) -> dict:
    """What a harness worker gets beyond worker_env's allowlist: its build settings and the one device it sees."""
    env = {"MAX_JOBS": str(build_jobs), "TORCH_EXTENSIONS_DIR": os.path.join(cache_root, "build")}
    if device == "cpu" or compiling:
        env["CUDA_VISIBLE_DEVICES"] = ""
        # tensors up to 32 MiB (glibc's most) from the heap, and up to 256 MiB of freed heap kept: else
        # a call's large tensors are fresh pages, and its CPU time page faults that vary with the load
        env.update(MALLOC_MMAP_THRESHOLD_=str(32 << 20), MALLOC_TRIM_THRESHOLD_=str(256 << 20))
    else:
        env["CUDA_VISIBLE_DEVICES"] = visible_device(device)
    if arch:
        env["TORCH_CUDA_ARCH_LIST"] = arch
    return env


def device_arch(device: str, cuda_arch: str | None) -> str:
    """The CUDA arch builds target ("" on cpu): `cuda_arch`, else the device's own, e.g. "9.0"."""
    if device == "cpu":
        return ""
    if cuda_arch:
        return cuda_arch
    import torch
    idx = torch.device(device).index or 0
    major, minor = torch.cuda.get_device_capability(idx)
    return f"{major}.{minor}"


def visible_device(device: str) -> str:
    import torch
    idx = torch.device(device).index or 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        ids = [v.strip() for v in visible.split(",") if v.strip()]
        return ids[idx] if idx < len(ids) else str(idx)
    return str(idx)


# ----------------------------------------------------------------------------- files and locks

def source_hash(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\0")
    return h.hexdigest()


def atomic_write(path: str, text: str) -> None:
    """Write `text` whole: a temp file, fsync, rename. A concurrent reader, or one after a crash,
    sees the old file or the new one, never half of it."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str):
    """The JSON value in `path`, or None if it is missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


_device_gates: dict = {}
_device_gates_guard = threading.Lock()


class DeviceLock:
    """Device work across threads and processes (an flock on cache_root/locks/device-NAME.lock): a timed
    run holds the device alone (exclusive); checks share it, never with a timed run. A thread waiting for
    the exclusive lock holds `gate`, so new checks queue behind it."""

    def __init__(self, cache_root: str, name: str, exclusive: bool = True):
        with _device_gates_guard:
            self.gate = _device_gates.setdefault(name, threading.Lock())
        os.makedirs(os.path.join(cache_root, "locks"), exist_ok=True)
        self.path = os.path.join(cache_root, "locks", f"device-{name}.lock")
        self.exclusive = exclusive

    def __enter__(self):
        self.file = open(self.path, "w")  # its own open file: flock locks of two opens conflict
        with self.gate:
            if self.exclusive:
                fcntl.flock(self.file, fcntl.LOCK_EX)
        if not self.exclusive:
            fcntl.flock(self.file, fcntl.LOCK_SH)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def device_lock(cache_root: str, device: str, exclusive: bool) -> DeviceLock:
    return DeviceLock(cache_root, "cpu" if device == "cpu" else "cuda" + visible_device(device), exclusive)


def scratch_dir(scratch_root: str | None, prefix: str) -> str:
    root = scratch_root or tempfile.gettempdir()
    os.makedirs(root, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=root)


# ----------------------------------------------------------------------------- framed channel

class ChannelError(RuntimeError):
    pass


class ChannelTimeout(ChannelError):
    pass


HEADER_MAX_BYTES = 16 << 20


class Channel:
    """JSON header line, then `nbytes` raw bytes; parent side with deadlines and size limits. Not
    multiprocessing.connection: its recv_bytes blocks past any deadline once a length header has arrived."""

    def __init__(self, read_fd: int, write_fd: int, max_bytes: int):
        self.read_fd, self.write_fd, self.max_bytes = read_fd, write_fd, max_bytes
        self.buf = bytearray()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)

    def _fill(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ChannelTimeout("deadline")
        ready, _, _ = select.select([self.read_fd], [], [], left)
        if not ready:
            raise ChannelTimeout("deadline")
        try:
            chunk = os.read(self.read_fd, 1 << 20)
        except BlockingIOError:
            return
        if not chunk:
            raise ChannelError("closed")
        self.buf += chunk

    def recv(self, deadline: float) -> tuple:
        while b"\n" not in self.buf:
            # a timing reply's header holds one float per call: tens of thousands for a microsecond kernel
            if len(self.buf) > HEADER_MAX_BYTES:
                raise ChannelError("malformed header")
            self._fill(deadline)
        line, _, rest = bytes(self.buf).partition(b"\n")
        self.buf = bytearray(rest)
        try:
            msg = json.loads(line)
        except ValueError as e:
            shown = repr(line)
            raise ChannelError(f"malformed header: {shown if len(shown) <= 60 else shown[:57] + '...'}") from e
        if not isinstance(msg, dict):
            raise ChannelError("malformed header")
        n = msg.get("nbytes", 0)
        if not isinstance(n, int) or n < 0 or n > self.max_bytes:
            raise ChannelError(f"payload of {n} bytes refused")
        while len(self.buf) < n:
            self._fill(deadline)
        payload = bytes(self.buf[:n])
        del self.buf[:n]
        return msg, payload

    def send(self, msg: dict, payload: bytes = b"", deadline: float | None = None) -> None:
        data = json.dumps(dict(msg, nbytes=len(payload))).encode() + b"\n" + payload
        view, sent = memoryview(data), 0
        while sent < len(data):
            left = (deadline or time.monotonic() + 60) - time.monotonic()
            if left <= 0:
                raise ChannelTimeout("deadline")
            _, ready, _ = select.select([], [self.write_fd], [], left)
            if not ready:
                raise ChannelTimeout("deadline")
            try:
                sent += os.write(self.write_fd, view[sent: sent + (1 << 20)])
            except BlockingIOError:
                continue
            except BrokenPipeError as e:
                raise ChannelError("closed") from e


def write_all(fd: int, data) -> None:
    view, sent = memoryview(data).cast("B"), 0
    while sent < len(view):
        sent += os.write(fd, view[sent: sent + (1 << 30)])


def child_send(fd: int, msg: dict, payload: bytes = b"") -> None:
    write_all(fd, json.dumps(dict(msg, nbytes=len(payload))).encode() + b"\n" + payload)


def child_recv(f) -> tuple:
    line = f.readline()
    if not line:
        raise EOFError("parent closed the channel")
    msg = json.loads(line)
    payload = f.read(msg.get("nbytes", 0))
    return msg, payload


class Refusal(Exception):
    """A command's failure that its message says in full (serve replies with it as it is)."""


def serve(cmd_fd: int, reply_fd: int, fd_sock: int, commands: dict, describe, before=None,
          stop_on_error: bool = False) -> None:
    """A worker's side of the channel: until the parent closes it, each command goes to
    `commands[msg["cmd"]](msg, fds, payload)` (its file descriptors closed after the reply), whose dict, or
    (dict, payload), is the reply under the command's nonce. A failure is the reply {"error":
    describe(exception) or a Refusal's message, "phase": cmd} (`stop_on_error`: and the loop ends).
    `before(cmd)` runs first."""
    cmd_in, sock = os.fdopen(cmd_fd, "rb"), socket.socket(fileno=fd_sock)
    while True:
        try:
            msg, payload = child_recv(cmd_in)
        except EOFError:
            return
        cmd, fds = msg.get("cmd"), []
        if msg.get("fds"):
            _, fds, _, _ = socket.recv_fds(sock, 16, msg["fds"])
            if len(fds) != msg["fds"]:
                raise RuntimeError(f"expected {msg['fds']} file descriptors, got {len(fds)}")
        try:
            if before is not None:
                before(cmd)
            if cmd not in commands:
                raise Refusal(f"unknown command {cmd!r}")
            reply = commands[cmd](msg, fds, payload)
            reply, data = reply if isinstance(reply, tuple) else (reply, b"")
            child_send(reply_fd, dict(reply, nonce=msg.get("nonce")), data)
        except Refusal as e:
            child_send(reply_fd, {"error": str(e), "phase": cmd or "?"})
        except BaseException as e:  # noqa: BLE001 - the worker's code failed: the reply says how
            child_send(reply_fd, {"error": describe(e), "phase": cmd or "?"})
            if stop_on_error:
                return
        finally:
            for fd in fds:  # closed once, after the reply: the parent seals output files then
                os.close(fd)


# ----------------------------------------------------------------------------- processes

def kill_by_tag(tag: str) -> int:
    """SIGKILL every process whose initial environment carries the tag; returns how many."""
    needle = f"{TAG_ENV}={tag}".encode()
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
    return killed


def _parent_map() -> dict:
    """pid -> its children's pids, from /proc."""
    parents = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError):
            with open(f"/proc/{entry}/stat") as f:
                parents.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    return parents


def children_of(pid: int) -> list:
    return _parent_map().get(pid, [])


def descendants(pid: int) -> list:
    parents, tree, todo = _parent_map(), [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        tree, todo = tree + kids, todo + kids
    return tree


def cpu_ms(pids: list) -> float | None:
    """CPU time (all threads) of the processes, summed, in ms; None if one has exited."""
    try:  # clock id of a process's CPU clock: MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED)
        return sum(time.clock_gettime(((~pid) << 3) | 2) for pid in pids) * 1e3
    except OSError:
        return None


def reap_children() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _worker_argv(spec: dict) -> list:
    cmd_fd, reply_fd, sock_fd = spec["fds"]
    return (["--_worker", spec["mode"], "--cmd-fd", str(cmd_fd), "--reply-fd", str(reply_fd),
             "--fd-sock", str(sock_fd)] + spec["args"])


class _PidWatch:
    """Waits for a process through a pidfd: a child of ours (reap: its exit status is collected), or a
    zygote's supervisor (not ours to reap: its exit reads as 0; the worker's code is in its code file)."""

    def __init__(self, pid: int, reap: bool):
        self.pid, self.reap, self.returncode = pid, reap, None
        self.fd = os.pidfd_open(pid)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self.fd], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout)
            code = 0
            if self.reap:
                try:
                    code = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
                except ChildProcessError:  # reaped by a waitpid(-1) sweep
                    code = -signal.SIGKILL
            self.returncode = code
            os.close(self.fd)
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None


def _fork_worker(spec: dict, out_w: int, err_w: int, limits, worker_main) -> _PidWatch:
    """The worker as a fork of this (zygote-forked, torch imported) supervisor: what an exec of `ENTRY
    --_worker` would be, less the interpreter start. `limits()` runs in it first (and enters the boundary)."""
    pid = os.fork()
    if pid == 0:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the supervisor's handler is not ours
            set_process_name(f"keval-{spec['mode']}")
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.dup2(out_w, 1)
            os.dup2(err_w, 2)
            keep = {0, 1, 2, *spec["fds"]}
            for fd in [int(x) for x in os.listdir("/proc/self/fd")]:  # what exec's close_fds does
                if fd not in keep:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            limits()
            os.environ.clear()  # putenv: the compiler processes it starts get this environment
            os.environ.update(spec["env"])
            sys.argv = [spec["entry"]] + _worker_argv(spec)
            worker_main(sys.argv[1:])
        except BaseException:  # noqa: BLE001 - whatever happened, this process ends here
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(1)
    return _PidWatch(pid, reap=True)


def supervise(spec: dict, worker_main=None) -> int:
    """Child subreaper: run the worker, then kill it and every orphan reparented to us. `worker_main`: we
    are a fork of a zygote, and the worker a fork of us running it (no exec). `spec["confine"]` (a
    kernel_boundary.confinement plan): the worker is pid 1 of a new PID namespace and enters the rest of
    the boundary before any of its code runs."""
    _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    confine = spec.get("confine")
    if confine:
        boundary.load_libc()  # loaded here, not in the child between fork and exec

    def limits():
        import resource
        os.setpgid(0, 0)
        if spec.get("as_bytes"):
            resource.setrlimit(resource.RLIMIT_AS, (spec["as_bytes"], spec["as_bytes"]))
        resource.setrlimit(resource.RLIMIT_FSIZE, (spec["fsize"], spec["fsize"]))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if spec.get("nice"):
            os.nice(spec["nice"])
        if spec.get("cpus"):  # inherited by the compilers a build starts
            os.sched_setaffinity(0, spec["cpus"])
        if confine:
            try:
                boundary.enter_boundary(confine)
            except OSError as e:
                os.write(2, f"kernel_sandbox: the boundary could not be entered: {e}\n".encode())
                raise

    stop = {"flag": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    # stdout and stderr through pipes: kept up to a limit, and a worker that floods them is killed
    # (RLIMIT_FSIZE cannot do this: it would also cap the memory files that carry tensors)
    flooded = threading.Event()
    written = [0]
    guard = threading.Lock()
    worker = None

    def drain(fd: int, path: str) -> None:
        with open(path, "wb") as f:
            while chunk := os.read(fd, 1 << 16):
                with guard:
                    keep = chunk[: max(0, spec["output_bytes"] - written[0])]
                    written[0] += len(chunk)
                if keep:
                    f.write(keep)
                    f.flush()
                if len(keep) < len(chunk) and not flooded.is_set():
                    flooded.set()
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(worker.pid, signal.SIGKILL)  # the worker wrote: it exists
        os.close(fd)

    # the drains start first: once this process has unshared its PID namespace it can start no thread
    drains = [threading.Thread(target=drain, args=(out_r, spec["stdout"]), daemon=True),
              threading.Thread(target=drain, args=(err_r, spec["stderr"]), daemon=True)]
    for t in drains:
        t.start()
    try:
        if confine:
            boundary.unshare_pid_namespace()  # the worker, our next and only child, is its pid 1
        if worker_main is not None:
            worker = _fork_worker(spec, out_w, err_w, limits, worker_main)
        else:
            worker = subprocess.Popen([sys.executable, spec["entry"]] + _worker_argv(spec),
                                      stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w,
                                      pass_fds=tuple(spec["fds"]), env=spec["env"], preexec_fn=limits)
    except (OSError, subprocess.SubprocessError) as e:  # no worker: its stderr says why
        os.write(err_w, f"kernel_sandbox: the worker could not start: {e!r}\n".encode())
        worker = None
    for fd in spec["fds"] + [out_w, err_w]:
        os.close(fd)
    if worker is None:
        for t in drains:
            t.join(timeout=2)
        with open(spec["code_file"], "w") as f:
            f.write("1\n")
        return 0
    code = None
    # the harness may die without stopping us (killed, or its own crash): then we are reparented,
    # and a hung worker must not keep the device forever
    while code is None and not stop["flag"] and os.getppid() == spec["parent"]:
        try:
            code = worker.wait(timeout=0.05)
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGKILL)
    quiet = 0
    while quiet < 3:  # orphans that called setsid are reparented to us: kill until none are left
        kids = children_of(os.getpid())
        for pid in kids:
            for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    kill()
        reap_children()
        quiet = quiet + 1 if not kids else 0
        time.sleep(0.02)
    if code is None:
        code = worker.returncode if worker.returncode is not None else -signal.SIGKILL
    for t in drains:  # every writer is dead now: the pipes end
        t.join(timeout=2)
    with open(spec["code_file"], "w") as f:
        f.write(f"{code}\n{'flooded' if flooded.is_set() else ''}")
    return 0


# Every worker alive in this process, so that an interrupted batch (Ctrl-C) can stop them all at
# once: stop_everything. Registration and _STOPPING are under one lock, so a worker that starts
# while a batch is being stopped stops itself instead of outliving it.
_LIVE_WORKERS: set = set()
_LIVE_LOCK = threading.Lock()
_STOPPING = threading.Event()


class Interrupted(RuntimeError):
    """A worker was started while its batch was being stopped (stop_everything)."""


def resume() -> None:
    """A new batch may start workers again (an earlier one of this process was interrupted)."""
    _STOPPING.clear()


def stop_everything(zygotes: "Zygotes | None") -> None:
    """An evaluation was interrupted (Ctrl-C, or an exception in the parent): stop every worker now. The
    supervisors kill their worker's process group and its orphans on SIGTERM; a sweep by tag then kills
    whatever is left (the supervisors themselves, a compiler a build started)."""
    with _LIVE_LOCK:
        _STOPPING.set()
        workers = list(_LIVE_WORKERS)
    for w in workers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(w.proc.pid, signal.SIGTERM)
    zygote_list = zygotes.all() if zygotes is not None else []
    for zygote in zygote_list:
        if zygote.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                zygote.proc.kill()
    time.sleep(0.2)  # the supervisors' own clean-up, which also reaps their orphans
    tags = [w.tag for w in workers] + [z.tag for z in zygote_list]
    for _ in range(2):  # a process forked during the first sweep carries the tag too
        for tag in tags:
            kill_by_tag(tag)


class Worker:
    """A worker process under its supervisor, with a framed channel to it: `python entry --_worker MODE ...
    ARGS` (or its fork from a zygote), in `scratch`, with the allowlisted environment plus `env_extra`.
    Limits: `fsize` bytes a file, `as_bytes` of address space (0: none), `output_bytes` of stdout + stderr
    kept (more kills it), `message_bytes` a message, `nice`, `cpus` (None: this process's). `confine`: a
    kernel_boundary.confinement plan (None: none, as the trusted reference's worker)."""

    def __init__(self, mode: str, args: list, scratch: str, env_extra: dict, *, entry: str, fsize: int,
                 output_bytes: int, message_bytes: int, as_bytes: int = 0, nice: int = 0, cpus: list | None = None,
                 zygotes: Zygotes | None = None, confine: dict | None = None):
        os.makedirs(scratch, exist_ok=True)
        self.scratch, self.tag = scratch, secrets.token_hex(8)
        if confine:
            confine = boundary.with_entry(confine, entry)
        cmd_r, cmd_w = os.pipe()
        rep_r, rep_w = os.pipe()
        # file descriptors (memory files of tensors) travel over a socket, next to the command pipe
        self.fd_sock, child_sock = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.fd_sock.settimeout(30)
        env = worker_env(dict(env_extra, PYTHONDONTWRITEBYTECODE="1", MALLOC_PERTURB_=POISON_MALLOC_PERTURB))
        env[TAG_ENV] = self.tag  # the zygote that forks this worker was started with env less the tag
        self.stdout, self.stderr = os.path.join(scratch, "stdout"), os.path.join(scratch, "stderr")
        self.code_file = os.path.join(scratch, "exit_code")
        self.output_bytes = output_bytes
        spec = {"mode": mode, "args": args, "env": env, "fds": [cmd_r, rep_w, child_sock.fileno()],
                "entry": os.path.abspath(entry), "stdout": self.stdout, "stderr": self.stderr,
                "code_file": self.code_file, "fsize": fsize, "output_bytes": output_bytes, "nice": nice,
                "parent": os.getpid(), "as_bytes": as_bytes, "cpus": cpus, "confine": confine}
        self.proc = zygotes.fork(spec) if zygotes else None  # None: no zygote, or it is out of service
        if self.proc is None:  # the spec (it holds the environment) through a pipe: argv is public (ps)
            self.proc = subprocess.Popen([sys.executable, spec["entry"], "--_supervise"],
                                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         pass_fds=(cmd_r, rep_w, child_sock.fileno()), start_new_session=True, env=env)
            with contextlib.suppress(BrokenPipeError), self.proc.stdin:  # died first: death_reason says how
                self.proc.stdin.write(json.dumps(spec).encode())
        os.close(cmd_r)
        os.close(rep_w)
        child_sock.close()
        self.channel = Channel(rep_r, cmd_w, message_bytes)
        self.fds = (rep_r, cmd_w)
        with _LIVE_LOCK:
            stopping = _STOPPING.is_set()
            if not stopping:
                _LIVE_WORKERS.add(self)
        if stopping:  # the batch was interrupted while this worker started
            self.stop()
            raise Interrupted("the evaluation was interrupted")

    def exit_record(self) -> tuple:
        """(exit code or None, whether the supervisor killed it for flooding its output)."""
        try:
            with open(self.code_file) as f:
                words = f.read().split()
        except OSError:
            return None, False
        try:
            code = int(words[0])
        except (ValueError, IndexError):
            code = None
        return code, "flooded" in words

    def stop(self) -> None:
        with _LIVE_LOCK:
            _LIVE_WORKERS.discard(self)
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        kill_by_tag(self.tag)
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = ()
        self.fd_sock.close()

    def send_fds(self, fds: list) -> None:
        try:
            socket.send_fds(self.fd_sock, [b"f"], fds)
        except OSError as e:  # includes a timeout: a worker that stopped reading
            raise ChannelError("closed") from e

    def tail(self, n: int = 2000) -> str:
        parts = []
        for path in (self.stderr, self.stdout):
            try:
                with open(path, "rb") as f:
                    f.seek(0, os.SEEK_END)
                    size = f.tell()
                    f.seek(max(0, size - n))
                    parts.append(f.read().decode(errors="replace"))
            except OSError:
                continue
        return "\n".join(p for p in parts if p.strip())

    def death_reason(self, phase: str, summarize=lambda tail: tail[-600:]) -> str:
        """How the worker ended, and `summarize` of its output's tail."""
        if self.proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        code, flooded = self.exit_record()
        if flooded:
            how = f"wrote more than {self.output_bytes >> 20} MiB to stdout/stderr and was killed"
        elif code is None:
            how = "closed its channel"
        elif code < 0:
            known = -code in signal.Signals._value2member_map_
            how = f"was killed by {signal.Signals(-code).name}" if known else f"died (signal {-code})"
        else:
            how = f"exited with code {code}"
        tail = summarize(self.tail())
        return f"process {how} during {phase}" + (f":\n{tail}" if tail else "")


def ask(worker: Worker, who: str, phase: str, timeout_s: float, msg: dict,
        deadline: float | None = None, fds: tuple = (), limit_note: str = "") -> tuple:
    """Send a command (and file descriptors), wait for the reply with the same nonce; failures become Failure.
    An empty `msg`: wait for the worker's next message (its boot). `limit_note`: how timeout_s was derived."""
    start = time.monotonic()
    deadline = deadline or start + timeout_s
    nonce = secrets.token_hex(8)
    try:
        if msg:
            if fds:
                worker.send_fds(list(fds))
            worker.channel.send(dict(msg, nonce=nonce, fds=len(fds)), b"", deadline)
        while True:
            reply, data = worker.channel.recv(deadline)
            if "error" in reply:
                raise Failure("runtime_error", f"{who} failed during {phase}: {reply['error']}")
            if not msg or reply.get("nonce") == nonce:
                return reply, data
    except ChannelTimeout as e:
        note = f": {limit_note}" if limit_note else ""
        raise Failure("timeout", f"{who} timed out during {phase} (limit {timeout_s:.3g} s{note})",
                      waited_s=time.monotonic() - start) from e
    except ChannelError as e:
        if str(e) != "closed":
            why = f"{who} wrote malformed data on the result channel during {phase} ({e})"
            raise Failure("runtime_error", why) from e
        raise Failure("runtime_error", f"{who} {death_reason(worker, phase)}") from e


def death_reason(worker: Worker, phase: str) -> str:
    return worker.death_reason(phase, summarize=lambda tail: trim_error(tail, max_lines=6, max_chars=600))


# ----------------------------------------------------------------------------- zygotes

def _retag_initial_environment(tag: str) -> None:
    """Write `tag` over this process's KERNEL_EVAL_TAG value in its initial environment block, in place
    (as setproctitle rewrites argv): /proc/<pid>/environ shows that block, so a zygote's fork would
    otherwise carry the zygote's tag, out of reach of its own evaluation's sweep (kill_by_tag)."""
    import ctypes
    with open("/proc/self/stat") as f:
        env_start = int(f.read().rsplit(")", 1)[1].split()[47])  # field 50, env_start (fields from 3)
    with open("/proc/self/environ", "rb") as f:
        block = f.read()
    prefix = f"{TAG_ENV}=".encode()
    offset = 0
    for entry in block.split(b"\0"):
        if entry.startswith(prefix):
            break
        offset += len(entry) + 1
    else:
        raise RuntimeError(f"{TAG_ENV} is not in the initial environment")
    if len(entry) != len(prefix) + len(tag):
        raise RuntimeError(f"{TAG_ENV} has {len(entry) - len(prefix)} characters, the new tag {len(tag)}")
    ctypes.memmove(env_start + offset + len(prefix), tag.encode(), len(tag))
    with open("/proc/self/environ", "rb") as f:
        if prefix + tag.encode() not in f.read().split(b"\0"):
            raise RuntimeError("the environment block did not take the new tag")


def _prctl(option: int, value) -> None:
    __import__("ctypes").CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def set_process_name(name: str) -> None:
    """The name ps and /proc/<pid>/comm show (15 bytes): how a reader (bench/cpu_by_process.py) tells a
    forked worker's role (it keeps its zygote's command line)."""
    _prctl(15, name.encode()[:15])  # PR_SET_NAME


def zygote_main(sock_fd: int, harness_pid: int, preload, worker_main) -> None:
    """`preload()` once (imports; returns why forks of this process could not serve, or ""), then
    fork a supervisor, which forks its worker to run `worker_main(argv)`, per request."""
    import gc
    why = preload()
    sock = socket.socket(fileno=sock_fd)
    try:  # the sweep by tag must work for forked workers, or the harness spawns them itself
        own = os.environ[TAG_ENV]
        _retag_initial_environment(secrets.token_hex(len(own) // 2))
        _retag_initial_environment(own)
    except (OSError, RuntimeError, KeyError, ValueError, IndexError) as e:
        why = why or f"cannot retag forked processes: {e}"
    gc.freeze()  # forked children touch fewer shared pages (reference counts aside)
    sock.send(json.dumps({"ok": not why, "why": why}).encode())
    zygote_pid = os.getpid()
    while not why and os.getppid() == harness_pid:  # the harness died: so do we, and our supervisors
        reap_children()
        if not select.select([sock], [], [], 0.2)[0]:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, 1 << 20, 8)
        except OSError:
            break
        if not data:
            break
        spec = json.loads(data)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                sock.close()
                set_process_name("keval-super")
                spec["fds"], spec["parent"] = fds, zygote_pid
                _retag_initial_environment(spec["env"][TAG_ENV])
                os.setsid()
                code = supervise(spec, worker_main)
            except BaseException:  # noqa: BLE001 - a forked child never returns into this loop
                traceback.print_exc()
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())
    os._exit(0)


class _Zygote:
    """A process that imported torch once, under one worker environment, and forks workers (each under
    its supervisor) on request while its Zygotes keeps it: a spawned worker's isolation (session,
    subreaper, process group, limits, tag) and environment (what glibc and torch read at start). It never
    creates a CUDA context and holds nothing secret; a candidate's code runs only in a forked worker (an
    unconfined candidate can still ptrace or kill it, as any process of its uid; a confined one cannot see
    it). When it cannot serve, `fork` returns None and the caller spawns; a supervisor it had forked sees
    itself reparented and stops its worker."""

    def __init__(self, env: dict, entry: str):
        self.env, self.entry = env, entry  # env without the tag, which is each worker's own
        self.lock = threading.Lock()
        self.proc = self.sock = None
        self.tag = secrets.token_hex(8)
        self.out_of_service = ""

    def _start(self) -> None:
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(120)
        self.proc = subprocess.Popen(
            [sys.executable, self.entry, "--_zygote", str(child.fileno()), str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(child.fileno(),), start_new_session=True, env=dict(self.env, **{TAG_ENV: self.tag}))
        child.close()
        ready = json.loads(self.sock.recv(1 << 16) or b'{"why": "it exited while starting"}')
        if not ready.get("ok"):
            raise RuntimeError(ready.get("why", "it did not start"))

    def fork(self, spec: dict) -> _PidWatch | None:
        """Fork a supervisor and its worker for `spec` (the fds travel with the request)."""
        with self.lock:
            if self.out_of_service:
                return None
            try:
                if self.proc is None:
                    self._start()
                socket.send_fds(self.sock, [json.dumps(spec).encode()], spec["fds"])
                reply = json.loads(self.sock.recv(1 << 16) or b"{}")
                return _PidWatch(int(reply["pid"]), reap=False)
            except (OSError, ValueError, KeyError, TypeError, RuntimeError) as e:
                self.out_of_service = f"zygote out of service: {e!r}"
                self._stop()
                return None

    def _stop(self) -> None:
        if self.sock is not None:
            self.sock.close()  # the zygote reads the end of its socket and exits
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            kill_by_tag(self.tag)  # a fork that had not retagged itself yet

    def close(self) -> None:
        with self.lock:
            self._stop()
            self.out_of_service = self.out_of_service or "closed"


class Zygotes:
    """One _Zygote per distinct worker environment (and entry), started by the first worker that needs it
    (on cuda one for compile workers, CUDA hidden, and one for run workers; on cpu they share one). A batch
    makes its own, or its caller keeps one across batches (`with Zygotes() as zygotes:`), so that a training
    run's turns do not each pay a torch import; kept, a zygote holds no more than within one batch."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_env: dict = {}

    def fork(self, spec: dict) -> _PidWatch | None:
        env = {k: v for k, v in spec["env"].items() if k != TAG_ENV}
        key = json.dumps([spec["entry"], env], sort_keys=True)
        with self.lock:
            if key not in self.by_env:
                self.by_env[key] = _Zygote(env, spec["entry"])
            zygote = self.by_env[key]
        return zygote.fork(spec)

    def all(self) -> list:
        with self.lock:
            return list(self.by_env.values())

    def drop_out_of_service(self) -> None:
        """Forget the zygotes that stopped serving (a fork failed), so that the next fork starts a fresh one:
        called once a batch, it gives each batch the one fresh try that zygotes of its own would have."""
        with self.lock:
            self.by_env = {key: z for key, z in self.by_env.items() if not z.out_of_service}

    def close(self) -> None:
        """Stop every zygote; a later fork starts a fresh one."""
        with self.lock:
            zygotes, self.by_env = list(self.by_env.values()), {}
        for zygote in zygotes:
            zygote.close()

    def __enter__(self) -> "Zygotes":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
