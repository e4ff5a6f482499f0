"""Tests for rewards.py: every gate rule passes a clean candidate and fails a broken one
(including spellings meant to slip past), built-in solutions pass, scores and returns
match hand-computed values."""
import glob
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import summarize
from rewards import check_format, discounted_returns, kernel_score, length_penalty, turn_score

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
@pytest.mark.parametrize("forward", [
    "return torch.relu(x)",
    "return torch.nn.functional.relu(x)",
    "y = ext.run(x, torch.empty_like(x))\nreturn y.sum()",
    "return x.matmul(x)",
    "return ext.run(x, torch.empty_like(x)) + 1",
    "return ext.run(x, torch.empty_like(x)) * x",
    "return x @ x",
    "return -x",
    "return x > 0",
    "y = torch.empty_like(x)\ny += x\nreturn y",
    "y = torch.empty_like(x)\ny[:] = x\nreturn y",
    "return x[x > 0]",
    "return abs(x)",
    "return x.to(torch.float16)",
    "return x.half()",
    "return x.t().contiguous()",
    "f = x.sum\nreturn f()",
    "y = [x][0]\nreturn y * 2",
    "return torch.ops.aten.relu(x)",
    "return torch.Tensor.relu(x)",
    "return x.clamp_min(0)",
])
def test_torch_compute_in_forward_is_refused(forward):
    rejected(candidate(forward=forward))


@pytest.mark.parametrize("forward", [
    "n = x.numel()\nblocks = (n + 255) // 256\ny = torch.empty(x.size(0), x.shape[1] * 1)\n"
    "return ext.run(x.contiguous(), y)",
    "b, c = x.shape\nout = x.new_empty((b, c * 2 // 2))\nreturn ext.run(x.view(b, c), out)",
    "y = torch.zeros_like(x)\ny.zero_()\nreturn ext.run(x.reshape(-1), y.view(-1)).view_as(x)",
    "return ext.run(x.to(x.device), torch.empty(x.shape, dtype=torch.float32, device=x.device))",
    "if x.dim() != 2 or x is None:\n    raise ValueError('2-D input expected')\n"
    "return ext.run(x, torch.empty_like(x))",
])
def test_allocation_shape_and_scalar_arithmetic_are_allowed(forward):
    assert check_format(candidate(forward=forward)) is None


@pytest.mark.parametrize("imports, forward", [
    ("import torch as t\n", "return t.relu(x)"),
    ("from torch import relu as r\n", "return r(x)"),
    ("from torch import nn as N\n", "return N.functional.relu(x)"),
    ("import torch.nn.functional as F\n", "return F.gelu(x)"),
    ("from torch.nn import functional\n", "return functional.relu(x)"),
    ("", "F = torch.nn.functional\nreturn F.relu(x)"),
    ("", "r = torch.relu\nreturn r(x)"),
    ("", 'return getattr(torch, "relu")(x)'),
    ("", 'return getattr(torch, "re" + "lu")(x)'),
    ("", 'return getattr(x, "sum")()'),
])
def test_aliases_and_getattr_do_not_slip_past(imports, forward):
    base = "import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n"
    rejected(candidate(forward=forward, imports=base + imports))


def test_compute_in_helpers_reached_from_forward_is_refused():
    helper_fn = "def _act(t):\n    return torch.relu(t)\n"
    rejected(candidate(forward="return _act(x)", top=helper_fn))
    method = "def _post(self, y):\n    return y * 2\n"
    rejected(candidate(forward="return self._post(ext.run(x, torch.empty_like(x)))",
                       extra_methods=method))
    # a function stored in __init__ and called later counts as forward code
    rejected(candidate(init="self.act = torch.relu", forward="return self.act(x)"))
    rejected(candidate(init="self.act = lambda t: t.clamp(min=0)", forward="return self.act(x)"))
    rejected(candidate(forward="return ext.run(x, torch.empty_like(x))",
                       extra_methods="def __add__(self, other):\n    return torch.add(other, 1)\n"))


@pytest.mark.parametrize("pieces", [
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
    rejected(candidate(**pieces))


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


@pytest.mark.parametrize("snippet, ok", [
    ("return torch::matmul(x, y);", False),
    ("return at::relu(x);", False),
    ("return torch::nn::functional::relu(x);", False),
    ("return x.sum();", False),
    ("return x.matmul(y);", False),
    ("auto s = at::cuda::getCurrentCUDAStream();", True),
    ("auto o = torch::empty({x.numel()}, x.options());", True),
    ("// torch::relu(x) would be the easy way", True),
    ("std::vector<int64_t> v; v.push_back(1);", True),
])
def test_torch_compute_called_from_the_kernel_source(snippet, ok):
    source = CUDA_SRC.replace("    return y;\n}", "    " + snippet + "\n    return y;\n}")
    assert source != CUDA_SRC
    reason = check_format(candidate(source=source))
    assert (reason is None) == ok, reason


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
                          "return ext.run(x, torch.empty_like(x)) + self.b"))


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


