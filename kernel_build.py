"""kernel_build: how a candidate's `load_inline` extension is built, for kernel_eval.

Optional, with kernel_early_verdict.py, which it imports: the harness's other kernel_*.py files judge
candidates without them (plain `load_inline`, in a build directory per candidate). With it, every
compile and run worker calls `patch_load_inline` before the candidate's code runs, and
`torch.utils.cpp_extension.load_inline` (and `load`) then build:

Fairness (what a verdict depends on)
- in cache_root/build/<sha256 of the call's sources, flags, torch, python, arch>: two candidates that
  both name their extension `ext` never load each other's library, and a kernel seen before is never
  rebuilt (the run worker imports what the compile worker built);
- with `-O3` where the call names no -O flag (load_inline alone builds C++ at -O0).

Speed (BuildConfig; a build's result is the same either way)
- CUDA units try the header tiers first (HEADER_TIERS): "slim" (ATen's tensor class, dispatch macros,
  stream headers, lean copies of the headers of the ops the source names) and "light" (all of ATen)
  instead of torch/extension.h. A source that fails on a tier falls back to the next, then to the
  source as written: a tier costs a failed attempt, never a verdict. The exception is a failure the full
  headers cannot rescue: brackets that do not pair up, a name no header spells used before the source
  declares it, a variable declared twice in one block (kernel_early_verdict.py: read from the unit as
  written preprocessed, not compiled), where a name the headers spell counts as undefined once the
  harness's name probe found it undeclared as written (probed once, with the source's other identifiers).
- a build ends at its first failed unit (run_ninja_until_failure); after a tier failed in its .cu unit
  alone, a build as written compiles its host unit only once the .cu unit has built.
- the slim tier's host units read a precompiled header built once per cache (host_pch); C++-only
  builds may use torch's own (use_pch). Compiler diagnostics point at the candidate's .py lines.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from kernel_boundary import UNPRIVILEGED_ID
from kernel_early_verdict import (AS_WRITTEN_CUDA_PREFIX, UNDEFINED, called_or_given_template_arguments,
                                  cuda_unit_errors, early_verdict, inline_sources, rules_may_read, tokens_of)
from kernel_sandbox import atomic_write, source_hash

_perf_counter = time.perf_counter  # bound before any candidate code runs in a worker


@dataclass
class BuildConfig:
    """How candidates' extensions are built (kernel_eval's EvalConfig.build)."""
    default_cflags: tuple = ("-O3",)  # C++ flags when the call names no -O flag (fairness)
    # torch's precompiled header is one file per torch install that any other load_inline user
    # deletes or rebuilds with other flags: turn on only where kernel_eval is the only builder
    use_pch: bool = False
    # header sets tried in order for CUDA builds before the source as written; () = as written
    cuda_header_tiers: tuple = ("slim",)
    # the slim tier's host units read a precompiled header kept in cache_root (build_host_pch), built
    # from the first such build with the default flags; units with other flags parse the headers
    host_pch: bool = True
    # after a tier failed in its .cu unit alone (on no name a probe found declared), the build as
    # written starts its host unit (all of torch/extension.h) once its .cu unit has built, so that the
    # .cu unit that most likely fails again has the cores to itself; False: both units side by side
    device_unit_first: bool = True
    # end a build at its first failed unit (run_ninja_until_failure): ninja lets the other units run to
    # their end, and a load_inline build's host unit (all of torch/extension.h) outlasts a failing .cu unit
    stop_at_first_failure: bool = True
    ninja_stop_wait_s: float = 10.0  # after that, ninja is killed (SIGKILL) instead of stopping its units
    # a tier's failure the headers as written cannot rescue is the verdict, read from the build as written
    # preprocessed instead of compiled (kernel_early_verdict); False: every such source is built as written
    early_verdicts: bool = True
    early_verdict_timeout_s: float = 60.0  # the two preprocessor runs (nvcc -E); past it, built as written

    def __post_init__(self):
        tiers = self.cuda_header_tiers
        if isinstance(tiers, str) or any(t not in HEADER_TIERS for t in tiers):
            raise ValueError(f"cuda_header_tiers must be a tuple of {HEADER_TIERS}, got {tiers!r}")
        self.default_cflags, self.cuda_header_tiers = tuple(self.default_cflags), tuple(tiers)


def patch_load_inline(cache_root: str, arch: str, config: BuildConfig, fast_load: bool,
                      await_name_probe=None) -> dict:
    """Force load_inline/load into per-hash build dirs; inject -O3, the header tiers and the
    precompiled headers. `fast_load` (run workers): import what the compile worker built here.
    `await_name_probe` (kernel_eval's compile workers): a function that asks kernel_eval for the probe
    of a request {"names", "also", "directives", "namespaces"} and returns once it is answered; a tier failure
    on names no probe has answered calls it (once per worker), then reads the answer.
    Returns the worker's build record: {"builds", "build_error", "header_tier", "build_s"}."""
    import inspect
    import torch
    import torch.utils.cpp_extension as ce

    default_cflags, use_pch, cuda_header_tiers = config.default_cflags, config.use_pch, config.cuda_header_tiers
    state = {"builds": 0, "build_error": None, "header_tier": None, "build_s": 0.0, "probe_asked": False,
             "device_unit_first": False, "early_verdict": None}
    base_key = (torch.__version__, sys.version_info[:2], arch)
    host_header = write_host_header(cache_root) if config.host_pch and cuda_header_tiers else None
    inline, load = ce.load_inline, ce.load

    def fix_flags(args: dict, cuda: bool) -> None:
        flags = list(args.get("extra_cflags") or [])
        if not any(f.startswith("-O") for f in flags):
            flags = list(default_cflags) + flags
        args["extra_cflags"] = flags
        if cuda:
            cflags = list(args.get("extra_cuda_cflags") or [])
            if not any(f.startswith("-O") for f in cflags):
                cflags = ["-O3"] + cflags
            args["extra_cuda_cflags"] = cflags

    def run(fn, args):
        t0 = _perf_counter()
        try:
            return fn(**args)
        except (RuntimeError, subprocess.CalledProcessError, OSError) as e:
            state["build_error"] = f"{e}\n{getattr(e, 'output', '') or ''}"
            raise
        finally:
            state["build_s"] += _perf_counter() - t0

    def patched_inline(*a, **kw):
        args = inspect.signature(inline).bind(*a, **kw).arguments
        cuda = bool(args.get("cuda_sources"))
        fix_flags(args, cuda)
        if (cuda and cuda_header_tiers and not args.get("no_implicit_headers")
                and "no_implicit_headers" in inspect.signature(inline).parameters):
            # no_implicit_headers: load_inline would put torch/types.h (autograd, library) at the top
            # of every .cu unit and torch/extension.h (all of torch's C++ API) in the host unit
            for tier in cuda_header_tiers:
                try:
                    tier_args = header_tier_args(args, tier)
                    module = build(tier_args, cuda, remember_failure=True)
                    state["header_tier"] = tier
                    if (tier == "slim" and host_header and not fast_load
                            and list(args["extra_cflags"]) == list(default_cflags)):
                        build_host_pch(host_header, tier_args["build_directory"])
                    return module
                except (RuntimeError, subprocess.CalledProcessError, OSError, ImportError):
                    tier_error, state["build_error"] = state["build_error"], None  # a heavier tier may build it
            early = config.early_verdicts and not fast_load
            # a probe's answer is a fact the rules read (namespace-scope lookup only), never a verdict alone
            lookups = name_lookups(args, tier_error or "", default_cflags) if early else None
            answer = read_name_probe(cache_root, lookups["context"], lookups["names"]) if lookups else None

            def judge_early(undeclared: frozenset) -> None:
                """The build as written fails too (early_verdict's rules; `undeclared`: names a probe answered)."""
                lean_ops = tier_args["extra_include_paths"][0] if tier == "slim" else None
                t0 = _perf_counter()
                # it maps the tier's error lines to the candidate's, so it is told how header_tier_args rewrote them
                state["early_verdict"] = early_verdict(
                    args, tier_args, tier_error, lean_ops, config.early_verdict_timeout_s,
                    dropped=(FULL_HEADER, TYPES_HEADER),
                    expanded=(CUDA_CONTEXT_HEADER, SLIM_CUDA_CONTEXT) if tier == "slim" else None,
                    undeclared=undeclared)
                state["build_s"] += _perf_counter() - t0
                if state["early_verdict"]:
                    state["build_error"] = tier_error
                    raise RuntimeError(tier_error)
            if answer is None and early:
                judge_early(frozenset())
            if lookups and answer is None and await_name_probe and not state["probe_asked"]:
                state["probe_asked"] = True  # kernel_eval answers one request a worker
                await_name_probe({key: lookups[key] for key in ("names", "also", "directives", "namespaces")})
                answer = read_name_probe(cache_root, lookups["context"], lookups["names"])
            if answer == "undeclared":  # the rules, those names taken as undefined although headers spell them
                judge_early(frozenset(lookups["names"]))
            # a tier that failed in its .cu unit alone, on no name a probe found declared: the build as
            # written most likely fails there too, and ninja would wait for the host unit (all of
            # torch/extension.h) before saying so, so the host unit starts once the .cu unit has built
            state["device_unit_first"] = (config.device_unit_first and answer is None
                                          and cuda_unit_errors(tier_error or "") is not None)
        try:
            return build(args, cuda)
        finally:
            state["device_unit_first"] = False

    def header_tier_args(args: dict, tier: str) -> dict:
        cpp = [s.replace(FULL_HEADER, "").replace(TYPES_HEADER, "") for s in inline_sources(args, "cpp_sources")]
        cu = [s.replace(FULL_HEADER, "").replace(TYPES_HEADER, "") for s in inline_sources(args, "cuda_sources")]
        include_paths = list(args.get("extra_include_paths") or [])
        if tier == "slim":
            ops_dir = os.path.join(ce.include_paths()[0], "ATen", "ops")
            host_ops, device_ops = op_names(cpp, ops_dir), op_names(cu, ops_dir)
            # first in the unit, so that g++ may use its precompiled form (build_host_pch)
            host_headers = f'#include "{host_header}"\n' if host_header else SLIM_HOST_HEADERS
            host = host_headers + ops_includes(host_ops) + TORCH_ALIASES
            device = SLIM_CUDA_HEADERS + ops_includes(device_ops)
            cu = [s.replace(CUDA_CONTEXT_HEADER, SLIM_CUDA_CONTEXT) for s in cu]
            # lean copies of those ops' headers, first on the include path (-I precedes -isystem)
            include_paths = [write_lean_op_headers(sorted(set(host_ops + device_ops)), ops_dir,
                                                   os.path.join(cache_root, "op_headers"))] + include_paths
        elif tier == "light":
            host, device = FULL_HEADER + "\n", LIGHT_CUDA_HEADERS  # torch/extension.h has the aliases
        else:
            raise ValueError(f"unknown CUDA header tier {tier!r} (known: {', '.join(HEADER_TIERS)})")
        return dict(args, no_implicit_headers=True, cpp_sources=[host] + cpp,
                    cuda_sources=[device + TORCH_ALIASES] + cu, extra_include_paths=include_paths)

    def build(args, cuda, remember_failure=False):
        pch = (use_pch and not cuda and "use_pch" in inspect.signature(inline).parameters
               and list(args["extra_cflags"]) == list(default_cflags) and not args.get("extra_include_paths"))
        args["use_pch"] = bool(pch)
        key = source_hash(base_key, sorted((k, v) for k, v in args.items() if k not in ("build_directory", "verbose")))
        args["build_directory"] = os.path.join(cache_root, "build", key[:32])
        os.makedirs(args["build_directory"], exist_ok=True)
        failed_marker = os.path.join(args["build_directory"], "FAILED")
        if remember_failure and os.path.exists(failed_marker):
            with open(failed_marker, errors="replace") as f:
                state["build_error"] = f.read() or "this build failed before"
            raise RuntimeError(state["build_error"])
        built = built_module_name(args["build_directory"], args["name"]) if fast_load else None
        if built:
            # the compile phase built exactly these sources here: import, skip ninja and the .gch check
            python_module = args.get("is_python_module", True)
            return ce._import_module_from_library(built, args["build_directory"], python_module)
        state["builds"] += 1
        lock = None
        if pch:
            # torch keeps one .gch next to its own headers, for every user of this torch install:
            # (re)build it holding an exclusive lock, then compile holding a shared one so that no
            # kernel_eval process rewrites it while a build reads it.
            lock = open(os.path.join(PCH_LOCK_DIR or tempfile.gettempdir(), "kernel_eval-pch-"
                                     + source_hash(os.path.dirname(torch.__file__))[:16] + ".lock"), "a")
            fcntl.flock(lock, fcntl.LOCK_EX)
            run(ce._check_and_build_extension_h_precompiler_headers,
                {"extra_cflags": args["extra_cflags"], "extra_include_paths": args.get("extra_include_paths")})
            fcntl.flock(lock, fcntl.LOCK_SH)
        # torch's own lock in a build dir is a file that a killed build leaves behind, and every later
        # build of that dir then waits forever; an flock dies with its holder, so hold one instead and
        # clear a baton left by a build that no longer runs.
        dir_lock = open(os.path.join(args["build_directory"], ".kernel_eval.lock"), "a")
        try:
            fcntl.flock(dir_lock, fcntl.LOCK_EX)
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(args["build_directory"], "lock"))
            return run(inline, args)
        except (RuntimeError, subprocess.CalledProcessError, OSError, ImportError):
            if remember_failure:  # with its diagnostics: they may still spare the build as written
                atomic_write(failed_marker, state["build_error"] or "")
            raise
        finally:
            dir_lock.close()
            if lock is not None:
                lock.close()

    def patched_load(*a, **kw):
        args = inspect.signature(load).bind(*a, **kw).arguments
        sources = args["sources"] if isinstance(args["sources"], list) else [args["sources"]]
        cuda = any(s.endswith((".cu", ".cuh")) for s in sources)
        fix_flags(args, cuda)
        contents = []
        for s in sources:
            with open(s, "rb") as f:
                contents.append(hashlib.sha256(f.read()).hexdigest())
        key = source_hash(base_key, contents, sorted((k, v) for k, v in args.items()
                                                     if k not in ("build_directory", "verbose", "sources")))
        args["build_directory"] = os.path.join(cache_root, "build", key[:32])
        os.makedirs(args["build_directory"], exist_ok=True)
        state["builds"] += 1
        return run(load, args)

    run_ninja = getattr(ce, "_run_ninja_build", None)  # torch's: writes nothing, runs ninja in the build dir

    def run_ninja_build(build_directory, verbose, error_prefix):
        if state["device_unit_first"]:
            host_unit_after_device_unit(os.path.join(build_directory, "build.ninja"))
        if not config.stop_at_first_failure:
            return run_ninja(build_directory, verbose, error_prefix)
        return run_ninja_until_failure(build_directory, verbose, error_prefix, ce._get_num_workers(verbose),
                                       config.ninja_stop_wait_s)

    ce.load_inline, ce.load = patched_inline, patched_load
    if run_ninja is not None:
        ce._run_ninja_build = run_ninja_build
    # load_inline(use_pch=False) deletes torch's shared .gch, which concurrent builds are using
    ce.remove_extension_h_precompiler_headers = lambda: None
    return state




