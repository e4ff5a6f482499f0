import torch
import torch.nn as nn


class Model(nn.Module):
    """Batched matrix product in fp32: C_b = A_b @ B_b with A (batch, M, K), B (batch, K, N)."""

    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return torch.bmm(A, B)


# 2 batch M K N = 4.3 GFLOP.
BATCH, M, K, N = 32, 256, 512, 520  # cpu: 8, 64, 128, 130


def get_inputs():
    return [torch.randn(BATCH, M, K), torch.randn(BATCH, K, N)]


def get_init_inputs():
    return []
