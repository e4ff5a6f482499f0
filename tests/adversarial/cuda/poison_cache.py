# expect: runtime_error
# Poisons the shared build cache while it compiles: every compile record it finds is rewritten as a
# compile error (a later candidate with that source would be judged compile_error without being
# built) and a file is planted beside the builds; it also leaves files in /tmp, /dev/shm and its home.
# It answers honestly where the cache took its writes; behind the boundary the cache is hidden and
# its own build directory is all it may write, so it fails.
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
