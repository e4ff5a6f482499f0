"""Matmul + GELU in plain C++: a blocked i-k-j loop (the inner loop runs along contiguous
columns of B and C, vectorised by -O3), then the exact GELU on each row block while in cache."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>
#include <algorithm>
#include <cmath>

torch::Tensor forward(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.dtype() == torch::kFloat32 && b.dtype() == torch::kFloat32, "inputs must be float32");
    TORCH_CHECK(a.is_contiguous() && b.is_contiguous(), "inputs must be contiguous");
    TORCH_CHECK(a.size(1) == b.size(0), "inner dimensions differ");
    const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
    auto c = torch::empty({M, N}, a.options());
    const float* ap = a.data_ptr<float>();
    const float* bp = b.data_ptr<float>();
    float* cp = c.data_ptr<float>();
    const int64_t BM = 64, BK = 128, BN = 256;  // a 128 KB weight block stays in L2
    for (int64_t i0 = 0; i0 < M; i0 += BM) {
        const int64_t i1 = std::min(i0 + BM, M);
        for (int64_t i = i0 * N; i < i1 * N; ++i) cp[i] = 0.f;
        for (int64_t k0 = 0; k0 < K; k0 += BK) {
            const int64_t k1 = std::min(k0 + BK, K);
            for (int64_t j0 = 0; j0 < N; j0 += BN) {
                const int64_t j1 = std::min(j0 + BN, N);
                for (int64_t i = i0; i < i1; ++i) {
                    float* cr = cp + i * N;
                    for (int64_t k = k0; k < k1; ++k) {
                        const float av = ap[i * K + k];
                        const float* br = bp + k * N;
                        for (int64_t j = j0; j < j1; ++j) cr[j] += av * br[j];
                    }
                }
            }
        }
        for (int64_t i = i0 * N; i < i1 * N; ++i) {
            const float v = cp[i];
            cp[i] = 0.5f * v * (1.f + std::erf(v * 0.70710678118654752f));
        }
    }
    return c;
}
"""

_ext = load_inline(
    name="builtin_l2_02_matmul_gelu_cpp",
    cpp_sources=CPP_SRC,
    functions=["forward"],
    extra_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return _ext.forward(a.contiguous(), b.contiguous())
