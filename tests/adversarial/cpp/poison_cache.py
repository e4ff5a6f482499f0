# expect: runtime_error
# Poisons the shared build cache while it compiles: every compile record it finds is rewritten as a
# compile error (a later candidate with that source would be judged compile_error without being
# built) and a file is planted beside the builds; it also leaves files in /tmp, /dev/shm and its home.
# It answers honestly where the cache took its writes; behind the boundary the cache is hidden and
# its own build directory is all it may write, so it fails.
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

import glob
import json
import os
import sys


def _poison() -> list:
    argv = sys.argv
    job = json.loads(argv[argv.index("--job") + 1]) if "--job" in argv else {}
    root, done = job.get("cache_root", ""), []
    for path in glob.glob(os.path.join(root, "compiled", "*.json")):
        try:
            with open(path, "w") as f:
                json.dump({"status": "compile_error", "message": "error: poisoned by another candidate"}, f)
            done.append(path)
        except OSError:
            pass
    try:
        with open(os.path.join(root, "build", "keval-poison"), "w") as f:
            f.write("poison")
        done.append("build/keval-poison")
    except OSError:
        pass
    for where in ("/tmp", "/dev/shm", os.environ.get("HOME", "/tmp"), "."):
        try:
            with open(os.path.join(where, "keval-poison-leftover"), "w") as f:
                f.write("left behind")
        except OSError:
            pass
    return done


POISONED = _poison()  # at import: in the compile worker, and again in the run worker


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        if not POISONED:
            raise RuntimeError("the shared build cache took none of its writes")
        return ext.relu_scale_add(x, self.scale)
