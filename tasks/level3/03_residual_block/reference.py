"""A residual block without normalisation: y = relu(x + conv3x3(relu(conv3x3(x))))."""
import torch
import torch.nn as nn

BATCH = 8  # cpu: 2
CHANNELS = 64  # cpu: 16
HEIGHT = 56  # cpu: 28
WIDTH = 56  # cpu: 28


class Model(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        return torch.relu(x + self.conv2(torch.relu(self.conv1(x))))


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [CHANNELS]
