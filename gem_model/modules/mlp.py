"""The plain MLP every tower, head and Wukong block is built from."""

from __future__ import annotations

from torch import nn


def mlp(in_dim: int, dims: tuple[int, ...], out_dim: int) -> nn.Sequential:
    """Linear-ReLU stack ending in a plain Linear to `out_dim`."""
    layers: list[nn.Module] = []
    for d in dims:
        layers += [nn.Linear(in_dim, d), nn.ReLU()]
        in_dim = d
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)
