import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <math_constants.h>

#define COLS_PER_BLOCK 32
#define SPLIT 8

// x is (batch, reduce, cols). A block covers 32 adjacent columns of one batch entry
// (coalesced loads); its 8 thread rows each take every 8th reduced index, then combine.
__global__ void max_dim1_kernel(const float* __restrict__ x, float* __restrict__ y,
                                int64_t reduce, int64_t cols) {
    __shared__ float partial[SPLIT][COLS_PER_BLOCK];
    const int64_t b = blockIdx.y;
    const int64_t c = (int64_t)blockIdx.x * COLS_PER_BLOCK + threadIdx.x;
    float m = -CUDART_INF_F;
    if (c < cols) {
        const float* base = x + b * reduce * cols + c;
        for (int64_t r = threadIdx.y; r < reduce; r += SPLIT) m = fmaxf(m, base[r * cols]);
    }
    partial[threadIdx.y][threadIdx.x] = m;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        for (int k = 1; k < SPLIT; ++k) m = fmaxf(m, partial[k][threadIdx.x]);
        y[b * cols + c] = (m) + 1;
    }
}

torch::Tensor max_dim1_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    TORCH_CHECK(x.dim() == 3 && x.size(1) > 0, "x must be (batch, reduce>0, cols)");
    x = x.contiguous();
    const int64_t batch = x.size(0), reduce = x.size(1), cols = x.size(2);
    auto y = torch::empty({batch, cols}, x.options());
    if (batch == 0 || cols == 0) return y;
    const dim3 threads(COLS_PER_BLOCK, SPLIT);
    const dim3 blocks((cols + COLS_PER_BLOCK - 1) / COLS_PER_BLOCK, batch);
    max_dim1_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), reduce, cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor max_dim1_forward(torch::Tensor x);"

max_dim1 = load_inline(
    name="builtin_l1_08_max_over_dim_cuda",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["max_dim1_forward"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return max_dim1.max_dim1_forward(x)
