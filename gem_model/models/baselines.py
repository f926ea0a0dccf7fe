"""Baseline interaction arches, run in the same framework, tables and heads as GEM.

DLRM and DCN-V2 see what the classic models see: one embedding per feature plus the behaviour
sequence mean-pooled into one more embedding (no attention, no time). `DLRMArch` is DLRM's pairwise
dot-product interaction (Naumov et al., arXiv 1906.00091), with torchrec's `InteractionArch`;
`DCNv2Arch` is DCN-V2's low-rank cross network (Wang et al., arXiv 2008.13535), torchrec's
`LowRankCrossNet`, stacked under the heads' MLP. Logistic regression (`LinearArch` under
`LinearHeads`) sees the features alone, each id's effect on a logit one learned number.
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.models.dlrm import InteractionArch
from torchrec.modules.crossnet import LowRankCrossNet

from gem_model.config import ModelConfig
from gem_model.modules.sparse_arch import SparseOutput


class DLRMArch(nn.Module):
    """x [B, F, D] + pooled sequence -> [D + (F+1)F/2]: the sequence embedding in the dense slot."""

    def __init__(self, config: ModelConfig, n_features: int) -> None:
        super().__init__()
        self.interaction = InteractionArch(num_sparse_features=n_features)
        self.out_dim = config.embedding_dim + (n_features + 1) * n_features // 2

    def forward(self, x: torch.Tensor, sparse: SparseOutput) -> torch.Tensor:
        return self.interaction(sparse.seq_mean, x)


class DCNv2Arch(nn.Module):
    """x [B, F, D] + pooled sequence -> [(F+1)·D] through `dcn_layers` low-rank cross layers."""

    def __init__(self, config: ModelConfig, n_features: int) -> None:
        super().__init__()
        self.out_dim = (n_features + 1) * config.embedding_dim
        self.cross = LowRankCrossNet(in_features=self.out_dim, num_layers=config.dcn_layers, low_rank=config.dcn_rank)

    def forward(self, x: torch.Tensor, sparse: SparseOutput) -> torch.Tensor:
        return self.cross(torch.cat([x, sparse.seq_mean.unsqueeze(1)], dim=1).flatten(1))


class LinearArch(nn.Module):
    """x [B, F, D] -> [F·D]: the feature embeddings side by side, no interaction and no sequence."""

    def __init__(self, config: ModelConfig, n_features: int) -> None:
        super().__init__()
        self.out_dim = n_features * config.embedding_dim

    def forward(self, x: torch.Tensor, sparse: SparseOutput) -> torch.Tensor:
        return x.flatten(1)


class LinearHeads(nn.Module):
    """h [B, F·D] -> logits [B, T] by one linear map: logit = b + sum_f a_f · e_f(id_f), so each id adds a
    learned number of its own to each task's logit (logistic regression on one-hot ids). The surface
    is one of the features, so it needs no tower of its own."""

    def __init__(self, in_dim: int, n_tasks: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_dim, n_tasks)

    def forward(self, h: torch.Tensor, surface: torch.Tensor) -> torch.Tensor:
        return self.linear(h)
