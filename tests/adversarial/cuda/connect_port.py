# expect: runtime_error
# Opens a TCP connection to a port on this machine (the test listens on KERNEL_EVAL_TEST_PORT): at
# import (the compile worker, then the run worker) and in forward. It answers honestly where it got
# through; behind the boundary its network namespace has no interface up, so it fails.
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
