"""SwiGLU in one CUDA kernel: a 16x16 shared-memory tiled GEMM that loads each x tile once and
accumulates both projections (gate and up) side by side, then stores silu(gate) * up."""
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define TILE 16

// y[m, n] = silu(sum_k x[m, k] w1[n, k]) * sum_k x[m, k] w2[n, k]; x is (M, K), w1 and w2 (N, K).
__global__ void swiglu_kernel(const float* __restrict__ x, const float* __restrict__ w1,
                              const float* __restrict__ w2, float* __restrict__ y,
                              int M, int N, int K) {
    __shared__ float xs[TILE][TILE];
    __shared__ float w1s[TILE][TILE + 1];  // +1: the transposed reads avoid bank conflicts
    __shared__ float w2s[TILE][TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;
    const int col = blockIdx.x * TILE + tx;
    const int wrow = blockIdx.x * TILE + ty;
    float a1 = 0.f, a2 = 0.f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        const bool kin = k0 + tx < K;
        xs[ty][tx] = (row < M && kin) ? x[(long)row * K + k0 + tx] : 0.f;
        w1s[ty][tx] = (wrow < N && kin) ? w1[(long)wrow * K + k0 + tx] : 0.f;
        w2s[ty][tx] = (wrow < N && kin) ? w2[(long)wrow * K + k0 + tx] : 0.f;
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < TILE; ++kk) {
            const float xv = xs[ty][kk];
            a1 += xv * w1s[tx][kk];
            a2 += xv * w2s[tx][kk];
        }
        __syncthreads();
    }
    if (row < M && col < N) y[(long)row * N + col] = a1 / (1.f + __expf(-a1)) * a2;
}

torch::Tensor forward(torch::Tensor x, torch::Tensor w1, torch::Tensor w2) {
    TORCH_CHECK(x.is_cuda() && w1.is_cuda() && w2.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.dtype() == torch::kFloat32, "x must be float32");
    const int M = x.size(0), K = x.size(1), N = w1.size(0);
    auto y = torch::empty({M, N}, x.options());
    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    swiglu_kernel<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), w1.data_ptr<float>(), w2.data_ptr<float>(), y.data_ptr<float>(), M, N, K);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

CPP_SRC = "torch::Tensor forward(torch::Tensor x, torch::Tensor w1, torch::Tensor w2);"

_ext = load_inline(
    name="builtin_l2_07_linear_swiglu_cuda",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["forward"],
    extra_cuda_cflags=["-O3"],
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
