"""The kernel gate: what a candidate may call, and the static check that decides, before any compiling,
whether a source may be judged at all.

Kevin-32B (Cognition, 2025) pays 0 for a turn whose code breaks its rules, and so does this project
(rewards.turn_score): torch.nn beyond Module/Parameter/containers/init, torch compute instead of its own
kernel in the forward pass, try/except or `pass`, no kernel at all. The gate also refuses what only an
attacker needs (other imports, exec/eval, dunder tricks, patching torch, CUDA streams and graphs). It is
a cheap first filter and the reward rule, not the security boundary: kernel_eval.py is.

CALLS, one table with a reason per row, is the only place a call's rule is written: allocation, views,
transposes, copies, casts and sizes are glue around the kernel, in forward and in the C++ host code
alike; torch compute and data-building operators are the task's work. Its readers derive what they need
when they run (allowed(), describe_rules()), never a copy: the prompt (summarize.base_instruction states
describe_rules()), the gate (check_format) and the harness's op check (kernel_verdict.flag_ops reads
allowed().aten_ops). tests/test_kernel_gate.py runs every row through the gate and the harness.

In forward (and every helper it reaches) the gate refuses torch.* functions and tensor methods outside
the allowed rows, torch.nn.functional and nn layers, and Python operators on tensors (x + y, x @ w,
x[mask]): an inference (kernel_types) tells tensors from sizes (n * 2 stays allowed). In the kernel's
C++: torch::/at:: calls outside the allowed rows, and the refused rows' tensor methods (a denylist).
__init__ may use torch freely, as KernelBench references do. The gate is a list of small rules (RULES),
each returning the reason for the first place that breaks it, over facts derived once per candidate
(_Candidate). Standard library and kernel_types only.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cached_property, lru_cache

from kernel_types import EXT, SCALAR, TENSOR, Types


# =========================================================================== what a kernel may call
@dataclass(frozen=True)
class Call:
    """One row of what a candidate may call around its kernel, and why. Spellings: in Python `torch.f`
    (a function) and `x.m()` / `x.a` (a tensor method or attribute); in C++ `torch::f` / `at::f` (a
    namespace call) and `x.m()`. Allowed rows list every spelling the gate lets through. Refused rows
    give Python examples (the forward pass is allowlisted: what no allowed row names is refused there)
    and, in C++, every tensor method the gate refuses (a denylist; the harness's op check catches the
    rest)."""
    what: str
    python: tuple[str, ...]
    cpp: tuple[str, ...]
    aten: tuple[str, ...]  # the aten operators these calls run: what the harness's op check accepts
    forward: bool          # allowed in forward and every helper it reaches
    host: bool             # allowed in the C++ host code around the kernel
    why: str


def _torch(names: str) -> tuple[str, ...]:
    return tuple(f"torch.{n}" for n in names.split())


def _cpp(names: str, namespace: str = "torch") -> tuple[str, ...]:
    return tuple(f"{namespace}::{n}" for n in names.split())


def _methods(names: str) -> tuple[str, ...]:
    return tuple(f"x.{n}()" for n in names.split())


CALLS = (
    Call("allocation",
         python=(*_torch("empty empty_like empty_strided zeros zeros_like"),
                 *_methods("new_empty new_empty_strided new_zeros zero_")),
         cpp=(*_cpp("empty empty_like empty_strided zeros zeros_like from_blob"),
              *_methods("zero_ resize_")),
         aten=tuple("empty empty_like empty_strided new_empty new_empty_strided new_zeros zeros "
                    "zeros_like zero_ resize_".split()), forward=True, host=True,
         why="Output and scratch buffers are memory, not arithmetic: the kernel fills them."),
    Call("constant fills",
         python=(*_torch("ones ones_like full full_like"), *_methods("new_ones new_full fill_")),
         cpp=(*_cpp("ones ones_like full full_like"), *_methods("new_ones new_full fill_")),
         aten=tuple("ones ones_like full full_like new_ones new_full fill_".split()), forward=True, host=True,
         why="A buffer of one constant reads no input: allocation, like torch.zeros (an "
             "accumulator that starts at 1 or -inf)."),
    Call("views",
         python=(*_torch("reshape flatten squeeze unsqueeze narrow select split chunk unbind"),
                 *_methods("view view_as reshape reshape_as flatten unflatten squeeze unsqueeze expand expand_as "
                           "narrow select split chunk unbind detach requires_grad_"), "x.data"),
         cpp=(*_cpp("reshape flatten squeeze unsqueeze narrow select split chunk unbind"),
              *_methods("view view_as reshape flatten squeeze unsqueeze expand expand_as narrow "
                        "select slice split chunk unbind detach as_strided set_")),
         aten=tuple("view _unsafe_view reshape _reshape_alias view_as as_strided expand expand_as "
                    "unsqueeze squeeze select slice narrow detach alias split split_with_sizes "
                    "unsafe_split chunk unbind flatten set_".split()), forward=True, host=True,
         why="The same memory under other sizes and strides, as indexing with ints and slices (x[0], x[:, 1:]) "
             "gives: no value is read or computed. A reshape that cannot be a view copies, as .contiguous() does."),
    Call("transposes",
         python=(*_torch("t transpose permute"), *_methods("t transpose permute"), "x.T", "x.mT"),
         cpp=(*_cpp("t transpose permute"), *_methods("t transpose permute")),
         aten=("t", "transpose", "permute"), forward=True, host=True,
         why="Layout glue: a view with its strides swapped, no value changes. References use "
             "them to lay out operands (A.T @ B); the kernel, or .contiguous(), moves the data."),
    Call("copies",
         python=("torch.clone", *_methods("contiguous clone copy_")),
         cpp=("torch::clone", *_methods("contiguous clone copy_")),
         aten=("contiguous", "clone", "copy_"), forward=True, host=True,
         why="A copy moves values unchanged into a layout the kernel can index: .contiguous() "
             "of a transposed view is such a copy, and clone and copy_ are the same thing."),
    Call("casts and device moves",
         python=_methods("to type_as half float double bfloat16 int long cuda cpu"),
         cpp=_methods("to toType cuda cpu"),
         aten=("_to_copy", "to"), forward=True, host=True,
         why="A cast converts each value on its own and does none of the task's arithmetic; "
             "its time counts against the candidate, and the tolerance judges the precision it "
             "loses. The harness sees a cast and a device move as one operator (_to_copy)."),
    Call("sizes and metadata",
         python=(*_methods("size dim numel stride item data_ptr element_size is_contiguous "
                           "get_device storage_offset nelement ndimension"),
                 *(f"x.{a}" for a in "shape dtype device ndim is_cuda layout requires_grad is_leaf".split())),
         cpp=_methods("size sizes dim numel stride strides item data_ptr element_size "
                      "is_contiguous scalar_type options device is_cuda is_nonzero"),
         aten=tuple("_local_scalar_dense item is_nonzero is_same_size sym_size sym_stride "
                    "sym_numel sym_storage_offset dim size stride numel is_contiguous "
                    "_has_compatible_shallow_copy_type".split()), forward=True, host=True,
         why="Numbers about a tensor, not its values; .item() copies one value to the host (a sync, no arithmetic)."),
    Call("options, dtypes and devices",
         python=_torch("Size device get_default_dtype is_tensor"),
         cpp=_cpp("TensorOptions Device Scalar IntArrayRef dtype device Tensor ScalarType Half "
                  "BFloat16 optional check requires_grad layout MemoryFormat"),
         aten=(), forward=True, host=True,
         why="They describe tensors (shape, dtype, device, options) and touch no values."),
    Call("the device, its current stream and the CPU threads",
         python=_torch("no_grad inference_mode cuda.is_available cuda.current_device "
                       "cuda.device_count cuda.current_stream cuda.get_device_properties "
                       "cuda.get_device_capability utils.cpp_extension.load_inline"),
         cpp=(*_cpp("getCurrentCUDAStream getCurrentDeviceProperties getDeviceProperties "
                    "current_device CUDAGuard OptionalCUDAGuard", "at::cuda"),
              *_cpp("DeviceGuard OptionalDeviceGuard parallel_for get_num_threads ceil_div", "at"),
              "x.record_stream()"),
         aten=("record_stream",), forward=True, host=True,
         why="Where and how the kernel runs: the device, the current stream (which the timing "
             "sees; other streams are refused), the CPU thread pool, the compiler."),
    Call("torch compute operators and Python operators on tensors such as x + y, x > 0 or x[mask]",
         python=("torch.relu", "torch.nn.functional.relu", "x.sum()", "x.matmul()", "torch.matmul",
                 "torch.nn.functional.conv2d", *_methods("relu exp clamp add_ mul_")),
         cpp=("torch::matmul", "at::relu", *_methods(
             "add add_ sub sub_ mul mul_ div div_ matmul mm bmm addmm baddbmm mv dot einsum sum mean prod amax amin "
             "argmax argmin relu relu_ gelu silu sigmoid tanh exp log softmax log_softmax clamp clamp_ clamp_min "
             "clamp_max pow sqrt rsqrt abs neg cumsum norm var std topk sort conv1d conv2d conv3d linear layer_norm "
             "batch_norm group_norm max_pool2d avg_pool2d mish hardtanh leaky_relu elu softplus maximum minimum lerp "
             "addcmul addcdiv bincount histc")),
         aten=(), forward=False, host=False,
         why="The task's arithmetic: done by torch, the reward would pay for torch's kernels."),
    Call("data-building operators",
         python=("torch.cat", "torch.where", "x.gather()", "x.repeat()", "torch.stack",
                 *_methods("flip index_select masked_fill tril nonzero")),
         cpp=(*_cpp("cat stack"), *_methods(
             "index_select gather scatter scatter_add masked_fill where fill_diagonal_ tril triu "
             "flip roll cat stack repeat index index_put_ masked_select nonzero unique")),
         aten=(), forward=False, host=False,
         why="They compute a tensor from several inputs, indices or conditions (DenseNet's "
             "concatenation, a gather, a mask): part of the model's work. In C++ x.index() "
             "cannot be told from a gather; x.select(), x.slice() and x.narrow() are views."),
    Call("new values on every call",
         python=_torch("tensor arange randn linspace rand"),
         cpp=_cpp("tensor arange randn linspace rand"),
         aten=(), forward=False, host=False,
         why="Constants belong in __init__ (nn.Parameter, register_buffer); index ranges and "
             "random numbers are the kernel's to compute."),
)


_DTYPES = {"float32", "float", "float16", "half", "bfloat16", "float64", "double", "int8", "uint8", "int16", "short",
           "int32", "int", "int64", "long", "bool", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2"}


@dataclass(frozen=True)
class Allowed:
    """The lists the gate and the harness read, made from a table of calls (allowed())."""
    torch: frozenset           # torch.* names forward may use: the table's, dtypes, types and layouts
    tensor_names: frozenset    # x.m() and x.a forward may use
    tensor_methods: frozenset  # the methods among them
    scalar_methods: frozenset  # tensor methods and attributes that give sizes, not tensors
    scalar_attrs: frozenset
    cpp_calls: frozenset       # torch::f / at::f the host code may call (an allowlist)
    cpp_methods_denied: frozenset  # tensor methods the host code may not call (a denylist)
    aten_ops: frozenset        # the aten operators the harness's op check accepts
    forward_rows: str          # the rows allowed in forward, as a refusal names them


def allowed(calls: tuple | None = None) -> Allowed:
    """The gate's and the harness's lists from `calls` (None: CALLS, read now, so that a table handed
    in or patched is what every reader follows)."""
    return _allowed(CALLS if calls is None else calls)


@lru_cache(maxsize=4)
def _allowed(calls: tuple) -> Allowed:
    forward = [s for row in calls if row.forward for s in row.python]
    sizes = next(row.python for row in calls if row.what == "sizes and metadata")
    # torch names that are values, never called for work (dtypes, layouts, the Tensor type), are
    # allowed beside the table's calls
    return Allowed(
        torch=frozenset({f"torch.{n}" for n in _DTYPES} | {s for s in forward if s.startswith("torch.")} | {
            "torch.dtype", "torch.Tensor", "torch.contiguous_format", "torch.channels_last", "torch.strided"}),
        tensor_names=frozenset(s[2:].removesuffix("()") for s in forward if s.startswith("x.")),
        tensor_methods=frozenset(s[2:-2] for s in forward if s.startswith("x.") and s.endswith("()")),
        scalar_methods=frozenset(s[2:-2] for s in sizes if s.endswith("()")),
        scalar_attrs=frozenset(s[2:] for s in sizes if not s.endswith("()")),
        cpp_calls=frozenset(s.rsplit("::", 1)[1] for row in calls if row.host for s in row.cpp if "::" in s),
        cpp_methods_denied=frozenset(s[2:-2] for row in calls if not row.host for s in row.cpp
                                     if s.startswith("x.")),
        aten_ops=frozenset(op for row in calls if row.forward or row.host for op in row.aten),
        forward_rows="; ".join(row.what for row in calls if row.forward))


def describe_calls(calls: tuple | None = None) -> str:
    """The table as the prompt states it (None: CALLS, read now)."""
    calls = CALLS if calls is None else calls

    def listed(rows, examples):
        return "; ".join(f"{r.what} ({', '.join(r.python[:4] if examples else r.python)}"
                         f"{', ...' if examples else ''})" for r in rows)
    parts = [("In forward (and the helpers it calls), and in the C++ host code around your kernel "
              "(spelled torch::empty, x.transpose(...)), you may call only",
              [r for r in calls if r.forward and r.host], False),
             ("In forward only", [r for r in calls if r.forward and not r.host], False),
             ("In the C++ host code only", [r for r in calls if r.host and not r.forward], False),
             ("Anything else there is the kernel's work and scores 0",
              [r for r in calls if not r.forward and not r.host], True)]
    return " ".join(f"{lead}: {listed(rows, examples)}." for lead, rows, examples in parts if rows)


def describe_imports() -> str:
    """ALLOWED_IMPORTS as the prompt and a refusal state them."""
    names = [f"{n} (with torch.nn and torch.utils.cpp_extension)" if n == "torch" else n for n in ALLOWED_IMPORTS]
    return ", ".join(names[:-1]) + " and " + names[-1]


def describe_rules(calls: tuple | None = None) -> str:
    """Every rule the gate holds a submission to, as the prompt states it: torch.nn (NN_ALLOWED), what
    forward and the host code may call (describe_calls), imports (ALLOWED_IMPORTS), and the rules no
    table lists (no_try_except, no_pass, SOURCE_DENIED)."""
    nn_names = ", ".join(f"nn.{n}" for n in sorted(NN_ALLOWED))
    return (f"Of torch.nn, ModelNew may use only the module system ({nn_names}); its __init__ may call "
            f"torch to build parameters. {describe_calls(calls)} Import only {describe_imports()}. "
            "No try/except, no `pass`, no extra streams, graphs, threads or processes.")


# =========================================================================== the gate
def check_format(code: str, language: str = "cuda", max_code_chars: int = 100_000) -> str | None:
    """Why `code` breaks the submission rules (a sentence a model can act on), or None. The rules
    (RULES, in order) each return the reason for the first place that breaks them. Code longer than
    max_code_chars is refused outright: no kernel submission needs thousands of lines."""
    if language not in ("cuda", "cpp"):
        raise ValueError(f"language must be 'cuda' or 'cpp', got {language!r}")
    if not isinstance(code, str) or not code.strip():
        return "the code block is empty."
    if len(code) > max_code_chars:
        return (f"the code is {len(code)} characters long, over the limit of {max_code_chars}; "
                "submit a compact solution.")
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        return f"line {e.lineno}: the code is not valid Python ({e.msg})."
    except (RecursionError, MemoryError):
        return "the code is nested too deeply to parse; simplify its expressions."
    try:
        candidate = _Candidate(tree, language)
        for rule in RULES:
            reason = rule(candidate)
            if reason:
                return reason
    except RecursionError:
        return "the code is nested too deeply to check."
    return None


ALLOWED_IMPORTS = ("torch", "math", "typing", "typing_extensions", "__future__")  # any other import is refused
BANNED_NAMES = {"exec", "eval", "compile", "__import__", "globals", "locals", "vars", "open", "setattr", "delattr",
                "breakpoint", "input", "__builtins__", "memoryview", "help", "exit", "quit"}
# torch.nn names a candidate may use: the module system itself, never a layer.
NN_ALLOWED = {"Module", "Parameter", "ModuleList", "ModuleDict", "ParameterList",
              "ParameterDict", "Sequential", "init", "parameter"}
# Module paths that may be named as values (aliases such as `F = torch.nn.functional`
# are fine; what matters is what is later taken from them).
TORCH_MODULES = {"torch", "torch.nn", "torch.nn.init", "torch.nn.functional", "torch.cuda",
                 "torch.utils", "torch.utils.cpp_extension", "torch.nn.parameter"}
# Anywhere in the file: namespaces that reach the runtime, files, compilers, other
# processes or the timing machinery.
TORCH_DENIED_PREFIXES = ("torch.ops", "torch.library", "torch.jit", "torch.compile", "torch.fx", "torch.export",
                         "torch.hub", "torch.load", "torch.save", "torch.distributed", "torch.multiprocessing",
                         "torch.backends", "torch.classes", "torch.profiler", "torch.autograd", "torch.testing",
                         "torch.set_", "torch.use_deterministic", "torch.overrides", "torch.storage", "torch.package")
# Methods of Python's own containers and strings, allowed on values of unknown type.
PYTHON_METHODS = {"append", "extend", "insert", "pop", "items", "keys", "values", "get", "setdefault", "update",
                  "format", "join", "strip", "startswith", "endswith", "lower", "upper", "replace", "register_buffer",
                  "register_parameter", "parameters", "named_parameters", "buffers", "modules", "children",
                  "add_module", "forward"}
# Builtins that call a tensor's operators when handed one.
BUILTINS_ON_TENSORS = {"abs", "sum", "max", "min", "pow", "round", "divmod", "sorted", "any",
                       "all", "map", "filter", "reversed", "iter", "next"}
# In the kernel source strings: what only a timing or sandbox attack needs.
SOURCE_DENIED = [
    (re.compile(r"\bcudaStreamCreate\w*|\bgetStreamFromPool\b|\bcudaStreamBeginCapture\b"),
     "creates a CUDA stream; launch on the current stream (at::cuda::getCurrentCUDAStream())"),
    (re.compile(r"\bcudaGraph\w*|\bCUDAGraph\b"), "uses CUDA graphs"),
    (re.compile(r"\bstd::(thread|async|jthread)\b|\bpthread_create\b|#\s*include\s*<thread>"),
     "starts threads; use OpenMP pragmas or the GPU for parallelism"),
    (re.compile(r"\b(fork|vfork|popen|execv\w*|execl\w*|dlopen|system)\s*\("),
     "starts processes or loads libraries"),
    (re.compile(r"\bcudaLaunchHostFunc\b|\bcudaStreamAddCallback\b"), "registers host callbacks"),
]
_CPP_TORCH_CALL = re.compile(r"\b(?:torch|at)(?:::\w+)*::(\w+)\s*(?:<[^<>;]*>)?\s*\(")
_CPP_METHOD_CALL = re.compile(r"(?:\.|->)\s*(\w+)\s*(?:<[^<>;]*>)?\s*\(")
_CPP_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_CPP_FUNCTION = re.compile(r"[\w:<>\*&]+\s+[\*&]?\s*\w+\s*\([^;{}]*\)\s*(const\s*)?\{")


def _at(node: ast.AST, why: str) -> str:
    return f"line {getattr(node, 'lineno', '?')}: {why}"


def _code(node: ast.AST) -> str:
    """The source of a node, shortened for a message."""
    text = ast.unparse(node)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def _is_const_getattr(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "getattr" and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str))


# --------------------------------------------------------------------------- rules: the file
def no_try_except(c: _Candidate) -> str | None:
    for node in c.nodes:
        if isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            return _at(node, "try/except is not allowed; let errors surface so the harness can report them.")


def no_pass(c: _Candidate) -> str | None:
    for node in c.nodes:
        if isinstance(node, ast.Pass):
            return _at(node, "`pass` is not allowed; write the body out or remove the block.")


def imports_only_torch_math_typing(c: _Candidate) -> str | None:
    for node in c.nodes:
        if isinstance(node, ast.ImportFrom) and node.level:
            return _at(node, f"relative imports are not allowed; import only {describe_imports()}.")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            for name in names:
                root = name.split(".")[0]
                if root not in ALLOWED_IMPORTS:
                    return _at(node, f"importing `{name}` is not allowed; only {describe_imports()}.")


def no_import_star(c: _Candidate) -> str | None:
    for node in c.nodes:
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return _at(node, "`import *` is not allowed; name what you use.")


def no_exec_eval_or_dunder_names(c: _Candidate) -> str | None:
    for node in c.nodes:
        if isinstance(node, ast.Name) and (node.id in BANNED_NAMES or (_is_dunder(node.id) and node.id != "__name__")):
            return _at(node, f"`{node.id}` is not allowed in a kernel submission.")


def no_dunder_attributes(c: _Candidate) -> str | None:
    for node in c.nodes:
        if isinstance(node, ast.Attribute) and _is_dunder(node.attr) and node.attr != "__init__":
            return _at(node, f"the attribute `{node.attr}` is not allowed; only "
                             "super().__init__() may touch dunder names.")
        if _is_const_getattr(node) and _is_dunder(node.args[1].value):
            return _at(node, f"getattr(..., {node.args[1].value!r}) is not allowed.")
        if isinstance(node, ast.Global) and any(_is_dunder(n) for n in node.names):
            return _at(node, "declaring dunder globals is not allowed.")


def no_computed_getattr(c: _Candidate) -> str | None:
    for node in c.nodes:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id == "getattr" and not _is_const_getattr(node):
            return _at(node, "getattr with a computed name is not allowed; write the attribute out.")


def no_assignment_into_modules(c: _Candidate) -> str | None:
    for node in c.nodes:
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        else:
            continue
        for t in targets:
            for sub in c.walk(t):
                if isinstance(sub, (ast.Attribute, ast.Subscript)) and c.dotted(sub.value):
                    return _at(node, f"assigning into the module `{c.dotted(sub.value)}` is not "
                                     "allowed; it would change torch for the harness.")


def defines_modelnew_with_forward(c: _Candidate) -> str | None:
    classes = [n for n in c.tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew"]
    if not classes:
        return _at(c.tree, "no top-level `class ModelNew(nn.Module)` found; define it with the "
                           "same constructor arguments as Model.")
    if not any(isinstance(n, ast.FunctionDef) and n.name == "forward" for n in classes[0].body):
        return _at(classes[0], "ModelNew has no forward method.")


# --------------------------------------------------------------------------- rules: the kernel source
def kernel_source_starts_no_streams_threads_or_processes(c: _Candidate) -> str | None:
    for text in c.string_constants:
        for pattern, why in SOURCE_DENIED:
            if pattern.search(text):
                return f"the kernel source {why}: not allowed."


def kernel_source_calls_only_allowed_torch(c: _Candidate) -> str | None:
    """The host column of CALLS: namespace calls allowlisted, tensor methods denylisted."""
    for text in c.string_constants:
        code = _CPP_COMMENTS.sub(" ", text)
        for m in _CPP_TORCH_CALL.finditer(code):
            if m.group(1) not in c.allowed.cpp_calls:
                return (f"the kernel source calls {m.group(0).rstrip('( ')}(), a torch compute "
                        "operator; compute it in your own kernel (allocation such as torch::empty is fine).")
        for m in _CPP_METHOD_CALL.finditer(code):
            if m.group(1) in c.allowed.cpp_methods_denied:
                return (f"the kernel source calls .{m.group(1)}(), a torch tensor operator; "
                        "compute it in your own kernel.")


def compiles_a_kernel_inline(c: _Candidate) -> str | None:
    calls = [n for n in c.nodes if isinstance(n, ast.Call)
             and c.dotted(n.func) == "torch.utils.cpp_extension.load_inline"]
    if not calls:
        return _at(c.tree, "no torch.utils.cpp_extension.load_inline call found; the work must "
                           "be done by a kernel you compile inline.")
    keywords = {k.arg for call in calls for k in call.keywords}
    if c.language == "cuda":
        if "cuda_sources" not in keywords:
            return _at(calls[0], "load_inline has no cuda_sources=; pass your CUDA code there.")
        cuda = [s for call in calls for s in c.source_strings(call, "cuda_sources", 2)]
        if not any(re.search(r"\b__global__\b", s) for s in cuda):
            return _at(calls[0], "no __global__ kernel found in the source passed as cuda_sources.")
        return None
    if any(k.arg == "cuda_sources" and not (isinstance(k.value, (ast.List, ast.Tuple))
                                            and not k.value.elts)
           for call in calls for k in call.keywords):
        return _at(calls[0], "CPU mode: pass C++ through cpp_sources= only, no cuda_sources.")
    if "cpp_sources" not in keywords and not any(len(call.args) >= 2 for call in calls):
        return _at(calls[0], "load_inline has no cpp_sources=; pass your C++ code there.")
    cpp = [s for call in calls for s in c.source_strings(call, "cpp_sources", 1)]
    if not any(_CPP_FUNCTION.search(s) for s in cpp):
        return _at(calls[0], "no C++ function definition found in the source passed as cpp_sources.")


# --------------------------------------------------------------------------- rules: torch names
def torch_names_are_public_and_harmless(c: _Candidate) -> str | None:
    for node, path in c.torch_references:
        parts = path.split(".")
        if any(p.startswith("_") for p in parts[1:]):
            return _at(node, f"`{path}` is private torch internals; not allowed.")
        if path.startswith(TORCH_DENIED_PREFIXES):
            return _at(node, f"`{path}` is not allowed in a kernel submission.")
        if path in TORCH_MODULES:
            continue
        if parts[1] == "cuda" and path not in c.allowed.torch:
            return _at(node, f"`{path}` is not allowed (CUDA streams, graphs, events and device "
                             "settings are off limits); launch on the current stream.")
        if parts[1] == "utils" and path not in c.allowed.torch:
            return _at(node, f"`{path}` is not allowed; use torch.utils.cpp_extension.load_inline.")


def nn_is_only_the_module_system(c: _Candidate) -> str | None:
    for node, path in c.torch_references:
        parts = path.split(".")
        if path in TORCH_MODULES or parts[1] != "nn":
            continue
        if parts[2] == "functional":
            shown = path.replace("torch.nn.functional", "F")
            return _at(node, f"`{shown}` is a torch compute operator; do the work in your own kernel.")
        if parts[2] not in NN_ALLOWED:
            return _at(node, f"`{path}` is a torch.nn layer; only nn.Module, nn.Parameter, containers and nn.init "
                             "may be used. Hold weights in nn.Parameter and compute with your kernel.")
        if parts[2] == "init" and c.in_forward(node):
            return _at(node, f"`{path}` belongs in __init__, not in the forward pass.")


def forward_calls_only_allowed_torch_functions(c: _Candidate) -> str | None:
    """The forward column of CALLS for torch.* names; __init__ may build parameters freely."""
    for node, path in c.torch_references:
        if path in TORCH_MODULES or path in c.allowed.torch or path.split(".")[1] == "nn":
            continue
        if c.in_forward(node):
            return _at(node, f"`{path}` is a torch compute operator, used in the forward pass; "
                             f"only {c.allowed.forward_rows} are allowed there. Do the work in your own kernel.")
        if not c.is_call_target(node):
            return _at(node, f"`{path}` may only be called (in __init__), not stored.")


# --------------------------------------------------------------------------- rules: forward's tensors
def forward_applies_no_operators_to_tensors(c: _Candidate) -> str | None:
    types = c.types
    for node in c.forward_nodes:
        tensor = types.is_tensor
        if isinstance(node, ast.BinOp) and (tensor(node.left) or tensor(node.right)):
            return _at(node, f"`{_code(node)}` applies a torch operator to a tensor in the forward "
                             "pass; compute it in your kernel (arithmetic on sizes is fine).")
        if isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not) and tensor(node.operand):
            return _at(node, f"`{_code(node)}` applies a torch operator to a tensor in the forward pass.")
        if isinstance(node, ast.Compare) and not all(isinstance(o, (ast.Is, ast.IsNot)) for o in node.ops) \
                and any(tensor(x) for x in [node.left, *node.comparators]):
            return _at(node, f"`{_code(node)}` compares tensors with torch in the forward pass.")
        if isinstance(node, ast.AugAssign) and (tensor(node.target) or tensor(node.value)):
            return _at(node, f"`{_code(node)}` updates a tensor with a torch operator in the forward pass.")
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(t, ast.Subscript) and tensor(t.value):
                    return _at(node, f"`{_code(node)}` writes into a tensor with torch indexing; "
                                     "let the kernel write its output.")
        if isinstance(node, ast.Subscript) and tensor(node.value) and \
                any(tensor(s) for s in c.walk(node.slice) if isinstance(s, ast.expr)):
            return _at(node, f"`{_code(node)}` indexes a tensor with a tensor (a torch gather).")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in BUILTINS_ON_TENSORS and node.func.id not in c.defs and \
                any(tensor(a) for a in [*node.args, *(k.value for k in node.keywords)]):
            return _at(node, f"`{_code(node)}` runs torch operators through the builtin {node.func.id}().")


def forward_calls_only_allowed_tensor_methods(c: _Candidate) -> str | None:
    """The forward column of CALLS for tensor methods and attributes."""
    types = c.types
    for node in c.forward_nodes:
        if isinstance(node, ast.Attribute) and types.is_tensor(node.value) and node.attr not in c.allowed.tensor_names:
            return _at(node, f"`.{node.attr}` on a tensor in the forward pass is torch compute; "
                             f"only {c.allowed.forward_rows} are allowed there.")
        if _is_const_getattr(node) and c.dotted(node) is None and \
                types.kind(node.args[0]) not in (EXT, SCALAR) and \
                not types.is_self(node.args[0]) and node.args[1].value not in c.allowed.tensor_names:
            return _at(node, f"`{_code(node)}` reaches `.{node.args[1].value}` on a possible tensor "
                             "in the forward pass; that is torch compute.")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and c.dotted(node.func) is None:
            func = node.func
            if types.kind(func.value) in (EXT, TENSOR, SCALAR) or types.is_self(func.value):
                continue  # tensors were judged by attribute; ext and scalars may call anything
            if isinstance(func.value, ast.Call) and isinstance(func.value.func, ast.Name) and \
                    func.value.func.id == "super":
                continue
            if func.attr not in c.allowed.tensor_methods and func.attr not in PYTHON_METHODS:
                return _at(node, f"`{_code(node)}`: `.{func.attr}()` may be a torch tensor operator; in the forward "
                                 "pass call only your compiled extension's functions and the allowed calls.")


RULES = (
    no_try_except, no_pass, imports_only_torch_math_typing, no_import_star,
    no_exec_eval_or_dunder_names, no_dunder_attributes, no_computed_getattr,
    no_assignment_into_modules, defines_modelnew_with_forward,
    kernel_source_starts_no_streams_threads_or_processes, kernel_source_calls_only_allowed_torch,
    compiles_a_kernel_inline, torch_names_are_public_and_harmless, nn_is_only_the_module_system,
    forward_calls_only_allowed_torch_functions, forward_applies_no_operators_to_tensors,
    forward_calls_only_allowed_tensor_methods,
)


# --------------------------------------------------------------------------- what the rules read
class _Candidate:
    """The parsed candidate and the facts the rules share: every node and its parent, import
    aliases, function definitions; the forward scope and the tensor types on first use."""

    def __init__(self, tree: ast.Module, language: str):
        self.tree, self.language = tree, language
        self.allowed = allowed()  # the table's lists, as CALLS stands when this candidate is judged
        self.nodes = list(ast.walk(tree))
        self._walks: dict[ast.AST, list[ast.AST]] = {tree: self.nodes}
        self.parent: dict[ast.AST, ast.AST] = {}
        self.defs: dict[str, list[ast.AST]] = {}  # def name -> FunctionDef nodes
        for node in self.nodes:
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.defs.setdefault(node.name, []).append(node)
        self.aliases: dict[str, str] = {}  # local name -> dotted module path
        for node in self.nodes:
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    if a.name != "*":
                        self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
        # `F = torch.nn.functional`, `r = torch.relu`, chains of those: to a fixpoint.
        for _ in range(4):
            for node in self.nodes:
                targets, value = _simple_bindings(node)
                path = self.dotted(value) if value is not None else None
                if path:
                    for t in targets:
                        if isinstance(t, ast.Name):
                            self.aliases[t.id] = path

    def walk(self, node: ast.AST) -> list[ast.AST]:
        if node not in self._walks:
            self._walks[node] = list(ast.walk(node))
        return self._walks[node]

    def dotted(self, node: ast.AST) -> str | None:
        """`t.nn.functional.relu` -> 'torch.nn.functional.relu' through aliases, else None."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        if _is_const_getattr(node):
            base = self.dotted(node.args[0])
            return f"{base}.{node.args[1].value}" if base else None
        return None

    def enclosing_functions(self, node: ast.AST) -> list[ast.AST]:
        """Innermost first."""
        out, cur = [], self.parent.get(node)
        while cur is not None:
            if isinstance(cur, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                out.append(cur)
            cur = self.parent.get(cur)
        return out

    def is_call_target(self, node: ast.AST) -> bool:
        parent = self.parent.get(node)
        return isinstance(parent, ast.Call) and parent.func is node

    @cached_property
    def string_constants(self) -> list[str]:
        return [n.value for n in self.nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)]

    def source_strings(self, call: ast.Call, keyword: str, position: int) -> list[str]:
        """The string literals that reach one load_inline argument, comments removed. Follows names to
        their assignments (`cuda_sources=[src]`, `src = HEAD + r\"\"\"...\"\"\"`), so a kernel named only in
        a docstring or comment does not count."""
        args = [k.value for k in call.keywords if k.arg == keyword]
        if not args and len(call.args) > position:
            args = [call.args[position]]
        out, seen, stack = [], set(), list(args)
        while stack:
            expr = stack.pop()
            for node in self.walk(expr):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    out.append(_CPP_COMMENTS.sub(" ", node.value))
                elif isinstance(node, ast.Name) and node.id not in seen:
                    seen.add(node.id)
                    stack.extend(value for n in self.nodes
                                 for targets, value in [_simple_bindings(n)]
                                 if value is not None and any(
                                     isinstance(t, ast.Name) and t.id == node.id for t in targets))
        return out

    @cached_property
    def torch_references(self) -> list[tuple[ast.AST, str]]:
        """(node, dotted path) of each longest name chain that leads into torch."""
        out = []
        for node in self.nodes:
            if not isinstance(node, (ast.Name, ast.Attribute, ast.Call)):
                continue
            parent = self.parent.get(node)
            if isinstance(parent, ast.Attribute) and parent.value is node:
                continue  # judged as part of the longer chain
            if _is_const_getattr(parent) and parent.args[0] is node:
                continue
            if isinstance(node, ast.Call) and not _is_const_getattr(node):
                continue
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                continue
            path = self.dotted(node)
            if path and path.split(".")[0] == "torch":
                out.append((node, path))
        return out

    @cached_property
    def forward_scope(self) -> tuple[set[ast.AST], set[ast.AST]]:
        """(functions whose torch use counts as the forward pass's work, their roots). Roots:
        forward/backward and other implicitly called dunder methods, decorated functions, lambdas, and
        any function referred to other than by a direct call (stored, passed, returned); then
        everything those call, transitively."""
        scope: set[ast.AST] = set()
        for node in self.nodes:
            if isinstance(node, ast.Lambda):
                scope.add(node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                plain = all(isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod")
                            for d in node.decorator_list)
                implicit = node.name in ("forward", "backward") or (_is_dunder(node.name) and node.name != "__init__")
                if implicit or not plain:
                    scope.add(node)
            elif isinstance(node, ast.Name) and node.id in self.defs and not self.is_call_target(node):
                scope.update(self.defs[node.id])
            elif isinstance(node, ast.Attribute) and node.attr in self.defs and not self.is_call_target(node):
                scope.update(self.defs[node.attr])
            elif _is_const_getattr(node) and node.args[1].value in self.defs:
                scope.update(self.defs[node.args[1].value])
        roots = set(scope)
        frontier = list(scope)
        while frontier:
            fn = frontier.pop()
            for node in self.walk(fn):
                if isinstance(node, ast.Call):
                    name = node.func.id if isinstance(node.func, ast.Name) else (
                        node.func.attr if isinstance(node.func, ast.Attribute) else None)
                    for d in self.defs.get(name, []) if name else []:
                        if d not in scope:
                            scope.add(d)
                            frontier.append(d)
        return scope, roots

    def in_forward(self, node: ast.AST) -> bool:
        scope = self.forward_scope[0]
        return any(f in scope for f in self.enclosing_functions(node))

    @cached_property
    def forward_nodes(self) -> list[ast.AST]:
        return [n for n in self.nodes if self.in_forward(n)]

    @cached_property
    def types(self) -> Types:
        return Types(self)


def _simple_bindings(node: ast.AST) -> tuple[list[ast.AST], ast.AST | None]:
    if isinstance(node, ast.Assign):
        return node.targets, node.value
    if isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
        return [node.target], node.value
    return [], None
