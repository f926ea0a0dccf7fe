"""Wukong interaction layers (Zhang et al., "Wukong: Towards a Scaling Law for Large-Scale
Recommendation", arXiv 2403.02545) over a set of embeddings X [B, n, D].

One layer: X' = LN(concat(FMB(X), LCB(X)) + residual(X)). The factorization-machine block uses
the optimized low-rank FM, X (Xᵀ Y) with Y [n, k], which costs O(n·D·k) instead of the O(n²·D)
of all pairwise dot products; Y is input-attentive (Y0 + X W, so each embedding weighs itself into
the k projections). Its [n, k] result is flattened, layer-normed and mapped by an MLP to n_F new
embeddings. The linear compress block re-mixes the n inputs into n_L embeddings. Stacking layers
raises the interaction order exponentially (layer i captures up to 2^i-order interactions), which
is what makes Wukong scale.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from gem_model.config import WukongConfig
from gem_model.modules.mlp import mlp


def low_rank_fm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x [B, n, D], y [n, k] or [B, n, k] -> (X Xᵀ) Y [B, n, k], computed as X (Xᵀ Y)."""
    return torch.bmm(x, torch.matmul(x.transpose(1, 2), y))


class FactorizationMachineBlock(nn.Module):
    """[B, n, D] -> [B, n_F, D] via MLP(LN(flatten(X (Xᵀ Y))))."""

    def __init__(self, n_in: int, dim: int, config: WukongConfig) -> None:
        super().__init__()
        self.n_out, self.dim = config.n_fm, dim
        self.y = nn.Parameter(torch.randn(n_in, config.rank) / n_in**0.5)
        self.attention = nn.Linear(dim, config.rank, bias=False)
        nn.init.zeros_(self.attention.weight)  # starts as the plain low-rank FM
        self.norm = nn.LayerNorm(n_in * config.rank)
        self.mlp = mlp(n_in * config.rank, config.mlp_dims, config.n_fm * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.y + self.attention(x)  # [B, n, k]
        return self.mlp(self.norm(low_rank_fm(x, y).flatten(1))).view(-1, self.n_out, self.dim)


class LinearCompressBlock(nn.Module):
    """[B, n, D] -> [B, n_L, D]: each output embedding a learned mix of the inputs."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) / n_in**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("oi,bid->bod", self.weight, x)


class WukongLayer(nn.Module):
    """One Wukong layer: n_in embeddings in, n_F + n_L embeddings out."""

    def __init__(self, n_in: int, dim: int, config: WukongConfig) -> None:
        super().__init__()
        self.n_out = config.n_fm + config.n_lc
        self.fmb = FactorizationMachineBlock(n_in, dim, config)
        self.lcb = LinearCompressBlock(n_in, config.n_lc)
        # The residual needs n_out embeddings; a token-mixing projection when the count changes.
        self.residual = None if n_in == self.n_out else LinearCompressBlock(n_in, self.n_out)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x if self.residual is None else self.residual(x)
        return self.norm(torch.cat([self.fmb(x), self.lcb(x)], dim=1) + residual)


class WukongExperts(nn.Module):
    """Kunlun's Mixture of Wukong Experts (`model.experimental.wukong_experts`): the n_in embeddings split into
    `n_experts` contiguous groups, each mixed by its own Wukong layer into an equal share of the n_F + n_L
    outputs, concatenated. No router: a dense partition whose experts are independent, so expert parallelism
    can place them on different devices (the write-ups name no gating;
    docs/experiments/2026-12-04-kunlun-reading-notes.md §7)."""

    def __init__(self, n_in: int, dim: int, config: WukongConfig, n_experts: int) -> None:
        super().__init__()
        m = n_experts
        if n_in < m:
            raise ValueError(
                f"model.experimental.wukong_experts={m} is above the {n_in} embeddings a layer takes; lower it"
            )
        self.sizes = [n_in // m + (1 if i < n_in % m else 0) for i in range(m)]
        share = dataclasses.replace(config, n_fm=config.n_fm // m, n_lc=config.n_lc // m)
        self.experts = nn.ModuleList([WukongLayer(n, dim, share) for n in self.sizes])
        self.n_out = config.n_fm + config.n_lc

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([expert(part) for expert, part in zip(self.experts, x.split(self.sizes, dim=1))], dim=1)


def wukong_layer(n_in: int, dim: int, config: WukongConfig, n_experts: int = 1) -> nn.Module:
    """One Wukong layer, or its mixture of `n_experts` experts when there are more than one."""
    return WukongExperts(n_in, dim, config, n_experts) if n_experts > 1 else WukongLayer(n_in, dim, config)
