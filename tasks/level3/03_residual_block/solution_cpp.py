"""A residual block in plain C++: each 3x3 convolution accumulates whole output planes with
the innermost loop along contiguous output columns (vectorised by -O3); the first ends in
bias + ReLU, the second in bias + skip + ReLU, applied per plane while it is in cache."""
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>
#include <algorithm>

// y = relu(conv(x, w) + b [+ skip]) for NCHW x with 'same' padding; skip may be null.
static void conv_relu(const float* x, const float* w, const float* b, const float* skip, float* y,
                      int64_t N, int64_t Ci, int64_t Co, int64_t H, int64_t W, int64_t KS) {
    const int64_t pad = KS / 2, HW = H * W;
    for (int64_t n = 0; n < N; ++n)
        for (int64_t co = 0; co < Co; ++co) {
            float* out = y + (n * Co + co) * HW;
            for (int64_t i = 0; i < HW; ++i) out[i] = b[co];
            for (int64_t ci = 0; ci < Ci; ++ci) {
                const float* in = x + (n * Ci + ci) * HW;
                for (int64_t kh = 0; kh < KS; ++kh)
                    for (int64_t kw = 0; kw < KS; ++kw) {
                        const float wv = w[((co * Ci + ci) * KS + kh) * KS + kw];
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
            if (skip) {
                const float* s = skip + (n * Co + co) * HW;
                for (int64_t i = 0; i < HW; ++i) out[i] += s[i];
            }
            for (int64_t i = 0; i < HW; ++i) out[i] = out[i] > 0.f ? out[i] : 0.f;
        }
}

torch::Tensor forward(torch::Tensor x, torch::Tensor w1, torch::Tensor b1, torch::Tensor w2, torch::Tensor b2) {
    TORCH_CHECK(x.dtype() == torch::kFloat32 && x.is_contiguous(), "x must be contiguous float32");
    const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3), KS = w1.size(2);
    TORCH_CHECK(w1.size(0) == C && w2.size(0) == C, "the block must keep the channel count");
    auto h = torch::empty_like(x);
    auto y = torch::empty_like(x);
    conv_relu(x.data_ptr<float>(), w1.data_ptr<float>(), b1.data_ptr<float>(), nullptr, h.data_ptr<float>(),
              N, C, C, H, W, KS);
    conv_relu(h.data_ptr<float>(), w2.data_ptr<float>(), b2.data_ptr<float>(), x.data_ptr<float>(),
              y.data_ptr<float>(), N, C, C, H, W, KS);
    return y;
}
"""

_ext = load_inline(
    name="builtin_l3_03_residual_block_cpp",
    cpp_sources=CPP_SRC,
    functions=["forward"],
    extra_cflags=["-O3"],
)


def _conv_params(channels):
    """(weight, bias) of a 3x3 conv initialised exactly as nn.Conv2d.reset_parameters does."""
    weight = nn.Parameter(torch.empty(channels, channels, 3, 3))
    bias = nn.Parameter(torch.empty(channels))
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    bound = 1 / math.sqrt(channels * 9)
    nn.init.uniform_(bias, -bound, bound)
    return weight, bias


class ModelNew(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.w1, self.b1 = _conv_params(channels)
        self.w2, self.b2 = _conv_params(channels)

    def forward(self, x):
        return _ext.forward(x.contiguous(), self.w1, self.b1, self.w2, self.b2)
