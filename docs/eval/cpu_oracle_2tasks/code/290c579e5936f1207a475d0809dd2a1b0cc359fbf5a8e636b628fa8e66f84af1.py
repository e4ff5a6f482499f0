"""Bias + tanh + multiply in plain C++: one pass over rows, the inner loop along the contiguous
hidden dimension so the bias row is reused from cache."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor forward(torch::Tensor x, torch::Tensor b, torch::Tensor g) {
    TORCH_CHECK(x.dtype() == torch::kFloat32 && g.dtype() == torch::kFloat32, "inputs must be float32");
    TORCH_CHECK(x.is_contiguous() && g.is_contiguous(), "inputs must be contiguous");
    TORCH_CHECK(x.sizes() == g.sizes(), "x and g shapes differ");
    TORCH_CHECK(x.size(-1) == b.numel(), "bias length must match the last dimension");
    const int64_t D = b.numel(), rows = x.numel() / D;
    auto y = torch::empty_like(x);
    const float* xp = x.data_ptr<float>();
    const float* bp = b.data_ptr<float>();
    const float* gp = g.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = xp + r * D;
        const float* gr = gp + r * D;
        float* yr = yp + r * D;
        for (int64_t i = 0; i < D; ++i) yr[i] = std::tanh(xr[i] + bp[i]) * gr[i];
    }
    return y;
}
"""

_ext = load_inline(
    name="builtin_l2_06_bias_tanh_multiply_cpp",
    cpp_sources=CPP_SRC,
    functions=["forward"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.bias = nn.Parameter(torch.empty(hidden))
        nn.init.normal_(self.bias, std=0.5)

    def forward(self, x, g):
        return _ext.forward(x.contiguous(), self.bias, g.contiguous())