_NINJA_STATUS = re.compile(r"\[\d+/\d+\] (.*)")
_NINJA_FAILED = re.compile(r"FAILED: (?:\[code=\d+\] )?(.*?)\s*")


def run_ninja_until_failure(build_directory: str, verbose: bool, error_prefix: str, num_workers: int | None,
                            stop_wait_s: float) -> None:
    """torch's _run_ninja_build (`ninja -v` in the build directory, RuntimeError(error_prefix + its output) on
    failure; with `verbose` the output goes to stdout and the error says no more), except that the first
    unit that fails ends the build: ninja is told to stop (SIGTERM: it stops its running units and exits)
    once it has printed that unit's diagnostics, instead of letting the others run to their end. A failure
    is ninja's own report: "FAILED: <outputs>" right after a unit's status line, then that unit's command,
    which writes those outputs (-o), none of them on disk; a compiler's diagnostics never start so (their
    first line names a file), so no source can end a build that would have built."""
    command = ["ninja", "-v"] + (["-j", str(num_workers)] if num_workers is not None else [])
    sys.stdout.flush()
    sys.stderr.flush()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=build_directory)
    out, status_command, failed, stopped = [], None, None, False
    for raw in proc.stdout:
        out.append(raw)
        if verbose:
            os.write(1, raw)
        line = raw.decode(errors="replace").rstrip("\r\n")
        if failed is not None and not stopped:
            if line == failed[0] and all(f" -o {o} " in f" {line} " and not os.path.exists(
                    os.path.join(build_directory, o)) for o in failed[1]):
                proc.send_signal(signal.SIGTERM)
                stopped = threading.Timer(stop_wait_s, proc.kill)  # a ninja that does not stop
                stopped.start()
            failed = None
        elif status_command is not None and (match := _NINJA_FAILED.fullmatch(line)) and match.group(1):
            failed = (status_command, match.group(1).split())
        status = _NINJA_STATUS.fullmatch(line)
        status_command = status.group(1) if status else None  # the line after a status line only
    code = proc.wait()
    if stopped:
        stopped.cancel()
    if code == 0 and not stopped:
        return
    output = b"".join(out).decode(errors="replace")
    if stopped:  # what torch's build says when a unit failed
        output = output.replace("ninja: build stopped: interrupted by user.", "ninja: build stopped: subcommand failed.")
    raise RuntimeError(error_prefix if verbose else f"{error_prefix}: {output}")


