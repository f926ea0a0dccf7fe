"""The sequence arch: a pyramid of jagged attention layers over long behaviour sequences.

Tokens are the events of a user's history, newest first: the item embedding (shared with the
target ad's table) plus learned action, age-bucket and item-attribute (category) embeddings,
projected to the sequence dim Ds. The batch stays jagged ([L, Ds] with per-row lengths) end to
end: attention runs through `kernels.jagged_attention`, never over a batch padded to its
longest row. Layer i keeps only the `pyramid[i]` most recent tokens and pools the older ones
into one summary token, so the first layer sees the whole history once and later layers cost
O(pyramid[i]²) per row.

Each layer also takes CLS tokens appended to every row (learned, or with InterFormer's interleaving
the non-sequential side's summary), and, interleaved, a personalised FFN (a low-rank gate, or Kunlun's
GDPA over keys and values made from the non-sequential side); the CLS outputs with the mean token and
the most recent tokens, or with Hierarchical Seed Pooling's tokens, form the sequence summary
(`SequenceSummary`). Under Computation Skip every other layer skips its self-attention. Interleaving,
GDPA, sliding windows, seed pooling and Computation Skip are research options (`model.experimental`).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from gem_model.config import ExperimentalConfig, FeatureSpec, SequenceConfig
from gem_model.modules.jagged import (
    concat_rows,
    first_tokens,
    keep_first,
    offsets_of,
    row_ids,
    segment_mean,
)
from gem_model.modules.seed_pooling import HierarchicalSeedPooling
from kernels.jagged_attention import jagged_attention, length_buckets
from kernels.reference.pt_jagged_attention import POINTWISE


class SequenceTokenizer(nn.Module):
    """[L, D] item embeddings + side ids -> [L, Ds] tokens."""

    def __init__(self, spec: FeatureSpec, embedding_dim: int, dim: int, match_candidate: bool = False) -> None:
        super().__init__()
        self.item = nn.Linear(embedding_dim, dim)
        self.side = nn.ModuleDict(
            {name: nn.Embedding(buckets, dim) for name, buckets in spec.sequence_side_columns.items()}
        )
        # Per item attribute: a row for "differs from the target ad's" (0) and one for "equals it" (1); empty
        # where the spec gives the events no attributes.
        self.match = nn.ModuleDict(
            {column: nn.Embedding(2, dim) for column in spec.sequence_attribute_columns.values()}
            if match_candidate
            else {}
        )

    def forward(self, items: torch.Tensor, side: dict[str, torch.Tensor]) -> torch.Tensor:
        tokens = self.item(items)
        for name, table in self.side.items():
            ids = side[name]
            if ids.numel() != items.shape[0]:
                raise ValueError(
                    f"sequence side column {name} has {ids.numel()} ids for {items.shape[0]} events; "
                    "the feature table must carry it aligned with the sequence"
                )
            tokens = tokens + table(ids)
        return tokens

    def candidate_match(
        self, side: dict[str, torch.Tensor], candidate_side: dict[str, torch.Tensor], lengths: torch.Tensor
    ) -> torch.Tensor:
        """[L, Ds] each event's match rows (call only where `self.match` has tables): its attribute id against its
        row's target ad's ([B], -1 where absent); a missing id (row 0) matches nothing."""
        rows = row_ids(lengths)
        return sum(
            table(((side[column] == candidate_side[column].index_select(0, rows)) & (side[column] > 0)).long())
            for column, table in self.match.items()
        )


class JaggedAttentionBlock(nn.Module):
    """Pre-LN transformer block on a jagged batch: x + Attn(LN x), then x + FFN(LN x). `activation` is the
    attention weights' (the softmax, or a GDPA pointwise one); `window` > 0 makes it sliding-window."""

    def __init__(self, dim: int, heads: int, activation: str = "softmax", window: int = 0) -> None:
        super().__init__()
        self.dim, self.heads, self.activation, self.window = dim, heads, activation, window
        self.norm_attn, self.norm_ffn = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.ffn = nn.Sequential(nn.Linear(dim, 2 * dim), nn.SiLU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, max_len: int, n_global: int = 0) -> torch.Tensor:
        """x [L, Ds] jagged; rows end with `n_global` tokens that a sliding window leaves global."""
        q, k, v = self.qkv(self.norm_attn(x)).view(-1, 3, self.heads, self.dim // self.heads).unbind(1)
        windowed = self.window > 0 and max_len > 2 * self.window + 1  # shorter rows: the window is the whole row
        attended = jagged_attention(
            q.contiguous(),
            k.contiguous(),
            v.contiguous(),
            offsets_of(lengths),
            max_seq_len=max_len,
            causal=False,
            activation=self.activation,
            window=self.window if windowed else None,
            n_global=n_global if windowed else 0,
        )
        x = x + self.out(attended.reshape(-1, self.dim))
        return x + self.ffn(self.norm_ffn(x))


class PersonalizedFFN(nn.Module):
    """x + Up(Down(x) * g_row): a low-rank FFN whose rank-r gate g [B, r] comes from the row's
    non-sequential summary (InterFormer's personalised FFN, at O(L·Ds·r) instead of a per-row
    Ds x Ds matrix)."""

    def __init__(self, dim: int, rank: int) -> None:
        super().__init__()
        self.down, self.up = nn.Linear(dim, rank, bias=False), nn.Linear(rank, dim)

    def forward(self, x: torch.Tensor, gate: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return x + self.up(self.down(x) * gate.index_select(0, row_ids(lengths)))


class GDPAPersonalizedFFN(nn.Module):
    """x + Out(act(Q(LN x) · K_bᵀ / sqrt(dh)) V_b / n_kv): each token of row b attends to `n_kv` keys and
    values made from that row's non-sequential side, context [B, C] (Kunlun's PFFN as generalized
    dot-product attention: a per-row two-layer FFN with W1 = K_bᵀ and W2 = V_b, n_kv its hidden width). Rows
    of similar lengths are padded into buckets (`kernels.jagged_attention.length_buckets`) and multiplied with
    their rows' keys and values in batches: gathering K_b and V_b for every token instead moves n_kv times
    the tokens' bytes and ran 3x slower than the low-rank PFFN's whole step at `small`."""

    def __init__(self, dim: int, heads: int, n_kv: int, activation: str, context_dim: int) -> None:
        super().__init__()
        self.heads, self.n_kv, self.act = heads, n_kv, POINTWISE[activation]
        self.norm = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(context_dim, 2 * n_kv * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        (n_tokens, dim), b = x.shape, context.shape[0]
        head_dim = dim // self.heads
        k, v = self.kv(context).view(b, 2, self.n_kv, self.heads, head_dim).unbind(1)  # [B, n_kv, H, dh]
        q = self.q(self.norm(x)).view(n_tokens, self.heads, head_dim)
        buckets = length_buckets(offsets_of(lengths))
        if not buckets:
            return x
        rows, outs, placed = row_ids(lengths), [], []
        for index, valid, _ in buckets:
            index, valid = index.to(x.device), valid.to(x.device)  # [b, n]
            bucket_rows = rows.index_select(0, index[:, 0])
            qb = q.index_select(0, index.flatten()).view(*index.shape, self.heads, head_dim)
            scores = torch.einsum("bnhd,bkhd->bnhk", qb, k.index_select(0, bucket_rows)) / math.sqrt(head_dim)
            out = torch.einsum("bnhk,bkhd->bnhd", self.act(scores) / self.n_kv, v.index_select(0, bucket_rows))
            outs.append(out[valid])
            placed.append(index[valid])
        order = torch.cat(placed)
        source = torch.empty_like(order)
        source[order] = torch.arange(order.numel(), device=order.device)
        return x + self.out(torch.cat(outs).index_select(0, source).reshape(n_tokens, dim))


class SequenceLayer(nn.Module):
    """One pyramid level: PFFN (when `personalised`), CLS tokens appended, jagged attention (unless `attends` is
    False: Computation Skip), then keep the `keep` newest tokens and pool the rest into one. `context_dim` is
    the width of the flattened non-sequential side that a GDPA PFFN reads."""

    def __init__(
        self,
        config: SequenceConfig,
        experimental: ExperimentalConfig,
        keep: int,
        personalised: bool,
        context_dim: int = 0,
        attends: bool = True,
    ) -> None:
        super().__init__()
        self.keep = keep
        self.pffn: nn.Module | None = None
        if personalised:
            self.pffn = (
                GDPAPersonalizedFFN(
                    config.dim, config.heads, experimental.pffn_kv, experimental.pffn_activation, context_dim
                )
                if experimental.pffn == "gdpa"
                else PersonalizedFFN(config.dim, experimental.pffn_rank)
            )
        self.block = (
            JaggedAttentionBlock(
                config.dim, config.heads, experimental.attention_activation, experimental.attention_window
            )
            if attends
            else None
        )

    def forward(
        self, tokens: torch.Tensor, lengths: torch.Tensor, max_len: int, cls: torch.Tensor, message: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """tokens [L, Ds], lengths [B], cls [B, C, Ds], message (the PFFN's gate [B, r] or context [B, C']) ->
        (tokens' [L', Ds], lengths', cls_out [B, C, Ds], the level: every token before the truncation [L, Ds]); a
        layer that skips attention returns its CLS tokens as they came."""
        b, n_cls, dim = cls.shape
        if self.pffn is not None:
            if message is None:
                raise ValueError("a personalised SequenceLayer needs the non-sequential message")
            tokens = self.pffn(tokens, message, lengths)
        if self.block is None:
            return *self._truncate(tokens, lengths), cls, tokens
        merged, merged_lengths, token_at, cls_at = concat_rows(
            tokens, lengths, cls.reshape(b * n_cls, dim), torch.full_like(lengths, n_cls)
        )
        merged = self.block(merged, merged_lengths, max_len + n_cls, n_global=n_cls)
        level = merged.index_select(0, token_at)
        return *self._truncate(level, lengths), merged.index_select(0, cls_at).view(b, n_cls, dim), level

    def _truncate(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's first (newest) `keep` tokens and one mean token of the rest."""
        kept, kept_lengths, dropped_mean, pooled = keep_first(tokens, lengths, self.keep)
        pooled_means = dropped_mean.index_select(0, pooled.nonzero().squeeze(1))
        out, out_lengths, _, _ = concat_rows(kept, kept_lengths, pooled_means, pooled.long())
        return out, out_lengths


def summary_tokens(config: SequenceConfig, experimental: ExperimentalConfig) -> int:
    """How many embeddings a `SequenceSummary` gives the non-sequential side."""
    return config.n_cls + (experimental.hsp_tokens if experimental.seed_pooling else 1 + config.n_recent)


class SequenceSummary(nn.Module):
    """[B, summary_tokens, D] gated summary tokens for the non-sequential side: the CLS outputs projected to
    the embedding dim, with the mean of the kept tokens and the most recent tokens, or with Hierarchical Seed
    Pooling's tokens (`model.experimental.seed_pooling`), which pool the layer's whole level, every token
    before the pyramid truncates it (rows of at most `max_len` tokens). A summary that does not `pool` (a
    Computation Skip layer that attends) is handed the pooled tokens of the layer before."""

    def __init__(
        self,
        config: SequenceConfig,
        experimental: ExperimentalConfig,
        embedding_dim: int,
        max_len: int,
        pools: bool = True,
    ) -> None:
        super().__init__()
        self.seed_pooling, self.n_recent = experimental.seed_pooling, config.n_recent
        self.n_tokens = summary_tokens(config, experimental)
        self.proj = nn.Linear(config.dim, embedding_dim)
        if self.seed_pooling:
            self.hsp = (
                HierarchicalSeedPooling(experimental, config.dim, config.heads, embedding_dim, max_len)
                if pools
                else None
            )
            self.gate = nn.Linear(self.n_tokens * embedding_dim, self.n_tokens)
        else:
            self.gate = nn.Linear(self.n_tokens * config.dim, self.n_tokens)

    def forward(
        self,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        cls_out: torch.Tensor,
        level: torch.Tensor,
        level_lengths: torch.Tensor,
        pooled: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The layer's output tokens [L', Ds] (lengths [B]), CLS outputs and level [L, Ds] (level_lengths [B]) ->
        (summary [B, n_tokens, D], the HSP tokens [B, T, D] for a later layer to reuse, or None)."""
        if self.seed_pooling:
            if self.hsp is not None:
                pooled = self.hsp(level, level_lengths)
            elif pooled is None:
                raise ValueError("a SequenceSummary that does not pool needs the pooled tokens of the layer before")
            parts = torch.cat([self.proj(cls_out), pooled], dim=1)  # [B, n_tokens, D]
            return torch.sigmoid(self.gate(parts.flatten(1))).unsqueeze(2) * parts, pooled
        mean = segment_mean(tokens, row_ids(lengths), lengths.numel()).unsqueeze(1)
        parts = torch.cat([cls_out, mean, first_tokens(tokens, lengths, self.n_recent)], dim=1)  # [B, S, Ds]
        gate = torch.sigmoid(self.gate(parts.flatten(1))).unsqueeze(2)
        return gate * self.proj(parts), None


def pyramid_max_lengths(spec: FeatureSpec, config: SequenceConfig) -> list[int]:
    """Upper bound on row length entering each layer (a kept row may carry one pooled token)."""
    return [spec.max_seq_len] + [keep + 1 for keep in config.pyramid[:-1]]
