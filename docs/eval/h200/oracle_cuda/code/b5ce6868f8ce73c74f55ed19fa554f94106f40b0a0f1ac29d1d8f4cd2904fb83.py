import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

// Direct convolution, stride 1: one thread per output element (n, oc, oh, ow), ow fastest so
// neighbouring threads read neighbouring inputs and the same weights.
__global__ void conv2d_kernel(const float* __restrict__ x, const float* __restrict__ w,
                              const float* __restrict__ bias, float* __restrict__ y,
                              int64_t batch, int64_t cin, int64_t h, int64_t wd,
                              int64_t cout, int64_t k, int64_t pad, int64_t ho, int64_t wo) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t total = batch * cout * ho * wo;
    if (idx >= total) return;
    const int64_t ow = idx % wo;
    int64_t t = idx / wo;
    const int64_t oh = t % ho;
    t /= ho;
    const int64_t oc = t % cout;
    const int64_t n = t / cout;
    float acc = bias[oc];
    for (int64_t ic = 0; ic < cin; ++ic) {
        const float* xp = x + (n * cin + ic) * h * wd;
        const float* wp = w + (oc * cin + ic) * k * k;
        for (int64_t kh = 0; kh < k; ++kh) {
            const int64_t ih = oh - pad + kh;
            if (ih < 0 || ih >= h) continue;
            for (int64_t kw = 0; kw < k; ++kw) {
                const int64_t iw = ow - pad + kw;
                if (iw < 0 || iw >= wd) continue;
                acc += xp[ih * wd + iw] * wp[kh * k + kw];
            }
        }
    }
    y[idx] = acc;
}

torch::Tensor conv2d_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, int64_t pad) {
    TORCH_CHECK(x.is_cuda() && weight.is_cuda() && bias.is_cuda(), "tensors must be on CUDA");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    TORCH_CHECK(x.dim() == 4 && weight.dim() == 4 && x.size(1) == weight.size(1), "shape mismatch");
    TORCH_CHECK(weight.size(2) == weight.size(3), "square kernels only");
    x = x.contiguous();
    weight = weight.contiguous();
    bias = bias.contiguous();
    const int64_t batch = x.size(0), cin = x.size(1), h = x.size(2), wd = x.size(3);
    const int64_t cout = weight.size(0), k = weight.size(2);
    const int64_t ho = h + 2 * pad - k + 1, wo = wd + 2 * pad - k + 1;
    TORCH_CHECK(ho > 0 && wo > 0, "kernel larger than the padded input");
    auto y = torch::empty({batch, cout, ho, wo}, x.options());
    const int64_t total = y.numel();
    if (total == 0) return y;
    const int threads = 256;
    const int64_t blocks = (total + threads - 1) / threads;
    conv2d_kernel<<<blocks, threads, 0, at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(), y.data_ptr<float>(),
        batch, cin, h, wd, cout, k, pad, ho, wo);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return y;
}
"""

cpp_source = "torch::Tensor conv2d_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, int64_t pad);"

conv = load_inline(
    name="builtin_l1_11_conv2d_cuda",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["conv2d_forward"],
)


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.padding = kernel_size // 2
        # nn.Conv2d's parameters, created and initialised exactly as its reset_parameters does
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, kernel_size, kernel_size))
        self.bias = nn.Parameter(torch.empty(out_channels))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        bound = 1 / math.sqrt(in_channels * kernel_size * kernel_size)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return conv.conv2d_forward(x, self.weight, self.bias, self.padding)
