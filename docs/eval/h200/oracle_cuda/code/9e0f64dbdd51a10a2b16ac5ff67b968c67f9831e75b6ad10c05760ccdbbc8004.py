"""GEMM + bias + ReLU + scale in one CUDA kernel: a 16x16 shared-memory tiled x @ W^T whose
epilogue adds the bias, applies ReLU and the scale before the single store."""
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define TILE 16

// y[m, n] = relu(sum_k x[m, k] * w[n, k] + b[n]) * scale; x is (M, K), w is (N, K).
__global__ void linear_relu_scale_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                         const float* __restrict__ b, float* __restrict__ y,
                                         int M, int N, int K, float scale) {
    __shared__ float xs[TILE][TILE];
    __shared__ float ws[TILE][TILE + 1];  // +1: the transposed read ws[tx][kk] avoids bank conflicts
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;
    const int col = blockIdx.x * TILE + tx;
    const int wrow = blockIdx.x * TILE + ty;  // the weight row this thread loads
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
        y[(long)row * N + col] = (v > 0.f ? v : 0.f) * scale;
    }
}

torch::Tensor forward(torch::Tensor x, torch::Tensor w, torch::Tensor b, double scale) {
    TORCH_CHECK(x.is_cuda() && w.is_cuda() && b.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.dtype() == torch::kFloat32, "x must be float32");
    const int M = x.size(0), K = x.size(1), N = w.size(0);
    auto y = torch::empty({M, N}, x.options());
    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    linear_relu_scale_kernel<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(),
        M, N, K, (float)scale);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

CPP_SRC = "torch::Tensor forward(torch::Tensor x, torch::Tensor w, torch::Tensor b, double scale);"

_ext = load_inline(
    name="builtin_l2_01_linear_bias_relu_scale_cuda",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["forward"],
    extra_cuda_cflags=["-O3"],
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
