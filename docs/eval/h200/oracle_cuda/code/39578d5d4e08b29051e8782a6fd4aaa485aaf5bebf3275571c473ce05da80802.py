"""LayerNorm + residual add in one CUDA kernel: one block per row computes the row's mean and
variance (two passes over the row, which stays in L1/L2), then writes
residual + (x - mean) * rstd * gamma + beta, so x is read from DRAM once and y written once."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define THREADS 256

__device__ float block_sum(float v, float* red) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int k = THREADS / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
        __syncthreads();
    }
    const float total = red[0];
    __syncthreads();  // red is reused by the next call
    return total;
}

__global__ void layernorm_residual_kernel(const float* __restrict__ x, const float* __restrict__ res,
                                          const float* __restrict__ gamma, const float* __restrict__ beta,
                                          float* __restrict__ y, int D, float eps) {
    __shared__ float red[THREADS];
    const long base = (long)blockIdx.x * D;
    float s = 0.f;
    for (int i = threadIdx.x; i < D; i += THREADS) s += x[base + i];
    const float mean = block_sum(s, red) / D;
    float v = 0.f;
    for (int i = threadIdx.x; i < D; i += THREADS) {
        const float d = x[base + i] - mean;
        v += d * d;
    }
    const float rstd = rsqrtf(block_sum(v, red) / D + eps);
    for (int i = threadIdx.x; i < D; i += THREADS)
        y[base + i] = res[base + i] + (x[base + i] - mean) * rstd * gamma[i] + beta[i];
}

torch::Tensor forward(torch::Tensor x, torch::Tensor res, torch::Tensor gamma, torch::Tensor beta, double eps) {
    TORCH_CHECK(x.is_cuda() && res.is_cuda(), "inputs must be CUDA tensors");
    TORCH_CHECK(x.dtype() == torch::kFloat32 && res.dtype() == torch::kFloat32, "inputs must be float32");
    TORCH_CHECK(x.sizes() == res.sizes(), "x and residual shapes differ");
    const int D = x.size(-1);
    const long rows = x.numel() / D;
    auto y = torch::empty_like(x);
    layernorm_residual_kernel<<<rows, THREADS, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), res.data_ptr<float>(), gamma.data_ptr<float>(), beta.data_ptr<float>(),
        y.data_ptr<float>(), D, (float)eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

CPP_SRC = "torch::Tensor forward(torch::Tensor x, torch::Tensor res, torch::Tensor gamma, torch::Tensor beta, double eps);"

_ext = load_inline(
    name="builtin_l2_04_layernorm_residual_add_cuda",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["forward"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        # nn.LayerNorm's init (ones/zeros) draws nothing; the reference then draws these two.
        self.gamma = nn.Parameter(torch.empty(hidden))
        self.beta = nn.Parameter(torch.empty(hidden))
        nn.init.uniform_(self.gamma, 0.5, 1.5)
        nn.init.uniform_(self.beta, -0.5, 0.5)
        self.eps = 1e-5

    def forward(self, x, residual):
        return _ext.forward(x.contiguous(), residual.contiguous(), self.gamma, self.beta, self.eps)
