"""Tests for kernel_gate.py: every gate rule passes a clean candidate and fails a broken one for its
reason (including spellings meant to slip past), built-in solutions pass, each row of the table
of what a kernel may call meets the gate (fast) and the harness on the CPU (slow) as it says, and
the harness's op list is the table's aten column."""
import glob
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import kernel_gate
import kernel_verdict
import summarize
from kernel_gate import CALLS, check_format

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CUDA_SRC = '''
cuda_src = r"""
#include <torch/extension.h>
__global__ void k(const float* x, float* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}
torch::Tensor run(torch::Tensor x, torch::Tensor y) {
    k<<<(x.numel() + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());
    return y;
}
"""
ext = load_inline(name="t", cpp_sources="torch::Tensor run(torch::Tensor x, torch::Tensor y);",
                  cuda_sources=cuda_src, functions=["run"])
'''


def candidate(forward="return ext.run(x, torch.empty_like(x))", init="", top="",
              imports="import torch\nimport torch.nn as nn\n"
                      "from torch.utils.cpp_extension import load_inline\n",
              source=CUDA_SRC, extra_methods=""):
    """A small valid CUDA candidate with pieces swapped in."""
    init_lines = textwrap.indent(textwrap.dedent(init), " " * 8) if init else ""
    return (imports + source + textwrap.dedent(top) + "\n\nclass ModelNew(nn.Module):\n"
            "    def __init__(self):\n        super().__init__()\n" + init_lines +
            "\n    def forward(self, x):\n" + textwrap.indent(textwrap.dedent(forward), " " * 8) +
            "\n" + textwrap.indent(textwrap.dedent(extra_methods), "    ") + "\n")


def rejected(code, language="cuda", *words):
    reason = check_format(code, language)
    assert reason is not None, "expected the gate to refuse:\n" + code
    for w in words:
        assert w in reason, (w, reason)
    return reason


def test_clean_candidate_passes():
    assert check_format(candidate()) is None


def test_examples_in_the_prompt_pass_the_gate():
    assert check_format(summarize.EXAMPLE_CUDA, "cuda") is None
    assert check_format(summarize.EXAMPLE_CPP, "cpp") is None


def test_builtin_solutions_pass_the_gate():
    files = sorted(glob.glob(os.path.join(ROOT, "tasks", "level*", "*", "solution_*.py")))
    assert files, "no built-in solutions found under tasks/"
    failures = {}
    for path in files:
        language = "cuda" if path.endswith("solution_cuda.py") else "cpp"
        with open(path) as f:
            reason = check_format(f.read(), language)
        if reason:
            failures[os.path.relpath(path, ROOT)] = reason
    assert not failures, failures


# ---------------------------------------------------------------- torch compute in forward
@pytest.mark.parametrize("forward, why", [
    ("return torch.relu(x)", "`torch.relu` is a torch compute operator"),
    ("return torch.nn.functional.relu(x)", "`F.relu` is a torch compute operator"),
    ("y = ext.run(x, torch.empty_like(x))\nreturn y.sum()", "`.sum` on a tensor"),
    ("return x.matmul(x)", "`.matmul` on a tensor"),
    ("return ext.run(x, torch.empty_like(x)) + 1", "applies a torch operator to a tensor"),
    ("return ext.run(x, torch.empty_like(x)) * x", "applies a torch operator to a tensor"),
    ("return x @ x", "`x @ x` applies a torch operator"),
    ("return -x", "`-x` applies a torch operator"),
    ("return x > 0", "compares tensors"),
    ("y = torch.empty_like(x)\ny += x\nreturn y", "updates a tensor"),
    ("y = torch.empty_like(x)\ny[:] = x\nreturn y", "writes into a tensor"),
    ("return x[x > 0]", "indexes a tensor with a tensor"),
    ("return abs(x)", "through the builtin abs()"),
    ("f = x.sum\nreturn f()", "`.sum` on a tensor"),
    ("y = [x][0]\nreturn y * 2", "applies a torch operator to a tensor"),
    ("return torch.ops.aten.relu(x)", "`torch.ops.aten.relu` is not allowed"),
    ("return torch.Tensor.relu(x)", "`torch.Tensor.relu` is a torch compute operator"),
    ("return x.clamp_min(0)", "`.clamp_min` on a tensor"),
    ("return torch.cat([x, x])", "`torch.cat` is a torch compute operator"),
    ("return x.bool()", "`.bool` on a tensor"),
])
def test_torch_compute_in_forward_is_refused(forward, why):
    rejected(candidate(forward=forward), "cuda", why)


