# expect: runtime_error
# Opens a TCP connection to a port on this machine (the test listens on KERNEL_EVAL_TEST_PORT): at
# import (the compile worker, then the run worker) and in forward. It answers honestly where it got
# through; behind the boundary its network namespace has no interface up, so it fails.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

KERNELS = r"""
#include <torch/extension.h>
#include <cmath>

// Shared by every C++ candidate of the adversarial suite, so the suite compiles once.
static void body(const float* in, float* out, int64_t begin, int64_t end, float s) {
    for (int64_t i = begin; i < end; ++i) {
        float v = in[i];
        out[i] = (v > 0.f ? v : 0.f) * s + v;
    }
}

torch::Tensor relu_scale_add(torch::Tensor x, double scale) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    body(xc.data_ptr<float>(), y.data_ptr<float>(), 0, xc.numel(), (float)scale);
    return y;
}

// partial computation: only the first half of the output is written
torch::Tensor relu_scale_add_half(torch::Tensor x, double scale) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    body(xc.data_ptr<float>(), y.data_ptr<float>(), 0, xc.numel() / 2, (float)scale);
    return y;
}

// lower precision: the result rounded to a 1/4 grid (an 8-bit-like format)
torch::Tensor relu_scale_add_coarse(torch::Tensor x, double scale) {
    auto y = relu_scale_add(x, scale);
    float* p = y.data_ptr<float>();
    for (int64_t i = 0; i < y.numel(); ++i) p[i] = std::round(p[i] * 4.f) / 4.f;
    return y;
}

// writes the result into its input and returns it
torch::Tensor relu_scale_add_inplace(torch::Tensor x, double scale) {
    float* p = x.data_ptr<float>();
    body(p, p, 0, x.numel(), (float)scale);
    return x;
}

torch::Tensor crash(torch::Tensor x) {
    volatile float* p = nullptr;
    p[12345] = 1.f;
    return x;
}

torch::Tensor spin(torch::Tensor x) {
    volatile int64_t k = 0;
    while (true) { k = k + 1; }
    return x;
}
"""

ext = load_inline(name="ext", cpp_sources=KERNELS,
                  functions=["relu_scale_add", "relu_scale_add_half", "relu_scale_add_coarse",
                             "relu_scale_add_inplace", "crash", "spin"])

import os
import socket


def _call_home() -> str:
    port = int(os.environ.get("KERNEL_EVAL_TEST_PORT", "9"))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"keval-candidate")
        return ""
    except OSError as e:
        return f"no connection to port {port}: {e}"


BLOCKED = _call_home()


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        blocked = BLOCKED or _call_home()
        if blocked:
            raise RuntimeError(blocked)
        return ext.relu_scale_add(x, self.scale)
