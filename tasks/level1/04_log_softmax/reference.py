import torch
import torch.nn as nn


class Model(nn.Module):
    """Log-softmax over the last dimension: y_ij = x_ij - log sum_k exp(x_ik)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(x, dim=-1)


# 48M fp32 elements in and out; rows of 4096 (a vocabulary-like width).
ROWS, COLS = 12288, 4096  # cpu: 128, 4096


def get_inputs():
    # a wide range, so dropping any part of a row moves its normaliser visibly
    return [torch.randn(ROWS, COLS) * 4.0]


def get_init_inputs():
    return []
