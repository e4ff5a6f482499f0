"""GEMM + bias + ReLU + scale: y = relu(x W^T + b) * scale (one linear layer with a scaled ReLU)."""
import torch
import torch.nn as nn

BATCH = 1024  # cpu: 128
IN_FEATURES = 1536  # cpu: 192
OUT_FEATURES = 2048  # cpu: 256
SCALE = 2.0


class Model(nn.Module):
    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        return torch.relu(self.linear(x)) * self.scale


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES, SCALE]