@pytest.mark.parametrize("forward", [
    "n = x.numel()\nblocks = (n + 255) // 256\ny = torch.empty(x.size(0), x.shape[1] * 1)\n"
    "return ext.run(x.contiguous(), y)",
    "b, c = x.shape\nout = x.new_empty((b, c * 2 // 2))\nreturn ext.run(x.view(b, c), out)",
    "y = torch.zeros_like(x)\ny.zero_()\nreturn ext.run(x.reshape(-1), y.view(-1)).view_as(x)",
    "return ext.run(x.to(x.device), torch.empty(x.shape, dtype=torch.float32, device=x.device))",
    "if x.dim() != 2 or x is None:\n    raise ValueError('2-D input expected')\n"
    "return ext.run(x, torch.empty_like(x))",
    # the table's glue (kernel_gate.CALLS): transposes, copies, casts and constant fills
    "return ext.run(x.t().contiguous(), torch.empty_like(x)).T",
    "a, b = x.chunk(2)\nreturn ext.run(torch.permute(a, (1, 0)).clone(), b.new_full(b.shape, -1.0))",
    "return ext.run(x.to(torch.float16), torch.ones_like(x).half()).to(dtype=x.dtype)",
    "y = torch.full((x.size(0),), float('-inf'), device=x.device)\nreturn ext.run(x.float(), y)",
    "y = torch.empty_like(x)\ny.copy_(x.mT.mT)\nreturn ext.run(y.type_as(x), torch.empty_like(x))",
])
def test_allocation_shape_and_scalar_arithmetic_are_allowed(forward):
    assert check_format(candidate(forward=forward)) is None


@pytest.mark.parametrize("imports, forward, why", [
    ("import torch as t\n", "return t.relu(x)", "`torch.relu` is a torch compute operator"),
    ("from torch import relu as r\n", "return r(x)", "`torch.relu` is a torch compute operator"),
    ("from torch import nn as N\n", "return N.functional.relu(x)", "`F.relu`"),
    ("import torch.nn.functional as F\n", "return F.gelu(x)", "`F.gelu`"),
    ("from torch.nn import functional\n", "return functional.relu(x)", "`F.relu`"),
    ("", "F = torch.nn.functional\nreturn F.relu(x)", "`F.relu`"),
    ("", "r = torch.relu\nreturn r(x)", "`torch.relu` is a torch compute operator"),
    ("", 'return getattr(torch, "relu")(x)', "`torch.relu` is a torch compute operator"),
    ("", 'return getattr(torch, "re" + "lu")(x)', "getattr with a computed name"),
    ("", 'return getattr(x, "sum")()', "reaches `.sum` on a possible tensor"),
])
def test_aliases_and_getattr_do_not_slip_past(imports, forward, why):
    base = "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"
    rejected(candidate(forward=forward, imports=base + imports), "cuda", why)


def test_compute_in_helpers_reached_from_forward_is_refused():
    helper_fn = "def _act(t):\n    return torch.relu(t)\n"
    rejected(candidate(forward="return _act(x)", top=helper_fn), "cuda", "`torch.relu`")
    method = "def _post(self, y):\n    return y * 2\n"
    rejected(candidate(forward="return self._post(ext.run(x, torch.empty_like(x)))",
                       extra_methods=method), "cuda", "`y * 2` applies a torch operator")
    # a function stored in __init__ and called later counts as forward code
    rejected(candidate(init="self.act = torch.relu", forward="return self.act(x)"), "cuda",
             "`torch.relu` may only be called (in __init__), not stored")
    rejected(candidate(init="self.act = lambda t: t.clamp(min=0)", forward="return self.act(x)"),
             "cuda", "`.clamp` on a tensor")
    rejected(candidate(forward="return ext.run(x, torch.empty_like(x))",
                       extra_methods="def __add__(self, other):\n    return torch.add(other, 1)\n"),
             "cuda", "`torch.add` is a torch compute operator")


@pytest.mark.parametrize("pieces", [  # each refused for the torch operator or method it hides
    dict(top="def ident(a):\n    return a\n", forward="return ident(x) * 2"),
    dict(forward="d = {'a': x}\nreturn d['a'] * 2"),
    dict(forward="for t in [x]:\n    return t * 2\nreturn x"),
    dict(forward="self.tmp = x\nreturn self.tmp * 2"),
    dict(forward="return (y := x) * 2"),
    dict(forward="a, *rest = [x, x]\nreturn a + rest[0]"),
    dict(forward="return type(x).relu(x)"),
    dict(forward="def g(t):\n    return t.sigmoid()\nreturn g(x)"),
    dict(top="class H:\n    def f(self, t):\n        return t * 2\n", forward="return H().f(x)"),
    dict(top="class A(nn.Module):\n    def forward(self, t):\n        return t.exp()\n",
         forward="return A()(x)"),
    dict(init="self.register_forward_hook(lambda m, i, o: o * 2)"),
    dict(top="def deco(f):\n    return f\n@deco\ndef g(t):\n    return t * 3\n"),
    dict(forward="return getattr(self, 'fn')(x)", extra_methods="def fn(self, t):\n    return t.exp()\n"),
    dict(init="self.w = nn.Parameter(torch.ones(3))", forward="return ext.run(x, self._w())",
         extra_methods="def _w(self):\n    return self.w * 2\n"),
])
def test_laundering_a_tensor_through_python_does_not_slip_past(pieces):
    reason = rejected(candidate(**pieces))
    assert re.search(r"`[^`]+ [*+] [^`]+` applies a torch operator|`\.(relu|sigmoid|exp)` on a tensor",
                     reason), reason


