"""Conv2d + GroupNorm + tanh in plain C++: the convolution accumulates whole output planes with
the innermost loop along contiguous output columns (vectorised by -O3), then each (sample,
group) span is reduced in double (two passes) and normalised, scaled and passed through tanh."""
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>
#include <algorithm>
#include <cmath>

torch::Tensor forward(torch::Tensor x, torch::Tensor w, torch::Tensor b, torch::Tensor gamma,
                      torch::Tensor beta, int64_t groups, double eps) {
    TORCH_CHECK(x.dtype() == torch::kFloat32 && x.is_contiguous(), "x must be contiguous float32");
    const int64_t N = x.size(0), Ci = x.size(1), H = x.size(2), W = x.size(3);
    const int64_t Co = w.size(0), KS = w.size(2), pad = KS / 2;
    TORCH_CHECK(Co % groups == 0, "channels must divide into groups");
    auto y = torch::empty({N, Co, H, W}, x.options());
    const float* xp = x.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    const float* bp = b.data_ptr<float>();
    const float* gp = gamma.data_ptr<float>();
    const float* bt = beta.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    for (int64_t n = 0; n < N; ++n)
        for (int64_t co = 0; co < Co; ++co) {
            float* out = yp + (n * Co + co) * H * W;
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
        }
    const int64_t cpg = Co / groups, span = cpg * H * W;
    for (int64_t ng = 0; ng < N * groups; ++ng) {
        float* p = yp + ng * span;
        double s = 0.0;
        for (int64_t i = 0; i < span; ++i) s += p[i];
        const double mu = s / span;
        double v = 0.0;
        for (int64_t i = 0; i < span; ++i) v += (p[i] - mu) * (p[i] - mu);
        const float rstd = (float)(1.0 / std::sqrt(v / span + eps));
        const float muf = (float)mu;
        for (int64_t cc = 0; cc < cpg; ++cc) {
            const int64_t c = (ng % groups) * cpg + cc;
            const float scale = rstd * gp[c], shift = bt[c];
            float* q = p + cc * H * W;
            for (int64_t i = 0; i < H * W; ++i) q[i] = std::tanh((q[i] - muf) * scale + shift);
        }
    }
    return y;
}
"""

_ext = load_inline(
    name="builtin_l2_03_conv2d_groupnorm_tanh_cpp",
    cpp_sources=CPP_SRC,
    functions=["forward"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups):
        super().__init__()
        # Same parameters, same init calls in the same order as the reference's
        # nn.Conv2d.reset_parameters followed by its GroupNorm draws.
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.empty(out_channels))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        bound = 1 / math.sqrt(in_channels * kernel_size * kernel_size)
        nn.init.uniform_(self.bias, -bound, bound)
        self.gamma = nn.Parameter(torch.empty(out_channels))
        self.beta = nn.Parameter(torch.empty(out_channels))
        nn.init.uniform_(self.gamma, 0.5, 1.5)
        nn.init.uniform_(self.beta, -0.5, 0.5)
        self.groups = groups
        self.eps = 1e-5

    def forward(self, x):
        return _ext.forward(x.contiguous(), self.weight, self.bias, self.gamma, self.beta, self.groups, self.eps)
