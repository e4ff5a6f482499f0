import torch
import torch.nn as nn


class Model(nn.Module):
    """LayerNorm over the last dimension with affine weight and bias:
    y = (x - mean) / sqrt(var + eps) * weight + bias (biased variance)."""

    def __init__(self, features: int, eps: float):
        super().__init__()
        self.norm = nn.LayerNorm(features, eps=eps)
        # random affine parameters, so a kernel that ignores them fails
        nn.init.uniform_(self.norm.weight, 0.5, 1.5)
        nn.init.uniform_(self.norm.bias, -0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


ROWS, FEATURES, EPS = 12288, 4096, 1e-5  # cpu: 128, 4096, 1e-5


def get_inputs():
    # rows with different offsets and scales, so the mean and variance both matter
    return [torch.randn(ROWS, FEATURES) * (torch.rand(ROWS, 1) * 3 + 0.5) + torch.randn(ROWS, 1) * 2]


def get_init_inputs():
    return [FEATURES, EPS]