@pytest.mark.parametrize("pieces", [
    dict(forward="N, C = x.shape\nout = torch.empty((N, C * 2 // 2), device=x.device, dtype=x.dtype)\n"
                 "return ext.run(x.contiguous(), out)"),
    dict(init="self.layers = nn.ModuleList([])",
         forward="for layer in self.layers:\n    x = layer(x)\nreturn ext.run(x, torch.empty_like(x))"),
    dict(forward="s = torch.cuda.current_stream().cuda_stream\nreturn ext.run(x, torch.empty_like(x))"),
    dict(forward="assert x.dtype == torch.float32 and x.is_cuda\nif x.numel() == 0:\n    return x\n"
                 "return ext.run(x, torch.empty_like(x))"),
    dict(top="_E = None\ndef _get():\n    global _E\n    if _E is None:\n        _E = ext\n    return _E\n",
         forward="return _get().run(x, torch.empty_like(x))"),
    dict(top="def _grid(n):\n    return (n + 255) // 256\n",
         forward="g = _grid(x.numel())\nreturn ext.run(x, torch.empty_like(x))"),
    dict(init="self.eps = 1e-5", forward="e = self.eps * 2\nreturn ext.run(x, torch.empty_like(x))"),
    dict(forward='return getattr(ext, "run")(x, torch.empty_like(x))'),
    dict(imports="from typing import Optional\nimport math\nimport torch\nimport torch.nn as nn\n"
                 "from torch.utils.cpp_extension import load_inline\n",
         forward="y: Optional[int] = math.ceil(x.numel() / 256)\nreturn ext.run(x, torch.empty_like(x))"),
])
def test_honest_forward_code_passes(pieces):
    assert check_format(candidate(**pieces)) is None


@pytest.mark.parametrize("snippet, refused_for", [
    ("return torch::matmul(x, y);", "calls torch::matmul(), a torch compute operator"),
    ("return at::relu(x);", "calls at::relu()"),
    ("return torch::nn::functional::relu(x);", "calls torch::nn::functional::relu()"),
    ("return x.sum();", "calls .sum(), a torch tensor operator"),
    ("return x.matmul(y);", "calls .matmul()"),
    ("return torch::cat({x, y});", "calls torch::cat()"),
    ("return x.index({0});", "calls .index()"),
    ("auto s = at::cuda::getCurrentCUDAStream();", None),
    ("auto o = torch::empty({x.numel()}, x.options());", None),
    ("// torch::relu(x) would be the easy way", None),
    ("std::vector<int64_t> v; v.push_back(1);", None),
    # the table's glue (kernel_gate.CALLS): transposes, copies, casts and constant fills
    ("auto t = x.t().contiguous(); auto p = x.transpose(0, 1).permute({1, 0});", None),
    ("auto c = x.clone(); y.copy_(c);", None),
    ("auto h = x.to(torch::kHalf).to(x); auto b = x.toType(torch::kBFloat16);", None),
    ("auto a = torch::full({4}, -INFINITY, x.options()); auto o = torch::ones_like(x);", None),
])
def test_torch_compute_called_from_the_kernel_source(snippet, refused_for):
    source = CUDA_SRC.replace("    return y;\n}", "    " + snippet + "\n    return y;\n}")
    assert source != CUDA_SRC
    reason = check_format(candidate(source=source))
    if refused_for is None:
        assert reason is None, reason
    else:
        assert reason is not None and refused_for in reason, reason


def test_torch_in_init_for_parameters_is_allowed():
    init = ("self.w = nn.Parameter(torch.randn(4, 4) * 0.02)\n"
            "nn.init.kaiming_uniform_(self.w, a=math.sqrt(5))\n"
            "self.register_buffer('b', torch.zeros(4))\n"
            "self.blocks = nn.ModuleList([])\nself._reset()\n")
    reset = "def _reset(self):\n    with torch.no_grad():\n        self.w.mul_(0.5)\n"
    code = candidate(init=init, extra_methods=reset,
                     imports="import math\nimport torch\nimport torch.nn as nn\n"
                             "from torch.utils.cpp_extension import load_inline\n")
    assert check_format(code) is None
    # ...but the forward pass may not use the stored parameter with torch compute
    rejected(code.replace("return ext.run(x, torch.empty_like(x))",
                          "return ext.run(x, torch.empty_like(x)) + self.b"), "cuda",
             "applies a torch operator to a tensor")


# ---------------------------------------------------------------- torch.nn
@pytest.mark.parametrize("init, ok", [
    ("self.lin = nn.Linear(4, 4)", False),
    ("self.act = nn.ReLU()", False),
    ("self.conv = torch.nn.modules.conv.Conv2d(3, 3, 3)", False),
    ("self.w = nn.Parameter(torch.empty(3))\nnn.init.zeros_(self.w)", True),
    ("self.ps = nn.ParameterList([nn.Parameter(torch.empty(2))])", True),
])
def test_nn_only_module_parameter_containers_init(init, ok):
    reason = check_format(candidate(init=init))
    assert (reason is None) == ok, reason


