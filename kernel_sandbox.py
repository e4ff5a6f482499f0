"""kernel_sandbox: where kernel_eval runs code it does not trust, and how it talks to it.

Standard library only (torch is imported inside the tensor-file functions, which run once torch is
loaded). It knows nothing of verdicts: it starts processes, limits them, moves bytes to and from
them, and kills them.

- A worker is `python ENTRY --_worker MODE --cmd-fd C --reply-fd R --fd-sock S ARGS...` (ENTRY: the
  caller's script, kernel_worker.py, whose __main__ hands `--_supervise` and `--_zygote` back here)
  under a supervisor (a child subreaper, `python ENTRY --_supervise`, its spec read from a pipe:
  argv is public) in its own session. The supervisor sets the limits (RLIMIT_AS, RLIMIT_FSIZE, no
  core files, nice, CPU affinity), keeps a bounded tail of stdout/stderr (a flood is killed), and
  on exit, SIGTERM or the harness's death (it is reparented) kills the worker's process group and
  every orphan reparented to it.
- Every process of a worker carries its tag (TAG_ENV) in its initial environment block, which the
  parent sweeps /proc for (kill_by_tag) after each worker and when a batch is interrupted
  (stop_everything). The environment is an allowlist (worker_env), never the trainer's API keys;
  MALLOC_PERTURB_ poisons fresh heap memory.
- The boundary (`confinement`, `enter_boundary`): a confined worker is pid 1 of a new PID namespace
  (its supervisor unshares it, then forks it), in new network, IPC, UTS and mount namespaces: the
  home and temp directories (and what the caller names) are empty tmpfs, with back in them only
  what it needs (Python, the entry's directory, the caller's binds), every other file system is
  read-only, /proc is its namespace's; then uid/gid 65534 (when the harness is root), no
  capabilities, no_new_privs. `boundary_for(mode)` says which boundary a batch gets (SANDBOX_MODES).
- Zygotes: a process that ran the caller's `preload` (import torch) once forks supervisors and
  their workers on request, each with its own tag written over the zygote's: the same isolation,
  without an interpreter start and `import torch` per worker. One out of service (killed, say)
  makes Worker spawn instead.
- Channel: a JSON line and raw bytes over pipes, with deadlines and size limits on the parent's
  side (serve: the worker's side). Tensors travel in memory files (memfd): raw bytes at aligned
  offsets and a JSON index, read in place and validated (read_tensor_sets); the parent seals a
  file (F_SEAL_WRITE) so that no holder can change it afterwards. File descriptors go over a
  Unix socket.
- DeviceLock (checks share a device, a timed run has it alone), atomic_write (the harness's one
  atomic write, with fsync), source_hash.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
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

# ----------------------------------------------------------------------------- environment

TAG_ENV = "KERNEL_EVAL_TAG"
POISON_MALLOC_PERTURB = "128"  # glibc fills fresh allocations with 128 ^ 0xff = 0x7f bytes

# The environment a worker gets: what the compilers, torch and CUDA need, and the harness's own
# variables; nothing else of the harness's (API keys and tokens of the trainer stay out of reach).
ENV_ALLOWED = frozenset("""PATH HOME USER LOGNAME LANG LANGUAGE TZ TMPDIR TMP TEMP LD_LIBRARY_PATH LIBRARY_PATH
CPATH C_INCLUDE_PATH CPLUS_INCLUDE_PATH PYTHONPATH VIRTUAL_ENV CC CXX CUDAHOSTCXX MAX_JOBS OMP_NUM_THREADS
MKL_NUM_THREADS XDG_CACHE_HOME""".split())
ENV_ALLOWED_PREFIXES = ("LC_", "CUDA_", "NVCC_", "NVIDIA_", "TORCH_", "TRITON_", "KERNEL_EVAL_")


def worker_env(extra: dict) -> dict:
    """The allowlisted part of this process's environment, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k in ENV_ALLOWED or k.startswith(ENV_ALLOWED_PREFIXES)}
    env.update(extra)
    return env


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
    """Device work across threads and processes (an flock on cache_root/locks/device-NAME.lock): a
    timed run holds the device alone (exclusive); correctness checks share it with each other, never
    with a timed run. A thread waiting for the exclusive lock holds `gate`, so new checks queue
    behind it."""

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


# ----------------------------------------------------------------------------- framed channel

class ChannelError(RuntimeError):
    pass


