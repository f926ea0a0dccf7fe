"""The sequence arch: a pyramid of jagged attention layers over long behaviour sequences.

Tokens are the events of a user's history, newest first: the item embedding (shared with the
target ad's table) plus learned action, age-bucket and item-attribute (category) embeddings,
projected to the sequence dim Ds. The batch stays jagged ([L, Ds] with per-row lengths) end to
end: attention runs through `kernels.jagged_attention`, never over a batch padded to its
longest row. Layer i keeps only the `pyramid[i]` most recent tokens and pools the older ones
into one summary token, so the first layer sees the whole history once and later layers cost
O(pyramid[i]²) per row.

Each layer also takes CLS tokens (the non-sequential summary, InterFormer's way in) appended
to every row, and an optional personalised FFN gate; the CLS outputs, the mean token and the
most recent tokens form the layer's sequence summary (`SequenceSummary`).
"""

from __future__ import annotations

import torch
from torch import nn

from gem_model.config import FeatureSpec, SequenceConfig
from gem_model.modules.jagged import concat_rows, first_tokens, keep_first, offsets_of, row_ids, segment_mean
from kernels.jagged_attention import jagged_attention


class SequenceTokenizer(nn.Module):
    """[L, D] item embeddings + side ids -> [L, Ds] tokens."""

    def __init__(self, spec: FeatureSpec, embedding_dim: int, dim: int) -> None:
        super().__init__()
        self.item = nn.Linear(embedding_dim, dim)
        self.side = nn.ModuleDict({name: nn.Embedding(buckets, dim)
                                   for name, buckets in spec.sequence_side_columns.items()})

    def forward(self, items: torch.Tensor, side: dict[str, torch.Tensor]) -> torch.Tensor:
        tokens = self.item(items)
        for name, table in self.side.items():
            ids = side[name]
            if ids.numel() != items.shape[0]:
                raise ValueError(f"sequence side column {name} has {ids.numel()} ids for {items.shape[0]} events; "
                                 "the feature table must carry it aligned with the sequence")
            tokens = tokens + table(ids)
        return tokens


class JaggedAttentionBlock(nn.Module):
    """Pre-LN transformer block on a jagged batch: x + Attn(LN x), then x + FFN(LN x)."""

    def __init__(self, config: SequenceConfig) -> None:
        super().__init__()
        self.config = config
        self.norm_attn, self.norm_ffn = nn.LayerNorm(config.dim), nn.LayerNorm(config.dim)
        self.qkv = nn.Linear(config.dim, 3 * config.dim)
        self.out = nn.Linear(config.dim, config.dim)
        hidden = 2 * config.dim
        self.ffn = nn.Sequential(nn.Linear(config.dim, hidden), nn.SiLU(), nn.Linear(hidden, config.dim))

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, max_len: int, n_global: int = 0) -> torch.Tensor:
        """x [L, Ds] jagged; rows end with `n_global` tokens that a sliding window leaves global."""
        c = self.config
        q, k, v = self.qkv(self.norm_attn(x)).view(-1, 3, c.heads, c.dim // c.heads).unbind(1)
        windowed = c.window > 0 and max_len > 2 * c.window + 1  # shorter rows: the window is the whole row
        attended = jagged_attention(q.contiguous(), k.contiguous(), v.contiguous(), offsets_of(lengths),
                                    max_seq_len=max_len, causal=c.causal, activation=c.activation,
                                    window=c.window if windowed else None, n_global=n_global if windowed else 0)
        x = x + self.out(attended.reshape(-1, c.dim))
        return x + self.ffn(self.norm_ffn(x))


class PersonalizedFFN(nn.Module):
    """x + Up(Down(x) * g_row): a low-rank FFN whose rank-r gate g [B, r] comes from the row's
    non-sequential summary (InterFormer's personalised FFN, at O(L·Ds·r) instead of a per-row
    Ds x Ds matrix)."""

    def __init__(self, dim: int, rank: int) -> None:
        super().__init__()
        self.down, self.up = nn.Linear(dim, rank, bias=False), nn.Linear(rank, dim)

    def forward(self, x: torch.Tensor, gate: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return x + self.up(self.down(x) * gate.index_select(0, rows))


class SequenceLayer(nn.Module):
    """One pyramid level: PFFN, CLS tokens appended, jagged attention, then keep `keep` newest tokens."""

    def __init__(self, config: SequenceConfig, keep: int, personalised: bool) -> None:
        super().__init__()
        self.config, self.keep = config, keep
        self.pffn = PersonalizedFFN(config.dim, config.pffn_rank) if personalised else None
        self.block = JaggedAttentionBlock(config)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor, max_len: int, cls: torch.Tensor,
                gate: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens [L, Ds], lengths [B], cls [B, C, Ds], gate [B, r] -> (tokens', lengths', cls_out [B, C, Ds])."""
        b, n_cls, dim = cls.shape
        if self.pffn is not None:
            if gate is None:
                raise ValueError("a personalised SequenceLayer needs the non-sequential gate")
            tokens = self.pffn(tokens, gate, row_ids(lengths))
        merged, merged_lengths, token_at, cls_at = concat_rows(
            tokens, lengths, cls.reshape(b * n_cls, dim), torch.full_like(lengths, n_cls))
        merged = self.block(merged, merged_lengths, max_len + n_cls, n_global=n_cls)
        kept, kept_lengths, dropped_mean, pooled = keep_first(merged.index_select(0, token_at), lengths, self.keep)
        # Older tokens beyond `keep` survive as one mean token at the end of the row.
        pooled_means = dropped_mean.index_select(0, pooled.nonzero().squeeze(1))
        out, out_lengths, _, _ = concat_rows(kept, kept_lengths, pooled_means, pooled.long())
        return out, out_lengths, merged.index_select(0, cls_at).view(b, n_cls, dim)


class SequenceSummary(nn.Module):
    """[B, C + 1 + n_recent, D] gated summary tokens for the non-sequential side:
    CLS outputs, the mean token and the most recent tokens, projected to the embedding dim."""

    def __init__(self, config: SequenceConfig, embedding_dim: int) -> None:
        super().__init__()
        self.n_recent = config.n_recent
        self.n_tokens = config.n_cls + 1 + config.n_recent
        self.proj = nn.Linear(config.dim, embedding_dim)
        self.gate = nn.Linear(self.n_tokens * config.dim, self.n_tokens)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor, cls_out: torch.Tensor) -> torch.Tensor:
        mean = segment_mean(tokens, row_ids(lengths), lengths.numel()).unsqueeze(1)
        parts = torch.cat([cls_out, mean, first_tokens(tokens, lengths, self.n_recent)], dim=1)  # [B, S, Ds]
        gate = torch.sigmoid(self.gate(parts.flatten(1))).unsqueeze(2)
        return gate * self.proj(parts)


def pyramid_max_lengths(spec: FeatureSpec, config: SequenceConfig) -> list[int]:
    """Upper bound on row length entering each layer (a kept row may carry one pooled token)."""
    return [spec.max_seq_len] + [keep + 1 for keep in config.pyramid[:-1]]

