import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <algorithm>

torch::Tensor max_dim1_forward(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu(), "x must be a CPU tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    TORCH_CHECK(x.dim() == 3 && x.size(1) > 0, "x must be (batch, reduce>0, cols)");
    x = x.contiguous();
    const int64_t batch = x.size(0), reduce = x.size(1), cols = x.size(2);
    auto y = torch::empty({batch, cols}, x.options());
    const float* in = x.data_ptr<float>();
    float* out = y.data_ptr<float>();
    // reduced index outside, columns inside: each step reads one contiguous row and
    // updates a row of running maxima, which vectorises
    for (int64_t b = 0; b < batch; ++b) {
        const float* src = in + b * reduce * cols;
        float* dst = out + b * cols;
        std::copy(src, src + cols, dst);
        for (int64_t r = 1; r < reduce; ++r) {
            const float* row = src + r * cols;
            for (int64_t c = 0; c < cols; ++c) dst[c] = std::max(dst[c], row[c]);
        }
    }
    return y;
}
"""

max_dim1 = load_inline(
    name="builtin_l1_08_max_over_dim_cpp",
    cpp_sources=cpp_source,
    functions=["max_dim1_forward"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return max_dim1.max_dim1_forward(x)
