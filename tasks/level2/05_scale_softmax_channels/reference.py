"""Scale + softmax over channels: y = softmax(scale * x, dim=1) for an NCHW map (per-pixel class
probabilities, as in segmentation heads). Memory bound; the reduction runs across a strided axis.
"""
import torch
import torch.nn as nn

BATCH = 32  # cpu: 2
CHANNELS = 16
HEIGHT = 256  # cpu: 128
WIDTH = 256  # cpu: 128
SCALE = 3.0


class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.softmax(x * self.scale, dim=1)


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [SCALE]