def host_unit_after_device_unit(ninja_path: str) -> bool:
    """Make load_inline's host unit (main.o) wait for its .cu unit (cuda.cuda.o, an order-only
    dependency) in a build.ninja torch wrote: when the .cu unit fails, ninja stops before the host unit
    starts. Returns whether the file had both units and now orders them."""
    with open(ninja_path) as f:
        text = f.read()
    ordered, n = re.subn(r"^(build main\.o: compile \S+)$", r"\1 || cuda.cuda.o", text, count=1, flags=re.M)
    if n == 0 or not re.search(r"^build cuda\.cuda\.o: ", text, re.M):
        return False
    atomic_write(ninja_path, ordered)
    return True


def built_module_name(build_directory: str, name: str) -> str | None:
    """The module a compile worker built in this directory for extension `name`: torch's versioner calls
    a process's second build of one name `name_v1` (a failed header tier counts, and a run worker skips
    that tier), so the run worker imports whichever the directory holds; None when neither is there."""
    if os.path.exists(os.path.join(build_directory, name + ".so")):
        return name
    versions = [f[len(name) + 2:-3] for f in os.listdir(build_directory)
                if f.startswith(name + "_v") and f.endswith(".so") and f[len(name) + 2:-3].isdigit()]
    return f"{name}_v{max(versions, key=int)}" if versions else None


