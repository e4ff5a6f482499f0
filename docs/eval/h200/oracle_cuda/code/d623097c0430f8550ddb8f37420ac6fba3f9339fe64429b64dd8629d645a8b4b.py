"""A three-layer MLP in CUDA: one 16x16 shared-memory tiled x @ W^T kernel whose epilogue adds
the bias and optionally applies ReLU, launched once per layer on the current stream."""
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define TILE 16

// y[m, n] = act(sum_k x[m, k] * w[n, k] + b[n]); act is ReLU when relu != 0, else identity.
__global__ void linear_kernel(const float* __restrict__ x, const float* __restrict__ w,
                              const float* __restrict__ b, float* __restrict__ y,
                              int M, int N, int K, int relu) {
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
        const float v = acc + b[col];
        y[(long)row * N + col] = (relu && v < 0.f) ? 0.f : v;
    }
}

static torch::Tensor linear(torch::Tensor x, torch::Tensor w, torch::Tensor b, bool relu) {
    const int M = x.size(0), K = x.size(1), N = w.size(0);
    TORCH_CHECK(w.size(1) == K, "weight does not match the input width");
    auto y = torch::empty({M, N}, x.options());
    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    linear_kernel<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(),
        M, N, K, relu ? 1 : 0);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}

torch::Tensor forward(torch::Tensor x, torch::Tensor w1, torch::Tensor b1, torch::Tensor w2,
                      torch::Tensor b2, torch::Tensor w3, torch::Tensor b3) {
    TORCH_CHECK(x.is_cuda() && x.dtype() == torch::kFloat32, "x must be a float32 CUDA tensor");
    auto h1 = linear(x, w1, b1, true);
    auto h2 = linear(h1, w2, b2, true);
    return linear(h2, w3, b3, false);
}
"""

CPP_SRC = ("torch::Tensor forward(torch::Tensor x, torch::Tensor w1, torch::Tensor b1, torch::Tensor w2, "
           "torch::Tensor b2, torch::Tensor w3, torch::Tensor b3);")

_ext = load_inline(
    name="builtin_l3_01_mlp_cuda",
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
    def __init__(self, in_features, hidden, out_features):
        super().__init__()
        self.w1, self.b1 = _linear_params(in_features, hidden)
        self.w2, self.b2 = _linear_params(hidden, hidden)
        self.w3, self.b3 = _linear_params(hidden, out_features)

    def forward(self, x):
        return _ext.forward(x.contiguous(), self.w1, self.b1, self.w2, self.b2, self.w3, self.b3)
