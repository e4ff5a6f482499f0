"""A transformer feed-forward block in plain C++: LayerNorm per row (double-precision
statistics), then two blocked i-k-j GEMMs over transposed weights (inner loop along contiguous
output columns, vectorised by -O3) with the GELU and the residual applied per row block."""
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>
#include <algorithm>
#include <cmath>
#include <vector>

// y[m, n] = x[m, :] . w[n, :] + b[n], then exact GELU if gelu, then + res[m, n] if res.
static void linear(const float* x, const float* w, const float* b, const float* res, float* y,
                   int64_t M, int64_t N, int64_t K, bool gelu) {
    // wt[k, n] = w[n, k]; rows padded by 16 floats so a power-of-two N does not map
    // every row of a block onto the same cache sets.
    const int64_t ldw = N + 16;
    std::vector<float> wt(K * ldw);
    for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) wt[k * ldw + n] = w[n * K + k];
    const int64_t BM = 64, BK = 128, BN = 256;  // a 128 KB weight block stays in L2
    for (int64_t i0 = 0; i0 < M; i0 += BM) {
        const int64_t i1 = std::min(i0 + BM, M);
        for (int64_t i = i0; i < i1; ++i)
            for (int64_t n = 0; n < N; ++n) y[i * N + n] = b[n];
        for (int64_t k0 = 0; k0 < K; k0 += BK) {
            const int64_t k1 = std::min(k0 + BK, K);
            for (int64_t j0 = 0; j0 < N; j0 += BN) {
                const int64_t j1 = std::min(j0 + BN, N);
                for (int64_t i = i0; i < i1; ++i) {
                    float* yr = y + i * N;
                    for (int64_t k = k0; k < k1; ++k) {
                        const float a = x[i * K + k];
                        const float* wr = wt.data() + k * ldw;
                        for (int64_t j = j0; j < j1; ++j) yr[j] += a * wr[j];
                    }
                }
            }
        }
        for (int64_t i = i0 * N; i < i1 * N; ++i) {
            float v = y[i];
            if (gelu) v = 0.5f * v * (1.f + std::erf(v * 0.70710678118654752f));
            if (res) v += res[i];
            y[i] = v;
        }
    }
}

torch::Tensor forward(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta, double eps,
                      torch::Tensor w1, torch::Tensor b1, torch::Tensor w2, torch::Tensor b2) {
    TORCH_CHECK(x.dtype() == torch::kFloat32 && x.is_contiguous(), "x must be contiguous float32");
    const int64_t E = x.size(-1), M = x.numel() / E, F = w1.size(0);
    TORCH_CHECK(w1.size(1) == E && w2.size(0) == E && w2.size(1) == F, "weights do not match the widths");
    const float* xp = x.data_ptr<float>();
    const float* gp = gamma.data_ptr<float>();
    const float* bp = beta.data_ptr<float>();
    std::vector<float> normed(M * E), hidden(M * F);
    for (int64_t r = 0; r < M; ++r) {
        const float* xr = xp + r * E;
        double s = 0.0;
        for (int64_t i = 0; i < E; ++i) s += xr[i];
        const float mean = (float)(s / E);
        double v = 0.0;
        for (int64_t i = 0; i < E; ++i) v += (double)(xr[i] - mean) * (xr[i] - mean);
        const float rstd = (float)(1.0 / std::sqrt(v / E + eps));
        float* nr = normed.data() + r * E;
        for (int64_t i = 0; i < E; ++i) nr[i] = (xr[i] - mean) * rstd * gp[i] + bp[i];
    }
    auto y = torch::empty_like(x);
    linear(normed.data(), w1.data_ptr<float>(), b1.data_ptr<float>(), nullptr, hidden.data(), M, F, E, true);
    linear(hidden.data(), w2.data_ptr<float>(), b2.data_ptr<float>(), xp, y.data_ptr<float>(), M, E, F, false);
    return y;
}
"""

_ext = load_inline(
    name="builtin_l3_04_transformer_ffn_cpp",
    cpp_sources=CPP_SRC,
    functions=["forward"],
    extra_cflags=["-O3"],
)


def _linear_params(in_features, out_features):
    """(weight, bias) initialised exactly as nn.Linear.reset_parameters does."""
    weight = nn.Parameter(torch.empty(out_features, in_features))
    bias = nn.Parameter(torch.empty(out_features))
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    bound = 1 / math.sqrt(in_features)
    nn.init.uniform_(bias, -bound, bound)
    return weight, bias


class ModelNew(nn.Module):
    def __init__(self, embed_dim, hidden):
        super().__init__()
        # Same draws in the same order as the reference: LayerNorm affine, fc1, fc2.
        self.gamma = nn.Parameter(torch.empty(embed_dim))
        self.beta = nn.Parameter(torch.empty(embed_dim))
        nn.init.uniform_(self.gamma, 0.5, 1.5)
        nn.init.uniform_(self.beta, -0.5, 0.5)
        self.eps = 1e-5
        self.w1, self.b1 = _linear_params(embed_dim, hidden)
        self.w2, self.b2 = _linear_params(hidden, embed_dim)

    def forward(self, x):
        return _ext.forward(x.contiguous(), self.gamma, self.beta, self.eps, self.w1, self.b1, self.w2, self.b2)
