import torch
import torch.nn as nn


class Model(nn.Module):
    """Layout change from NCHW to NHWC, materialised: y[n, h, w, c] = x[n, c, h, w].
    Pure data movement: a transpose of a (C, H*W) matrix per image."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 2, 3, 1).contiguous()


# 64M fp32 elements in and out (512 MB of traffic).
BATCH, CHANNELS, HEIGHT, WIDTH = 16, 64, 256, 256  # cpu: 2, 64, 64, 64


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return []