# ----------------------------------------------------------------------------- name probes
# A name probe: the unit load_inline writes as written (AS_WRITTEN_CUDA_PREFIX, then the source's
# directives: the same headers in the same macro state; the probe's "context"), then names looked up where
# the source looks them up (global scope and the namespaces the source opens or uses), each in a function
# of its own, compiled by kernel_eval as a source of the harness's own behind the boundary. A name's answer
# is a fact about its lookup in that context: "undeclared" when the only error of its lines is that its
# identifier is undefined (it is no macro), else "declared"; kept in cache_root/name_probes/<context
# hash>/<name>, which candidates read and never write. The lookups are independent: every lookup line is
# well-formed whatever the identifier (keywords, reserved names and macros are never looked up), so EDG
# reports each line's errors alone, and one compile answers many names for about what the build as
# written costs. A probe therefore also looks up the source's other identifiers (up to MAX_PROBE_LOOKUPS):
# a later source of that context failing on some of them is answered without a compile.
# A compile worker whose tier failed on unanswered names asks kernel_eval (patch_load_inline's
# await_name_probe) and waits while kernel_eval compiles the probe, then reads the answers: all
# "undeclared" lets early_verdict's rules take those names as undefined, and the tier's diagnostics are
# the error only if the rules explain every one (its errors may be such names and variables declared
# twice: a line pasted over the declaration of `stride`, which torch's headers spell); one "declared"
# builds the source as written. An answer is never a verdict alone: a probe looks a name up at namespace
# scope, and only the source's preprocessed tokens say that it looks the name up nowhere else (a call,
# a qualified declarator, a base class: kernel_early_verdict.explained_errors). With early verdicts off
# no probe is asked.
# Two compiles that ask for one context at once wait for one probe (a lock file). A source qualifies only
# where its text cannot make the two lookups differ: no conditional or other directives, no macro but a
# number (a macro could call or spell a name), no raw string, no base classes (member lookup), no
# namespace aliases, no qualified declarator outside a body (`int at::cuda::f() {`: lookup in the scope it
# names), and no name called or given template arguments, a comment between or not (argument-dependent
# lookup); its build must have used the default flags (the probe's). What the
# rule cannot see: a macro of the full headers, absent from the tier's, named like an identifier the
# source declares (its expansion could declare the name); only a source written for it would meet
# one, and it would cost that source its own build, no other's verdict.
_PROBE_DIRECTIVE = re.compile(r"#\s*(include\s*<[\w./+-]+>|define\s+\w+(?:[ \t].*)?|undef\s+\w+|pragma\s+once)\s*")
_NOT_PROBED = re.compile(r"_Pragma|__has_include|\bnamespace\s+\w+\s*=|\b(?:class|struct)\s+\w+\s*(?:final\s*)?:(?!:)")
MAX_PROBED_NAMES = 4  # a failed build's undefined names a probe answers (more: the source is built as written)
MAX_PROBE_LOOKUPS = 32  # lookups in one probe: the failed names, then the source's other identifiers
CXX_KEYWORDS = frozenset("""alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t
char16_t char32_t class co_await co_return co_yield compl concept const consteval constexpr constinit
const_cast continue decltype default delete do double dynamic_cast else enum explicit export extern false
float for friend goto if inline int long mutable namespace new noexcept not not_eq nullptr operator or
or_eq private protected public register reinterpret_cast requires return short signed sizeof static
static_assert static_cast struct switch template this thread_local throw true try typedef typeid typename
union unsigned using virtual void volatile wchar_t while xor xor_eq""".split())


def undefined_names(build_error: str) -> list | None:
    """The identifiers a failed CUDA build calls undefined in its cuda.cu unit, when those are all of
    its errors; None when anything else may have failed."""
    messages = [m for ms in (cuda_unit_errors(build_error) or {}).values() for m in ms]
    if not messages or not all(UNDEFINED.fullmatch(m) for m in messages):
        return None
    return sorted({UNDEFINED.fullmatch(m).group(1) for m in messages})


