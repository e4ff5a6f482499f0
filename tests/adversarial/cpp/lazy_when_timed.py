# expect: runtime_error
# Honest while a dispatch mode watches its forward (the check trials' operator recorder); in the timed
# calls it returns lazy_output's tensor subclass, computed on first use, after the timed call.
import torch
import torch.nn as nn
from torch.utils._pytree import tree_map
from torch.utils.cpp_extension import load_inline

KERNELS = r"""
#include <torch/extension.h>
#include <cmath>

// Shared by every C++ candidate of the adversarial suite, so the suite compiles once.
static void body(const float* in, float* out, int64_t begin, int64_t end, float s) {
    for (int64_t i = begin; i < end; ++i) {
        float v = in[i];
        out[i] = (v > 0.f ? v : 0.f) * s + v;
    }
}

torch::Tensor relu_scale_add(torch::Tensor x, double scale) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    body(xc.data_ptr<float>(), y.data_ptr<float>(), 0, xc.numel(), (float)scale);
    return y;
}

// partial computation: only the first half of the output is written
torch::Tensor relu_scale_add_half(torch::Tensor x, double scale) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    body(xc.data_ptr<float>(), y.data_ptr<float>(), 0, xc.numel() / 2, (float)scale);
    return y;
}

// lower precision: the result rounded to a 1/4 grid (an 8-bit-like format)
torch::Tensor relu_scale_add_coarse(torch::Tensor x, double scale) {
    auto y = relu_scale_add(x, scale);
    float* p = y.data_ptr<float>();
    for (int64_t i = 0; i < y.numel(); ++i) p[i] = std::round(p[i] * 4.f) / 4.f;
    return y;
}

// writes the result into its input and returns it
torch::Tensor relu_scale_add_inplace(torch::Tensor x, double scale) {
    float* p = x.data_ptr<float>();
    body(p, p, 0, x.numel(), (float)scale);
    return x;
}

torch::Tensor crash(torch::Tensor x) {
    volatile float* p = nullptr;
    p[12345] = 1.f;
    return x;
}

torch::Tensor spin(torch::Tensor x) {
    volatile int64_t k = 0;
    while (true) { k = k + 1; }
    return x;
}
"""

ext = load_inline(name="ext", cpp_sources=KERNELS,
                  functions=["relu_scale_add", "relu_scale_add_half", "relu_scale_add_coarse",
                             "relu_scale_add_inplace", "crash", "spin"])


class LazyRelu(torch.Tensor):
    """The result of relu_scale_add(x, scale), computed on first use."""

    @staticmethod
    def __new__(cls, x, scale):
        return torch.Tensor._make_wrapper_subclass(cls, x.shape, dtype=x.dtype, device=x.device)

    def __init__(self, x, scale):
        self.x, self.scale = x, scale

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def value(a):
            return ext.relu_scale_add(a.x, a.scale) if isinstance(a, LazyRelu) else a
        return func(*tree_map(value, args), **tree_map(value, kwargs or {}))


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        if torch._C._len_torch_dispatch_stack():
            return ext.relu_scale_add(x, self.scale)
        return LazyRelu(x, self.scale)
