import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define TILE 32

// Shared-memory tiled matrix product, one grid z-slice per batch entry; out-of-range
// elements load as zero, so any M, K, N works.
__global__ void bmm_kernel(const float* __restrict__ A, const float* __restrict__ B,
                           float* __restrict__ C, int64_t M, int64_t K, int64_t N) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE + 1];
    const int64_t batch = blockIdx.z;
    A += batch * M * K;
    B += batch * K * N;
    C += batch * M * N;
    const int64_t row = (int64_t)blockIdx.y * TILE + threadIdx.y;
    const int64_t col = (int64_t)blockIdx.x * TILE + threadIdx.x;
    float acc = 0.f;
    for (int64_t k0 = 0; k0 < K; k0 += TILE) {
        const int64_t ka = k0 + threadIdx.x, kb = k0 + threadIdx.y;
        As[threadIdx.y][threadIdx.x] = (row < M && ka < K) ? A[row * K + ka] : 0.f;
        Bs[threadIdx.y][threadIdx.x] = (kb < K && col < N) ? B[kb * N + col] : 0.f;
        __syncthreads();
#pragma unroll
        for (int k = 0; k < TILE; ++k) acc += As[threadIdx.y][k] * Bs[k][threadIdx.x];
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = acc;
}

torch::Tensor bmm_forward(torch::Tensor A, torch::Tensor B) {
    TORCH_CHECK(A.is_cuda() && B.is_cuda(), "A and B must be CUDA tensors");
    TORCH_CHECK(A.scalar_type() == torch::kFloat32 && B.scalar_type() == torch::kFloat32, "float32 only");
    TORCH_CHECK(A.dim() == 3 && B.dim() == 3 && A.size(0) == B.size(0) && A.size(2) == B.size(1),
                "shapes must be (batch, M, K) and (batch, K, N)");
    TORCH_CHECK(A.size(0) <= 65535, "batch must fit in gridDim.z");
    A = A.contiguous();
    B = B.contiguous();
    const int64_t batch = A.size(0), M = A.size(1), K = A.size(2), N = B.size(2);
    auto C = torch::empty({batch, M, N}, A.options());
    if (batch == 0 || M == 0 || N == 0) return C;
    const dim3 threads(TILE, TILE);
    const dim3 blocks((N + TILE - 1) / TILE, (M + TILE - 1) / TILE, batch);
    bmm_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        A.data_ptr<float>(), B.data_ptr<float>(), C.data_ptr<float>(), M, K, N);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return C;
}
"""

cpp_source = "torch::Tensor bmm_forward(torch::Tensor A, torch::Tensor B);"

bmm = load_inline(
    name="builtin_l1_10_batched_matmul_cuda",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["bmm_forward"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return bmm.bmm_forward(A, B)
