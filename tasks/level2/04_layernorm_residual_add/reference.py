"""LayerNorm + residual add: y = residual + LayerNorm(x) over the last dimension (memory bound).

The LayerNorm affine parameters are drawn at random (not torch's ones/zeros) and x has a
non-zero mean, so a kernel that skips the affine step or the centring fails the check.
"""
import torch
import torch.nn as nn

ROWS = 8192  # cpu: 512
HIDDEN = 4096  # cpu: 1024


class Model(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        nn.init.uniform_(self.norm.weight, 0.5, 1.5)
        nn.init.uniform_(self.norm.bias, -0.5, 0.5)

    def forward(self, x, residual):
        return residual + self.norm(x)


def get_inputs():
    return [torch.randn(ROWS, HIDDEN) * 2.0 + 0.5, torch.randn(ROWS, HIDDEN)]


def get_init_inputs():
    return [HIDDEN]
