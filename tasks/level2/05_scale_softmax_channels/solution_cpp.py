"""Scale + channel softmax in plain C++: per sample, the pixels are processed in row chunks with
the channel loop outside and the pixel loop inside (contiguous, vectorised by -O3): a running
max, then exp and its sum written in place, then one normalising pass."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>
#include <algorithm>
#include <cmath>
#include <vector>

torch::Tensor forward(torch::Tensor x, double scale) {
    TORCH_CHECK(x.dtype() == torch::kFloat32 && x.is_contiguous(), "x must be contiguous float32");
    TORCH_CHECK(x.dim() >= 2, "x needs a channel dimension");
    const int64_t N = x.size(0), C = x.size(1), HW = x.numel() / (N * C);
    auto y = torch::empty_like(x);
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const float s = (float)scale;
    const int64_t CHUNK = 1024;  // C * CHUNK floats of x and y stay in L2 across the passes
    std::vector<float> mx(CHUNK), sum(CHUNK);
    for (int64_t n = 0; n < N; ++n)
        for (int64_t p0 = 0; p0 < HW; p0 += CHUNK) {
            const int64_t len = std::min(CHUNK, HW - p0);
            const float* xb = xp + n * C * HW + p0;
            float* yb = yp + n * C * HW + p0;
            for (int64_t p = 0; p < len; ++p) { mx[p] = -INFINITY; sum[p] = 0.f; }
            for (int64_t c = 0; c < C; ++c)
                for (int64_t p = 0; p < len; ++p) mx[p] = std::max(mx[p], xb[c * HW + p] * s);
            for (int64_t c = 0; c < C; ++c)
                for (int64_t p = 0; p < len; ++p) {
                    const float e = std::exp(xb[c * HW + p] * s - mx[p]);
                    yb[c * HW + p] = e;
                    sum[p] += e;
                }
            for (int64_t p = 0; p < len; ++p) sum[p] = 1.f / sum[p];
            for (int64_t c = 0; c < C; ++c)
                for (int64_t p = 0; p < len; ++p) yb[c * HW + p] *= sum[p];
        }
    return y;
}
"""

_ext = load_inline(
    name="builtin_l2_05_scale_softmax_channels_cpp",
    cpp_sources=CPP_SRC,
    functions=["forward"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return _ext.forward(x.contiguous(), self.scale)
