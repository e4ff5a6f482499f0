"""Conv2d + channel max in one CUDA kernel: one thread per output pixel computes every output
channel's convolution in turn and keeps the running max, so the (N, C, H, W) convolution
output never touches memory."""
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

// y[n, 0, oh, ow] = max_co (b[co] + sum_{ci, kh, kw} x[n, ci, oh + kh - pad, ow + kw - pad] * w[co, ci, kh, kw])
__global__ void conv2d_channel_max_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                          const float* __restrict__ b, float* __restrict__ y,
                                          int N, int Ci, int Co, int H, int W, int KS, int pad) {
    const long total = (long)N * H * W;
    for (long idx = blockIdx.x * (long)blockDim.x + threadIdx.x; idx < total;
         idx += (long)gridDim.x * blockDim.x) {
        const int ow = idx % W;
        const int oh = (idx / W) % H;
        const int n = idx / ((long)W * H);
        float best = -INFINITY;
        for (int co = 0; co < Co; ++co) {
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
            best = fmaxf(best, acc);
        }
        y[idx] = best;
    }
}

torch::Tensor forward(torch::Tensor x, torch::Tensor w, torch::Tensor b) {
    TORCH_CHECK(x.is_cuda() && x.dtype() == torch::kFloat32, "x must be a float32 CUDA tensor");
    const int N = x.size(0), Ci = x.size(1), H = x.size(2), W = x.size(3);
    const int Co = w.size(0), KS = w.size(2);
    auto y = torch::empty({N, 1, H, W}, x.options());
    const long total = (long)N * H * W;
    const int threads = 256;
    const int blocks = (int)std::min<long>((total + threads - 1) / threads, 65535L * 8);
    conv2d_channel_max_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), y.data_ptr<float>(),
        N, Ci, Co, H, W, KS, KS / 2);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

CPP_SRC = "torch::Tensor forward(torch::Tensor x, torch::Tensor w, torch::Tensor b);"

_ext = load_inline(
    name="builtin_l2_08_conv2d_channel_max_cuda",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["forward"],
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        # Same parameters, same init calls in the same order as nn.Conv2d.reset_parameters.
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.empty(out_channels))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        bound = 1 / math.sqrt(in_channels * kernel_size * kernel_size)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x):
        return _ext.forward(x.contiguous(), self.weight, self.bias)
