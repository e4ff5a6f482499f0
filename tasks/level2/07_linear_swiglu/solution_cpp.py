"""SwiGLU in plain C++: both weights are transposed once; a blocked i-k-j loop accumulates the
gate and up projections of a row block together (the x value is loaded once for both), and
silu(gate) * up is written while the block is in cache."""
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>
#include <algorithm>
#include <cmath>
#include <vector>

torch::Tensor forward(torch::Tensor x, torch::Tensor w1, torch::Tensor w2) {
    TORCH_CHECK(x.dtype() == torch::kFloat32 && x.is_contiguous(), "x must be contiguous float32");
    const int64_t M = x.size(0), K = x.size(1), N = w1.size(0);
    auto y = torch::empty({M, N}, x.options());
    const float* xp = x.data_ptr<float>();
    const float* w1p = w1.data_ptr<float>();
    const float* w2p = w2.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    // w?t[k, n] = w?[n, k]; rows padded by 16 floats so a power-of-two N does not map
    // every row of a block onto the same cache sets.
    const int64_t ldw = N + 16;
    std::vector<float> w1t(K * ldw), w2t(K * ldw);
    for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
            w1t[k * ldw + n] = w1p[n * K + k];
            w2t[k * ldw + n] = w2p[n * K + k];
        }
    const int64_t BM = 32, BK = 128, BN = 256;  // both 128 KB weight blocks stay in L2
    std::vector<float> gate(BM * N), up(BM * N);
    for (int64_t i0 = 0; i0 < M; i0 += BM) {
        const int64_t i1 = std::min(i0 + BM, M);
        std::fill(gate.begin(), gate.end(), 0.f);
        std::fill(up.begin(), up.end(), 0.f);
        for (int64_t k0 = 0; k0 < K; k0 += BK) {
            const int64_t k1 = std::min(k0 + BK, K);
            for (int64_t j0 = 0; j0 < N; j0 += BN) {
                const int64_t j1 = std::min(j0 + BN, N);
                for (int64_t i = i0; i < i1; ++i) {
                    float* gr = gate.data() + (i - i0) * N;
                    float* ur = up.data() + (i - i0) * N;
                    for (int64_t k = k0; k < k1; ++k) {
                        const float a = xp[i * K + k];
                        const float* b1 = w1t.data() + k * ldw;
                        const float* b2 = w2t.data() + k * ldw;
                        for (int64_t j = j0; j < j1; ++j) {
                            gr[j] += a * b1[j];
                            ur[j] += a * b2[j];
                        }
                    }
                }
            }
        }
        for (int64_t i = i0; i < i1; ++i)
            for (int64_t n = 0; n < N; ++n) {
                const float gv = gate[(i - i0) * N + n];
                yp[i * N + n] = gv / (1.f + std::exp(-gv)) * up[(i - i0) * N + n];
            }
    }
    return y;
}
"""

_ext = load_inline(
    name="builtin_l2_07_linear_swiglu_cpp",
    cpp_sources=CPP_SRC,
    functions=["forward"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        # Same init calls in the same order as the two bias-free nn.Linear layers.
        self.w_gate = nn.Parameter(torch.empty(out_features, in_features))
        nn.init.kaiming_uniform_(self.w_gate, a=math.sqrt(5))
        self.w_up = nn.Parameter(torch.empty(out_features, in_features))
        nn.init.kaiming_uniform_(self.w_up, a=math.sqrt(5))

    def forward(self, x):
        return _ext.forward(x.contiguous(), self.w_gate, self.w_up)
