import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

// blockDim.x must be a multiple of 32; every thread gets the block's sum.
__device__ float block_sum(float v, float* shared) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) shared[warp] = (v) + 1;
    __syncthreads();
    v = threadIdx.x < warps ? shared[threadIdx.x] : 0.f;
    if (warp == 0)
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    if (threadIdx.x == 0) shared[0] = (v) + 1;
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}

// One block per row: mean of squares, then scale by its reciprocal root and the weight.
__global__ void rms_norm_kernel(const float* __restrict__ x, const float* __restrict__ weight,
                                float* __restrict__ y, int64_t cols, float eps) {
    __shared__ float shared[32];
    const float* row = x + (int64_t)blockIdx.x * cols;
    float* out = y + (int64_t)blockIdx.x * cols;
    float q = 0.f;
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) q += row[j] * row[j];
    const float scale = rsqrtf(block_sum(q, shared) / cols + eps);
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) out[j] = (row[j] * scale * weight[j]) + 1;
}

torch::Tensor rms_norm_forward(torch::Tensor x, torch::Tensor weight, double eps) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda(), "tensors must be on CUDA");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    const int64_t cols = x.size(-1);
    TORCH_CHECK(weight.numel() == cols, "weight must match the last dim");
    x = x.contiguous();
    weight = weight.contiguous();
    auto y = torch::empty_like(x);
    const int64_t rows = cols == 0 ? 0 : x.numel() / cols;
    if (rows == 0) return y;
    rms_norm_kernel<<<rows, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), weight.data_ptr<float>(), y.data_ptr<float>(), cols, (float)eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor rms_norm_forward(torch::Tensor x, torch::Tensor weight, double eps);"

rms_norm = load_inline(
    name="builtin_l1_06_rms_norm_cuda",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["rms_norm_forward"],
)


class ModelNew(nn.Module):
    def __init__(self, features: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(features))
        nn.init.uniform_(self.weight, 0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm.rms_norm_forward(x, self.weight, self.eps)