def probe_may_look_up(name: str) -> bool:
    """An identifier whose lookup line is well-formed and reads as no other diagnostic: no keyword, no
    reserved name (an implementation's: it may be a keyword), none whose echoed line says "error"."""
    return (bool(re.fullmatch(r"[A-Za-z_]\w*", name)) and name not in CXX_KEYWORDS
            and not re.match(r"__|_[A-Z]", name) and not re.search(r"error|Error", name))


def name_lookups(args: dict, build_error: str, default_cflags) -> dict | None:
    """{"names", "also", "directives", "namespaces", "context"} for a load_inline call that failed on a
    tier with undefined names only, or with those and redeclared variables or template arguments no `>`
    closes (`c < n)`: c found nowhere, so read as a template's name), whose source and
    flags qualify (above); else None. "names": those undefined names never called or given template
    arguments. "also": the source's other identifiers a probe may look
    up (written in its code, not its directives, comments or strings; not only as a member or a qualified
    name; never called or given template arguments; not its own macros)."""
    messages = [m for ms in (cuda_unit_errors(build_error) or {}).values() for m in ms]
    names = None
    if all(map(rules_may_read, messages)):
        names = sorted({m.group(1) for m in map(UNDEFINED.fullmatch, messages) if m})
    source = "\n".join(inline_sources(args, "cuda_sources"))
    if (not names or len(names) > MAX_PROBED_NAMES or not all(map(probe_may_look_up, names))
            or _NOT_PROBED.search(source) or list(args.get("extra_cflags") or []) != list(default_cflags)
            or list(args.get("extra_cuda_cflags") or []) != ["-O3"] or args.get("extra_include_paths")):
        return None
    directives = [line.strip() for line in source.splitlines() if line.lstrip().startswith("#")]
    if any(not _PROBE_DIRECTIVE.fullmatch(d) or d.endswith("\\") for d in directives):
        return None
    if any(not re.search(rf"\b{n}\b", source) for n in names):
        return None
    namespaces = sorted(set(re.findall(r"\busing\s+namespace\s+((?:::)?\w+(?:::\w+)*)\s*;", source))
                        | set(re.findall(r"\bnamespace\s+(\w+(?:::\w+)*)\s*\{", source)))
    code = re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"', " ", "\n".join(
        line for line in source.splitlines() if not line.lstrip().startswith("#")), flags=re.S)  # no comments, strings
    # where the probe's namespace-scope lookup is not the source's (read on the code: a comment may stand
    # between a name and its call): a qualified definition (the scope it names), a macro that could call or
    # spell a name (only numbers are defined), a raw string (its quotes would hide code from this reading)
    if (_RAW_STRING.search(source) or qualified_definition(code)
            or any(re.match(r"#\s*define\b", d) and not _NUMBER_MACRO.fullmatch(d) for d in directives)):
        return None
    # a name called or given template arguments is asked of no probe (argument-dependent lookup may find it
    # where a namespace-scope lookup finds nothing): the rules take it undefined only where no header spells
    # it, and each other name's lookup is its own (`silu_kernel<<<...>>>` beside a dropped `stride`)
    tokens = tokens_of(code)
    names = [n for n in names if not called_or_given_template_arguments(tokens, n)]
    if not names:
        return None
    macros = set(re.findall(r"#\s*define\s+(\w+)", source))
    also = [n for n in dict.fromkeys(re.findall(r"\b[A-Za-z_]\w*\b", code))
            if n not in names and n not in macros and probe_may_look_up(n)
            and re.search(rf"(?<![\w.:>]){n}\b", code) and not re.search(rf"\b{n}\s*[(<]", code)]
    try:
        context = name_probe_context(directives, namespaces)
    except ValueError:
        return None
    return {"names": names, "also": also[:2 * MAX_PROBE_LOOKUPS], "directives": directives,
            "namespaces": namespaces, "context": context}


_RAW_STRING = re.compile(r'R"')
_NUMBER_MACRO = re.compile(r"#\s*define\s+\w+(?:[ \t]+[-+]?\.?\d(?:[eEpP][-+]|[\w.])*)?\s*")
_QUALIFIED_DECLARATOR = re.compile(r"::\s*(?:~|operator\b|\w+\s*(?:[(),=;{\[:]|__\w|asm\b|alignas\b))")


def qualified_definition(code: str) -> bool:
    """Whether `code` (no comments, strings or directives) names a qualified declarator outside a function's
    or statement's body (`int at::cuda::warp_size() {`, `void S::f()`, `int ns::x = 1;`): there unqualified
    lookup searches the scope it names, which the probe does not. A brace opens a body after ")", ";", "{",
    "}", else, do or try; a class's, a namespace's or an initializer's otherwise."""
    in_body = []   # per open brace: whether it opened a body
    for match in re.finditer(r"[{}]|" + _QUALIFIED_DECLARATOR.pattern, code):
        token = match.group()
        if token == "{":
            before = re.search(r"(\w+|\S)\s*$", code[max(0, match.start() - 64):match.start()])
            in_body.append(bool(before) and before.group(1) in (")", ";", "{", "}", "else", "do", "try"))
        elif token == "}":
            if in_body:
                in_body.pop()
        elif not (in_body and in_body[-1]):
            return True
    return False


def name_probe_context(directives: list, namespaces: list) -> str:
    """The probe's text before its lookups (see above); raises ValueError on parts a probe may not hold."""
    if (any(not isinstance(n, str) or not re.fullmatch(r"(?:::)?\w+(?:::\w+)*", n) for n in namespaces)
            or any(not isinstance(d, str) or not _PROBE_DIRECTIVE.fullmatch(d) or "\n" in d for d in directives)):
        raise ValueError("name probe: a namespace or directive of a form a probe may not hold")
    opened = "".join(f"namespace {n.removeprefix('::')} {{}}\n" for n in namespaces)
    used = "".join(f"using namespace ::{n.removeprefix('::')};\n" for n in namespaces)
    return (AS_WRITTEN_CUDA_PREFIX + "".join(d + "\n" for d in directives) + opened
            + f"namespace kernel_eval_name_probe {{\n{used}")