# ---------------------------------------------------------------- syntax rules
def test_try_except_and_pass_are_refused():
    rejected(candidate(forward="try:\n    return ext.run(x, torch.empty_like(x))\n"
                               "except RuntimeError:\n    return x"), "cuda", "try/except")
    rejected(candidate(init="if False:\n    pass"), "cuda", "pass")


@pytest.mark.parametrize("imports", ["import os\n", "import sys\n", "import subprocess\n",
                                     "from ctypes import CDLL\n", "import importlib\n",
                                     "import numpy as np\n", "import threading\n",
                                     "import gc\n", "import inspect\n", "from . import x\n"])
def test_imports_beyond_torch_and_math_are_refused(imports):
    base = "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"
    rejected(candidate(imports=base + imports), "cuda", "import")


@pytest.mark.parametrize("top, why", [
    ("exec('import os')", "`exec` is not allowed"), ("eval('1')", "`eval` is not allowed"),
    ("compile('1', 'f', 'eval')", "`compile` is not allowed"),
    ("__import__('os')", "`__import__` is not allowed"),
    ("name = 'relu'\nf = getattr(torch, name)", "getattr with a computed name"),
    ("torch.relu = lambda t: t", "assigning into the module `torch`"),
    ("torch.backends.cudnn.allow_tf32 = True", "assigning into the module `torch.backends.cudnn`"),
    ("nn.functional.relu = None", "assigning into the module `torch.nn.functional`"),
    ("s = torch.cuda.Stream()", "`torch.cuda.Stream` is not allowed"),
    ("g = torch.cuda.CUDAGraph()", "`torch.cuda.CUDAGraph` is not allowed"),
    ("torch.cuda.synchronize()", "`torch.cuda.synchronize` is not allowed"),
    ("x = ().__class__.__base__", "the attribute `__"),
    ("globals()['torch'] = None", "`globals` is not allowed"),
    ("setattr(torch, 'relu', None)", "`setattr` is not allowed"),
    ("torch.set_num_threads(1)", "`torch.set_num_threads` is not allowed"),
    ("torch.utils.cpp_extension.load(name='a', sources=['a.cpp'])",
     "`torch.utils.cpp_extension.load` is not allowed"),
    ("def f():\n    import os as o\n    return o", "importing `os` is not allowed"),
])
def test_attacker_only_constructs_are_refused(top, why):
    rejected(candidate(top=top), "cuda", why)


@pytest.mark.parametrize("snippet, why", [
    ("cudaStream_t s; cudaStreamCreate(&s);", "creates a CUDA stream"),
    ("cudaGraph_t g;", "uses CUDA graphs"), ("std::thread t([]{});", "starts threads"),
    ("system(\\\"rm -rf /\\\");", "starts processes")])
def test_streams_graphs_threads_in_kernel_source_are_refused(snippet, why):
    source = CUDA_SRC.replace("return y;\n}", snippet + "\n    return y;\n}")
    assert source != CUDA_SRC
    rejected(candidate(source=source), "cuda", why)


# ---------------------------------------------------------------- kernel presence
def test_cuda_needs_global_kernel_and_cuda_sources():
    rejected(candidate(source=CUDA_SRC.replace("__global__", "__device__")), "cuda", "__global__")
    rejected(candidate(source=CUDA_SRC.replace("cuda_sources=cuda_src,", "")), "cuda",
             "cuda_sources")
    # a __global__ mentioned only in a docstring or a C++ comment is no kernel
    no_kernel = CUDA_SRC.replace("__global__", "__device__").replace(
        "#include <torch/extension.h>", "#include <torch/extension.h>\n// a __global__ kernel")
    rejected('"""Uses a __global__ kernel."""\n' + candidate(source=no_kernel), "cuda", "__global__")
    # sources reached through names, lists and concatenation count
    split = CUDA_SRC.replace('cuda_src = r"""', 'HEAD = "#include <cuda_runtime.h>\\n"\n'
                             'cuda_src = HEAD + r"""').replace("cuda_sources=cuda_src",
                                                            "cuda_sources=[cuda_src]")
    assert split != CUDA_SRC and check_format(candidate(source=split)) is None
    rejected("import torch\nimport torch.nn as nn\nclass ModelNew(nn.Module):\n"
             "    def forward(self, x):\n        return x\n", "cuda", "load_inline")


def test_cpp_needs_a_cpp_function_and_no_cuda():
    assert check_format(summarize.EXAMPLE_CPP, "cpp") is None
    rejected(summarize.EXAMPLE_CUDA, "cpp", "cuda_sources")
    declaration_only = summarize.EXAMPLE_CPP.split('cpp_source = r"""')[0] + (
        'cpp_source = "torch::Tensor add(torch::Tensor a, torch::Tensor b);"\n' +
        summarize.EXAMPLE_CPP.split('"""\n', 2)[-1])
    rejected(declaration_only, "cpp", "C++ function")


