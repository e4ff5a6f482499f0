import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """SiLU (swish): y = x * sigmoid(x)."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(x)


# 48M fp32 elements in and out (384 MB of traffic).
BATCH, FEATURES = 3072, 16384  # cpu: 256, 2048


def get_inputs():
    return [torch.randn(BATCH, FEATURES) * 3.0]


def get_init_inputs():
    return []
