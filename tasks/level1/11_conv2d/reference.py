import torch
import torch.nn as nn


class Model(nn.Module):
    """2-D convolution with bias, stride 1, 'same' zero padding (nn.Conv2d)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


# 2 N Cout Cin k^2 H W = 4.8 GFLOP.
BATCH, IN_CHANNELS, OUT_CHANNELS, KERNEL, HEIGHT, WIDTH = 8, 32, 64, 3, 128, 128  # cpu: 2, 16, 32, 3, 32, 32


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL]