def name_probe_source(context: str, names: list) -> tuple[str, dict]:
    """(the .cu unit of a probe of `names` in `context`, {name: (its macro line, its lookup line)});
    raises ValueError on names a probe may not look up."""
    if (not names or len(names) > MAX_PROBE_LOOKUPS or len(set(names)) != len(names)
            or not all(isinstance(n, str) and probe_may_look_up(n) for n in names)):
        raise ValueError("name probe: a name of a form a probe may not look up")
    lines, first = [], context.count("\n") + 1
    for k, n in enumerate(names):
        lines += [f"#if defined({n})",  # a macro is no lookup: its answer is "declared"
                  f'__host__ __device__ inline void probe_{k}() {{ static_assert(sizeof(char) == 0, "a macro"); }}',
                  "#else", f"__host__ __device__ inline void probe_{k}() {{ (void){n}; }}", "#endif"]
    where = {n: (first + 5 * k + 1, first + 5 * k + 3) for k, n in enumerate(names)}
    return context + "".join(line + "\n" for line in lines) + "}\n", where


def name_probe_path(cache_root: str, context: str, name: str) -> str:
    return os.path.join(cache_root, "name_probes", source_hash("name probe", context)[:32], name)


def read_name_probe(cache_root: str, context: str, names: list) -> str | None:
    """"undeclared" when every name's lookup failed in that context, "declared" when one's did not,
    None when not all were probed."""
    answers = []
    for name in names:
        try:
            with open(name_probe_path(cache_root, context, name)) as f:
                answers.append(f.read())
        except OSError:
            answers.append(None)
    if "declared" in answers:
        return "declared"
    return "undeclared" if answers and all(a == "undeclared" for a in answers) else None


# The probe's host unit: an empty module of Python's C API (torch/extension.h there took longer to
# compile than the probe's .cu unit, and ninja lets a running unit finish after another failed)
PROBE_HOST_UNIT = """#include <Python.h>
static struct PyModuleDef probe_module = {PyModuleDef_HEAD_INIT, "kernel_eval_name_probe", nullptr, -1, nullptr};
PyMODINIT_FUNC PyInit_kernel_eval_name_probe(void) { return PyModule_Create(&probe_module); }
"""


def name_probe_harness_source(probe_source: str) -> str:
    """A source of the harness's own that builds one probe as written (no tier: no_implicit_headers)."""
    return ("from torch.utils.cpp_extension import load_inline\n\n"
            f"load_inline(name='kernel_eval_name_probe', cpp_sources={PROBE_HOST_UNIT!r},\n"
            f"            cuda_sources={probe_source!r}, no_implicit_headers=True)\n")


def answer_name_probes(requested: dict, cache_root: str, compile_harness_source) -> None:
    """Compile the probe a failed build's worker asked for (its await_name_probe request: the failed
    "names", the source's other identifiers "also"), a source of the harness's own built from the
    request's parts (a request not of that form is dropped), with kernel_eval's `compile_harness_source`
    (behind the boundary, like warm_host_pch's), and keep each name's answer where builds read it. A
    worker chooses which facts are learned, never what they say."""
    try:
        names, also = requested["names"], requested.get("also", [])
        context = name_probe_context(requested["directives"], requested["namespaces"])
    except (KeyError, TypeError, AttributeError, ValueError):
        return
    if (not isinstance(names, list) or not isinstance(also, list) or not 0 < len(names) <= MAX_PROBED_NAMES
            or not all(isinstance(n, str) and probe_may_look_up(n) for n in names)):
        return
    also = [n for n in also[:2 * MAX_PROBE_LOOKUPS] if isinstance(n, str) and probe_may_look_up(n)]
    folder = os.path.dirname(name_probe_path(cache_root, context, "x"))
    os.makedirs(folder, exist_ok=True)
    with open(folder + ".lock", "a") as lock:  # one compile per context at a time, across threads and processes
        fcntl.flock(lock, fcntl.LOCK_EX)
        if read_name_probe(cache_root, context, names) is not None:
            return  # answered meanwhile
        unanswered = [n for n in dict.fromkeys(names + also)
                      if not os.path.exists(name_probe_path(cache_root, context, n))]
        probe, where = name_probe_source(context, unanswered[:MAX_PROBE_LOOKUPS])
        for name, answer in (name_probe_answers(where, compile_harness_source(name_probe_harness_source(probe)))
                             or {}).items():
            atomic_write(name_probe_path(cache_root, context, name), answer)


def name_probe_answers(where: dict, compile_record: dict) -> dict | None:
    """What a probe's compile says of each name ({name: (macro line, lookup line)}): "undeclared" when
    its lines' only error is its lookup's "identifier is undefined", else "declared"; every name
    "declared" when the probe built or failed in a way its lines do not account for (the context's own
    error); None when its compile says nothing (no verdict)."""
    if compile_record.get("status") == "ok":
        return {name: "declared" for name in where}
    if compile_record.get("status") != "compile_error":
        return None
    errors = compile_record.get("cuda_errors")  # the worker's reading of its whole dump, line by line
    lines_of = {line for pair in where.values() for line in pair}
    if (not isinstance(errors, dict) or not errors
            or any(not str(line).isdigit() or int(line) not in lines_of for line in errors)):
        return {name: "declared" for name in where}
    errors = {int(line): messages for line, messages in errors.items()}
    return {name: "undeclared" if (macro_line not in errors
                                   and errors.get(lookup_line) == [f'identifier "{name}" is undefined'])
            else "declared" for name, (macro_line, lookup_line) in where.items()}


