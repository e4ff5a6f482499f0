import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <cmath>

torch::Tensor layer_norm_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, double eps) {
    TORCH_CHECK(x.device().is_cpu(), "x must be a CPU tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    const int64_t cols = x.size(-1);
    TORCH_CHECK(weight.numel() == cols && bias.numel() == cols, "weight/bias must match the last dim");
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    auto y = torch::empty_like(x);
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    const float* in = x.data_ptr<float>();
    const float* w = weight.data_ptr<float>();
    const float* b = bias.data_ptr<float>();
    float* out = y.data_ptr<float>();
    for (int64_t i = 0; i < rows; ++i) {
        const float* row = in + i * cols;
        float* dst = out + i * cols;
        double s = 0.0;
        for (int64_t j = 0; j < cols; ++j) s += row[j];
        const float mean = (float)(s / cols);
        double q = 0.0;
        for (int64_t j = 0; j < cols; ++j) {
            const float d = row[j] - mean;
            q += d * d;
        }
        const float rstd = (float)(1.0 / std::sqrt(q / cols + eps));
        for (int64_t j = 0; j < cols; ++j) dst[j] = (row[j] - mean) * rstd * w[j] + b[j];
    }
    return y;
}
"""

layer_norm = load_inline(
    name="builtin_l1_05_layer_norm_cpp",
    cpp_sources=cpp_source,
    functions=["layer_norm_forward"],
)


class ModelNew(nn.Module):
    def __init__(self, features: int, eps: float):
        super().__init__()
        self.eps = eps
        # the same parameters, created and initialised in the same order as the reference's
        self.weight = nn.Parameter(torch.empty(features))
        self.bias = nn.Parameter(torch.empty(features))
        nn.init.uniform_(self.weight, 0.5, 1.5)
        nn.init.uniform_(self.bias, -0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm.layer_norm_forward(x, self.weight, self.bias, self.eps)
