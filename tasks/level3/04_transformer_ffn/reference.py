"""A pre-norm transformer feed-forward block: y = x + W2 gelu(W1 LayerNorm(x) + b1) + b2.

The LayerNorm affine parameters are drawn at random (not torch's ones/zeros) so a kernel that
skips them fails the check.
"""
import torch
import torch.nn as nn

BATCH = 4  # cpu: 2
SEQ_LEN = 256  # cpu: 32
EMBED_DIM = 512  # cpu: 128
HIDDEN = 2048  # cpu: 512


class Model(nn.Module):
    def __init__(self, embed_dim, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(embed_dim)
        nn.init.uniform_(self.norm.weight, 0.5, 1.5)
        nn.init.uniform_(self.norm.bias, -0.5, 0.5)
        self.fc1 = nn.Linear(embed_dim, hidden)
        self.fc2 = nn.Linear(hidden, embed_dim)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


def get_inputs():
    return [torch.randn(BATCH, SEQ_LEN, EMBED_DIM)]


def get_init_inputs():
    return [EMBED_DIM, HIDDEN]
