"""Conv2d + GroupNorm + tanh in three CUDA kernels: a direct convolution (one thread per
output element, bias added), a per-(sample, group) two-pass mean/variance reduction, and one
elementwise pass that normalises, applies the affine parameters and tanh."""
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

// y[n, co, oh, ow] = b[co] + sum_{ci, kh, kw} x[n, ci, oh + kh - pad, ow + kw - pad] * w[co, ci, kh, kw]
__global__ void conv2d_kernel(const float* __restrict__ x, const float* __restrict__ w,
                              const float* __restrict__ b, float* __restrict__ y,
                              int N, int Ci, int Co, int H, int W, int KS, int pad) {
    const long total = (long)N * Co * H * W;
    for (long idx = blockIdx.x * (long)blockDim.x + threadIdx.x; idx < total;
         idx += (long)gridDim.x * blockDim.x) {
        const int ow = idx % W;
        const int oh = (idx / W) % H;
        const int co = (idx / ((long)W * H)) % Co;
        const int n = idx / ((long)W * H * Co);
        float acc = b[co];
        for (int ci = 0; ci < Ci; ++ci) {
            const float* xp = x + ((long)n * Ci + ci) * H * W;
            const float* wp = w + ((long)co * Ci + ci) * KS * KS;
            for (int kh = 0; kh < KS; ++kh) {
                const int ih = oh + kh - pad;
                if (ih < 0 || ih >= H) continue;
                for (int kw = 0; kw < KS; ++kw) {
                    const int iw = ow + kw - pad;
                    if (iw < 0 || iw >= W) continue;
                    acc += xp[ih * W + iw] * wp[kh * KS + kw];
                }
            }
        }
        y[idx] = acc;
    }
}

// One block per (sample, group): mean and 1/sqrt(var + eps) over the group's contiguous span.
__global__ void group_stats_kernel(const float* __restrict__ y, float* __restrict__ mean,
                                   float* __restrict__ rstd, long group_size, float eps) {
    __shared__ float red[256];
    const float* p = y + blockIdx.x * group_size;
    float s = 0.f;
    for (long i = threadIdx.x; i < group_size; i += blockDim.x) s += p[i];
    red[threadIdx.x] = s;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
        __syncthreads();
    }
    const float mu = red[0] / group_size;
    __syncthreads();
    float v = 0.f;
    for (long i = threadIdx.x; i < group_size; i += blockDim.x) {
        const float d = p[i] - mu;
        v += d * d;
    }
    red[threadIdx.x] = v;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) red[threadIdx.x] += red[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        mean[blockIdx.x] = mu;
        rstd[blockIdx.x] = rsqrtf(red[0] / group_size + eps);
    }
}

__global__ void norm_tanh_kernel(float* __restrict__ y, const float* __restrict__ mean,
                                 const float* __restrict__ rstd, const float* __restrict__ gamma,
                                 const float* __restrict__ beta, long total, int C, long HW, int cpg) {
    for (long idx = blockIdx.x * (long)blockDim.x + threadIdx.x; idx < total;
         idx += (long)gridDim.x * blockDim.x) {
        const long nc = idx / HW;
        const int c = nc % C;
        const long g = (nc / C) * (C / cpg) + c / cpg;
        y[idx] = tanhf((y[idx] - mean[g]) * rstd[g] * gamma[c] + beta[c]);
    }
}

torch::Tensor forward(torch::Tensor x, torch::Tensor w, torch::Tensor b, torch::Tensor gamma,
                      torch::Tensor beta, int64_t groups, double eps) {
    TORCH_CHECK(x.is_cuda() && x.dtype() == torch::kFloat32, "x must be a float32 CUDA tensor");
    const int N = x.size(0), Ci = x.size(1), H = x.size(2), W = x.size(3);
    const int Co = w.size(0), KS = w.size(2);
    TORCH_CHECK(Co % groups == 0, "channels must divide into groups");
    auto y = torch::empty({N, Co, H, W}, x.options());
    auto mean = torch::empty({N * groups}, x.options());
    auto rstd = torch::empty({N * groups}, x.options());
    auto stream = at::cuda::getCurrentCUDAStream();
    const long total = (long)N * Co * H * W;
    const int threads = 256;
    const int blocks = (int)std::min<long>((total + threads - 1) / threads, 65535L * 8);
    conv2d_kernel<<<blocks, threads, 0, stream>>>(x.data_ptr<float>(), w.data_ptr<float>(),
        b.data_ptr<float>(), y.data_ptr<float>(), N, Ci, Co, H, W, KS, KS / 2);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const int cpg = Co / groups;
    group_stats_kernel<<<N * groups, 256, 0, stream>>>(y.data_ptr<float>(), mean.data_ptr<float>(),
        rstd.data_ptr<float>(), (long)cpg * H * W, (float)eps);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    norm_tanh_kernel<<<blocks, threads, 0, stream>>>(y.data_ptr<float>(), mean.data_ptr<float>(),
        rstd.data_ptr<float>(), gamma.data_ptr<float>(), beta.data_ptr<float>(), total, Co,
        (long)H * W, cpg);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

CPP_SRC = ("torch::Tensor forward(torch::Tensor x, torch::Tensor w, torch::Tensor b, torch::Tensor gamma, "
           "torch::Tensor beta, int64_t groups, double eps);")

_ext = load_inline(
    name="builtin_l2_03_conv2d_groupnorm_tanh_cuda",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["forward"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups):
        super().__init__()
        # Same parameters, same init calls in the same order as the reference's
        # nn.Conv2d.reset_parameters followed by its GroupNorm draws.
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.empty(out_channels))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        bound = 1 / math.sqrt(in_channels * kernel_size * kernel_size)
        nn.init.uniform_(self.bias, -bound, bound)
        self.gamma = nn.Parameter(torch.empty(out_channels))
        self.beta = nn.Parameter(torch.empty(out_channels))
        nn.init.uniform_(self.gamma, 0.5, 1.5)
        nn.init.uniform_(self.beta, -0.5, 0.5)
        self.groups = groups
        self.eps = 1e-5

    def forward(self, x):
        return _ext.forward(x.contiguous(), self.weight, self.bias, self.gamma, self.beta, self.groups, self.eps)
