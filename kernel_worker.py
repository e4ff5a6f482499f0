"""kernel_worker: what runs inside a worker process of kernel_eval, sandboxed by kernel_sandbox.

kernel_eval names this file as the entry of every process it starts (and never imports it):
`python kernel_worker.py --_worker MODE --cmd-fd C --reply-fd R --fd-sock S --job JOB`, forked from a
zygote (`--_zygote`, torch imported once) or spawned, under a supervisor (`--_supervise`). A worker
is one of three, each a function here:

- compile (_compile_worker): imports the candidate, whose load_inline builds its extension (through
  kernel_build's patch when kernel_build.py is there, plain load_inline otherwise), and reports once:
  ok (how many builds, the header tier, a time profile), a build error (the compiler's diagnostics at
  the candidate's lines), or another import error (judged again at load).
- ref (_reference_worker), trusted: the task's own code. It writes the model's init inputs and the
  inputs it draws from the parent's secret seeds to memory files the parent seals, keeps the reference
  outputs (they never leave this process) and compares a candidate's output file with them
  (kernel_verdict.compare_outputs): it sends back the first difference, or None.
- cand (_candidate_worker), untrusted: the candidate's code. It runs a check trial at a time, on clones
  of the inputs under an aten operator recorder, and writes the call's outputs to a memory file of its
  own (judged before the next trial); it sends back which inputs the trial changed and the ops it saw,
  never a verdict.

Both run workers boot while the candidate compiles (_TaskWorker) and are timed in the same loop
(TimingLoop), each reporting its own per-call times, which the parent cross-checks with its own clock.
Every output must be a plain tensor with no torch mode left active (OutputCheck); a failure is sent
back at the line of the task's code where it happened (describe_exception).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import traceback

import kernel_sandbox as sandbox
from kernel_memory import TRUSTED_FILE_MAX_BYTES, TensorFileWriter, read_tensor_sets, write_tensor_sets
from kernel_verdict import compare_outputs, cut, trim_error

try:  # per-hash build directories and -O3, header tiers, precompiled headers (kernel_build.py's docstring)
    import kernel_build
except ModuleNotFoundError as e:  # plain load_inline, in a directory of the source's own (_install_builder)
    if e.name != "kernel_build":
        raise
    kernel_build = None

_perf_counter = time.perf_counter  # bound before any candidate code runs in a worker
_process_time = time.process_time  # CPU timing: this process's CPU time (all threads), not wall


def _compile_worker(a, job: dict) -> None:
    """Import the candidate (its load_inline builds the extension) and report once: ok, a build
    error (its diagnostics, at the candidate's lines), or another import error (judged at load).
    Before that, a build may ask for one name probe (kernel_build.py) and wait for kernel_eval's
    "probed" on the command channel."""
    t0 = _perf_counter()
    preloaded = "torch" in sys.modules  # forked by a zygote
    import torch  # noqa: F401 - timed apart from the build (diagnostics: the record's profile)
    t_torch = _perf_counter() - t0
    state = _install_builder(job, fast_load=False,
                             await_name_probe=_name_prober(a) if job.get("name_probes") is True else None)

    def built() -> dict:  # what the compile built, and where its time went (every reply's, read when it is sent)
        return {"builds": state["builds"],  # a failed header tier and the build as written: two
                "profile": {"torch": t_torch, "build": state["build_s"],
                            "rest": _perf_counter() - t0 - t_torch - state["build_s"]}}
    try:
        _import_source(job["source"], "candidate_module")
        if not kernel_build:  # plain load_inline: a directory per extension it built
            state["builds"] = len(os.listdir(state["dir"])) if os.path.isdir(state["dir"]) else 0
        sandbox.child_send(a.reply_fd, {"ok": True, "header_tier": state["header_tier"],
                                        "torch_preloaded": preloaded, **built()})
    except BaseException as e:  # noqa: BLE001 - any failure of candidate code is a verdict
        build_error = state["build_error"] if kernel_build else (
            str(e) if isinstance(e, RuntimeError) and str(e).startswith("Error building extension") else None)
        if build_error is None:
            sandbox.child_send(a.reply_fd, {"ok": False, "kind": "import",
                                            "message": trim_error(traceback.format_exc()), **built()})
            return
        undefined = errors = None
        if kernel_build:  # of the whole dump (a probe's answers)
            undefined, errors = kernel_build.undefined_names(build_error), kernel_build.cuda_unit_errors(build_error)
            with open(job["source"]) as f:
                build_error = kernel_build.point_at_source(build_error, f.read())
        sandbox.child_send(a.reply_fd, {"ok": False, "kind": "build", "message": trim_error(build_error),
                                        "undefined_names": undefined, "cuda_errors": errors,
                                        "early_verdict": state.get("early_verdict"), **built()})


def _name_prober(a):
    """A compile worker's await_name_probe: the request to kernel_eval, then its "probed" (the answer is
    in the cache, where kernel_build reads it)."""
    commands = os.fdopen(a.cmd_fd, "rb", closefd=False)

    def ask(request: dict) -> None:
        sandbox.child_send(a.reply_fd, {"kind": "name_probe", "name_probe": request})
        sandbox.child_recv(commands)
    return ask


def _install_builder(job: dict, fast_load: bool, await_name_probe=None) -> dict:
    """Before any code of the task runs: kernel_build's patch of load_inline, or without
    kernel_build.py, plain load_inline building in a directory of this source's own (two candidates
    that name their extension alike never share one). Returns the worker's build record."""
    if kernel_build:
        return kernel_build.patch_load_inline(job["cache_root"], job["arch"], kernel_build.BuildConfig(**job["build"]),
                                              fast_load=fast_load, await_name_probe=await_name_probe)
    with open(job["source"], "rb") as f:
        own = os.path.join(job["cache_root"], "build", "by-source", sandbox.source_hash(f.read())[:32])
    os.environ["TORCH_EXTENSIONS_DIR"] = own
    return {"builds": 0, "build_error": None, "header_tier": None, "build_s": 0.0, "dir": own}