class ChannelTimeout(ChannelError):
    pass


HEADER_MAX_BYTES = 16 << 20


class Channel:
    """JSON header line, then `nbytes` raw bytes; parent side with deadlines and size limits."""

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
    `commands[msg["cmd"]](msg, fds, payload)` (the file descriptors it came with, closed after the
    reply), whose dict, or (dict, payload), is the reply under the command's nonce. A failure is
    the reply {"error": describe(exception) or a Refusal's message, "phase": cmd}; `stop_on_error`:
    and the loop ends. `before(cmd)` runs first."""
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


# ----------------------------------------------------------------------------- tensor files
# Bulk tensors (hundreds of MB per call on real tasks) go through memory files, not the pipe: raw
# bytes at 64-byte aligned offsets, then a JSON index, its length and a magic tag. Readers view the
# bytes in place (no copy, no pickle) after validating every offset, size and dtype: a candidate
# writes its own output file and may put anything in it.

TENSOR_FILE_MAGIC = b"KEVALTS1"
TENSOR_FILE_DTYPES = ("float32", "float64", "float16", "bfloat16", "complex64", "complex128",
                      "int8", "int16", "int32", "int64", "uint8", "bool")
TENSOR_FILE_ALIGN = 64
TRUSTED_FILE_MAX_BYTES = 1 << 46  # input files: written by the reference session, sealed by the parent


class TensorFileWriter:
    """Writes sets of tensors (or JSON values such as ints) to an empty file, one set at a time, in
    the layout read_tensor_sets reads. Device tensors go through a small pinned buffer: a pageable
    device-to-host copy into fresh memory is several times slower."""

    STAGING_BYTES = 64 << 20

    def __init__(self, fd: int):
        self.fd, self.pos, self.index, self.staging = fd, 0, [], None

    def add(self, values: list) -> None:
        import torch
        entries = []
        for v in values:
            if not isinstance(v, torch.Tensor):
                json.dumps(v)  # a value the index cannot hold fails here, loudly
                entries.append({"value": v})
                continue
            t = v.detach()
            t = t.contiguous() if t.device.type == "cuda" else t.to("cpu").contiguous()
            pad = -self.pos % TENSOR_FILE_ALIGN
            write_all(self.fd, bytes(pad))
            self.pos += pad
            nbytes = t.nbytes
            if nbytes:
                flat = t.reshape(-1).view(torch.uint8)
                if t.device.type == "cuda":
                    if self.staging is None:
                        self.staging = torch.empty(self.STAGING_BYTES, dtype=torch.uint8, pin_memory=True)
                    for i in range(0, nbytes, self.STAGING_BYTES):
                        n = min(self.STAGING_BYTES, nbytes - i)
                        self.staging[:n].copy_(flat[i: i + n])
                        write_all(self.fd, self.staging[:n].numpy())
                else:
                    write_all(self.fd, flat.numpy())
            entries.append({"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
                            "offset": self.pos, "nbytes": nbytes})
            self.pos += nbytes
        self.index.append(entries)

    def close(self) -> None:
        footer = json.dumps({"sets": self.index}).encode()
        write_all(self.fd, footer + len(footer).to_bytes(8, "little") + TENSOR_FILE_MAGIC)
        self.staging = None


def write_tensor_sets(fd: int, sets: list) -> None:
    """Write lists of tensors (or JSON values) to an empty file, streaming."""
    writer = TensorFileWriter(fd)
    for values in sets:
        writer.add(values)
    writer.close()


def read_tensor_sets(fd: int, max_bytes: int) -> list:
    """The sets a tensor file holds, as CPU tensors viewing the mapped file (read-only: copy to
    write). Raises ValueError on anything malformed."""
    import mmap
    import warnings
    import torch
    size = os.fstat(fd).st_size
    if size < 16 or size > max_bytes:
        raise ValueError(f"tensor file of {size} bytes (limit {max_bytes})")
    # MAP_POPULATE: fault the pages in at once (one syscall) rather than one by one on first touch
    mapped = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=mmap.PROT_READ)
    if mapped[size - 8:] != TENSOR_FILE_MAGIC:
        raise ValueError("not a tensor file")
    n = int.from_bytes(mapped[size - 16: size - 8], "little")
    data_end = size - 16 - n
    if not 0 < n <= min(size - 16, 1 << 26):
        raise ValueError("bad index length")
    try:
        index = json.loads(mapped[data_end: size - 16])
    except ValueError as e:
        raise ValueError("unreadable index") from e
    sets = index.get("sets") if isinstance(index, dict) else None
    if not isinstance(sets, list) or not all(isinstance(s, list) for s in sets):
        raise ValueError("bad index")
    out = []
    for entries in sets:
        values = []
        for e in entries:
            if not isinstance(e, dict):
                raise ValueError("bad index entry")
            if "value" in e:
                values.append(e["value"])
                continue
            dtype, shape, offset, nbytes = e.get("dtype"), e.get("shape"), e.get("offset"), e.get("nbytes")
            if (dtype not in TENSOR_FILE_DTYPES or not isinstance(shape, list) or len(shape) > 16
                    or not all(isinstance(d, int) and 0 <= d < 1 << 40 for d in shape)
                    or not isinstance(offset, int) or not isinstance(nbytes, int)
                    or offset < 0 or offset % TENSOR_FILE_ALIGN or offset + nbytes > data_end):
                raise ValueError("bad tensor entry")
            dt = getattr(torch, dtype)
            if nbytes != math.prod(shape) * dt.itemsize:
                raise ValueError("tensor size does not match its shape")
            if nbytes == 0:
                values.append(torch.empty(shape, dtype=dt))
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "non-writable buffer": readers copy before writing
                flat = torch.frombuffer(mapped, dtype=torch.uint8, count=nbytes, offset=offset)
            values.append(flat.view(dt).view(shape))
        out.append(values)
    return out


def memfd(name: str) -> int:
    return os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)


def seal(fd: int) -> None:
    """Make a memory file immutable for every holder; fails (EBUSY) while anyone maps it writable."""
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS,
                fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)


# ----------------------------------------------------------------------------- the boundary
# The module docstring says what a confined worker sees. The GPU rules out a user namespace (CUDA
# does not work in one), so the unprivileged uid comes from dropping root's.

SANDBOX_MODES = ("auto", "require", "off")
UNPRIVILEGED_ID = 65534  # nobody / nogroup
TMPFS_BYTES = 1 << 30  # each tmpfs a confined worker may write (RAM: a candidate could fill it)
# directories never hidden (nor their ancestors): the system a worker runs on
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/dev", "/proc", "/sys", "/opt", "/var",
                "/run", "/boot", "/snap", "/nix")
_HIDDEN_BY_DEFAULT = ("/root", "/home", "/tmp", "/var/tmp", "/dev/shm", "/run/user", "/mnt", "/media", "/srv")
_PSEUDO_MOUNTS = ("/proc", "/sys", "/dev")  # left as they are (their writes need privileges; GPU nodes live in /dev)

_CLONE_NEWNS, _CLONE_NEWUTS, _CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
_CLONE_NEWPID, _CLONE_NEWNET = 0x20000000, 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_MOUNT_OPTION_FLAGS = {"nosuid": _MS_NOSUID, "nodev": _MS_NODEV, "noexec": _MS_NOEXEC, "noatime": 1024,
                       "nodiratime": 2048, "relatime": 1 << 21}
_PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _PR_SET_NO_NEW_PRIVS = 4, 24, 38


def _libc():
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return libc


def _checked(ret: int, what: str) -> None:
    if ret != 0:
        import ctypes
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _strictly_hidden(path: str, hidden) -> bool:
    """Inside a hidden directory, and holding none (binding it would show a hidden one again)."""
    return any(_inside(path, h) and path != h for h in hidden) and not any(_inside(h, path) for h in hidden)


def confinement(workdir: str, binds=(), hide=(), tmpfs_bytes: int = TMPFS_BYTES) -> dict:
    """The boundary's plan for one worker (JSON: it travels in the supervisor's spec), computed by
    the trusted parent: `workdir` (the worker's scratch, seen as an empty directory it owns), the
    directories hidden under an empty tmpfs (the defaults, $HOME and `hide`), and the binds into
    them: [source, target, writable] of `binds`, then, read-only, every path of this Python (its
    prefixes, sys.path, CUDA_HOME) that a hidden directory would cover."""
    uid = UNPRIVILEGED_ID if os.geteuid() == 0 else os.geteuid()
    gid = UNPRIVILEGED_ID if os.geteuid() == 0 else os.getegid()
    home = [os.environ.get("HOME", "")]
    with contextlib.suppress(ImportError, KeyError):
        home.append(__import__("pwd").getpwuid(os.geteuid()).pw_dir)
    own_home = os.path.realpath(home[0]) if home[0] else ""
    # the temp directories a compiler or torch may write to (TMPDIR elsewhere: read-only, unless hidden)
    temp = {os.path.realpath(p) for p in ("/tmp", "/var/tmp", "/dev/shm", tempfile.gettempdir(),
                                          *(os.environ.get(k, "") for k in ("TMPDIR", "TMP", "TEMP"))) if p}
    hidden = []
    for path in [*_HIDDEN_BY_DEFAULT, *temp, *home, *hide]:
        path = os.path.realpath(path) if path else ""
        if (not path or not os.path.isdir(path) or path in hidden
                or any(_inside(system, path) for system in ("/", *_SYSTEM_DIRS))):
            continue
        hidden.append(path)
    workdir = os.path.realpath(workdir)
    needed = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, os.path.dirname(sys.executable),
              *sys.path, os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", "")]
    keep = []
    for path in needed:
        if not path or not os.path.exists(path):
            continue
        for p in {os.path.abspath(path), os.path.realpath(path)}:  # a hidden directory itself is never kept
            if _strictly_hidden(p, hidden) and not any(_inside(p, k) for k in keep):
                keep = [k for k in keep if not _inside(k, p)] + [p]
    plan_binds = [[os.path.realpath(p), p, False] for p in keep]
    plan_binds += [[os.path.realpath(src), os.path.abspath(dst), bool(rw)] for src, dst, rw in binds]
    # [path, kind]: an empty directory, "own" (the worker's to write: its scratch, its home), "temp"
    # (anyone's, sticky) or "empty" (root's)
    hide_plan = [[p, "own" if p == own_home else "temp" if p in temp else "empty"]
                 for p in sorted(hidden, key=lambda p: p.count("/"))] + [[workdir, "own"]]
    return {"hide": hide_plan, "binds": plan_binds, "workdir": workdir, "uid": uid, "gid": gid,
            "tmpfs_bytes": int(tmpfs_bytes)}


def _mount_points() -> list:
    """(mount point, per-mount flags) of this mount namespace, from /proc/self/mountinfo."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            options = fields[5].split(",")
            flags = sum(_MOUNT_OPTION_FLAGS.get(o, 0) for o in options)
            points.append((point, flags, "ro" in options))
    return points


def enter_boundary(plan: dict) -> None:
    """In a fresh child that is pid 1 of a new PID namespace (see `supervise`), still root: the rest
    of the boundary, then drop privileges. Raises OSError when any step fails: the worker must then
    not run at all."""
    libc = _libc()

    def mount(source, target, fstype, flags, data=None):
        enc = lambda s: s.encode() if isinstance(s, str) else s  # noqa: E731
        _checked(libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")

    _checked(libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC | _CLONE_NEWUTS), "unshare")
    mount(None, "/", None, _MS_REC | _MS_PRIVATE)  # nothing mounted here reaches the harness's namespace
    os.umask(0o022)  # directories made here must be traversable by the worker's uid
    sources = [os.open(src, os.O_PATH | os.O_CLOEXEC) for src, _, _ in plan["binds"]]  # before hiding them
    try:
        for point, flags, ro in _mount_points():  # every file system read-only to the worker
            if ro or any(_inside(point, p) for p in _PSEUDO_MOUNTS):
                continue
            try:
                mount(None, point, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | flags)
            except OSError:
                if point == "/":
                    raise
                # another special mount (left writable where its permissions allow: the worker is not root)
        uid, gid, size = plan["uid"], plan["gid"], plan["tmpfs_bytes"]
        # shallowest first, so that what is mounted deeper (its scratch inside a kept directory, a bind
        # inside a hidden one) lands on top; a path whose innermost mount is a tmpfs of ours is created
        # there, any other is mounted over
        steps = [(path, 0, kind, None) for path, kind in plan["hide"]]
        steps += [(dst, 1, (src, rw), fd) for (src, dst, rw), fd in zip(plan["binds"], sources)]
        mounted = []  # (path, a tmpfs of ours)

        def in_our_tmpfs(path: str) -> bool:
            covering = [ours for point, ours in mounted if _inside(path, point)]
            return bool(covering) and covering[-1]

        for path, kind, what, fd in sorted(steps, key=lambda step: (step[0].count("/"), step[1])):
            if kind == 0:  # hidden: an empty directory of the kind `what` says
                if in_our_tmpfs(path):
                    os.makedirs(path, mode=0o755, exist_ok=True)
                    if what == "own":
                        os.chown(path, uid, gid)
                    elif what == "temp":
                        os.chmod(path, 0o1777)
                    continue
                ids = f",uid={uid},gid={gid}" if what == "own" else ""
                mode = "1777" if what == "temp" else "0755"
                mount("tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, f"mode={mode},size={size}{ids}")
                mounted.append((path, True))
                continue
            rw = what[1]
            if not os.path.lexists(path):
                if not in_our_tmpfs(path):
                    raise OSError(f"bind target {path} is outside the hidden directories")
                os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
                if os.path.isdir(f"/proc/self/fd/{fd}"):
                    os.mkdir(path, 0o755)
                else:
                    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
            mount(f"/proc/self/fd/{fd}", path, None, _MS_BIND | _MS_REC)
            # a bind keeps its source's flags, and every source was made read-only above
            mount(None, path, None, _MS_REMOUNT | _MS_BIND | _MS_NOSUID | _MS_NODEV | (0 if rw else _MS_RDONLY))
            mounted.append((path, False))
    finally:
        for fd in sources:
            os.close(fd)
    mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)  # this PID namespace's processes only
    os.chdir(plan["workdir"])  # not the harness's directory, which a relative path would still reach
    _drop_privileges(libc, plan["uid"], plan["gid"])


def _drop_privileges(libc, uid: int, gid: int) -> None:
    if os.geteuid() == 0:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last_cap = int(f.read())
        for cap in range(last_cap + 1):  # no capability can come back (file capabilities, setuid)
            _checked(libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0), "PR_CAPBSET_DROP")
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)  # from root to another uid: the permitted and effective sets are emptied
    _checked(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "PR_SET_NO_NEW_PRIVS")
    # a uid change made the process undumpable: its /proc/self files would be root's, unreadable to it
    _checked(libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0), "PR_SET_DUMPABLE")
    with open("/proc/self/status") as f:
        status = dict(line.split(":", 1) for line in f.read().splitlines() if ":" in line)
    if int(status["CapEff"], 16) or int(status["CapPrm"], 16) or status["NoNewPrivs"].strip() != "1" or (
            os.getuid() == 0 and uid != 0):
        raise OSError(f"privileges still held: CapEff {status['CapEff'].strip()}, uid {os.getuid()}")


