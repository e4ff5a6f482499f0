import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor rms_norm_forward(torch::Tensor x, torch::Tensor weight, double eps) {
    TORCH_CHECK(x.device().is_cpu(), "x must be a CPU tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    const int64_t cols = x.size(-1);
    TORCH_CHECK(weight.numel() == cols, "weight must match the last dim");
    x = x.contiguous();
    weight = weight.contiguous();
    auto y = torch::empty_like(x);
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    const float* in = x.data_ptr<float>();
    const float* w = weight.data_ptr<float>();
    float* out = y.data_ptr<float>();
    for (int64_t i = 0; i < rows; ++i) {
        const float* row = in + i * cols;
        float* dst = out + i * cols;
        // eight partial sums, so the loop can use SIMD lanes without -ffast-math
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        int64_t j = 0;
        for (; j + 8 <= cols; j += 8)
            for (int k = 0; k < 8; ++k) acc[k] += row[j + k] * row[j + k];
        float q = 0.f;
        for (; j < cols; ++j) q += row[j] * row[j];
        for (int k = 0; k < 8; ++k) q += acc[k];
        const float scale = 1.f / std::sqrt(q / cols + (float)eps);
        for (j = 0; j < cols; ++j) dst[j] = row[j] * scale * w[j];
    }
    return y;
}
"""

rms_norm = load_inline(
    name="builtin_l1_06_rms_norm_cpp",
    cpp_sources=cpp_source,
    functions=["rms_norm_forward"],
)


class ModelNew(nn.Module):
    def __init__(self, features: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(features))
        nn.init.uniform_(self.weight, 0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm.rms_norm_forward(x, self.weight, self.eps)
