import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor row_sum_forward(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu(), "x must be a CPU tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    TORCH_CHECK(x.dim() >= 1, "x must have at least one dimension");
    x = x.contiguous();
    auto sizes = x.sizes().vec();
    const int64_t cols = sizes.back();
    sizes.pop_back();
    auto y = torch::empty(sizes, x.options());
    const int64_t rows = y.numel();
    const float* in = x.data_ptr<float>();
    float* out = y.data_ptr<float>();
    // eight independent partial sums: without -ffast-math the compiler may not reorder a
    // single accumulator, so this is what lets the loop use SIMD lanes
    for (int64_t i = 0; i < rows; ++i) {
        const float* row = in + i * cols;
        float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        int64_t j = 0;
        for (; j + 8 <= cols; j += 8)
            for (int k = 0; k < 8; ++k) acc[k] += row[j + k];
        float s = 0.f;
        for (; j < cols; ++j) s += row[j];
        for (int k = 0; k < 8; ++k) s += acc[k];
        out[i] = s;
    }
    return y;
}
"""

row_sum = load_inline(
    name="builtin_l1_07_row_sum_cpp",
    cpp_sources=cpp_source,
    functions=["row_sum_forward"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return row_sum.row_sum_forward(x)
