import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <algorithm>

// Per image, NCHW -> NHWC is the transpose of a (C, HW) matrix; it is done in 16x64 blocks
// so the rows being read and the rows being written both stay in cache.
torch::Tensor nchw_to_nhwc_forward(torch::Tensor x) {
    TORCH_CHECK(x.device().is_cpu(), "x must be a CPU tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    TORCH_CHECK(x.dim() == 4, "x must be (N, C, H, W)");
    x = x.contiguous();
    const int64_t n = x.size(0), channels = x.size(1), hw = x.size(2) * x.size(3);
    auto y = torch::empty({x.size(0), x.size(2), x.size(3), channels}, x.options());
    const int64_t CB = 16, PB = 64;
    for (int64_t b = 0; b < n; ++b) {
        const float* src = x.data_ptr<float>() + b * channels * hw;
        float* dst = y.data_ptr<float>() + b * channels * hw;
        for (int64_t p0 = 0; p0 < hw; p0 += PB) {
            const int64_t p1 = std::min(hw, p0 + PB);
            for (int64_t c0 = 0; c0 < channels; c0 += CB) {
                const int64_t c1 = std::min(channels, c0 + CB);
                for (int64_t p = p0; p < p1; ++p)
                    for (int64_t c = c0; c < c1; ++c) dst[p * channels + c] = src[c * hw + p];
            }
        }
    }
    return y;
}
"""

layout = load_inline(
    name="builtin_l1_12_nchw_to_nhwc_cpp",
    cpp_sources=cpp_source,
    functions=["nchw_to_nhwc_forward"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layout.nchw_to_nhwc_forward(x)
