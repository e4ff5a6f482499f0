"""LayerNorm + residual add in plain C++: per row, a double-precision two-pass mean/variance
(the row stays in cache), then one fused pass writing residual + normalised, scaled x."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor forward(torch::Tensor x, torch::Tensor res, torch::Tensor gamma, torch::Tensor beta, double eps) {
    TORCH_CHECK(x.dtype() == torch::kFloat32 && res.dtype() == torch::kFloat32, "inputs must be float32");
    TORCH_CHECK(x.is_contiguous() && res.is_contiguous(), "inputs must be contiguous");
    TORCH_CHECK(x.sizes() == res.sizes(), "x and residual shapes differ");
    const int64_t D = x.size(-1), rows = x.numel() / D;
    auto y = torch::empty_like(x);
    const float* xp = x.data_ptr<float>();
    const float* rp = res.data_ptr<float>();
    const float* gp = gamma.data_ptr<float>();
    const float* bp = beta.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    for (int64_t r = 0; r < rows; ++r) {
        const float* xr = xp + r * D;
        double s = 0.0;
        for (int64_t i = 0; i < D; ++i) s += xr[i];
        const float mean = (float)(s / D);
        double v = 0.0;
        for (int64_t i = 0; i < D; ++i) {
            const double d = xr[i] - mean;
            v += d * d;
        }
        const float rstd = (float)(1.0 / std::sqrt(v / D + eps));
        const float* rr = rp + r * D;
        float* yr = yp + r * D;
        for (int64_t i = 0; i < D; ++i) yr[i] = rr[i] + (xr[i] - mean) * rstd * gp[i] + bp[i];
    }
    return y;
}
"""

_ext = load_inline(
    name="builtin_l2_04_layernorm_residual_add_cpp",
    cpp_sources=CPP_SRC,
    functions=["forward"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        # nn.LayerNorm's init (ones/zeros) draws nothing; the reference then draws these two.
        self.gamma = nn.Parameter(torch.empty(hidden))
        self.beta = nn.Parameter(torch.empty(hidden))
        nn.init.uniform_(self.gamma, 0.5, 1.5)
        nn.init.uniform_(self.beta, -0.5, 0.5)
        self.eps = 1e-5

    def forward(self, x, residual):
        return _ext.forward(x.contiguous(), residual.contiguous(), self.gamma, self.beta, self.eps)
