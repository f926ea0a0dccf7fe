"""Broadcast-query attention: one learned query set (seeds) shared by every row of a jagged batch.

`seed_attention` takes q [S, H, Dh], the same queries for every row, and jagged keys and values k, v [L, H, Dh]
(B rows concatenated, offsets [B+1]), and returns [B, S, H, Dh]: each row pooled by every seed. It is the
broadcast-query form of Kunlun's generalized dot-product attention (Meta's GDPA kernel, `broadcast_q`), what
Hierarchical Seed Pooling runs; it replaces expanding the seeds to [B, S, H, Dh] and padding the rows.
kernel="triton" runs `kernels/triton/triton_seed_attention.py` (CUDA, or CPU under TRITON_INTERPRET=1);
kernel="pytorch" scores every token against every seed ([L, S, H]), normalises within each row (a segment
softmax, or act / n_b) and sums each row's weighted values with index_add, a few seeds at a time, so nothing
is padded. The fp32 ground truth is `kernels/reference/pt_seed_attention.py`.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from kernels.jagged_attention import _KERNELS, _import_triton_kernel, _validate_cross, _validate_offsets
from kernels.reference.pt_jagged_attention import POINTWISE

_SEED_CHUNK = 8  # seeds pooled per index_add in the PyTorch path: bounds the [L, chunk, H, Dh] product


def seed_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    offsets: Tensor,
    *,
    max_seq_len: int,
    activation: Literal["softmax", "silu", "gelu", "relu2", "identity"] = "softmax",
    scale: float | None = None,
    kernel: Literal["auto", "pytorch", "triton"] = "auto",
) -> Tensor:
    """[B, S, H, Dh] attention of the shared queries q [S, H, Dh] to each row of k, v [L, H, Dh].

    offsets [B+1] int64 as for `kernels.jagged_attention` (rows may be empty: their output is zeros);
    max_seq_len bounds the row lengths (the Triton grid). activation: "softmax" over the row's keys, or a
    pointwise one, w_sj = act(scale * q_s.k_j) / n_b. scale defaults to 1/sqrt(Dh). kernel: "auto" (Triton
    for CUDA tensors, else PyTorch), "pytorch" or "triton". Differentiable in q, k, v on every path.
    """
    if kernel not in _KERNELS:
        raise ValueError(f"kernel={kernel!r} is not one of {_KERNELS}; pass 'auto' to choose by device")
    _validate_cross(q, k, v, activation, queries="S")
    _validate_offsets(offsets, k, max_seq_len, name="k")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if kernel == "triton" or (kernel == "auto" and q.is_cuda):
        triton_seed_attention = _import_triton_kernel(q, "triton_seed_attention")
        return triton_seed_attention(q, k, v, offsets, max_seq_len=max_seq_len, activation=activation, scale=scale)
    return _segment_seed_attention(q, k, v, offsets, activation=activation, scale=scale)


def _segment_seed_attention(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, *, activation: str, scale: float
) -> Tensor:
    b, (n_seeds, heads, head_dim) = offsets.numel() - 1, q.shape
    lengths = offsets.diff()
    rows = torch.repeat_interleave(torch.arange(b, device=q.device), lengths)
    scores = torch.einsum("lhd,shd->lsh", k, q) * scale  # [L, S, H]
    if activation == "softmax":
        weights = _segment_softmax(scores, rows, b)
    else:
        weights = POINTWISE[activation](scores) / lengths.index_select(0, rows).to(scores.dtype)[:, None, None]
    pooled = [
        v.new_zeros(b, end - start, heads, head_dim).index_add(0, rows, weights[:, start:end, :, None] * v[:, None])
        for start, end in ((s, min(s + _SEED_CHUNK, n_seeds)) for s in range(0, n_seeds, _SEED_CHUNK))
    ]
    out = torch.cat(pooled, dim=1) if pooled else v.new_zeros(b, 0, heads, head_dim)
    return out + 0 * (q.sum() + k.sum())  # connected to q and k even when no row has a key


def _segment_softmax(scores: Tensor, rows: Tensor, n_rows: int) -> Tensor:
    """Softmax of scores [L, ...] over the tokens of each row (`rows` [L] the row of each token)."""
    shape = (n_rows, *scores.shape[1:])
    index = rows.view(-1, *([1] * (scores.dim() - 1))).expand_as(scores)
    # Any per-row constant leaves the softmax unchanged, so the max needs no gradient.
    peak = scores.detach().new_full(shape, float("-inf")).scatter_reduce(0, index, scores.detach(), "amax")
    e = torch.exp(scores - peak.index_select(0, rows))
    return e / scores.new_zeros(shape).index_add(0, rows, e).index_select(0, rows)