def unshare_pid_namespace() -> None:
    """The caller's next child is pid 1 of a new PID namespace (and the caller can start no thread)."""
    _checked(_libc().unshare(_CLONE_NEWPID), "unshare(CLONE_NEWPID)")


_boundary_problem: str | None = None
_gpu_problem: str | None = None
_boundary_lock = threading.Lock()
_warned = False
_GPU_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0")  # what a CUDA process opens first


def boundary_problem(gpu: bool = False) -> str:
    """Why confined workers cannot run here ("" when they can), found once per process by starting
    one: a child of a fresh interpreter enters the boundary and checks what it sees. `gpu`: and why
    they could not use the GPU (its device files closed to the unprivileged uid)."""
    global _boundary_problem, _gpu_problem
    with _boundary_lock:
        if _boundary_problem is None:
            _boundary_problem, _gpu_problem = _probe_boundary()
        return _boundary_problem or (gpu and _gpu_problem or "")


def _probe_boundary() -> tuple:
    """(why confined workers cannot run, why they could not open the GPU's devices)"""
    if not sys.platform.startswith("linux"):
        return f"namespaces are Linux's ({sys.platform})", ""
    if os.geteuid() != 0:
        return "the harness is not root (it drops candidates to uid 65534; a user namespace would hide the GPU)", ""
    workdir = tempfile.mkdtemp(prefix="kevalprobe-")
    try:
        code = ("import sys; sys.path.insert(0, %r); import kernel_sandbox; sys.exit(kernel_sandbox._probe_child(%r, %r))"
                % (os.path.dirname(os.path.abspath(__file__)), json.dumps(confinement(workdir)), list(_GPU_DEVICES)))
        try:
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                                  env=worker_env({}))
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"the probe did not run: {e}", ""
        if done.returncode != 0:
            lines = (done.stderr or done.stdout).strip().splitlines()
            return (lines[-1] if lines else f"the probe exited with code {done.returncode}"), ""
        return "", done.stdout.strip()
    finally:
        __import__("shutil").rmtree(workdir, ignore_errors=True)


