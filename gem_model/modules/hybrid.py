"""HybridArch: GEM's interaction arch, Wukong over the feature embeddings and the timeline arch over the events.

    tokens  = EventTokenizer(events)                  # [L, Ds]: item, action, age bucket, item attributes
    encoded = TimelineEncoder(tokens)                 # causal, once per user timeline
    s       = TargetReader(encoded, ad and context)   # [B, n_s, D] per impression, over its visible events
    X_{i+1} = Wukong_i(X_i)                           # X_0 = the feature embeddings [B, F, D]
    out     = flatten(X_last) ++ flatten(s)

The events' summary joins the non-sequential side at the top. InterFormer's exchange at every layer would feed
each impression's features into the events' encoding, and the encoding is what a timeline's impressions share
(docs/MODEL.md, "Encoded once per user"). Ablations (ModelConfig): `use_wukong=False` swaps each Wukong layer for
an MLP layer of the same output shape; `use_sequence=False` drops the timeline arch and adds the mean item
embedding of each impression's visible events as one more embedding. `model.experimental.wukong_experts` splits
each Wukong layer into experts.
"""

from __future__ import annotations

import torch
from torch import nn

from gem_model.config import FeatureSpec, ModelConfig
from gem_model.modules.mlp import mlp
from gem_model.modules.sparse_arch import SparseOutput
from gem_model.modules.timeline import EventTokenizer, Matches, TargetReader, TimelineEncoder
from gem_model.modules.wukong import wukong_layer


class MLPLayer(nn.Module):
    """The `use_wukong=False` stand-in: LN(MLP(flatten X) + residual), n_in -> n_out embeddings."""

    def __init__(self, n_in: int, n_out: int, dim: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.n_out, self.dim = n_out, dim
        self.mlp = mlp(n_in * dim, hidden, n_out * dim)
        self.residual = nn.Linear(n_in * dim, n_out * dim, bias=False) if n_in != n_out else None
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.flatten(1)
        residual = x if self.residual is None else self.residual(flat).view(-1, self.n_out, self.dim)
        return self.norm(self.mlp(flat).view(-1, self.n_out, self.dim) + residual)


class HybridArch(nn.Module):
    def __init__(self, spec: FeatureSpec, config: ModelConfig, n_features: int) -> None:
        super().__init__()
        self.spec, self.config = spec, config
        d, seq, experimental = config.embedding_dim, config.sequence, config.experimental
        n_out = config.wukong.n_fm + config.wukong.n_lc
        n_ins = [n_features + (0 if config.use_sequence else 1)] + [n_out] * (config.wukong.n_layers - 1)
        self.interaction = nn.ModuleList(
            [
                wukong_layer(n, d, config.wukong, experimental.wukong_experts)
                if config.use_wukong
                else MLPLayer(n, n_out, d, config.wukong.mlp_dims)
                for n in n_ins
            ]
        )
        n_summary = 0
        if config.use_sequence:
            self.candidate_features = [f.name for f in (*spec.side("ad"), *spec.side("context"))]
            self.attributes = list(spec.sequence_attribute_columns.values()) if seq.match_candidate else []
            self.tokenizer = EventTokenizer(spec, d, seq.dim)
            self.encoder = TimelineEncoder(seq.dim, seq.heads, seq.layers, seq.window)
            self.reader = TargetReader(
                candidate_dim=len(self.candidate_features) * d,
                dim=seq.dim,
                heads=seq.heads,
                n_queries=seq.queries,
                n_recent=seq.n_recent,
                read_window=seq.read_window,
                embedding_dim=d,
                attribute_buckets={column: spec.sequence_side_columns[column] for column in self.attributes},
                age_buckets=spec.age_buckets,
                match=seq.match_candidate,
                match_kinds=2 + len(self.attributes),
                action_buckets=spec.action_buckets,
                action_kinds=(1 + len(self.attributes)) * spec.action_buckets,
            )
            n_summary = self.reader.n_tokens
        self.out_dim = (n_out + n_summary) * d

    def forward(self, x: torch.Tensor, sparse: SparseOutput) -> torch.Tensor:
        """x [B, F, D] feature embeddings -> [B, out_dim]."""
        if not self.config.use_sequence:
            x = torch.cat([x, sparse.seq_mean.unsqueeze(1)], dim=1)
        for layer in self.interaction:
            x = layer(x)
        if not self.config.use_sequence:
            return x.flatten(1)
        timelines = sparse.timelines
        encoded = self.encoder(self.tokenizer(sparse.seq_values, sparse.seq_side), timelines)
        matches = None
        if self.config.sequence.match_candidate:
            actions, n_actions = sparse.seq_side[self.spec.action_idx_column], self.spec.action_buckets
            keyed = [(sparse.seq_ids, sparse.candidate_item)]
            keyed += [(sparse.seq_side[column], sparse.candidate_side[column]) for column in self.attributes]
            pairs = list(keyed)
            # Then per key and action, a kind of its own: the visible events of that action that share the
            # candidate's item or attribute (an add-to-cart in the ad's category).
            every_action = torch.arange(n_actions, device=actions.device)
            for event, candidate in keyed:
                event_action = torch.where(event > 0, event * n_actions + actions, 0)
                with_action = candidate.unsqueeze(1) * n_actions + every_action  # [M, n_actions]: one sort for all
                pairs.append((event_action, torch.where(candidate.unsqueeze(1) > 0, with_action, 0)))
            matches = Matches.find(
                timelines,
                pairs,
                sparse.seq_minutes,
                sparse.target_minutes,
                actions,
                self.spec.age_buckets,
                self.spec.action_buckets,
            )
        summary = self.reader(
            encoded,
            timelines,
            torch.cat([sparse.pooled[name] for name in self.candidate_features], dim=1),
            sparse.target_age,
            {column: sparse.seq_side[column] for column in self.attributes},
            {column: sparse.candidate_side[column] for column in self.attributes},
            matches,
        )
        return torch.cat([x.flatten(1), summary.flatten(1)], dim=1)
