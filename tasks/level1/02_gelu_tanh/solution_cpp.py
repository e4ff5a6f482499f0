import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>

// 0.5 v (1 + tanh(u)) = v sigmoid(2u) = v / (1 + exp(-2u)): the same value, and exp is
// several times faster than glibc's tanh. Large |u| saturates correctly (exp -> inf or 0).
static inline float gelu_tanh_op(float v) {
    const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
    return v / (1.f + std::exp(-2.f * u));
}

torch::Tensor gelu_tanh_forward(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu(), "x must be a CPU tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    const float* in = x.data_ptr<float>();
    float* out = y.data_ptr<float>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) {
        out[i] = gelu_tanh_op(in[i]);
    }
    return y;
}
"""

gelu_tanh = load_inline(
    name="builtin_l1_02_gelu_tanh_cpp",
    cpp_sources=cpp_source,
    functions=["gelu_tanh_forward"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_tanh.gelu_tanh_forward(x)