PCH_LOCK_DIR = None  # None: the system temp dir (the lock must be shared by every kernel_eval user)
FULL_HEADER = "#include <torch/extension.h>"
TYPES_HEADER = "#include <torch/types.h>"
# Most of a CUDA build is parsing torch's headers (three times in a .cu unit: nvcc's device and
# host passes, then the host compiler). torch/extension.h brings all of torch's C++ API (nn, optim,
# autograd, jit) and pybind11; a kernel's wrapper needs at::Tensor, a few factory functions,
# AT_DISPATCH, TORCH_CHECK and the current stream. A tier a unit does not build under falls back to
# the next, then to the source as written, so a lighter tier costs a failed attempt but never a verdict.
HEADER_TIERS = ("slim", "light")
# slim: the tensor class, dispatch macros and CUDA stream/guard headers, plus ATen/ops/<name>.h for
# every torch::name( / at::name( the unit calls (op_names), lean (LEAN_OP_DROPPED); tensor
# operators (+, *) and torch::nn are not in it.
SLIM_CUDA_HEADERS = """#include <cuda.h>
#include <cuda_runtime.h>
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <c10/core/DeviceGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>
"""
# Every ATen/ops/<name>.h opens with these includes, which its inline wrappers do not use;
# ATen/DeviceGuard.h alone pulls in IValue. A source that needed them falls back to the source as
# written.
LEAN_OP_DROPPED = frozenset({"#include <ATen/Context.h>", "#include <ATen/DeviceGuard.h>",
                             "#include <ATen/TensorUtils.h>", "#include <ATen/TracerMode.h>"})
# the host unit only binds the functions: pybind11 with torch's Tensor caster and
# torch::wrap_pybind_function (which load_inline's generated bindings call)
SLIM_HOST_HEADERS = """#include <torch/csrc/Exceptions.h>
#include <ATen/core/Tensor.h>
"""
# A slim .cu unit gets this for ATen/cuda/CUDAContext.h: its device-property calls and AT_CUDA_CHECK
# without cuBLAS, cuSPARSE, cuSOLVER and ATen/Context.h (at::cuda:: already names c10::cuda's streams
# and guards); a source that needs the rest falls back to the next tier.
CUDA_CONTEXT_HEADER = "#include <ATen/cuda/CUDAContext.h>"
SLIM_CUDA_CONTEXT = """#include <c10/cuda/CUDAFunctions.h>
#include <c10/core/Allocator.h>
namespace at::cuda {
TORCH_CUDA_CPP_API cudaDeviceProp* getCurrentDeviceProperties();
TORCH_CUDA_CPP_API int warp_size();
TORCH_CUDA_CPP_API cudaDeviceProp* getDeviceProperties(c10::DeviceIndex device);
TORCH_CUDA_CPP_API c10::Allocator* getCUDADeviceAllocator();
}
#ifndef AT_CUDA_CHECK
#define AT_CUDA_CHECK(EXPR) C10_CUDA_CHECK(EXPR)
#endif
"""
# light: all of ATen (every operator) in the .cu unit, torch/extension.h in the host unit
LIGHT_CUDA_HEADERS = """#include <cuda.h>
#include <cuda_runtime.h>
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
"""
# the torch:: names torch/types.h would give a unit
TORCH_ALIASES = """namespace torch {
using namespace at;
using Dtype = at::ScalarType;
constexpr auto kUInt8 = at::kByte;
constexpr auto kInt8 = at::kChar;
constexpr auto kInt16 = at::kShort;
constexpr auto kInt32 = at::kInt;
constexpr auto kInt64 = at::kLong;
constexpr auto kFloat16 = at::kHalf;
constexpr auto kFloat32 = at::kFloat;
constexpr auto kFloat64 = at::kDouble;
}
"""


def op_names(sources: list, ops_dir: str) -> list:
    """The ATen operators the sources call as torch::name( or at::name( that have a header ATen/ops/<name>.h."""
    names = sorted({m for src in sources for m in re.findall(r"\b(?:torch|at)::(\w+)\s*\(", src)})
    return [n for n in names
            if re.fullmatch(r"[a-z_][a-z0-9_]*", n) and os.path.exists(os.path.join(ops_dir, n + ".h"))]


def ops_includes(names: list) -> str:
    return "".join(f"#include <ATen/ops/{n}.h>\n" for n in names)


def write_lean_op_headers(names: list, ops_dir: str, root: str) -> str:
    """An include dir holding ATen/ops/<name>.h for `names`: torch's headers without LEAN_OP_DROPPED.
    Keyed by the torch headers and the names, so every build of one source sees the same files
    (and a header another candidate's source needed can never change this one's build)."""
    texts = {}
    for n in names:
        with open(os.path.join(ops_dir, n + ".h")) as f:
            texts[n] = "".join(line for line in f if line.strip() not in LEAN_OP_DROPPED)
    include_dir = os.path.join(root, source_hash(sorted(texts.items()))[:24])
    target = os.path.join(include_dir, "ATen", "ops")
    os.makedirs(target, exist_ok=True)
    for n, text in texts.items():
        path = os.path.join(target, n + ".h")
        if not os.path.exists(path):
            atomic_write(path, text)
    return include_dir


def write_host_header(cache_root: str) -> str:
    """SLIM_HOST_HEADERS as a file of their own under cache_root, which the slim tier's host units
    include first: g++ then reads its precompiled form (<file>.gch, build_host_pch) where one is valid
    for the unit's flags, and parses the headers where none is (same unit either way). Its folder is
    named by torch's installed metadata version, which the harness's process (no torch imported) and
    its workers read alike; torch.__version__ can differ from it (2.11's CUDA 13 build), and a worker
    that named another folder than the one bound for it could not write there."""
    import importlib.metadata
    torch_version = importlib.metadata.version("torch")
    path = os.path.join(cache_root, "host_pch", source_hash(SLIM_HOST_HEADERS, torch_version)[:24],
                        "kernel_eval_host.h")
    if not os.path.exists(path):
        atomic_write(path, SLIM_HOST_HEADERS)
    return path


