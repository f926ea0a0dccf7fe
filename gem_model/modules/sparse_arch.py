"""SparseArch: the TorchRec embedding tables of the model, built from the shared FeatureSpec.

One `EmbeddingBagCollection` (fbgemm table-batched embeddings once sharded by
DistributedModelParallel) holds a table per sparse feature; the behaviour sequence shares the
item table (`FeatureSpec.sequence_table`) and is mean-pooled. Output: one [B, D] tensor per
feature name.
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from gem_model.config import FeatureSpec


def table_configs(spec: FeatureSpec, embedding_dim: int) -> list[EmbeddingBagConfig]:
    configs = []
    for feature in spec.features:
        names = [feature.name]
        if feature.name == spec.sequence_table:
            names.append(spec.sequence_feature)
        configs.append(
            EmbeddingBagConfig(
                name=f"t_{feature.name}",
                num_embeddings=feature.buckets,
                embedding_dim=embedding_dim,
                feature_names=names,
                pooling=PoolingType.MEAN,
            )
        )
    return configs


class SparseArch(nn.Module):
    def __init__(self, spec: FeatureSpec, embedding_dim: int, device: torch.device | None = None) -> None:
        super().__init__()
        self.feature_names = [f.name for f in spec.features] + [spec.sequence_feature]
        self.ebc = EmbeddingBagCollection(tables=table_configs(spec, embedding_dim), device=device)

    def forward(self, features: KeyedJaggedTensor) -> dict[str, torch.Tensor]:
        """features: KJT over `feature_names` (one id per row, the sequence jagged) -> name -> [B, D]."""
        return self.ebc(features).to_dict()
