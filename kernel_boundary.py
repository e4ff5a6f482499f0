"""kernel_boundary: what a candidate's processes run behind, and what a candidate can still do.

Standard library only. kernel_sandbox starts every worker of kernel_eval; a candidate's (its compile and
its run, never the trusted reference's) start behind this boundary, from a plan the trusted parent
computes (confinement, candidate_confinement) and the worker's supervisor enters (enter_boundary) before
any of the candidate's code runs. A confined worker is pid 1 of a new PID namespace (it sees and signals
no other process; /proc is its namespace's); in new network (no interface up), IPC and UTS namespaces;
in a new mount namespace where the home and temp directories, the build cache and what the caller names
are empty tmpfs (TMPFS_BYTES each) with back in them only what it needs (Python, the entry's directory,
its source, its own build directory), every other file system read-only; uid/gid 65534 (when the
harness is root: CUDA rules out a user namespace), with no capabilities and no_new_privs. Every worker,
and the probe, get an allowlisted environment (worker_env), never the trainer's API keys.
`boundary_for(mode)` says which boundary a batch gets (SANDBOX_MODES), from a probe (boundary_problem).

What a candidate can still do behind it: skip the work of timed calls whose outputs are not compared
(only each timing set's last is), compute at lower precision within the tolerance, under-report its
clock by less than the cross-check allows, leave GPU work running into the reference's blocks (paid up
to ref_slowdown_max), read what is world-readable outside the hidden directories, fill its tmpfs.
Without it (sandbox "off", or "auto" where namespaces are refused: a warning, and EvalResult.boundary
"process") it runs with the harness's uid and can also read or ptrace other processes of that uid (the
reference's included), open the timing inputs early through /proc, write outside its scratch dir (the
build cache, poisoning later candidates), use the network, read the harness's home directory, and hand
work to a process outside its tree on CPU.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading

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


@functools.cache
def load_libc():
    """libc through ctypes (Python 3.11 has no os.unshare), loaded once: load it before forking a
    child that enters the boundary, so that the child (of a process with threads) loads nothing."""
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


def with_entry(plan: dict, entry: str) -> dict:
    """`plan` with what a worker runs and imports from bound back read-only: the entry's directory,
    or, where that directory holds a hidden one, its modules."""
    entry_dir, hidden = os.path.realpath(os.path.dirname(os.path.abspath(entry))), [p for p, _ in plan["hide"]]
    if _strictly_hidden(entry_dir, hidden):
        return dict(plan, binds=[*plan["binds"], [entry_dir, entry_dir, False]])
    if any(_inside(entry_dir, h) for h in hidden):  # a hidden directory, or one holding one
        modules = [os.path.join(entry_dir, f) for f in os.listdir(entry_dir) if f.endswith(".py")]
        return dict(plan, binds=[*plan["binds"], *([m, m, False] for m in modules)])
    return plan


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
    """In a fresh child that is pid 1 of a new PID namespace (kernel_sandbox.supervise), still root:
    the rest of the boundary, then drop privileges. Raises OSError when any step fails: the worker
    must then not run at all."""
    libc = load_libc()

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
    _checked(load_libc().unshare(_CLONE_NEWPID), "unshare(CLONE_NEWPID)")


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
        code = ("import sys; sys.path.insert(0, %r); import kernel_boundary; "
                "sys.exit(kernel_boundary._probe_child(%r, %r))"
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
            warnings.warn(f"kernel_boundary: candidates run WITHOUT a boundary (the harness's uid, its file "
                          f"system and network): {problem}. sandbox='require' refuses instead.",
                          RuntimeWarning, stacklevel=3)
    return "process"


def candidate_confinement(cache_root: str, scratch_root: str | None, src_path: str, workdir: str, own: str,
                          writable: bool, binds: list) -> dict:
    """A candidate worker's boundary (confinement): the build cache and the scratch root hidden;
    back in them its source (read-only), its own build and op_headers directories under `own`, seen at
    cache_root/build and cache_root/op_headers (`writable` or read-only), then `binds`."""
    own_binds = [(src_path, src_path, False)]
    for part in ("build", "op_headers"):
        path = os.path.join(own, part)
        os.makedirs(path, exist_ok=True)
        if os.geteuid() == 0 and writable:
            os.chown(path, UNPRIVILEGED_ID, UNPRIVILEGED_ID)
        own_binds.append((path, os.path.join(cache_root, part), writable))
    hide = [cache_root, scratch_root or tempfile.gettempdir()]
    return confinement(workdir, binds=own_binds + list(binds), hide=hide)
