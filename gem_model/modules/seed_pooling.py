"""Hierarchical Seed Pooling (Kunlun, arXiv 2602.10016): a behaviour sequence summarised by learned seeds.

Stage one: `hsp_seeds` learned queries, one set shared by every row, attend to each row's jagged tokens:
[L, Ds] -> [B, S, Ds] through `kernels.seed_attention` (the broadcast-query form of attention: the seeds are
never copied per row, nothing is padded). There are more seeds than output tokens, so the pooling is
overcomplete. Stage two: `SumKronLinear` compresses the S seeds to `hsp_tokens` embeddings with a sum of
`hsp_rank` Kronecker-factored maps, Y_b = sum_i Z_iᵀ X_b W_i. That costs k(S·T + Ds·D) parameters, not
S·Ds·T·D, and keeps the joint seed-by-dimension structure that separate seed and dimension maps would lose.
The public write-ups leave the sizes open; ours are config (`model.experimental.hsp_*`;
docs/experiments/2026-12-04-kunlun-reading-notes.md §3).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from gem_model.config import ExperimentalConfig
from gem_model.modules.jagged import offsets_of
from kernels.seed_attention import seed_attention


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
    """Jagged tokens [L, Ds] (`dim` = Ds, `heads` heads) with lengths [B] (at most `max_len`) ->
    [B, hsp_tokens, out_dim]; an empty row pools to zeros."""

    def __init__(self, config: ExperimentalConfig, dim: int, heads: int, out_dim: int, max_len: int) -> None:
        super().__init__()
        self.heads, self.n_seeds, self.max_len = heads, config.hsp_seeds, max_len
        self.seeds = nn.Parameter(torch.randn(config.hsp_seeds, dim) * 0.02)
        self.norm = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * dim)
        self.compress = SumKronLinear(config.hsp_seeds, config.hsp_tokens, dim, out_dim, config.hsp_rank)

    def forward(self, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        b, (n_tokens, dim) = lengths.numel(), tokens.shape
        head_dim = dim // self.heads
        k, v = self.kv(self.norm(tokens)).view(n_tokens, 2, self.heads, head_dim).unbind(1)  # [L, H, dh]
        q = self.q(self.seeds).view(self.n_seeds, self.heads, head_dim).to(k.dtype)
        pooled = seed_attention(q, k.contiguous(), v.contiguous(), offsets_of(lengths), max_seq_len=self.max_len)
        return self.compress(pooled.reshape(b, self.n_seeds, dim))