def test_modelnew_and_forward_required():
    rejected(candidate().replace("class ModelNew", "class Model2"), "cuda", "ModelNew")
    rejected(candidate().replace("def forward", "def fwd"), "cuda", "forward")


def test_oversized_code_is_refused_before_parsing():
    code = candidate() + "\n# padding\n" * 20000
    assert "over the limit" in check_format(code, "cuda")
    assert check_format(code, "cuda", max_code_chars=len(code)) is None


def test_bad_input():
    assert "not valid Python" in check_format("def (:\n", "cuda")
    assert check_format("", "cuda")
    with pytest.raises(ValueError, match="language"):
        check_format(candidate(), "triton")


# ---------------------------------------------------------------- the table of what a kernel may call
def _name(spelling):
    """torch.nn.functional.relu -> relu, x.view() -> view, at::cuda::CUDAGuard -> CUDAGuard."""
    return re.split(r"\.|::", spelling.removesuffix("()"))[-1]


@pytest.mark.parametrize("row, spelling", [(r, s) for r in CALLS for s in r.python],
                         ids=[s for r in CALLS for s in r.python])
def test_each_forward_spelling_of_the_table_meets_the_gate(row, spelling):
    use = spelling if spelling.startswith("x.") else spelling + "()"
    reason = check_format(candidate(forward=f"_probe = {use}\nreturn ext.run(x, torch.empty_like(x))"))
    if row.forward:
        assert reason is None, (row.what, reason)
    else:
        assert reason is not None and _name(spelling) in reason, (row.what, reason)


@pytest.mark.parametrize("row, spelling", [(r, s) for r in CALLS for s in r.cpp],
                         ids=[s for r in CALLS for s in r.cpp])
def test_each_host_spelling_of_the_table_meets_the_gate(row, spelling):
    use = spelling if spelling.startswith("x.") else spelling + "()"
    source = CUDA_SRC.replace("    return y;\n}", f"    auto probe = {use};\n    return y;\n}}")
    assert source != CUDA_SRC
    reason = check_format(candidate(source=source))
    if row.host:
        assert reason is None, (row.what, reason)
    else:
        assert reason is not None and _name(spelling) in reason, (row.what, reason)


def test_every_row_says_why_and_the_harness_accepts_exactly_the_allowed_rows_ops():
    assert all(row.why and row.python and row.cpp for row in CALLS)
    assert not any(row.aten for row in CALLS if not (row.forward or row.host))
    allowed = [f"aten::{op}" for row in CALLS if row.forward for op in row.aten]
    refused = ["aten::relu", "aten::mm", "aten::cat", "aten::gather", "aten::arange", "aten::lift_fresh"]
    assert kernel_verdict.flag_ops(allowed + refused + ["myext::fused"]) == sorted(refused)


def test_transposes_copies_casts_and_fills_are_allowed_alike_by_prompt_gate_and_harness():
    rows = {row.what: row for row in CALLS}
    for what, spelled, ops in [("transposes", ("x.t()", "x.permute()"), ("t", "transpose", "permute")),
                               ("copies", ("x.clone()", "x.copy_()"), ("clone", "copy_")),
                               ("casts and device moves", ("x.to()", "x.half()"), ("_to_copy",)),
                               ("constant fills", ("torch.ones", "torch.full", "x.new_full()"),
                                ("ones", "full", "new_ones", "new_full"))]:
        row = rows[what]
        assert row.forward and row.host and set(spelled) <= set(row.python), what
        assert all(s in kernel_gate.describe_calls() for s in spelled), what
        assert kernel_verdict.flag_ops([f"aten::{op}" for op in ops]) == [], what


def test_one_row_edited_in_a_copy_of_the_table_changes_the_prompt_the_gate_and_the_op_check(monkeypatch):
    """CALLS is the only place a call's rule is written: refuse one row (transposes) in a copy of the
    table, and the prompt's rules, the gate's lists and decision, and the harness's op check all follow."""
    import dataclasses

    transposing = candidate(forward="return ext.run(x.t(), torch.empty_like(x))")
    ops = ["aten::t", "aten::transpose", "aten::permute"]

    def where_transposes_are(text):  # among the allowed calls, or after "Anything else ... scores 0"
        return "refused" if text.index("transposes (") > text.index("Anything else") else "allowed"

    before = summarize.base_instruction("cuda")
    assert where_transposes_are(before) == "allowed"
    assert {"torch.transpose", "torch.permute"} <= kernel_gate.allowed().torch
    assert {"t", "transpose", "permute"} <= kernel_gate.allowed().tensor_methods
    assert check_format(transposing) is None and kernel_verdict.flag_ops(ops) == []

    edited = tuple(dataclasses.replace(row, forward=False, host=False) if row.what == "transposes" else row
                   for row in CALLS)
    monkeypatch.setattr(kernel_gate, "CALLS", edited)
    after = summarize.base_instruction("cuda")
    assert where_transposes_are(after) == "refused" and after != before
    assert not {"torch.transpose", "torch.permute"} & kernel_gate.allowed().torch
    assert not {"t", "transpose", "permute"} & kernel_gate.allowed().tensor_methods
    assert "transpose" in kernel_gate.allowed().cpp_methods_denied  # the host code's denylist grows
    reason = check_format(transposing)
    assert "`.t`" in reason and "transposes" not in reason  # the refusal names the rows still allowed
    assert kernel_verdict.flag_ops(ops) == sorted(ops)