def build_host_pch(header: str, build_dir: str, timeout_s: float = 300.0) -> bool:
    """Precompile `header` once per cache with the host flags of a build that used it: torch's own
    (read from that build's build.ninja, so they match whatever this torch writes) less the
    extension's name and -I paths, which g++ does not require to match. Returns whether a new one
    was written; a failed or concurrent attempt leaves none, and the units parse the headers."""
    gch = header + ".gch"
    try:
        with open(os.path.join(build_dir, "build.ninja")) as f:
            ninja = f.read()
    except OSError:
        return False
    variables = dict(re.findall(r"^(cxx|cflags|post_cflags) = (.*)$", ninja, re.M))
    if os.path.exists(gch) or "cxx" not in variables or "cflags" not in variables:
        return False
    flags = [f for f in shlex.split(variables["cflags"] + " " + variables.get("post_cflags", ""))
             if not f.startswith(("-DTORCH_EXTENSION_NAME=", "-I"))]
    try:
        lock = open(header + ".lock", "a")
    except OSError:  # its directory is read-only (a confined candidate's compile): none is written
        return False
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # another build is writing it
        if os.path.exists(gch):
            return False
        tmp = f"{gch}.{os.getpid()}.tmp"
        try:
            done = subprocess.run(shlex.split(variables["cxx"]) + ["-x", "c++-header", header, "-o", tmp] + flags,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout_s)
            if done.returncode == 0:
                os.replace(tmp, gch)
                return True
        except (OSError, subprocess.TimeoutExpired):
            pass
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)
        return False


# A CUDA extension of the harness's own: its slim-tier build with the default flags leaves the host
# units' precompiled header (build_host_pch)
HOST_PCH_SOURCE = r'''
from torch.utils.cpp_extension import load_inline

load_inline(name="kernel_eval_host_pch", cpp_sources="torch::Tensor kernel_eval_copy(torch::Tensor x);",
            functions=["kernel_eval_copy"],
            cuda_sources="""
__global__ void copy_kernel(const float* x, float* y, int64_t n) {
    int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
torch::Tensor kernel_eval_copy(torch::Tensor x) {
    auto y = torch::empty_like(x);
    copy_kernel<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
""")
'''


def warm_host_pch(cache_root: str, compile_harness_source) -> None:
    """Build the host units' precompiled header once per cache, where it is missing. A confined
    candidate's compile may read it, never write it (it would be in every later build), so
    `compile_harness_source(HOST_PCH_SOURCE)` (kernel_eval's compile of the harness's own source,
    behind the same boundary, the only one that may write there) builds it; the header's directory
    is root's again after it."""
    header = write_host_header(cache_root)
    if os.path.exists(header + ".gch"):
        return
    directory, root = os.path.dirname(header), os.geteuid() == 0
    if root:
        os.chown(directory, UNPRIVILEGED_ID, UNPRIVILEGED_ID)
    try:
        compile_harness_source(HOST_PCH_SOURCE)
    finally:
        if root:
            for path in [directory] + [os.path.join(directory, f) for f in os.listdir(directory)]:
                os.chown(path, 0, 0)


# a compiler's position in a generated source: gcc "/x/main.cpp:12:5:", nvcc "/x/cuda.cu(12):"
# (load_inline's generated files only: a line of torch's headers is never the candidate's)
_DIAGNOSTIC_AT = re.compile(r"(/[^\s:()]+/(main\.cpp|cuda\.cu))(?::(\d+)(?::(\d+))?|\((\d+)\))")


def point_at_source(diagnostics: str, py_src: str) -> str:
    """Compiler diagnostics with positions in load_inline's generated files (main.cpp, cuda.cu:
    headers, then the C++/CUDA strings, then bindings) rewritten to the candidate's .py lines:
    "main.cpp:12:5: error" -> "line 40 (main.cpp:12:5): error". A generated line is found in the
    .py by its text and its neighbours (a string literal is copied verbatim); a line not found
    (a string built at run time, the harness's own headers) keeps the generated file's name."""
    py = [ln.rstrip() for ln in py_src.splitlines()]
    cache: dict = {}

    def where(path: str, name: str, line: int, col: str | None) -> str:
        if path not in cache:
            try:
                with open(path, errors="replace") as f:
                    cache[path] = [ln.rstrip() for ln in f.read().splitlines()]
            except OSError:
                cache[path] = None
        generated, at = cache[path], f"{name}:{line}" + (f":{col}" if col else "")
        if not generated or not 0 < line <= len(generated) or not generated[line - 1].strip():
            return at
        best, best_score, tie = None, -1, False
        for k, text in enumerate(py):
            if text != generated[line - 1]:
                continue
            score = sum(1 for d in range(-3, 4) if 0 <= k + d < len(py) and 0 < line + d <= len(generated)
                        and py[k + d] == generated[line - 1 + d])
            if score > best_score:
                best, best_score, tie = k, score, False
            else:
                tie = tie or score == best_score
        return at if best is None or tie else f"line {best + 1} ({at})"

    moved = {}  # generated line -> .py line, for gcc's quoted source lines ("    4 |   return y;")

    def rewrite(m: re.Match) -> str:
        line = int(m.group(3) or m.group(5))
        at = where(m.group(1), m.group(2), line, m.group(4))
        if at.startswith("line "):
            moved[line] = int(at.split()[1])
        return at

    def quoted(m: re.Match) -> str:
        line = int(m.group(2))
        return f"{m.group(1)}{moved[line]:>{len(m.group(2))}} |" if line in moved else m.group(0)

    out = [_DIAGNOSTIC_AT.sub(rewrite, ln) if "/" in ln else ln for ln in diagnostics.splitlines()]
    return "\n".join(re.sub(r"^(\s*)(\d+) \|", quoted, ln) for ln in out)
