"""Multi-head self-attention in plain C++: the projections are blocked i-k-j GEMMs over a
transposed weight; each (batch, head) copies its q, k^T and v slices into contiguous buffers so
Q K^T and P V run as the same cache-friendly i-k-j loop, with a row softmax in between."""
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CPP_SRC = r"""
#include <torch/extension.h>
#include <algorithm>
#include <cmath>
#include <vector>

// c[M, N] += a[M, K] @ b[K, N], all row-major with row strides lda, ldb, ldc.
static void gemm_acc(const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
                     int64_t M, int64_t N, int64_t K) {
    const int64_t BM = 64, BK = 128, BN = 256;  // a 128 KB weight block stays in L2
    for (int64_t i0 = 0; i0 < M; i0 += BM)
        for (int64_t k0 = 0; k0 < K; k0 += BK)
            for (int64_t j0 = 0; j0 < N; j0 += BN) {
                const int64_t i1 = std::min(i0 + BM, M), k1 = std::min(k0 + BK, K), j1 = std::min(j0 + BN, N);
                for (int64_t i = i0; i < i1; ++i) {
                    float* cr = c + i * ldc;
                    for (int64_t k = k0; k < k1; ++k) {
                        const float av = a[i * lda + k];
                        const float* br = b + k * ldb;
                        for (int64_t j = j0; j < j1; ++j) cr[j] += av * br[j];
                    }
                }
            }
}

// y[M, N] = x[M, K] @ w[N, K]^T + bias[N]
static void linear(const float* x, const float* w, const float* bias, float* y, int64_t M, int64_t N, int64_t K) {
    // wt[k, n] = w[n, k]; rows padded by 16 floats so a power-of-two N does not map
    // every row of a block onto the same cache sets.
    const int64_t ldw = N + 16;
    std::vector<float> wt(K * ldw);
    for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) wt[k * ldw + n] = w[n * K + k];
    for (int64_t i = 0; i < M; ++i)
        for (int64_t n = 0; n < N; ++n) y[i * N + n] = bias[n];
    gemm_acc(x, K, wt.data(), ldw, y, N, M, N, K);
}

torch::Tensor forward(torch::Tensor x, torch::Tensor w_qkv, torch::Tensor b_qkv,
                      torch::Tensor w_proj, torch::Tensor b_proj, int64_t num_heads) {
    TORCH_CHECK(x.dtype() == torch::kFloat32 && x.is_contiguous(), "x must be contiguous float32");
    const int64_t Bt = x.size(0), S = x.size(1), E = x.size(2), H = num_heads;
    TORCH_CHECK(E % H == 0, "embed_dim must divide into heads");
    const int64_t d = E / H, M = Bt * S, E3 = 3 * E;
    std::vector<float> qkv(M * E3), heads_out(M * E);
    linear(x.data_ptr<float>(), w_qkv.data_ptr<float>(), b_qkv.data_ptr<float>(), qkv.data(), M, E3, E);
    std::vector<float> q(S * d), kt(d * S), v(S * d), p(S * S), o(S * d);
    const float scale = 1.f / std::sqrt((float)d);
    for (int64_t b = 0; b < Bt; ++b)
        for (int64_t h = 0; h < H; ++h) {
            const float* base = qkv.data() + b * S * E3 + h * d;
            for (int64_t s = 0; s < S; ++s)
                for (int64_t j = 0; j < d; ++j) {
                    q[s * d + j] = base[s * E3 + j] * scale;
                    kt[j * S + s] = base[s * E3 + E + j];
                    v[s * d + j] = base[s * E3 + 2 * E + j];
                }
            std::fill(p.begin(), p.end(), 0.f);
            gemm_acc(q.data(), d, kt.data(), S, p.data(), S, S, S, d);
            for (int64_t i = 0; i < S; ++i) {
                float* r = p.data() + i * S;
                float m = -INFINITY;
                for (int64_t j = 0; j < S; ++j) m = std::max(m, r[j]);
                float sum = 0.f;
                for (int64_t j = 0; j < S; ++j) {
                    r[j] = std::exp(r[j] - m);
                    sum += r[j];
                }
                const float inv = 1.f / sum;
                for (int64_t j = 0; j < S; ++j) r[j] *= inv;
            }
            std::fill(o.begin(), o.end(), 0.f);
            gemm_acc(p.data(), S, v.data(), d, o.data(), d, S, d, S);
            for (int64_t s = 0; s < S; ++s)
                for (int64_t j = 0; j < d; ++j) heads_out[(b * S + s) * E + h * d + j] = o[s * d + j];
        }
    auto y = torch::empty({Bt, S, E}, x.options());
    linear(heads_out.data(), w_proj.data_ptr<float>(), b_proj.data_ptr<float>(), y.data_ptr<float>(), M, E, E);
    return y;
}
"""

_ext = load_inline(
    name="builtin_l3_02_multihead_self_attention_cpp",
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
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.w_qkv, self.b_qkv = _linear_params(embed_dim, 3 * embed_dim)
        self.w_proj, self.b_proj = _linear_params(embed_dim, embed_dim)

    def forward(self, x):
        return _ext.forward(x.contiguous(), self.w_qkv, self.b_qkv, self.w_proj, self.b_proj, self.num_heads)
