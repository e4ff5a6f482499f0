"""Linear + SiLU gating (SwiGLU): y = silu(x W1^T) * (x W2^T), two bias-free projections of the
same input fused by an elementwise gate, as in LLaMA-style feed-forward layers."""
import torch
import torch.nn as nn

BATCH = 1024  # cpu: 128
IN_FEATURES = 1024  # cpu: 128
OUT_FEATURES = 1536  # cpu: 192


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.gate = nn.Linear(in_features, out_features, bias=False)
        self.up = nn.Linear(in_features, out_features, bias=False)

    def forward(self, x):
        return torch.nn.functional.silu(self.gate(x)) * self.up(x)


def get_inputs():
    # Scaled by 2 so both projections are O(1) and the gate works on both sides of zero.
    return [torch.randn(BATCH, IN_FEATURES) * 2.0]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
