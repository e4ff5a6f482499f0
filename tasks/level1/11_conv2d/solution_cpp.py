import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <algorithm>

// Direct convolution, stride 1. One output row stays in L1 while every (ic, kh, kw) tap adds
// a shifted input row into it; the valid ow range is computed up front so the inner loop
// has no branches and vectorises.
torch::Tensor conv2d_forward(torch::Tensor x, torch::Tensor weight, torch::Tensor bias, int64_t pad) {
    TORCH_CHECK(x.device().is_cpu(), "x must be a CPU tensor");
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
    const float* in = x.data_ptr<float>();
    const float* w = weight.data_ptr<float>();
    const float* b = bias.data_ptr<float>();
    float* out = y.data_ptr<float>();
    for (int64_t n = 0; n < batch; ++n) {
        for (int64_t oc = 0; oc < cout; ++oc) {
            for (int64_t oh = 0; oh < ho; ++oh) {
                float* __restrict__ orow = out + ((n * cout + oc) * ho + oh) * wo;
                std::fill(orow, orow + wo, b[oc]);
                for (int64_t ic = 0; ic < cin; ++ic) {
                    const float* plane = in + (n * cin + ic) * h * wd;
                    const float* taps = w + (oc * cin + ic) * k * k;
                    for (int64_t kh = 0; kh < k; ++kh) {
                        const int64_t ih = oh - pad + kh;
                        if (ih < 0 || ih >= h) continue;
                        const float* __restrict__ irow = plane + ih * wd;
                        for (int64_t kw = 0; kw < k; ++kw) {
                            const float tap = taps[kh * k + kw];
                            const int64_t shift = kw - pad;  // iw = ow + shift
                            const int64_t lo = std::max<int64_t>(0, -shift);
                            const int64_t hi = std::min<int64_t>(wo, wd - shift);
                            for (int64_t ow = lo; ow < hi; ++ow) orow[ow] += tap * irow[ow + shift];
                        }
                    }
                }
            }
        }
    }
    return y;
}
"""

conv = load_inline(
    name="builtin_l1_11_conv2d_cpp",
    cpp_sources=cpp_source,
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
