"""GemModel: the teacher (and, by `ModelConfig.architecture`, its baselines), from named parts.

    SparseArch (TorchRec EBC + EC)
      ├─ UserTower, AdTower -> unit user / ad embeddings [B, R] (representation heads: exported,
      │                        trained with the in-batch retrieval loss in GemTrain)
      └─ feature embeddings [B, F, D] + sequence
           -> interaction arch: HybridArch (gem: Wukong and the timeline arch, a user's events encoded
              once and read by each impression, joined at the top), DLRMArch or DCNv2Arch (baselines)
           -> MultiSurfaceHeads (shared + per-surface towers) -> logits [B, T]
      (`lr`, logistic regression: LinearArch -> LinearHeads, one linear map of the embeddings)

Tasks follow the funnel (ESMM): `ctr` = P(click | impression) and `cvr` = P(conversion | click),
so P(conversion | impression) = ctr * cvr is defined on every impression. The loss lives in
`gem_model.models.train_wrapper`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from gem_model.config import TASKS, FeatureSpec, ModelConfig
from gem_model.models.baselines import DCNv2Arch, DLRMArch, LinearArch, LinearHeads
from gem_model.modules.heads import MultiSurfaceHeads
from gem_model.modules.hybrid import HybridArch
from gem_model.modules.mlp import mlp
from gem_model.modules.sparse_arch import SparseArch, SparseOutput


@dataclass
class GemOutput:
    logits: torch.Tensor  # [B, T], in TASKS order
    user_embedding: torch.Tensor  # [B, R], unit norm
    ad_embedding: torch.Tensor  # [B, R], unit norm


def interaction_arch(spec: FeatureSpec, config: ModelConfig, n_features: int) -> nn.Module:
    if config.architecture == "dlrm":
        return DLRMArch(config, n_features)
    if config.architecture == "dcnv2":
        return DCNv2Arch(config, n_features)
    if config.architecture == "lr":
        return LinearArch(config, n_features)
    return HybridArch(spec, config, n_features)


def heads(spec: FeatureSpec, config: ModelConfig, in_dim: int) -> nn.Module:
    if config.architecture == "lr":
        return LinearHeads(in_dim, len(TASKS))
    return MultiSurfaceHeads(in_dim, config.shared_dims, config.surface_dims, spec.domain.buckets, len(TASKS))


class GemModel(nn.Module):
    def __init__(self, spec: FeatureSpec, config: ModelConfig, device: torch.device | None = None) -> None:
        super().__init__()
        self.spec, self.tasks = spec, TASKS
        d = config.embedding_dim
        self.feature_names = [f.name for f in spec.features]
        self.user_features = [f.name for f in spec.side("user")]
        self.ad_features = [f.name for f in spec.side("ad")]
        self.sparse_arch = SparseArch(spec, d, device=device)
        # The user tower also reads the mean item embedding of the events before the impression.
        self.user_tower = mlp(d * (len(self.user_features) + 1), config.tower_dims, config.repr_dim)
        self.ad_tower = mlp(d * len(self.ad_features), config.tower_dims, config.repr_dim)
        self.interaction = interaction_arch(spec, config, len(self.feature_names))
        self.heads = heads(spec, config, self.interaction.out_dim)
        # GEM's towers read the embeddings detached: the retrieval loss trains the towers and leaves the shared
        # tables to the ranking loss. Its gradient into them, with a batch's clicks grouped by user, cost GEM 0.004
        # click NE and 0.004 conversion NE at `small`. The baselines keep it: without it DCN-V2 fell from 0.7453 to
        # 0.7019 click AUC there, seed 0 (docs/experiments/2026-12-07-encoded-once-per-user.md).
        self.towers_train_tables = config.architecture != "gem"

    def _tower_input(self, embeddings: list[torch.Tensor]) -> torch.Tensor:
        joined = torch.cat(embeddings, dim=1)
        return joined if self.towers_train_tables else joined.detach()

    # Normalised in float32 even under bf16 autocast: unit norms to 1e-6, as the indexes' inner products assume.
    def _user(self, sparse: SparseOutput) -> torch.Tensor:
        parts = [sparse.pooled[n] for n in self.user_features] + [sparse.seq_mean]
        return F.normalize(self.user_tower(self._tower_input(parts)).float(), dim=1)

    def _ad(self, sparse: SparseOutput) -> torch.Tensor:
        tower = self.ad_tower(self._tower_input([sparse.pooled[n] for n in self.ad_features]))
        return F.normalize(tower.float(), dim=1)

    def _domain_ids(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """[B] embedding-row id of each row's surface (the heads' domain)."""
        jt = features[self.spec.domain.name]
        lengths = jt.lengths()
        if bool((lengths != 1).any()):
            raise ValueError(
                f"every row needs exactly one {self.spec.domain.name!r} id to rank; "
                "embed users or ads alone with user_embedding() / ad_embedding()"
            )
        return jt.values()  # one id per row, in row order

    def _logits(self, features: KeyedJaggedTensor, sparse: SparseOutput) -> torch.Tensor:
        x = torch.stack([sparse.pooled[n] for n in self.feature_names], dim=1)  # [B, F, D]
        return self.heads(self.interaction(x, sparse), self._domain_ids(features))

    def forward(self, features: KeyedJaggedTensor) -> GemOutput:
        sparse = self.sparse_arch(features)
        return GemOutput(
            logits=self._logits(features, sparse), user_embedding=self._user(sparse), ad_embedding=self._ad(sparse)
        )

    def logits(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """[B, T] task logits alone: scoring skips the two towers that forward() also runs for training."""
        return self._logits(features, self.sparse_arch(features))

    def user_embedding(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """[B, R] embeddings of the users in `features` (ad features may be empty)."""
        return self._user(self.sparse_arch(features))

    def ad_embedding(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """[B, R] embeddings of the ads in `features` (user features may be empty)."""
        return self._ad(self.sparse_arch(features))
