import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__device__ __forceinline__ float gelu_tanh_op(float v) {
    const float u = 0.7978845608028654f * (v + 0.044715f * v * v * v);
    return 0.5f * v * (1.f + tanhf(u));
}

// GELU (tanh approximation): float4 loads for the first n4 groups of four, scalar for the rest, grid-stride for any size.
__global__ void gelu_tanh_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n, int64_t n4) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t start = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float4* y4 = reinterpret_cast<float4*>(y);
    for (int64_t i = start; i < n4; i += stride) {
        float4 v = x4[i];
        v.x = gelu_tanh_op(v.x); v.y = gelu_tanh_op(v.y); v.z = gelu_tanh_op(v.z); v.w = gelu_tanh_op(v.w);
        y4[i] = v;
    }
    for (int64_t i = n4 * 4 + start; i < n; i += stride) {
        y[i] = gelu_tanh_op(x[i]);
    }
}

torch::Tensor gelu_tanh_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    const int64_t n = x.numel();
    if (n == 0) return y;
    const int threads = 256;
    // float4 access needs 16-byte alignment; a view with an odd offset takes the scalar path
    const bool aligned = reinterpret_cast<uintptr_t>(x.data_ptr<float>()) % 16 == 0 &&
                         reinterpret_cast<uintptr_t>(y.data_ptr<float>()) % 16 == 0;
    const int64_t n4 = aligned ? n / 4 : 0;
    const int64_t blocks = std::min<int64_t>((std::max<int64_t>(n4, n - n4 * 4) + threads - 1) / threads, 1 << 20);
    gelu_tanh_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), y.data_ptr<float>(), n, n4);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor gelu_tanh_forward(torch::Tensor x);"

gelu_tanh = load_inline(
    name="builtin_l1_02_gelu_tanh_cuda",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["gelu_tanh_forward"],
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_tanh.gelu_tanh_forward(x)
