"""Multi-head self-attention in CUDA: one batched, strided 16x16 shared-memory tiled GEMM
kernel serves all four products (QKV projection, Q K^T per head, P V per head, output
projection) by reading its operands through (batch, head, row, col) strides, so no head is
ever copied or transposed; a block-per-row kernel does the softmax in place."""
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

CUDA_SRC = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>

#define TILE 16
#define THREADS 256

// For z = blockIdx.z, zb = z / heads, zh = z % heads:
//   C(m, n) = alpha * sum_k A(m, k) B(k, n) + bias[n]   (bias may be null)
// where X(i, j) of operand X lives at X[zb * xb + zh * xh + i * xi + j * xj].
__global__ void bgemm_kernel(const float* __restrict__ A, const float* __restrict__ B,
                             const float* __restrict__ bias, float* __restrict__ C,
                             int M, int N, int K, int heads, float alpha,
                             long ab, long ah, long am, long ak,
                             long bb, long bh, long bk, long bn,
                             long cb, long ch, long cm, long cn) {
    __shared__ float as[TILE][TILE];
    __shared__ float bs[TILE][TILE];
    const int zb = blockIdx.z / heads, zh = blockIdx.z % heads;
    A += zb * ab + zh * ah;
    B += zb * bb + zh * bh;
    C += zb * cb + zh * ch;
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;
    const int col = blockIdx.x * TILE + tx;
    float acc = 0.f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        as[ty][tx] = (row < M && k0 + tx < K) ? A[row * am + (k0 + tx) * ak] : 0.f;
        bs[ty][tx] = (k0 + ty < K && col < N) ? B[(k0 + ty) * bk + col * bn] : 0.f;
        __syncthreads();
        #pragma unroll
        for (int kk = 0; kk < TILE; ++kk) acc += as[ty][kk] * bs[kk][tx];
        __syncthreads();
    }
    if (row < M && col < N) C[row * cm + col * cn] = alpha * acc + (bias ? bias[col] : 0.f);
}

__device__ float block_reduce(float v, float* red, bool is_max) {
    red[threadIdx.x] = v;
    __syncthreads();
    for (int k = THREADS / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k)
            red[threadIdx.x] = is_max ? fmaxf(red[threadIdx.x], red[threadIdx.x + k])
                                      : red[threadIdx.x] + red[threadIdx.x + k];
        __syncthreads();
    }
    const float total = red[0];
    __syncthreads();  // red is reused by the next call
    return total;
}

// In-place softmax of each length-L row of p; one block per row.
__global__ void softmax_rows_kernel(float* __restrict__ p, int L) {
    __shared__ float red[THREADS];
    float* r = p + (long)blockIdx.x * L;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < L; i += THREADS) m = fmaxf(m, r[i]);
    m = block_reduce(m, red, true);
    float s = 0.f;
    for (int i = threadIdx.x; i < L; i += THREADS) {
        const float e = __expf(r[i] - m);
        r[i] = e;
        s += e;
    }
    const float inv = 1.f / block_reduce(s, red, false);
    for (int i = threadIdx.x; i < L; i += THREADS) r[i] *= inv;
}

static void bgemm(const float* A, const float* B, const float* bias, float* C, int M, int N, int K,
                  int batch, int heads, float alpha, long ab, long ah, long am, long ak,
                  long bb, long bh, long bk, long bn, long cb, long ch, long cm, long cn) {
    dim3 block(TILE, TILE);
    dim3 grid((N + TILE - 1) / TILE, (M + TILE - 1) / TILE, batch * heads);
    bgemm_kernel<<<grid, block, 0, at::cuda::getCurrentCUDAStream()>>>(
        A, B, bias, C, M, N, K, heads, alpha, ab, ah, am, ak, bb, bh, bk, bn, cb, ch, cm, cn);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
}

torch::Tensor forward(torch::Tensor x, torch::Tensor w_qkv, torch::Tensor b_qkv,
                      torch::Tensor w_proj, torch::Tensor b_proj, int64_t num_heads) {
    TORCH_CHECK(x.is_cuda() && x.dtype() == torch::kFloat32, "x must be a float32 CUDA tensor");
    const int Bt = x.size(0), S = x.size(1), E = x.size(2), H = num_heads;
    TORCH_CHECK(E % H == 0, "embed_dim must divide into heads");
    const int d = E / H, M = Bt * S;
    auto qkv = torch::empty({Bt, S, 3 * E}, x.options());
    auto scores = torch::empty({Bt, H, S, S}, x.options());
    auto heads_out = torch::empty({Bt, S, E}, x.options());
    auto y = torch::empty({Bt, S, E}, x.options());
    const float* xp = x.data_ptr<float>();
    float* q = qkv.data_ptr<float>();
    float* sp = scores.data_ptr<float>();
    float* hp = heads_out.data_ptr<float>();
    const long E3 = 3L * E;
    // qkv(m, n) = sum_k x(m, k) w_qkv(n, k) + b_qkv(n)
    bgemm(xp, w_qkv.data_ptr<float>(), b_qkv.data_ptr<float>(), q, M, 3 * E, E, 1, 1, 1.f,
          0, 0, E, 1, 0, 0, 1, E, 0, 0, 3 * E, 1);
    // scores[b, h](i, j) = q[b, i, h, :] . k[b, j, h, :] / sqrt(d)
    bgemm(q, q + E, nullptr, sp, S, S, d, Bt, H, 1.f / sqrtf((float)d),
          S * E3, d, E3, 1, S * E3, d, 1, E3, (long)H * S * S, (long)S * S, S, 1);
    softmax_rows_kernel<<<Bt * H * S, THREADS, 0, at::cuda::getCurrentCUDAStream()>>>(sp, S);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    // heads_out[b, i, h, :] = sum_j p[b, h](i, j) v[b, j, h, :]
    bgemm(sp, q + 2 * E, nullptr, hp, S, d, S, Bt, H, 1.f,
          (long)H * S * S, (long)S * S, S, 1, S * E3, d, E3, 1, (long)S * E, d, E, 1);
    // y(m, n) = sum_k heads_out(m, k) w_proj(n, k) + b_proj(n)
    bgemm(hp, w_proj.data_ptr<float>(), b_proj.data_ptr<float>(), y.data_ptr<float>(), M, E, E, 1, 1, 1.f,
          0, 0, E, 1, 0, 0, 1, E, 0, 0, E, 1);
    return y;
}
"""

CPP_SRC = ("torch::Tensor forward(torch::Tensor x, torch::Tensor w_qkv, torch::Tensor b_qkv, "
           "torch::Tensor w_proj, torch::Tensor b_proj, int64_t num_heads);")

_ext = load_inline(
    name="builtin_l3_02_multihead_self_attention_cuda",
    cpp_sources=CPP_SRC,
    cuda_sources=CUDA_SRC,
    functions=["forward"],
    extra_cuda_cflags=["-O3"],
)


def _linear_params(in_features, out_features):
    """(weight, bias) initialised exactly as nn.Linear.reset_parameters does."""
    weight = nn.Parameter(torch.empty(out_features, in_features))
    bias = nn.Parameter(torch.empty(out_features))
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    bound = 1 / math.sqrt(in_features)
    nn.init.uniform_(bias, -bound, bound)
    return weight, bias


class ModelNew(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.w_qkv, self.b_qkv = _linear_params(embed_dim, 3 * embed_dim)
        self.w_proj, self.b_proj = _linear_params(embed_dim, embed_dim)

    def forward(self, x):
        return _ext.forward(x.contiguous(), self.w_qkv, self.b_qkv, self.w_proj, self.b_proj, self.num_heads)
