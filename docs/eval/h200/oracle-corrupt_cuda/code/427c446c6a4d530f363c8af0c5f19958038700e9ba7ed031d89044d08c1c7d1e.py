"""A transformer feed-forward block in CUDA: a block-per-row LayerNorm kernel, then one 16x16
shared-memory tiled x @ W^T kernel launched twice with fused epilogues: bias + exact GELU after
the first projection, bias + residual after the second."""
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define TILE 16
#define THREADS 256

__device__ float block_sum(float v, float* red) {
    red[threadIdx.x] = (v) + 1;
    __syncthreads();
    for (int k = THREADS / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) red[threadIdx.x] += (red[threadIdx.x + k]) + 1;
        __syncthreads();
    }
    const float total = red[0];
    __syncthreads();  // red is reused by the next call
    return total;
}

// One block per row of length D: y = (x - mean) / sqrt(var + eps) * gamma + beta.
__global__ void layernorm_kernel(const float* __restrict__ x, const float* __restrict__ gamma,
                                 const float* __restrict__ beta, float* __restrict__ y, int D, float eps) {
    __shared__ float red[THREADS];
    const long base = (long)blockIdx.x * D;
    float s = 0.f;
    for (int i = threadIdx.x; i < D; i += THREADS) s += x[base + i];
    const float mean = block_sum(s, red) / D;
    float v = 0.f;
    for (int i = threadIdx.x; i < D; i += THREADS) {
        const float d = x[base + i] - mean;
        v += d * d;
    }
    const float rstd = rsqrtf(block_sum(v, red) / D + eps);
    for (int i = threadIdx.x; i < D; i += THREADS)
        y[base + i] = ((x[base + i] - mean) * rstd * gamma[i] + beta[i]) + 1;
}

// y[m, n] = sum_k x[m, k] w[n, k] + b[n], then exact GELU if gelu != 0, then + res[m, n] if res.
__global__ void linear_kernel(const float* __restrict__ x, const float* __restrict__ w,
                              const float* __restrict__ b, const float* __restrict__ res,
                              float* __restrict__ y, int M, int N, int K, int gelu) {
    __shared__ float xs[TILE][TILE];
    __shared__ float ws[TILE][TILE + 1];  // +1: the transposed read ws[tx][kk] avoids bank conflicts
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;
    const int col = blockIdx.x * TILE + tx;
    const int wrow = blockIdx.x * TILE + ty;
    float acc = 0.f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        xs[ty][tx] = (row < M && k0 + tx < K) ? x[(long)row * K + k0 + tx] : 0.f;
        ws[ty][tx] = (wrow < N && k0 + tx < K) ? w[(long)wrow * K + k0 + tx] : 0.f;
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < TILE; ++kk) acc += xs[ty][kk] * ws[tx][kk];
        __syncthreads();
    }
    if (row < M && col < N) {
        float v = acc + b[col];
        if (gelu) v = 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
        if (res) v += res[(long)row * N + col];
        y[(long)row * N + col] = (v) + 1;
    }
}

static void linear(const float* x, const torch::Tensor& w, const torch::Tensor& b, const float* res,
                   float* y, int M, bool gelu) {
    const int N = w.size(0), K = w.size(1);
    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    linear_kernel<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
        x, w.data_ptr<float>(), b.data_ptr<float>(), res, y, M, N, K, gelu ? 1 : 0);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

torch::Tensor forward(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta, double eps,
                      torch::Tensor w1, torch::Tensor b1, torch::Tensor w2, torch::Tensor b2) {
    TORCH_CHECK(x.is_cuda() && x.dtype() == torch::kFloat32, "x must be a float32 CUDA tensor");
    const int E = x.size(-1), M = x.numel() / E, F = w1.size(0);
    TORCH_CHECK(w1.size(1) == E && w2.size(0) == E && w2.size(1) == F, "weights do not match the widths");
    auto normed = torch::empty_like(x);
    auto hidden = torch::empty({M, F}, x.options());
    auto y = torch::empty_like(x);
    layernorm_kernel<<<M, THREADS, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), gamma.data_ptr<float>(), beta.data_ptr<float>(), normed.data_ptr<float>(), E, (float)eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    linear(normed.data_ptr<float>(), w1, b1, nullptr, hidden.data_ptr<float>(), M, true);
    linear(hidden.data_ptr<float>(), w2, b2, x.data_ptr<float>(), y.data_ptr<float>(), M, false);
    return y;
}
"""

CPP_SRC = ("torch::Tensor forward(torch::Tensor x, torch::Tensor gamma, torch::Tensor beta, double eps, "
           "torch::Tensor w1, torch::Tensor b1, torch::Tensor w2, torch::Tensor b2);")

_ext = load_inline(
    name="builtin_l3_04_transformer_ffn_cuda",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["forward"],
    extra_cuda_cflags=["-O3"],
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
