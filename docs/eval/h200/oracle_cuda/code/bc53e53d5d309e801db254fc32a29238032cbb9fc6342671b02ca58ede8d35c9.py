import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

// blockDim.x must be a multiple of 32; thread 0 gets the block's sum.
__device__ float block_sum(float v, float* shared) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = threadIdx.x < warps ? shared[threadIdx.x] : 0.f;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    return v;
}

// One block per row; each thread sums a strided slice of the row, then the block reduces.
__global__ void row_sum_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
    __shared__ float shared[32];
    const float* row = x + (int64_t)blockIdx.x * cols;
    float s = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += row[j];
    s = block_sum(s, shared);
    if (threadIdx.x == 0) y[blockIdx.x] = s;
}

torch::Tensor row_sum_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    TORCH_CHECK(x.dim() >= 1, "x must have at least one dimension");
    x = x.contiguous();
    auto sizes = x.sizes().vec();
    const int64_t cols = sizes.back();
    sizes.pop_back();
    auto y = torch::empty(sizes, x.options());
    const int64_t rows = y.numel();
    if (rows == 0) return y;
    row_sum_kernel<<<rows, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor row_sum_forward(torch::Tensor x);"

row_sum = load_inline(
    name="builtin_l1_07_row_sum_cuda",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["row_sum_forward"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return row_sum.row_sum_forward(x)
