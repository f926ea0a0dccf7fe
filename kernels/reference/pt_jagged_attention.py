"""Reference jagged attention: a Python loop over rows, each row a dense [H, n, n] attention in float32.

q, k, v are jagged values [L, H, Dh] (the B rows concatenated, row b spanning offsets[b]:offsets[b+1]);
token i of a row attends to tokens j of the same row (j <= i when causal; |i - j| <= window when windowed,
except that the row's last `n_global` tokens see and are seen by every token). "softmax" is standard
attention; the pointwise activations are generalized dot-product attention (HSTU, arXiv 2402.17152, and
Kunlun's GDPA): w_ij = act(scale * q_i.k_j) / n_b, no normalisation over j. It is the ground truth of the
parity tests, differentiable through autograd, and slow: one Python iteration and several small matmuls
per row. Inputs are not validated here; `kernels.jagged_attention` does.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

POINTWISE = {
    "silu": F.silu,
    "gelu": F.gelu,
    "relu2": lambda x: F.relu(x).square(),
    "identity": lambda x: x,
}


def allowed_pairs(n: int, causal: bool, window: int | None, n_global: int, device: torch.device) -> Tensor:
    """[n, n] bool: may query i attend to key j of a row of n tokens."""
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(n, device=device)[None, :]
    allowed = torch.ones(n, n, dtype=torch.bool, device=device)
    if window is not None:
        first_global = n - n_global
        allowed = ((i - j).abs() <= window) | (i >= first_global) | (j >= first_global)
    if causal:
        allowed = allowed & (j <= i)
    return allowed


def pt_jagged_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    offsets: Tensor,
    *,
    causal: bool = True,
    activation: str = "softmax",
    scale: float | None = None,
    window: int | None = None,
    n_global: int = 0,
) -> Tensor:
    """Jagged attention of [L, H, Dh] q, k, v over the rows of offsets [B+1]; returns [L, H, Dh] in q's dtype."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    pieces = []
    for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        n = end - start
        if n == 0:
            continue
        qb, kb, vb = (t[start:end].float().transpose(0, 1) for t in (q, k, v))  # [H, n, Dh]
        logits = scale * qb @ kb.transpose(-1, -2)  # [H, n, n]
        allowed = allowed_pairs(n, causal, window, n_global, q.device)
        if activation == "softmax":
            weights = logits.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
        elif activation in POINTWISE:
            weights = POINTWISE[activation](logits) * allowed / n
        else:
            raise ValueError(f"activation={activation!r} is not one of 'softmax', {list(POINTWISE)}")
        pieces.append((weights @ vb).transpose(0, 1))  # [n, H, Dh]
    if not pieces:  # L == 0: an empty result that still has a grad_fn to q, k and v
        return (q + k + v) * 0
    return torch.cat(pieces).to(q.dtype)
