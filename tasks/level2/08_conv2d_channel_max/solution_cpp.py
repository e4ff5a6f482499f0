"""Conv2d + channel max in plain C++: for each sample and output channel the convolution plane
is accumulated into a scratch plane (inner loop along contiguous columns, vectorised by -O3)
and folded into the running max plane, so only two planes are live."""
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>
#include <algorithm>
#include <cmath>
#include <vector>

torch::Tensor forward(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    TORCH_CHECK(x.dtype() == torch::kFloat32 && x.is_contiguous(), "x must be contiguous float32");
    const int64_t N = x.size(0), Ci = x.size(1), H = x.size(2), W = x.size(3);
    const int64_t Co = w.size(0), KS = w.size(2), pad = KS / 2;
    auto y = torch::empty({N, 1, H, W}, x.options());
    const float* xp = x.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    const float* bp = b.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    std::vector<float> plane(H * W);
    for (int64_t n = 0; n < N; ++n) {
        float* best = yp + n * H * W;
        for (int64_t i = 0; i < H * W; ++i) best[i] = -INFINITY;
        for (int64_t co = 0; co < Co; ++co) {
            float* out = plane.data();
            for (int64_t i = 0; i < H * W; ++i) out[i] = bp[co];
            for (int64_t ci = 0; ci < Ci; ++ci) {
                const float* in = xp + (n * Ci + ci) * H * W;
                for (int64_t kh = 0; kh < KS; ++kh)
                    for (int64_t kw = 0; kw < KS; ++kw) {
                        const float wv = wp[((co * Ci + ci) * KS + kh) * KS + kw];
                        // Output columns whose input column ow + kw - pad lies inside the image.
                        const int64_t ow0 = std::max<int64_t>(0, pad - kw);
                        const int64_t ow1 = std::min<int64_t>(W, W + pad - kw);
                        for (int64_t oh = 0; oh < H; ++oh) {
                            const int64_t ih = oh + kh - pad;
                            if (ih < 0 || ih >= H) continue;
                            const float* inr = in + ih * W + kw;
                            float* outr = out + oh * W;
                            for (int64_t ow = ow0; ow < ow1; ++ow) outr[ow] += wv * inr[ow - pad];
                        }
                    }
            }
            for (int64_t i = 0; i < H * W; ++i) best[i] = std::max(best[i], out[i]);
        }
    }
    return y;
}
"""

_ext = load_inline(
    name="builtin_l2_08_conv2d_channel_max_cpp",
    cpp_sources=CPP_SRC,
    functions=["forward"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        # Same parameters, same init calls in the same order as nn.Conv2d.reset_parameters.
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.empty(out_channels))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        bound = 1 / math.sqrt(in_channels * kernel_size * kernel_size)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        return _ext.forward(x.contiguous(), self.weight, self.bias)
