"""GemModel: the first multi-task teacher, composed of named parts.

SparseArch (TorchRec embeddings) -> UserTower and AdTower (MLPs producing the exported,
L2-normalised user and ad embeddings) -> OverArch (MLP over both embeddings, their product and
the context) -> one logit per task. Tasks follow the funnel (ESMM): `ctr` = P(click | impression)
and `cvr` = P(conversion | click), so P(conversion | impression) = ctr * cvr is defined on every
impression. The loss lives in `gem_model.models.train_wrapper`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from gem_model.config import FeatureSpec, ModelConfig
from gem_model.modules.sparse_arch import SparseArch


def mlp(in_dim: int, dims: tuple[int, ...], out_dim: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for d in dims:
        layers += [nn.Linear(in_dim, d), nn.ReLU()]
        in_dim = d
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


@dataclass
class GemOutput:
    logits: torch.Tensor  # [B, T], in ModelConfig.tasks order
    user_embedding: torch.Tensor  # [B, R], unit norm
    ad_embedding: torch.Tensor  # [B, R], unit norm


class GemModel(nn.Module):
    def __init__(self, spec: FeatureSpec, config: ModelConfig, device: torch.device | None = None) -> None:
        super().__init__()
        self.tasks = config.tasks
        d = config.embedding_dim
        self.user_features = [f.name for f in spec.side("user")] + [spec.sequence_feature]
        self.ad_features = [f.name for f in spec.side("ad")]
        self.context_features = [f.name for f in spec.side("context")]
        self.sparse_arch = SparseArch(spec, d, device=device)
        self.user_tower = mlp(d * len(self.user_features), config.tower_dims, config.repr_dim)
        self.ad_tower = mlp(d * len(self.ad_features), config.tower_dims, config.repr_dim)
        over_in = 3 * config.repr_dim + d * len(self.context_features)
        self.over_arch = mlp(over_in, config.over_dims, len(config.tasks))

    def embed(self, pooled: dict[str, torch.Tensor], names: list[str], tower: nn.Module) -> torch.Tensor:
        return F.normalize(tower(torch.cat([pooled[n] for n in names], dim=1)), dim=1)

    def forward(self, features: KeyedJaggedTensor) -> GemOutput:
        pooled = self.sparse_arch(features)
        user = self.embed(pooled, self.user_features, self.user_tower)
        ad = self.embed(pooled, self.ad_features, self.ad_tower)
        context = [pooled[n] for n in self.context_features]
        logits = self.over_arch(torch.cat([user, ad, user * ad, *context], dim=1))
        return GemOutput(logits=logits, user_embedding=user, ad_embedding=ad)

    def user_embedding(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """[B, R] embeddings of the users in `features` (ad features may be empty)."""
        return self.embed(self.sparse_arch(features), self.user_features, self.user_tower)

    def ad_embedding(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """[B, R] embeddings of the ads in `features` (user features may be empty)."""
        return self.embed(self.sparse_arch(features), self.ad_features, self.ad_tower)
