"""SparseArch: the TorchRec embedding tables of the model, built from the shared FeatureSpec.

Two collections, both fbgemm table-batched embeddings once DistributedModelParallel shards them
(the planner picks table-, row- or column-wise per table): an `EmbeddingBagCollection` with one
table per single-valued feature, and an `EmbeddingCollection` holding the item table, looked up
by the target ad (`ad_id`) and, unpooled, by every event of the behaviour sequence, so history
and candidate share one embedding space. The sequence's per-event side ids (action, age bucket,
the item's ad attributes such as its category) and the timeline keys pass through for the timeline arch
(`gem_model.modules.timeline`): a timeline's events ride on its first impression row, so each event is looked
up once however many impressions read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from gem_model.config import FeatureSpec
from gem_model.modules.timeline import Timelines


@dataclass
class SparseOutput:
    pooled: dict[str, torch.Tensor]  # feature name -> [B, D]; zeros where a row lacks the feature
    seq_values: torch.Tensor  # [L, D] item embeddings of the timelines' events, oldest first per timeline
    seq_ids: torch.Tensor  # [L] int64 the events' item rows, aligned with seq_values
    seq_side: dict[str, torch.Tensor]  # side column -> [L] int64 ids, aligned with seq_values
    seq_minutes: torch.Tensor  # [L] int64 each event's minutes before its timeline's instant
    timelines: Timelines  # which events each row may read
    target_age: torch.Tensor  # [B] int64 age bucket of each impression
    target_minutes: torch.Tensor  # [B] int64 each impression's minutes before its timeline's instant
    candidate_item: torch.Tensor  # [B] int64 the target ad's item row (0 where absent)
    # attribute side column -> [B] the target ad's ids in the same buckets as the events' (0 where absent)
    candidate_side: dict[str, torch.Tensor]

    @cached_property
    def seq_mean(self) -> torch.Tensor:
        """[B, D] mean item embedding of each row's visible events (zeros where none is)."""
        return self.timelines.visible_mean(self.seq_values)


class SparseArch(nn.Module):
    def __init__(self, spec: FeatureSpec, embedding_dim: int, device: torch.device | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.splits = [len(spec.pooled_features), 2, len(spec.sequence_side_columns) + 1, len(spec.timeline_keys)]
        self.ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(
                    name=f"t_{f.name}",
                    num_embeddings=f.buckets,
                    embedding_dim=embedding_dim,
                    feature_names=[f.name],
                    pooling=PoolingType.SUM,
                )
                for f in spec.pooled_features
            ],
            device=device,
        )
        item = spec.item_feature
        self.ec = EmbeddingCollection(
            tables=[
                EmbeddingConfig(
                    name=f"t_{item.name}",
                    num_embeddings=item.buckets,
                    embedding_dim=embedding_dim,
                    feature_names=[item.name, spec.sequence_feature],
                )
            ],
            device=device,
        )

    def forward(self, features: KeyedJaggedTensor) -> SparseOutput:
        """features: KJT over `spec.kjt_keys` (see gem_model.data.loader.features_to_kjt)."""
        pooled_in, item_in, side_in, timeline_in = features.split(self.splits)
        pooled = self.ebc(pooled_in).to_dict()  # SUM over 0 or 1 ids: the row, or zeros when absent
        items = self.ec(item_in)
        target, seq = items[self.spec.sequence_table], items[self.spec.sequence_feature]
        pooled[self.spec.sequence_table] = target.to_padded_dense(desired_length=1).squeeze(1)
        side = side_in.to_dict()
        start, visible, target_age, target_minutes = (timeline_in[key].values() for key in self.spec.timeline_keys)
        return SparseOutput(
            pooled=pooled,
            seq_values=seq.values(),
            seq_ids=item_in[self.spec.sequence_feature].values().long(),
            seq_side={name: side[name].values() for name in self.spec.sequence_side_columns},
            seq_minutes=side[self.spec.event_minutes_key].values().long(),
            timelines=Timelines.from_rows(seq.lengths().long(), start, visible.long()),
            target_age=target_age.long(),
            target_minutes=target_minutes.long(),
            candidate_item=item_in[self.spec.sequence_table].to_padded_dense(1, padding_value=0).squeeze(1).long(),
            candidate_side={
                column: pooled_in[name].to_padded_dense(1, padding_value=0).squeeze(1)
                for name, column in self.spec.sequence_attribute_columns.items()
            },
        )
