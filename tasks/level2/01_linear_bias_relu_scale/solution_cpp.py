"""GEMM + bias + ReLU + scale in plain C++: W is transposed once so the inner loop runs along
contiguous output columns (vectorised by -O3), the rows start from the bias, and the ReLU and
scale are applied per row block while it is still in cache."""
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>
#include <algorithm>
#include <vector>

torch::Tensor forward(torch::Tensor x, torch::Tensor w, torch::Tensor b, double scale) {
    TORCH_CHECK(x.dtype() == torch::kFloat32 && x.is_contiguous(), "x must be contiguous float32");
    const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
    auto y = torch::empty({M, N}, x.options());
    const float* xp = x.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    const float* bp = b.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    // wt[k, n] = w[n, k]; rows padded by 16 floats so a power-of-two N does not map
    // every row of a block onto the same cache sets.
    const int64_t ldw = N + 16;
    std::vector<float> wt(K * ldw);
    for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) wt[k * ldw + n] = wp[n * K + k];
    const int64_t BM = 64, BK = 128, BN = 256;  // a 128 KB weight block stays in L2
    const float s = (float)scale;
    for (int64_t i0 = 0; i0 < M; i0 += BM) {
        const int64_t i1 = std::min(i0 + BM, M);
        for (int64_t i = i0; i < i1; ++i)
            for (int64_t n = 0; n < N; ++n) yp[i * N + n] = bp[n];
        for (int64_t k0 = 0; k0 < K; k0 += BK) {
            const int64_t k1 = std::min(k0 + BK, K);
            for (int64_t j0 = 0; j0 < N; j0 += BN) {
                const int64_t j1 = std::min(j0 + BN, N);
                for (int64_t i = i0; i < i1; ++i) {
                    float* yr = yp + i * N;
                    for (int64_t k = k0; k < k1; ++k) {
                        const float a = xp[i * K + k];
                        const float* wr = wt.data() + k * ldw;
                        for (int64_t j = j0; j < j1; ++j) yr[j] += a * wr[j];
                    }
                }
            }
        }
        for (int64_t i = i0; i < i1; ++i)
            for (int64_t n = 0; n < N; ++n) {
                const float v = yp[i * N + n];
                yp[i * N + n] = (v > 0.f ? v : 0.f) * s;
            }
    }
    return y;
}
"""

_ext = load_inline(
    name="builtin_l2_01_linear_bias_relu_scale_cpp",
    cpp_sources=CPP_SRC,
    functions=["forward"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scale):
        super().__init__()
        # Same parameters, same init calls in the same order as nn.Linear.reset_parameters.
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        bound = 1 / math.sqrt(in_features)
        nn.init.uniform_(self.bias, -bound, bound)
        self.scale = scale

    def forward(self, x):
        return _ext.forward(x.contiguous(), self.weight, self.bias, self.scale)
