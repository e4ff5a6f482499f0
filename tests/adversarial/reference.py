"""Reference for the adversarial suite: y = relu(x) * scale + x, shape (batch, dim), fp32.

A little more than a ReLU so that partial or approximate work is visible, and 1-D (flat) loops
in the candidates stay simple."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale + x


batch, dim = 64, 4096


def get_inputs():
    return [torch.randn(batch, dim)]


def get_init_inputs():
    return [1.5]
