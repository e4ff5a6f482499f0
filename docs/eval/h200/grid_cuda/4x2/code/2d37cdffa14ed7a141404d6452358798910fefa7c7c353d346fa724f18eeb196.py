"""A residual block in CUDA: one direct 3x3 convolution kernel (one thread per output element)
with a fused epilogue, launched twice: bias + ReLU after the first convolution, bias + skip
connection + ReLU after the second, so no separate elementwise passes are needed."""
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

// y = relu(conv(x, w) + b [+ skip]); 'skip' may be null. Padding keeps H x W.
__global__ void conv2d_fused_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                    const float* __restrict__ b, const float* __restrict__ skip,
                                    float* __restrict__ y, int N, int Ci, int Co, int H, int W,
                                    int KS, int pad) {
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
        if (skip) acc += skip[idx];
        y[idx] = acc > 0.f ? acc : 0.f;
    }
}

static void conv(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                 const float* skip, torch::Tensor& y) {
    const int N = x.size(0), Ci = x.size(1), H = x.size(2), W = x.size(3);
    const int Co = w.size(0), KS = w.size(2);
    const long total = (long)N * Co * H * W;
    const int threads = 256;
    const int blocks = (int)std::min<long>((total + threads - 1) / threads, 65535L * 8);
    conv2d_fused_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), skip, y.data_ptr<float>(),
        N, Ci, Co, H, W, KS, KS / 2);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

torch::Tensor forward(torch::Tensor x, torch::Tensor w1, torch::Tensor b1, torch::Tensor w2, torch::Tensor b2) {
    TORCH_CHECK(x.is_cuda() && x.dtype() == torch::kFloat32, "x must be a float32 CUDA tensor");
    TORCH_CHECK(w1.size(0) == x.size(1) && w2.size(0) == x.size(1), "the block must keep the channel count");
    auto h = torch::empty_like(x);
    auto y = torch::empty_like(x);
    conv(x, w1, b1, nullptr, h);
    conv(h, w2, b2, x.data_ptr<float>(), y);
    return y;
}
"""

CPP_SRC = "torch::Tensor forward(torch::Tensor x, torch::Tensor w1, torch::Tensor b1, torch::Tensor w2, torch::Tensor b2);"

_ext = load_inline(
    name="builtin_l3_03_residual_block_cuda",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["forward"],
    extra_cuda_cflags=["-O3"],
)


def _conv_params(channels):
    """(weight, bias) of a 3x3 conv initialised exactly as nn.Conv2d.reset_parameters does."""
    weight = nn.Parameter(torch.empty(channels, channels, 3, 3))
    bias = nn.Parameter(torch.empty(channels))
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    bound = 1 / math.sqrt(channels * 9)
    nn.init.uniform_(bias, -bound, bound)
    return weight, bias


class ModelNew(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.w1, self.b1 = _conv_params(channels)
        self.w2, self.b2 = _conv_params(channels)

    def forward(self, x):
        return _ext.forward(x.contiguous(), self.w1, self.b1, self.w2, self.b2)
