import torch
import torch.nn as nn


class Model(nn.Module):
    """Matrix product in fp32: C = A @ B with A (M, K) and B (K, N)."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.matmul(A, B)


# 2 M K N = 4.3 GFLOP; sizes not multiples of 32 so tile edges are exercised.
M, K, N = 2000, 1040, 1030  # cpu: 320, 200, 198


def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]


def get_init_inputs():
    return []
