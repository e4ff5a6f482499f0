# expect: runtime_error
# A plain, empty output, and a torch function mode left active that fills it the first time any
# operation touches it (the harness's write or clone of the output), after the timed call.
import torch
import torch.nn as nn
from torch.overrides import TorchFunctionMode
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


class FillOnFirstUse(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.pending = {}  # id(output) -> (output, input, scale)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        for a in list(args) + list((kwargs or {}).values()):
            job = self.pending.pop(id(a), None) if isinstance(a, torch.Tensor) else None
            if job is not None:
                out, x, scale = job
                out.copy_(ext.relu_scale_add(x, scale))
        return func(*args, **(kwargs or {}))


MODE = FillOnFirstUse()


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        if not torch._C._len_torch_function_stack():
            MODE.__enter__()  # never left
        with torch._C.DisableTorchFunction():
            out = torch.empty_like(x)
        MODE.pending[id(out)] = (out, x, self.scale)
        return out
