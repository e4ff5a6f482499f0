"""Conv2d + GroupNorm + tanh: y = tanh(GroupNorm(conv3x3(x))), a common conv-net stage.

The GroupNorm affine parameters are drawn at random (not torch's ones/zeros) so a kernel that
skips them fails the check.
"""
import torch
import torch.nn as nn

BATCH = 16  # cpu: 2
IN_CHANNELS = 32  # cpu: 16
OUT_CHANNELS = 64  # cpu: 32
HEIGHT = 64  # cpu: 32
WIDTH = 64  # cpu: 32
KERNEL_SIZE = 3
GROUPS = 8


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, groups):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.norm = nn.GroupNorm(groups, out_channels)
        nn.init.uniform_(self.norm.weight, 0.5, 1.5)
        nn.init.uniform_(self.norm.bias, -0.5, 0.5)

    def forward(self, x):
        return torch.tanh(self.norm(self.conv(x)))


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE, GROUPS]