# Each row judged by the harness on the CPU: a candidate makes the row's calls in forward and in
# its C++ host code around the reference's work (relu(x) * scale + x), so an allowed row must be
# "correct" and a refused one "incorrect" for its operators. Two builds: the allowed rows' host
# functions in one extension, the refused rows' in another.
_KERNEL = r"""
#include <torch/extension.h>
#include <ATen/ceil_div.h>

static torch::Tensor kernel(const torch::Tensor& x, double scale) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    const float* in = xc.data_ptr<float>();
    float* out = y.data_ptr<float>();
    for (int64_t i = 0; i < xc.numel(); ++i) {
        float v = in[i];
        out[i] = (v > 0.f ? v : 0.f) * (float)scale + v;
    }
    return y;
}

torch::Tensor kernel_only(torch::Tensor x, double scale) { return kernel(x, scale); }
"""
HOST_CALLS = {  # per row: C++ host code run before the kernel
    "allocation": """
    auto a = torch::empty({4}, x.options()); auto b = torch::empty_like(x);
    auto c = torch::empty_strided({2, 2}, {2, 1}, x.options()); auto d = torch::zeros({3}, x.options());
    auto e = torch::zeros_like(x); float buffer[4] = {1, 2, 3, 4};
    auto f = torch::from_blob(buffer, {4}); f.zero_(); a.resize_({8});""",
    "constant fills": """
    auto a = torch::ones({3}, x.options()); auto b = torch::ones_like(x);
    auto c = torch::full({2}, 1.5, x.options()); auto d = torch::full_like(x, 2.0);
    auto e = x.new_ones({3}); auto f = x.new_full({2}, 1.5); a.fill_(0.5);""",
    "views": """
    auto a = torch::reshape(x, {-1}); auto b = torch::flatten(x);
    auto c = torch::squeeze(torch::unsqueeze(x, 0), 0); auto d = torch::narrow(x, 0, 0, 2);
    auto e = torch::select(x, 0, 1); auto f = torch::split(x, 2); auto g = torch::chunk(x, 2);
    auto h = torch::unbind(x, 0); auto i = x.view({-1}).view_as(x).reshape({-1}).flatten();
    auto j = x.unsqueeze(0).squeeze(0).narrow(1, 0, 4).select(0, 0).slice(0, 0, 2);
    auto k = x.slice(0, 0, 1).expand({4, -1}).expand_as(x.narrow(0, 0, 4));
    auto l = x.split(2); auto m = x.chunk(2); auto n = x.unbind(0);
    auto o = x.detach().as_strided({2, 2}, {1, 1}); auto p = torch::empty({0}, x.options()); p.set_(x);""",
    "transposes": """
    auto a = torch::t(x); auto b = torch::transpose(x, 0, 1); auto c = torch::permute(x, {1, 0});
    auto d = x.t().transpose(0, 1).permute({1, 0});""",
    "copies": """
    auto a = x.t().contiguous(); auto b = x.clone(); auto c = torch::clone(x);
    auto d = torch::empty_like(x); d.copy_(x);""",
    "casts and device moves": """
    auto a = x.to(torch::kFloat64); auto b = x.toType(torch::kFloat16); auto c = x.to(torch::kBFloat16);
    auto d = x.to(x.device(), torch::kFloat16).to(x); auto e = x.cpu();""",
    "sizes and metadata": """
    int64_t n = x.size(0) + x.sizes()[1] + x.dim() + x.numel() + x.stride(0) + x.strides()[1];
    auto one = x.select(0, 0).select(0, 0); float first = one.item<float>(); bool nz = one.is_nonzero();
    const float* p = x.data_ptr<float>(); auto opts = x.options(); auto dev = x.device();
    bool flags = x.is_contiguous() && x.scalar_type() == torch::kFloat32 && !x.is_cuda() && x.element_size() == 4;""",
    "options, dtypes and devices": """
    auto o = torch::TensorOptions().dtype(torch::kFloat32).device(torch::Device(torch::kCPU));
    auto o2 = torch::dtype(torch::kFloat32); auto o3 = torch::device(torch::kCPU);
    auto o4 = torch::requires_grad(false); auto o5 = torch::layout(torch::kStrided);
    auto a = torch::empty({2}, o2.memory_format(torch::MemoryFormat::Contiguous));
    torch::Scalar s(1.0); torch::IntArrayRef shape = x.sizes(); torch::ScalarType st = torch::ScalarType::Float;
    torch::Half h(1.0f); torch::BFloat16 bh(1.0f); torch::optional<int64_t> maybe; torch::Tensor same = x;""",
    "the device, its current stream and the CPU threads": """
    int64_t threads = at::get_num_threads(); int64_t blocks = at::ceil_div(x.numel(), (int64_t)256);
    c10::DeviceGuard guard(x.device()); c10::OptionalDeviceGuard maybe_guard;
    at::parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) { (void)begin; (void)end; });""",
    # refused rows
    "compute": """
    auto a = x.relu(); auto b = torch::matmul(x, x.t());""",
    "data-building operators": """
    auto a = torch::cat({x, x}); auto b = x.flip({0});""",
    "new values on every call": """
    auto a = torch::arange(3);""",
}
FORWARD_CALLS = {  # per row: forward's calls before `return ext.<row's function>(x, self.scale)`
    "allocation": """
        a, b = torch.empty(4, device=x.device), torch.empty_like(x)
        c, d, e = torch.empty_strided((2, 2), (2, 1)), torch.zeros(3), torch.zeros_like(x)
        f, g = x.new_empty(3), x.new_empty_strided((2, 2), (2, 1))
        h = x.new_zeros(3).zero_()""",
    "constant fills": """
        a, b = torch.ones(3), torch.ones_like(x)
        c, d = torch.full((2,), 1.5), torch.full_like(x, 2.0)
        e, f, g = x.new_ones(3), x.new_full((2,), 1.5), torch.empty(3).fill_(1.0)""",
    "views": """
        a, b, c = torch.reshape(x, (-1,)), torch.flatten(x), torch.squeeze(torch.unsqueeze(x, 0), 0)
        d, e = torch.narrow(x, 0, 0, 2), torch.select(x, 0, 1)
        f, g, h = torch.split(x, 2), torch.chunk(x, 2), torch.unbind(x)
        i = x.view(-1).view_as(x).reshape(-1).reshape_as(x).flatten().unflatten(0, (64, -1))
        j = x.unsqueeze(0).squeeze(0).narrow(0, 0, 2).select(0, 1)
        k = x[:1].expand(4, -1).expand_as(x[:4])
        l, m, n = x.split(2), x.chunk(2), x.unbind(0)
        o, p, q = x.detach().requires_grad_(False), x.data, x[0, 1:]""",
    "transposes": """
        a, b, c = torch.t(x), torch.transpose(x, 0, 1), torch.permute(x, (1, 0))
        d = x.t().transpose(0, 1).permute(1, 0).T.mT""",
    "copies": """
        a, b, c = x.t().contiguous(), x.clone(), torch.clone(x)
        d = torch.empty_like(x)
        d.copy_(x)""",
    "casts and device moves": """
        a, b = x.to(torch.float16), x.to(dtype=torch.float64).type_as(x)
        c, d, e = x.half().float(), x.double(), x.bfloat16()
        f, g, h = x.int(), x.long(), x.to(x.device).cpu()""",
    "sizes and metadata": """
        n = x.size(0) + x.dim() + x.numel() + x.stride(0) + x.element_size() + x.storage_offset()
        n += x.nelement() + x.ndimension() + x.get_device() + x.shape[0] + x.ndim
        first, pointer, flags = x[0, 0].item(), x.data_ptr(), x.is_contiguous()
        facts = (x.dtype, x.device, x.is_cuda, x.layout, x.requires_grad, x.is_leaf)""",
    "options, dtypes and devices": """
        s, d = torch.Size([2]), torch.device("cpu")
        facts = (torch.get_default_dtype(), torch.is_tensor(x))""",
    "the device, its current stream and the CPU threads": """
        facts = (torch.cuda.is_available(), torch.cuda.device_count())
        with torch.no_grad(), torch.inference_mode():
            y = CALL
        return y""",
    # refused rows
    "compute": """
        a = torch.relu(x)
        b = x.sum()""",
    "data-building operators": """
        a = torch.cat([x, x])""",
    "new values on every call": """
        a = torch.tensor([1.0, 2.0])
        b = torch.arange(3)""",
}
# spellings the CPU harness cannot run (no CUDA device), the module-level compiler call every
# candidate makes, and a name the gate allows that C++ code rarely spells
NOT_RUN_ON_CPU = {"x.cuda()", "torch.cuda.current_device", "torch.cuda.current_stream",
                  "torch.cuda.get_device_properties", "torch.cuda.get_device_capability",
                  "torch.utils.cpp_extension.load_inline", "at::cuda::getCurrentCUDAStream",
                  "at::cuda::getCurrentDeviceProperties", "at::cuda::getDeviceProperties",
                  "at::cuda::current_device", "at::cuda::CUDAGuard", "at::cuda::OptionalCUDAGuard",
                  "x.record_stream()", "torch::check"}


