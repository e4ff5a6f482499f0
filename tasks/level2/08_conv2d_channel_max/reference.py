"""Conv2d + channel-wise max: y[n, 0, h, w] = max_c conv3x3(x)[n, c, h, w] (a max-response map)."""
import torch
import torch.nn as nn

BATCH = 16  # cpu: 2
IN_CHANNELS = 16
OUT_CHANNELS = 64  # cpu: 32
HEIGHT = 128  # cpu: 32
WIDTH = 128  # cpu: 32
KERNEL_SIZE = 3


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x):
        return torch.amax(self.conv(x), dim=1, keepdim=True)


def get_inputs():
    return [torch.randn(BATCH, IN_CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [IN_CHANNELS, OUT_CHANNELS, KERNEL_SIZE]