def _probe_child(plan_json: str, gpu_devices: list) -> int:
    """The probe's child side: pid 1 of a new namespace enters the boundary and checks it."""
    plan = json.loads(plan_json)
    try:
        unshare_pid_namespace()
    except OSError as e:
        print(f"no PID namespace: {e}", file=sys.stderr)
        return 1
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            enter_boundary(plan)
            problems = []
            if os.getpid() != 1 or sorted(filter(str.isdigit, os.listdir("/proc"))) != ["1"]:
                problems.append("other processes are visible")
            if os.getuid() == 0:
                problems.append("still root")
            interfaces = [name for _, name in socket.if_nameindex()]
            if interfaces != ["lo"]:
                problems.append(f"network interfaces {interfaces}")
            __import__("colorsys")  # the standard library is still readable, and what Python imports
            unreadable = [p for p in sys.path if os.path.isdir(p) and not os.access(p, os.R_OK | os.X_OK)]
            if unreadable:
                problems.append(f"uid {os.getuid()} cannot read {unreadable[0]}")
            with open(os.path.join(plan["workdir"], "probe"), "w") as f:  # and its scratch writable
                f.write("ok")
            closed = [d for d in gpu_devices if os.path.exists(d) and not os.access(d, os.R_OK | os.W_OK)]
            if closed:  # stdout: a problem for GPU work only
                print(f"uid {os.getuid()} cannot open {closed[0]}", flush=True)
            if problems:
                print("; ".join(problems), file=sys.stderr)
            else:
                code = 0
        except BaseException as e:  # noqa: BLE001 - reported as the probe's answer
            print(f"{type(e).__name__}: {e}", file=sys.stderr)
        finally:
            sys.stderr.flush()
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