def _key(row):
    return "compute" if row.what.startswith("torch compute") else row.what


def _spelled_in(spelling, text):
    name = re.escape(_name(spelling))
    if spelling.startswith("torch."):
        pattern = re.escape(spelling) + r"\b"
    elif "::" in spelling:
        pattern = rf"::{name}\b"
    elif spelling.endswith("()"):
        pattern = rf"[.>]{name}\s*(<[^<>]*>)?\("
    else:
        pattern = rf"\.{name}\b(?!\()"
    return re.search(pattern, text) is not None


def _extension(allowed):
    rows = [r for r in CALLS if r.forward == allowed]
    functions = [f"row_{CALLS.index(r)}" for r in rows]
    cpp = _KERNEL + "".join(f"\ntorch::Tensor row_{CALLS.index(r)}(torch::Tensor x, double scale) "
                            f"{{{HOST_CALLS[_key(r)]}\n    return kernel(x, scale);\n}}\n" for r in rows)
    name = "calls_allowed" if allowed else "calls_refused"
    return (f"ext = load_inline(name={name!r}, cpp_sources=[r'''{cpp}'''],\n"
            f"                 functions={['kernel_only'] + functions!r})\n")


def harness_candidate(row, forward=True, host=True):
    """A C++ candidate making `row`'s forward calls and / or its host calls."""
    call = f"ext.row_{CALLS.index(row)}(x, self.scale)" if host else "ext.kernel_only(x, self.scale)"
    body = textwrap.dedent(FORWARD_CALLS[_key(row)]).strip("\n") if forward else ""
    body = body.replace("CALL", call) if "CALL" in body else body + f"\nreturn {call}"
    return ("import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
            + _extension(row.forward) + "\n\nclass ModelNew(nn.Module):\n    def __init__(self, scale):\n"
            "        super().__init__()\n        self.scale = scale\n\n    def forward(self, x):\n"
            + textwrap.indent(body.strip("\n"), " " * 8) + "\n")


