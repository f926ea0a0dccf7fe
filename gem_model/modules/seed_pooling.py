"""Hierarchical Seed Pooling (Kunlun, arXiv 2602.10016): a behaviour sequence summarised by learned seeds.

Stage one: `hsp_seeds` learned queries, one set shared by every row (the broadcast-query form of
attention), attend to each row's jagged tokens: [L, Ds] -> [B, S, Ds], with no padding (a softmax over
each row's tokens, `segment_softmax`). There are more seeds than output tokens, so the pooling is
overcomplete. Stage two: `SumKronLinear` compresses the S seeds to `hsp_tokens` embeddings with a sum of
`hsp_rank` Kronecker-factored maps, Y_b = sum_i Z_iᵀ X_b W_i. That costs k(S·T + Ds·D) parameters, not
S·Ds·T·D, and keeps the joint seed-by-dimension structure that separate seed and dimension maps would lose.
The public write-ups leave the sizes open; ours are config (docs/KUNLUN_NOTES.md §3).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from gem_model.config import SequenceConfig
from gem_model.modules.jagged import row_ids, segment_softmax

_SEED_CHUNK = 8  # seeds pooled per step: bounds the [L, chunk, Ds] product held in memory


class SumKronLinear(nn.Module):
    """[B, S, Din] -> [B, T, Dout]: Y_b = sum over i < rank of Z_iᵀ X_b W_i."""

    def __init__(self, n_in: int, n_out: int, d_in: int, d_out: int, rank: int) -> None:
        super().__init__()
        self.z = nn.Parameter(torch.randn(rank, n_in, n_out) / math.sqrt(n_in))
        self.w = nn.Parameter(torch.randn(rank, d_in, d_out) / math.sqrt(d_in * rank))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = torch.einsum("kst,bsd->bktd", self.z, x)  # [B, k, T, Din]
        return torch.einsum("bktd,kde->bte", mixed, self.w)


class HierarchicalSeedPooling(nn.Module):
    """Jagged tokens [L, Ds] with lengths [B] -> [B, hsp_tokens, out_dim]; an empty row pools to zeros."""

    def __init__(self, config: SequenceConfig, out_dim: int) -> None:
        super().__init__()
        self.heads, self.n_seeds = config.heads, config.hsp_seeds
        self.seeds = nn.Parameter(torch.randn(config.hsp_seeds, config.dim) * 0.02)
        self.norm = nn.LayerNorm(config.dim)
        self.q = nn.Linear(config.dim, config.dim)
        self.kv = nn.Linear(config.dim, 2 * config.dim)
        self.compress = SumKronLinear(config.hsp_seeds, config.hsp_tokens, config.dim, out_dim, config.hsp_rank)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        b, (n_tokens, dim) = lengths.numel(), tokens.shape
        head_dim = dim // self.heads
        rows = row_ids(lengths)
        k, v = self.kv(self.norm(tokens)).view(n_tokens, 2, self.heads, head_dim).unbind(1)  # [L, H, dh]
        q = self.q(self.seeds).view(self.n_seeds, self.heads, head_dim)
        weights = segment_softmax(torch.einsum("lhd,shd->lsh", k, q) / math.sqrt(head_dim), rows, b)  # [L, S, H]
        pooled = [tokens.new_zeros(b, end - start, self.heads, head_dim).index_add(
                      0, rows, weights[:, start:end, :, None] * v[:, None])
                  for start, end in _chunks(self.n_seeds, _SEED_CHUNK)]
        return self.compress(torch.cat(pooled, dim=1).view(b, self.n_seeds, dim))


def _chunks(n: int, size: int) -> list[tuple[int, int]]:
    return [(start, min(start + size, n)) for start in range(0, n, size)]
