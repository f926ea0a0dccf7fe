"""Multi-domain, multi-task heads: a shared tower, then per-surface towers, one logit per task.

logits[b] = Shared(h_b) + Surface_{s_b}(z_b) with z = SharedTower(h): every surface learns from
all traffic through the shared tower and keeps its own correction (different click and
conversion baselines per surface), without a separate model per surface. The per-surface towers
are batched weights gathered by each row's surface id, so one matmul serves a mixed batch.
"""

from __future__ import annotations

import torch
from torch import nn

from gem_model.modules.mlp import mlp


class MultiSurfaceHeads(nn.Module):
    def __init__(
        self, in_dim: int, shared_dims: tuple[int, ...], surface_dims: tuple[int, ...], n_surfaces: int, n_tasks: int
    ) -> None:
        super().__init__()
        if len(surface_dims) != 1:
            raise ValueError(f"model.surface_dims={surface_dims} must have one hidden layer")
        self.shared_tower = mlp(in_dim, shared_dims[:-1], shared_dims[-1])
        self.shared_head = nn.Linear(shared_dims[-1], n_tasks)
        z, hidden = shared_dims[-1], surface_dims[0]
        self.w1 = nn.Parameter(torch.randn(n_surfaces, z, hidden) / z**0.5)
        self.b1 = nn.Parameter(torch.zeros(n_surfaces, hidden))
        self.w2 = nn.Parameter(torch.zeros(n_surfaces, hidden, n_tasks))  # starts as the shared head alone
        self.b2 = nn.Parameter(torch.zeros(n_surfaces, n_tasks))

    def forward(self, h: torch.Tensor, surface: torch.Tensor) -> torch.Tensor:
        """h [B, in_dim], surface [B] embedding-row ids of the surface -> logits [B, T]."""
        z = torch.relu(self.shared_tower(h))
        hidden = torch.relu(torch.bmm(z.unsqueeze(1), self.w1[surface]).squeeze(1) + self.b1[surface])
        specific = torch.bmm(hidden.unsqueeze(1), self.w2[surface]).squeeze(1) + self.b2[surface]
        return self.shared_head(z) + specific