@pytest.mark.parametrize("top", [
    "exec('import os')", "eval('1')", "compile('1', 'f', 'eval')", "__import__('os')",
    "name = 'relu'\nf = getattr(torch, name)", "torch.relu = lambda t: t",
    "torch.backends.cudnn.allow_tf32 = True", "nn.functional.relu = None",
    "s = torch.cuda.Stream()", "g = torch.cuda.CUDAGraph()", "torch.cuda.synchronize()",
    "x = ().__class__.__base__", "globals()['torch'] = None", "setattr(torch, 'relu', None)",
    "torch.set_num_threads(1)", "torch.utils.cpp_extension.load(name='a', sources=['a.cpp'])",
    "def f():\n    import os as o\n    return o",
])
def test_attacker_only_constructs_are_refused(top):
    rejected(candidate(top=top))


@pytest.mark.parametrize("snippet", ["cudaStream_t s; cudaStreamCreate(&s);",
                                     "cudaGraph_t g;", "std::thread t([]{});",
                                     "system(\\\"rm -rf /\\\");"])
def test_streams_graphs_threads_in_kernel_source_are_refused(snippet):
    source = CUDA_SRC.replace("return y;\n}", snippet + "\n    return y;\n}")
    assert source != CUDA_SRC
    rejected(candidate(source=source))


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


# ---------------------------------------------------------------- scores and returns
def test_kernel_score_hand_values():
    assert kernel_score({"correct": True, "speedup": 1.85}) == pytest.approx(2.15)
    assert kernel_score({"correct": False, "speedup": 0.0}) == 0.0
    assert kernel_score({"correct": True, "speedup": 9.0}, speedup_cap=4.0) == pytest.approx(4.3)
    assert kernel_score({"correct": True, "speedup": 2.0}, correctness_weight=1.0) == 3.0

    class Result:  # an EvalResult look-alike
        correct, speedup = True, 0.5
    assert kernel_score(Result()) == pytest.approx(0.8)
    with pytest.raises(KeyError, match="speedup"):
        kernel_score({"correct": True})


@pytest.mark.parametrize("speedup", [float("inf"), float("nan"), -1.0, None, 1e308 * 10])
def test_untrustworthy_speedups_pay_correctness_alone_and_never_raise(speedup):
    # 5e-324 ms claimed by a candidate gives ref_ms / 5e-324 = inf: training must go on.
    import kernel_eval
    result = kernel_eval.EvalResult(status="correct", compiled=True, correct=True, speedup=speedup)
    assert kernel_score(result) == pytest.approx(0.3)
    assert kernel_score(result, speedup_cap=4.0) == pytest.approx(0.3)
    returns = discounted_returns([kernel_score(result), 0.0, kernel_score(result)], gamma=0.4)
    assert returns == pytest.approx([0.3 + 0.4 * 0.4 * 0.3, 0.4 * 0.3, 0.3])
    assert kernel_score({"correct": False, "speedup": speedup}) == 0.0


def test_turn_score():
    good = {"correct": True, "speedup": 1.0}
    assert turn_score(None, None, good) == pytest.approx(1.3)
    assert turn_score("no code", None, good) == 0.0
    assert turn_score(None, "uses torch.relu", good) == 0.0


def test_discounted_returns_hand_values():
    s = [0.0, 1.3, 0.0, 2.0]
    # sum: R3 = 2; R2 = 0 + .4*2 = .8; R1 = 1.3 + .4*.8 = 1.62; R0 = .4*1.62 = .648
    assert discounted_returns(s, 0.4, "sum") == pytest.approx([0.648, 1.62, 0.8, 2.0])
    # max: R3 = 2; R2 = max(0, .8) = .8; R1 = max(1.3, .32) = 1.3; R0 = max(0, .52) = .52
    assert discounted_returns(s, 0.4, "max") == pytest.approx([0.52, 1.3, 0.8, 2.0])
    assert discounted_returns([], 0.4) == []
    assert discounted_returns([3.0], 0.9, "max") == [3.0]


def test_discounted_returns_match_the_definition():
    import random
    rng = random.Random(0)
    for _ in range(50):
        s = [rng.choice([0.0, rng.uniform(0, 5)]) for _ in range(rng.randint(1, 8))]
        g = rng.uniform(0, 1)
        n = len(s)
        want_sum = [sum(g ** (k - t) * s[k] for k in range(t, n)) for t in range(n)]
        want_max = [max(g ** (k - t) * s[k] for k in range(t, n)) for t in range(n)]
        assert discounted_returns(s, g, "sum") == pytest.approx(want_sum)
        assert discounted_returns(s, g, "max") == pytest.approx(want_max)
    with pytest.raises(ValueError):
        discounted_returns([1.0], 0.4, "mean")


def test_length_penalty_kimi_formula():
    # lengths 10, 20, 30: lambda = .5, 0, -.5; incorrect ones keep only the negative part
    assert length_penalty([10, 20, 30], [True, True, True]) == pytest.approx([0.5, 0.0, -0.5])
    assert length_penalty([10, 20, 30], [False, True, False]) == pytest.approx([0.0, 0.0, -0.5])
    assert length_penalty([5, 5], [True, False]) == [0.0, 0.0]


def test_imports_with_only_the_standard_library(tmp_path):
    shutil.copy(os.path.join(ROOT, "rewards.py"), tmp_path)
    out = subprocess.run([sys.executable, "-S", "-E", "-c",
                          "import rewards, sys; assert 'torch' not in sys.modules; "
                          "print(rewards.kernel_score({'correct': True, 'speedup': 1.0}))"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "1.3"
