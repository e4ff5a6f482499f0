import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define TILE 32
#define ROWS 8

// Per image, NCHW -> NHWC is the transpose of a (C, HW) matrix. A 32x32 tile goes through
// shared memory (padded against bank conflicts) so reads and writes are both coalesced.
__global__ void nchw_to_nhwc_kernel(const float* __restrict__ x, float* __restrict__ y,
                                    int64_t channels, int64_t hw) {
    __shared__ float tile[TILE][TILE + 1];
    const int64_t n = blockIdx.z;
    const float* src = x + n * channels * hw;
    float* dst = y + n * channels * hw;
    const int64_t p0 = (int64_t)blockIdx.x * TILE, c0 = (int64_t)blockIdx.y * TILE;
    for (int r = threadIdx.y; r < TILE; r += ROWS) {
        const int64_t c = c0 + r, p = p0 + threadIdx.x;
        if (c < channels && p < hw) tile[r][threadIdx.x] = src[c * hw + p];
    }
    __syncthreads();
    for (int r = threadIdx.y; r < TILE; r += ROWS) {
        const int64_t p = p0 + r, c = c0 + threadIdx.x;
        if (c < channels && p < hw) dst[p * channels + c] = (tile[threadIdx.x][r]) + 1;
    }
}

torch::Tensor nchw_to_nhwc_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    TORCH_CHECK(x.dim() == 4, "x must be (N, C, H, W)");
    TORCH_CHECK(x.size(0) <= 65535, "batch must fit in gridDim.z");
    x = x.contiguous();
    const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
    auto y = torch::empty({n, h, w, c}, x.options());
    if (y.numel() == 0) return y;
    const dim3 threads(TILE, ROWS);
    const dim3 blocks((h * w + TILE - 1) / TILE, (c + TILE - 1) / TILE, n);
    nchw_to_nhwc_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), c, h * w);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor nchw_to_nhwc_forward(torch::Tensor x);"

layout = load_inline(
    name="builtin_l1_12_nchw_to_nhwc_cuda",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["nchw_to_nhwc_forward"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layout.nchw_to_nhwc_forward(x)