def test_the_harness_candidates_make_every_call_of_their_row_and_allowed_ones_pass_the_gate():
    for row in CALLS:
        forward, host = textwrap.dedent(FORWARD_CALLS[_key(row)]), HOST_CALLS[_key(row)]
        missing = [s for s in row.python if s not in NOT_RUN_ON_CPU and not _spelled_in(s, forward)]
        missing += [s for s in row.cpp if s not in NOT_RUN_ON_CPU and not _spelled_in(s, host)]
        if row.forward or row.host:  # refused rows list examples: one of each column is enough
            assert not missing, (row.what, missing)
            assert check_format(harness_candidate(row), "cpp") is None, row.what
        else:
            assert any(_spelled_in(s, forward) for s in row.python), row.what
            assert any(_spelled_in(s, host) for s in row.cpp), row.what


@pytest.mark.slow
def test_each_row_of_the_table_against_the_harness_on_the_cpu():
    import kernel_eval
    reference = open(os.path.join(ROOT, "tests", "adversarial", "reference.py")).read()
    cases = [(row, True, True) for row in CALLS if row.forward and row.host]
    cases += [(row, forward, not forward) for row in CALLS if not row.forward for forward in (True, False)]
    # outside the boundary: the 15 candidates share two extensions, which confined candidates would each
    # build (15 builds instead of 2: 306 s instead of 84 on the 2-core box); the gate, not the boundary, is tested
    results = kernel_eval.evaluate_batch([(reference, harness_candidate(*case)) for case in cases],
                                         device="cpu", time_candidate=False, n_correct_trials=2, sandbox="off",
                                         load_timeout_s=300, check_timeout_s=120)
    for (row, forward, host), result in zip(cases, results):
        where = f"{row.what} ({'forward' if forward else ''}{' host' if host else ''})"
        if row.forward:
            assert result.status == "correct", (where, result.status, result.message)
        else:
            assert result.status == "incorrect", (where, result.status, result.message)
            assert "forward ran torch compute operators" in result.message, (where, result.message)
            assert set(FLAGGED[_key(row), forward]) <= set(result.ops), (where, result.ops)


FLAGGED = {  # what the harness names for each refused row's calls (FORWARD_CALLS, HOST_CALLS)
    ("compute", True): ["aten::relu", "aten::sum"], ("compute", False): ["aten::relu", "aten::mm"],
    ("data-building operators", True): ["aten::cat"],
    ("data-building operators", False): ["aten::cat", "aten::flip"],
    ("new values on every call", True): ["aten::lift_fresh", "aten::arange"],
    ("new values on every call", False): ["aten::arange"],
}


def test_imports_with_only_the_standard_library(tmp_path):
    """Copied with its type inference (kernel_types.py) into an empty folder, the gate judges without
    torch or another project module."""
    for name in ("kernel_gate.py", "kernel_types.py"):
        shutil.copy(os.path.join(ROOT, name), tmp_path)
    (tmp_path / "ok.py").write_text(summarize.EXAMPLE_CPP)
    (tmp_path / "torch_compute.py").write_text(candidate(forward="return torch.relu(x)"))
    out = subprocess.run([sys.executable, "-S", "-E", "-c",
                          "import kernel_gate, sys; "
                          "print(kernel_gate.check_format(open('ok.py').read(), 'cpp')); "
                          "print(kernel_gate.check_format(open('torch_compute.py').read(), 'cuda')); "
                          "assert set(sys.modules) & {'torch', 'rewards', 'summarize'} == set()"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    ok, refused = out.stdout.strip().split("\n")
    assert ok == "None" and "`torch.relu` is a torch compute operator" in refused, out.stdout
