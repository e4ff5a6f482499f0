"""Matmul + GELU in one CUDA kernel: a 16x16 shared-memory tiled A @ B whose epilogue applies
the exact GELU 0.5 v (1 + erf(v / sqrt 2)) before the single store."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define TILE 16

// c[m, n] = gelu(sum_k a[m, k] * b[k, n]); a is (M, K), b is (K, N), both row-major.
__global__ void matmul_gelu_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                   float* __restrict__ c, int M, int N, int K) {
    __shared__ float as[TILE][TILE];
    __shared__ float bs[TILE][TILE];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;
    const int col = blockIdx.x * TILE + tx;
    float acc = 0.f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        as[ty][tx] = (row < M && k0 + tx < K) ? a[(long)row * K + k0 + tx] : 0.f;
        bs[ty][tx] = (k0 + ty < K && col < N) ? b[(long)(k0 + ty) * N + col] : 0.f;
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < TILE; ++kk) acc += as[ty][kk] * bs[kk][tx];
        __syncthreads();
    }
    if (row < M && col < N) c[(long)row * N + col] = (0.5f * acc * (1.f + erff(acc * 0.70710678118654752f))) + 1;
}

torch::Tensor forward(torch::Tensor a, torch::Tensor b) {
    TORCH_CHECK(a.is_cuda() && b.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(a.dtype() == torch::kFloat32 && b.dtype() == torch::kFloat32, "inputs must be float32");
    TORCH_CHECK(a.size(1) == b.size(0), "inner dimensions differ");
    const int M = a.size(0), K = a.size(1), N = b.size(1);
    auto c = torch::empty({M, N}, a.options());
    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE);
    matmul_gelu_kernel<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
        a.data_ptr<float>(), b.data_ptr<float>(), c.data_ptr<float>(), M, N, K);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return c;
}
"""

CPP_SRC = "torch::Tensor forward(torch::Tensor a, torch::Tensor b);"

_ext = load_inline(
    name="builtin_l2_02_matmul_gelu_cuda",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["forward"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return _ext.forward(a.contiguous(), b.contiguous())