class BoundaryUnavailable(RuntimeError):
    """sandbox="require" where confined workers cannot run."""


def boundary_for(mode: str, gpu: bool = False) -> str:
    """The boundary candidates run under for `mode` (SANDBOX_MODES): "namespaces", or "process" (their
    own session, limits and environment, the harness's uid). "auto" where namespaces are unavailable
    (`gpu`: or the GPU could not be used behind them): a warning, once per process; "require":
    BoundaryUnavailable."""
    global _warned
    if mode not in SANDBOX_MODES:
        raise ValueError(f"sandbox must be one of {', '.join(SANDBOX_MODES)}, got {mode!r}")
    if mode == "off":
        return "process"
    problem = boundary_problem(gpu)
    if not problem:
        return "namespaces"
    if mode == "require":
        raise BoundaryUnavailable(f"sandbox 'require': candidates cannot be confined here: {problem}")
    with _boundary_lock:
        if not _warned:
            _warned = True
            import warnings
            warnings.warn(f"kernel_sandbox: candidates run WITHOUT a boundary (the harness's uid, its file "
                          f"system and network): {problem}. sandbox='require' refuses instead.",
                          RuntimeWarning, stacklevel=3)
    return "process"


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
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
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
    """Waits for a process through a pidfd: a child of ours (reap: its exit status is collected),
    or a supervisor forked by a zygote (not ours to reap; its exit reads as 0, and the
    worker's own exit code is in the supervisor's code file either way)."""

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
    """The worker as a fork of this (zygote-forked, torch already imported) supervisor: the same
    process an exec of `ENTRY --_worker` would be, minus the interpreter start and the preload.
    `limits()` runs in it first (and enters the boundary, for a confined worker)."""
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
    """Child subreaper: run the worker, then kill it and every orphan reparented to us.
    `worker_main`: we are a fork of a zygote, and the worker is a fork of us running it (no exec).
    `spec["confine"]` (a `confinement` plan): the worker is pid 1 of a new PID namespace and enters
    the rest of the boundary before any of its code runs."""
    _prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    confine = spec.get("confine")
    if confine:
        _libc()  # loaded here, not in the child between fork and exec

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
                enter_boundary(confine)
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
            unshare_pid_namespace()  # the worker, our next and only child, is its pid 1
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
    try:
        os.killpg(worker.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    quiet = 0
    while quiet < 3:  # orphans that called setsid are reparented to us: kill until none are left
        kids = children_of(os.getpid())
        for pid in kids:
            for kill in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                try:
                    kill()
                except (ProcessLookupError, PermissionError):
                    pass
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
    """An evaluation was interrupted (Ctrl-C, or an exception in the parent): stop every worker,
    build and reference session now, without waiting for their phases. The supervisors kill their
    worker's process group and its orphans on SIGTERM; a sweep by tag then kills whatever is left
    (the supervisors themselves, a compiler a build started)."""
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
    """A worker process under its supervisor, with a framed channel to it: `python entry --_worker
    MODE ... ARGS` (or its fork from a zygote), in `scratch`, with the allowlisted environment plus
    `env_extra`. Limits: `fsize` bytes a file (RLIMIT_FSIZE), `as_bytes` of address space (0: none),
    `output_bytes` of stdout + stderr kept (more kills it), `message_bytes` a message's payload,
    `nice`, `cpus` (None: this process's). `confine`: a `confinement` plan, the boundary it runs
    behind (None: none, as the trusted reference's worker)."""

    def __init__(self, mode: str, args: list, scratch: str, env_extra: dict, *, entry: str, fsize: int,
                 output_bytes: int, message_bytes: int, as_bytes: int = 0, nice: int = 0, cpus: list | None = None,
                 zygotes: Zygotes | None = None, confine: dict | None = None):
        os.makedirs(scratch, exist_ok=True)
        self.scratch, self.tag = scratch, secrets.token_hex(8)
        if confine:  # what a spawned worker runs, and imports from: the entry's directory (or its modules)
            entry_dir, hidden = os.path.realpath(os.path.dirname(os.path.abspath(entry))), [p for p, _ in confine["hide"]]
            if _strictly_hidden(entry_dir, hidden):
                confine = dict(confine, binds=[*confine["binds"], [entry_dir, entry_dir, False]])
            elif any(_inside(entry_dir, h) for h in hidden):  # a hidden directory, or one holding one
                modules = [os.path.join(entry_dir, f) for f in os.listdir(entry_dir) if f.endswith(".py")]
                confine = dict(confine, binds=[*confine["binds"], *([m, m, False] for m in modules)])
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
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()
        kill_by_tag(self.tag)
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
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
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        code, flooded = self.exit_record()
        if flooded:
            how = f"wrote more than {self.output_bytes >> 20} MiB to stdout/stderr and was killed"
        elif code is None:
            how = "closed its channel"
        elif code < 0:
            how = f"was killed by {signal.Signals(-code).name}" if -code in signal.Signals._value2member_map_ else f"died (signal {-code})"
        else:
            how = f"exited with code {code}"
        tail = summarize(self.tail())
        return f"process {how} during {phase}" + (f":\n{tail}" if tail else "")


# ----------------------------------------------------------------------------- zygotes

def _retag_initial_environment(tag: str) -> None:
    """Write `tag` over this process's KERNEL_EVAL_TAG value in its initial environment block, in
    place (setproctitle rewrites argv the same way). /proc/<pid>/environ shows that block, so a
    process forked from the zygote, and every fork of it, would otherwise carry the zygote's tag,
    out of reach of its own evaluation's sweep (kill_by_tag)."""
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
    """The name ps and /proc/<pid>/comm show (15 bytes): a forked process keeps its zygote's
    command line, so this is how a reader (bench/cpu_by_process.py) tells a forked worker's role."""
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
    """A process that has imported torch once, under one worker environment, and forks workers
    (each under its supervisor) on request, for one batch: the same isolation as a spawned worker's
    (session, subreaper, process group, limits, tag), and the same environment, so what glibc and
    torch read at start (MALLOC_PERTURB_, the heap thresholds, CUDA_VISIBLE_DEVICES) is the same.
    It never creates a CUDA context (each run worker creates its own) and its memory holds nothing
    secret (the allowlisted environment, the requests it served); the candidate's code runs only in
    a forked worker, never in the zygote (which an unconfined candidate can still ptrace or kill, as
    any process of its uid; a confined one cannot see it). When it cannot serve, `fork` returns None and the caller spawns; a supervisor the
    dying zygote had forked sees it has been reparented and stops its worker."""

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
    """One _Zygote per distinct worker environment (and entry), started by the first worker that
    needs it: kernel_eval on cuda has one for compile workers (CUDA hidden) and one for run workers;
    on cpu both roles have the same environment and share one."""

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

    def close(self) -> None:
        for zygote in self.all():
            zygote.close()