class _TaskWorker:
    """A run worker's side of its task: the code's module, its model on the device, its timing loop.
    Booted before any code of the task is loaded (torch imported, the device's context created,
    load_inline patched), while the candidate's kernel compiles."""

    def __init__(self, a, job: dict):
        self.preloaded = "torch" in sys.modules  # forked by a zygote
        import torch
        self.a, self.source, self.cuda = a, job["source"], job["device"] == "cuda"
        self.dev = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        self.sync = torch.cuda.synchronize if self.cuda else (lambda: None)
        if job.get("threads"):
            torch.set_num_threads(int(job["threads"]))
        if self.cuda:
            torch.cuda.set_device(self.dev)
            torch.empty(1, device=self.dev)  # create the context now: this boot overlaps the compile
        _install_builder(job, fast_load=True)
        self.module = self.cls = self.model = self.flush = self.timing = None
        # bound now, before the task's code runs: a candidate that rebinds torch.Tensor or the mode
        # stacks' accessors later does not change what this checks
        self.output_problem = OutputCheck(torch)
        self.refuse_outputs = False  # the candidate's worker refuses what output_problem finds

    def serve(self, commands: dict) -> None:
        """Report the boot (its CPU time: a fork's starts at zero; the device's free memory: the
        budget's capacity), then answer commands. A failure is reported at the line of the task's
        code where it happened; on CUDA it ends the worker (CUDA errors are sticky)."""
        import torch
        free = torch.cuda.mem_get_info(self.dev)[0] if self.cuda else None
        sandbox.child_send(self.a.reply_fd, {"ready": True, "torch_preloaded": self.preloaded,
                                             "boot_cpu_s": time.process_time(), "device_free": free})
        home_cpus = os.sched_getaffinity(0)
        timing = self.timing_commands()

        def before(cmd):  # a timing window's CPUs are for timing only
            if cmd not in timing:
                os.sched_setaffinity(0, home_cpus)

        sandbox.serve(self.a.cmd_fd, self.a.reply_fd, self.a.fd_sock, dict(commands, **timing),
                      lambda e: describe_exception(e, self.source), before, stop_on_error=self.cuda)

    def load(self, wanted: str, module_name: str) -> dict:
        try:
            self.module = _import_source(self.source, module_name)
        except BaseException as e:  # noqa: BLE001 - a failed import is a verdict: say where
            raise sandbox.Refusal(describe_exception(e, self.source)) from None
        self.cls = getattr(self.module, wanted, None)
        if not isinstance(self.cls, type):
            raise sandbox.Refusal(f"the code defines no class {wanted}")
        return {}

    def build_model(self, init: list, seed: int) -> None:
        import torch
        torch.manual_seed(seed)
        self.model = self.cls(*init).to(self.dev)

    def to_dev(self, xs: list) -> list:
        import torch
        return [x.to(self.dev) if isinstance(x, torch.Tensor) else x for x in xs]

    def timing_commands(self) -> dict:
        """Both sides' part in a timing window (_paired_timing): the same loop, each timed by its own
        process; only `time` is on the parent's clock."""
        import torch

        def prepare(msg, fds, payload):  # inputs onto the device and warm-up, off the parent's clock
            if msg.get("cpus"):
                os.sched_setaffinity(0, msg["cpus"])
            self.timing = None  # an earlier window's, freed before this one's sets arrive
            sets = [self.to_dev(xs) for xs in read_tensor_sets(fds[0], TRUSTED_FILE_MAX_BYTES)]
            if self.cuda and self.flush is None:
                self.flush = torch.empty(msg["l2_flush_bytes"] // 4, dtype=torch.float32, device=self.dev)
            # the candidate's output file, where its kept outputs go (fds are closed after each reply)
            last_file = TensorFileWriter(os.dup(fds[1])) if fds[1:] else None
            self.timing = TimingLoop(self.model, sets, self.flush, self.cuda, self.sync, msg["buffers"],
                                     msg["buffer_bytes"], self.output_problem, self.refuse_outputs,
                                     last_file=last_file, host_outputs=bool(msg.get("host_outputs")))
            self.timing.keep = False
            self.timing.run(msg["warmup"])
            return {}

        def warm(msg, fds, payload):  # more warm-up, for as long as the parent's clock says
            self.timing.keep = False
            self.timing.run(msg["calls"])
            return {}

        def timed(msg, fds, payload):  # run(n) as candidates see it: `keep` beside it, not an argument
            self.timing.keep = msg.get("keep", True)
            return {"times": self.timing.run(msg["trials"])}

        def release(msg, fds, payload):  # the window is over: its sets, buffers and outputs go
            if self.timing is not None:
                self.timing.close()
            self.timing = None
            if self.cuda:
                torch.cuda.empty_cache()
            return {}

        return {"time_prepare": prepare, "warm": warm, "time_release": release,
                "time": timed}


def _reference_worker(w: _TaskWorker) -> None:
    """The trusted side: the task's own code. It draws the inputs from the parent's secret seeds,
    holds the reference outputs, or computes them again from the sealed inputs when told not to keep
    them (they never leave this process), and compares candidates' outputs with them."""
    import torch
    outputs = {}  # part -> per input set, the reference's outputs, on the device (none if not kept)
    out_sizes = {}  # part -> per input set, the byte size of each output

    def draw_inputs(seed):
        """The task's get_inputs under `seed`, drawn on the device when it runs there (CPU random
        number generation was most of a large task's setup); on the CPU if that fails."""
        torch.manual_seed(seed)
        if w.cuda:
            try:
                with w.dev:
                    return list(w.module.get_inputs())
            except Exception:  # noqa: BLE001 - e.g. numpy in get_inputs: draw as written instead
                torch.manual_seed(seed)
        return list(w.module.get_inputs())

    def init(msg, fds, payload):  # the model; its constructor's arguments to a file the parent seals for candidates
        inputs = list(w.module.get_init_inputs())
        w.build_model(inputs, msg["seed"])
        try:
            write_tensor_sets(fds[0], [inputs])
        except TypeError as e:
            raise sandbox.Refusal(f"get_init_inputs() holds what the harness cannot pass to a candidate: {e}") from None
        return {}

    def probe(msg, fds, payload):
        """The task's footprint (plan_copies), alone on the device: one input set, its outputs, the
        forward's peak allocation; everything freed after."""
        xs = w.to_dev(draw_inputs(msg["seed"]))
        base = torch.cuda.memory_allocated(w.dev) if w.cuda else 0
        if w.cuda:
            torch.cuda.reset_peak_memory_stats(w.dev)
        with torch.no_grad():
            outs = _as_list(w.model(*xs))
        peak = torch.cuda.max_memory_allocated(w.dev) - base if w.cuda else 0
        sizes = {"set_bytes": _tensor_bytes(xs), "out_bytes": _tensor_bytes(outs)}
        del xs, outs
        if w.cuda:
            torch.cuda.empty_cache()
        return {"peak_bytes": max(peak, sizes["out_bytes"]), **sizes}

    def rehearse(msg, fds, payload):
        """One forward on inputs nobody sees, so that the timed gen after it measures the reference
        warm: its first call's costs (lazy kernel loads, a library's handle) belong in run_limit's slack."""
        xs = w.to_dev(draw_inputs(msg["seed"]))
        with torch.no_grad():
            _as_list(w.model(*xs))
        return {}

    def gen(msg, fds, payload):
        """Inputs from the parent's secret seeds to the two input files, one set at a time (a large
        task's sets are never all on the device at once); the outputs stay here if kept. Also what the check
        sets cost (run_limit): the forwards' seconds, and the rest (drawing, moving, writing the inputs)."""
        check_cost = {}
        for fd, part in zip(fds, ("check", "time")):
            writer, outputs[part], out_sizes[part] = TensorFileWriter(fd), [], []
            t_part, forward_s, in_bytes = time.perf_counter(), 0.0, 0
            for seed in msg["seeds"][part]:
                xs = draw_inputs(seed)
                on_dev = w.to_dev(xs)
                w.sync()
                t = time.perf_counter()
                with torch.no_grad():
                    outs = _as_list(w.model(*on_dev))
                w.sync()
                forward_s += time.perf_counter() - t
                out_sizes[part].append([o.nbytes for o in outs if isinstance(o, torch.Tensor)])
                if msg["keep_outputs"]:  # copies: an output may be a buffer the next forward reuses
                    outputs[part].append([o.detach().clone() if isinstance(o, torch.Tensor) else o for o in outs])
                writer.add(xs)
                in_bytes += _tensor_bytes(xs)
                del xs, on_dev, outs
            writer.close()
            if part == "check":
                check_cost = {"forward_s": forward_s, "rest_s": time.perf_counter() - t_part - forward_s,
                              "in_bytes": in_bytes}
        if w.cuda:  # the inputs' and forwards' blocks: for the candidate's worker (plan_copies counts only the outputs)
            torch.cuda.empty_cache()
        return {"out_bytes": out_sizes, "check_cost": check_cost}

    def recomputed(fd, trials):
        """The outputs of the given input sets of a sealed input file, one set on the device at a time
        (gen did not keep them: a large task's outputs are most of the device)."""
        sets = read_tensor_sets(fd, TRUSTED_FILE_MAX_BYTES)
        for t in trials:
            # copies: the file's mapping is read-only, and a forward may write its inputs
            on_dev = [x.to(w.dev, copy=True) if isinstance(x, torch.Tensor) else x for x in sets[t]]
            with torch.no_grad():
                outs = _as_list(w.model(*on_dev))
            del on_dev
            yield outs
            del outs

    def judge(msg, fds, payload):
        """The first difference between a candidate's output file and the reference's outputs (the kept
        ones, or with an input file beside the output file, computed again from it): of every input set
        of the part, or of the one check trial msg["trial"]."""
        part, trial = msg["part"], msg.get("trial")
        try:
            cand = read_tensor_sets(fds[0], msg["max_bytes"])
        except ValueError as e:  # the candidate wrote this file: its failure, not ours
            return {"unreadable": str(e)}
        n = len(out_sizes[part])
        trials = range(n) if trial is None else [trial]
        expected = recomputed(fds[1], trials) if fds[1:] else (outputs[part][t] for t in trials)
        if len(cand) != len(trials):
            return {"reason": f"expected {len(trials)} output set{'s' if len(trials) > 1 else ''}, got {len(cand)}"}
        for t, c in zip(trials, cand):
            try:
                r = next(expected)
            except Exception as e:  # noqa: BLE001 - the reference's own forward failed: the task's fault
                return {"reference_failed": describe_exception(e, w.source)}
            reason = compare_outputs(r, c, msg["tolerances"], device=w.dev)
            if reason:
                return {"reason": (f"trial {t + 1}/{n}: " if part == "check" else "") + reason}
        return {"reason": None}

    w.serve({"load": lambda msg, fds, payload: w.load("Model", "reference_module"), "init": init,
             "probe": probe, "rehearse": rehearse, "gen": gen, "judge": judge})


def _candidate_worker(w: _TaskWorker) -> None:
    """The untrusted side: the candidate's code. It is given inputs only and writes each call's
    outputs to a memory file of its own; it never holds a reference output and computes no verdict.
    During the check trials an aten operator recorder sees what its forward runs."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpRecorder(TorchDispatchMode):
        """The aten operators run while it is entered. Not wrapped to skip Dynamo: torch wraps a
        mode's __torch_dispatch__ in torch._disable_dynamo unless told otherwise, and that wrapper's
        first call imports torch._dynamo, sympy and triton (seconds of every worker's boot)."""
        @classmethod
        def _should_skip_dynamo(cls):
            return False

        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(func._schema.name)
            return func(*args, **(kwargs or {}))

    with OpRecorder():  # a dispatch mode's first use loads what dispatch needs: during boot
        torch.ones(1, device=w.dev).add(1)

    def init(msg, fds, payload):  # the reference's init inputs, from the file the parent sealed
        [inputs] = read_tensor_sets(fds[0], TRUSTED_FILE_MAX_BYTES)  # tensors: views of a read-only mapping
        w.build_model([x.clone() if isinstance(x, torch.Tensor) else x for x in inputs], msg["seed"])
        return {}

    def run(msg, fds, payload):
        """One check trial, msg["trial"]: a call on clones of that input set (compared with it after),
        its outputs written to the trial's output file (judged before the next trial runs, so a buffer
        reused across calls is checked per call, and one trial's outputs are in host memory at a time)."""
        trial = msg.get("trial")
        sets = read_tensor_sets(fds[0], TRUSTED_FILE_MAX_BYTES)
        if not isinstance(trial, int) or not 0 <= trial < len(sets):
            raise ValueError(f"no check trial {trial!r} of {len(sets)}")
        xs = sets[trial]
        # host_inputs (a task too large for a device copy of them): compared with the sealed file's
        pristine = xs if msg.get("host_inputs") else w.to_dev(xs)
        call = [x.to(w.dev, copy=True) if isinstance(x, torch.Tensor) else x for x in pristine]
        if w.cuda:  # hand NaN-filled blocks of each output's size to the next torch.empty
            blocks = [torch.full(((n + 3) // 4,), float("nan"), device=w.dev)
                      for n in msg.get("poison_bytes", []) for _ in range(2)]
            del blocks
        recorder = OpRecorder() if msg.get("op_check") else contextlib.nullcontext()
        with torch.no_grad(), recorder:
            out = _as_list(w.model(*call))
        problem = w.output_problem(out)  # before anything touches the outputs (writing them would)
        if problem:
            raise sandbox.Refusal(problem)
        changed = [i for i, (p, c) in enumerate(zip(pristine, call))
                   if isinstance(p, torch.Tensor) and not _same(p, c)]
        write_tensor_sets(fds[1], [out])
        return {"changed": changed, "ops": sorted(getattr(recorder, "ops", set()))}

    def time_outputs(msg, fds, payload):  # each input set's last timed output, to be checked again
        w.timing.write_last()
        return {}

    w.refuse_outputs = True
    w.serve({"load": lambda msg, fds, payload: w.load("ModelNew", "candidate_module"), "init": init,
             "run": run, "time_outputs": time_outputs})


class TimingLoop:
    """Calls on `buffers` copies of the input buffers (fewer if they would pass `buffer_bytes`),
    refilled from alternating input sets; `run` returns per-call times (ms) and keeps each set's last
    output. Call k takes set k mod sets into copy (k div sets) mod copies: every copy holds each set in
    turn. On GPU each call is preceded by an L2 flush and ends with a device-wide sync before the end
    event, so work left on other streams is counted.

    Every call's outputs, warm-up included, go through `output_problem` (OutputCheck) right after its
    timed interval, before anything touches them; with `refuse` (the candidate's side) a problem ends
    the run with a sandbox.Refusal. Both sides pay the check, so the loop costs the same on both.
    Kept outputs are clones on the device, written to `last_file` (the candidate's output file) when
    the window ends (`write_last`). `host_outputs` (a task whose outputs are most of the device): only
    a run told to `keep` keeps its last outputs, streamed to `last_file` at once through a small pinned
    buffer (no copy in host memory beside the file); a side with no file keeps none (the reference:
    its outputs are computed again when judged). That side's last block is then the shorter one, which
    the verdict's lower medians read past (kernel_verdict.paired_verdict)."""

    def __init__(self, model, sets: list, flush, cuda: bool, sync, buffers: int = 1, buffer_bytes: int = 0,
                 output_problem=None, refuse: bool = False, last_file=None, host_outputs: bool = False):
        import torch
        self.model, self.sets, self.flush, self.cuda, self.sync = model, sets, flush, cuda, sync
        self.output_problem, self.refuse = output_problem or OutputCheck(torch), refuse
        size = sum(x.numel() * x.element_size() for x in sets[0] if isinstance(x, torch.Tensor))
        copies = max(1, min(buffers, buffer_bytes // size if size else buffers))
        self.bufs = [[x.clone() if isinstance(x, torch.Tensor) else x for x in sets[0]] for _ in range(copies)]
        self.last = [None] * len(sets)
        self.calls = 0
        self.last_file, self.host_outputs = last_file, host_outputs
        if host_outputs and len(sets) != 1:  # a file is written in call order: one set keeps it in set order
            raise ValueError("host_outputs times one input set")
        self.keep = True  # the next run's last outputs are kept (host_outputs: set per request by the worker)

    def run(self, n: int) -> list:
        import torch
        times, out, keep = [], None, self.keep
        with torch.no_grad():
            for k in range(n):
                i = self.calls % len(self.sets)
                recorded = n - k <= len(self.sets) and (
                    not self.host_outputs or keep and self.last_file is not None)
                out = None  # the previous call's outputs are gone before this call (as in a plain loop)
                bufs = self.bufs[self.calls // len(self.sets) % len(self.bufs)]
                self.calls += 1
                for b, s in zip(bufs, self.sets[i]):
                    if isinstance(b, torch.Tensor):
                        b.copy_(s)
                if self.cuda:
                    self.flush.zero_()
                    self.sync()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    out = self.model(*bufs)
                    self.sync()  # device-wide: work left on side streams is counted
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end))
                else:  # CPU time: preemption by other processes (load) is not the kernel's cost
                    t0 = _process_time()
                    out = self.model(*bufs)
                    times.append((_process_time() - t0) * 1e3)
                out = _as_list(out)
                problem = self.output_problem(out)
                if problem and self.refuse:
                    raise sandbox.Refusal(f"a timed call: {problem}")
                if recorded and self.host_outputs:
                    self.last_file.add(out)
                elif recorded:  # a run's last call of each set, copied at once (a clone per call is overhead)
                    self.last[i] = [o.clone() if isinstance(o, torch.Tensor) else o for o in out]
            self.sync()
        return times

    def write_last(self) -> None:
        """The kept outputs, each set's, into last_file (already there with host_outputs), which is then complete."""
        if not self.host_outputs:
            for outs in self.last:
                self.last_file.add(outs)
        self.last_file.close()
        self.close()

    def close(self) -> None:
        if self.last_file is not None:
            with contextlib.suppress(OSError):
                os.close(self.last_file.fd)
            self.last_file = None


class OutputCheck:
    """Why a forward's outputs (a list) are not what the harness accepts from a candidate, or None.

    Each output must be exactly a torch.Tensor: not a subclass (whose __torch_function__ or
    __torch_dispatch__ could compute its values on first use, after the timed call, when the harness
    writes or clones it), not a tensor-like object, and without the Python dispatch key (a subclass
    disguised by assigning __class__). And the forward must leave no torch function or dispatch mode
    active: a mode runs on every later operation, the harness's reads of a plain output included,
    and could do the work there (torch's own DeviceContext, which torch.set_default_device leaves,
    only fills in the device of factory calls: allowed). A plain tensor holds its values in its storage when the call
    returns (on GPU, after the device-wide sync that ends a timed call), so no work can wait for its
    first use. An output that aliases an input is not refused: the inputs are checked unchanged, and
    an identity-like task's honest answer may be a view."""

    def __init__(self, torch):
        import torch.utils._device
        self.tensor = torch.Tensor
        self.dispatch_keys, self.python_key = torch._C._dispatch_keys, torch._C.DispatchKey.Python
        self.function_modes, self.function_mode_at = torch._C._len_torch_function_stack, torch._C._get_function_stack_at
        self.dispatch_modes, self.default_device = torch._C._len_torch_dispatch_stack, torch.utils._device.DeviceContext

    def __call__(self, outputs: list) -> str | None:
        for k, o in enumerate(outputs):
            name = f"output {k}" if len(outputs) > 1 else "output"
            kind = type(o)
            if kind is not self.tensor:
                what = "a torch.Tensor subclass" if issubclass(kind, self.tensor) else "not a tensor"
                return f"{name} is {_type_name(kind)} ({what}); forward must return plain torch.Tensor outputs"
            if self.dispatch_keys(o).has(self.python_key):
                return (f"{name} is a torch.Tensor with Python dispatch (a disguised subclass); forward must return "
                        "plain tensors")
        if self.dispatch_modes() or any(type(self.function_mode_at(i)) is not self.default_device
                                        for i in range(self.function_modes())):
            return "forward left a torch function or dispatch mode active; it must return plain tensors and no hooks"
        return None


def _type_name(kind: type) -> str:
    module, name = getattr(kind, "__module__", None), getattr(kind, "__qualname__", "?")
    return name if module in (None, "builtins") else f"{module}.{name}"


def _import_source(path: str, module_name: str):
    import importlib.util
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def describe_exception(exc: BaseException, path: str, max_lines: int = 6, max_chars: int = 800) -> str:
    """A failure of the code in `path` as the policy (and a user) can act on it: the line of that
    file where it happened and the exception, without the harness's frames or caret lines:
    "line 12: SyntaxError: invalid syntax: def forward(self x):", "line 30: NameError: ..."."""
    if isinstance(exc, SyntaxError) and exc.filename == path:
        text = (exc.text or "").strip()
        return f"line {exc.lineno}: {type(exc).__name__}: {exc.msg}" + (f": {cut(text, 200)}" if text else "")
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if frame.f_code.co_filename == path:
            line = lineno  # the innermost frame in the code's own file
    lines = [ln.rstrip() for ln in str(exc).splitlines() if ln.strip()]
    head = (f"line {line}: " if line else "") + type(exc).__name__
    text = head + (f": {lines[0]}" if lines else "")
    if len(lines) > 1:  # e.g. a build error raised at load: its first error lines
        text += "\n" + trim_error("\n".join(lines[1:]), max_lines=max_lines)
    return cut(text, max_chars)


def _as_list(out) -> list:
    import torch
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return list(out)
    return [out]


def _same(pristine, call) -> bool:
    """torch.equal of an input as given (on the host, or the device) and the call's copy after it ran (on the
    device), a slice at a time: no second device copy of a large input."""
    import torch
    if pristine.device == call.device or pristine.shape != call.shape or pristine.dtype != call.dtype:
        return pristine.device == call.device and torch.equal(pristine, call)
    p, c = pristine.reshape(-1), call.reshape(-1)
    step = max(1, SAME_SLICE_BYTES // max(1, p.element_size()))
    return all(torch.equal(p[i: i + step].to(c.device), c[i: i + step]) for i in range(0, p.numel(), step))


SAME_SLICE_BYTES = 256 << 20


def _tensor_bytes(values: list) -> int:
    import torch
    return sum(v.nbytes for v in values if isinstance(v, torch.Tensor))


def _worker_main(argv: list) -> None:
    """A worker process's entry (`kernel_worker.py --_worker MODE --cmd-fd ... --job JOB`)."""
    p = argparse.ArgumentParser()
    p.add_argument("--_worker", dest="mode", required=True, choices=("compile", "ref", "cand"))
    p.add_argument("--cmd-fd", type=int, required=True)
    p.add_argument("--reply-fd", type=int, required=True)
    p.add_argument("--fd-sock", type=int, default=-1)
    p.add_argument("--job", required=True)
    a = p.parse_args(argv)
    job = json.loads(a.job)
    if a.mode == "compile":
        _compile_worker(a, job)
    elif a.mode == "ref":
        _reference_worker(_TaskWorker(a, job))
    else:
        _candidate_worker(_TaskWorker(a, job))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: candidate atexit hooks and threads do not matter


def _zygote_preload() -> str:
    """What a zygote imports once for the workers it forks; returns why its forks could not serve."""
    import torch
    __import__("torch.utils._python_dispatch")  # run workers' op recorder
    cuda_visible = os.environ.get("CUDA_VISIBLE_DEVICES") != ""
    if not cuda_visible:  # its import asks CUDA for devices, after which no fork of ours could use CUDA
        __import__("torch.utils.cpp_extension")
        return ""
    probe = os.fork()  # can a fork of this process use CUDA? (torch marks a fork after a driver call)
    if probe == 0:
        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
    if os.waitstatus_to_exitcode(os.waitpid(probe, 0)[1]) != 0:
        return "torch called the CUDA driver at import: forked workers could not use CUDA"
    return ""


if __name__ == "__main__":
    # the processes kernel_sandbox starts for kernel_eval run this file: a supervisor, a zygote, a worker
    if sys.argv[1:2] == ["--_supervise"]:
        sys.exit(sandbox.supervise(json.load(sys.stdin)))
    if sys.argv[1:2] == ["--_zygote"]:
        sandbox.zygote_main(int(sys.argv[2]), int(sys.argv[3]), _zygote_preload, _worker_main)
    if sys.argv[1:2] == ["--_worker"]:
        _worker_main(sys.argv[1:])
    print("kernel_worker.py: started by kernel_eval's sandbox only (--_worker, --_zygote, --_supervise); "
          "run kernel_eval.py", file=sys.stderr)
    sys.exit(2)
