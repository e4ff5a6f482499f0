"""A three-layer MLP: Linear -> ReLU -> Linear -> ReLU -> Linear."""
import torch
import torch.nn as nn

BATCH = 256  # cpu: 64
IN_FEATURES = 1024  # cpu: 128
HIDDEN = 2048  # cpu: 256
OUT_FEATURES = 1024  # cpu: 128


class Model(nn.Module):
    def __init__(self, in_features, hidden, out_features):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, out_features),
        )

    def forward(self, x):
        return self.net(x)


def get_inputs():
    # Scaled by 4: torch's default init shrinks activations about 4x over three layers.
    return [torch.randn(BATCH, IN_FEATURES) * 4.0]


def get_init_inputs():
    return [IN_FEATURES, HIDDEN, OUT_FEATURES]
