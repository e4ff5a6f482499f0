"""Bias + tanh + multiply in one CUDA kernel: a grid-stride elementwise pass reading x and g
once and writing y once, instead of three kernels with two intermediate tensors."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

__global__ void bias_tanh_mul_kernel(const float* __restrict__ x, const float* __restrict__ b,
                                     const float* __restrict__ g, float* __restrict__ y,
                                     long total, int D) {
    for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total;
         i += (long)gridDim.x * blockDim.x)
        y[i] = (tanhf(x[i] + b[i % D]) * g[i]) + 1;
}

torch::Tensor forward(torch::Tensor x, torch::Tensor b, torch::Tensor g) {
    TORCH_CHECK(x.is_cuda() && g.is_cuda() && b.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.dtype() == torch::kFloat32 && g.dtype() == torch::kFloat32, "inputs must be float32");
    TORCH_CHECK(x.sizes() == g.sizes(), "x and g shapes differ");
    TORCH_CHECK(x.size(-1) == b.numel(), "bias length must match the last dimension");
    auto y = torch::empty_like(x);
    const long total = x.numel();
    const int threads = 256;
    const int blocks = (int)std::min<long>((total + threads - 1) / threads, 65535L * 8);
    bias_tanh_mul_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), b.data_ptr<float>(), g.data_ptr<float>(), y.data_ptr<float>(),
        total, (int)b.numel());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

CPP_SRC = "torch::Tensor forward(torch::Tensor x, torch::Tensor b, torch::Tensor g);"

_ext = load_inline(
    name="builtin_l2_06_bias_tanh_multiply_cuda",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["forward"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.bias = nn.Parameter(torch.empty(hidden))
        nn.init.normal_(self.bias, std=0.5)

    def forward(self, x, g):
        return _ext.forward(x.contiguous(), self.bias, g.contiguous())
