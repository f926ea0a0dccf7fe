"""Reference target attention: each target of a row attends to a prefix of that row's keys, a loop over rows.

Targets q [M, H, Dh] are jagged by q_offsets [B+1] and keys and values k, v [L, H, Dh] by kv_offsets [B+1]:
row b's targets attend to row b's keys. Target i sees the first visible[i] keys of its row (keys in time
order, visible[i] the number strictly before the target's time), so nothing at or after that time reaches it;
with a window, only the last `window` of them. "softmax" normalises over the keys seen; a pointwise activation
(silu, gelu, relu2, identity) gives w_ij = act(scale * q_i.k_j) / (keys seen). A target that sees no key gives
zeros. The ground truth of the
parity tests, in float32; `kernels.target_attention` validates inputs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kernels.reference.pt_jagged_attention import POINTWISE


def pt_target_attention(
    q: Tensor,
    q_offsets: Tensor,
    k: Tensor,
    v: Tensor,
    kv_offsets: Tensor,
    visible: Tensor,
    *,
    activation: str = "softmax",
    scale: float | None = None,
    window: int | None = None,
) -> Tensor:
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    rows = []
    for (q_start, q_end), (k_start, k_end) in zip(
        zip(q_offsets[:-1].tolist(), q_offsets[1:].tolist()), zip(kv_offsets[:-1].tolist(), kv_offsets[1:].tolist())
    ):
        qb = q[q_start:q_end].float().transpose(0, 1)  # [H, m, Dh]
        kb, vb = (t[k_start:k_end].float().transpose(0, 1) for t in (k, v))  # [H, n, Dh]
        seen = visible[q_start:q_end]
        first = (seen - window).clamp(min=0) if window is not None else torch.zeros_like(seen)
        places = torch.arange(k_end - k_start, device=q.device)[None, :]
        allowed = (places >= first[:, None]) & (places < seen[:, None])  # [m, n]
        logits = scale * qb @ kb.transpose(-1, -2)  # [H, m, n]
        if activation == "softmax":
            # A target that sees no key normalises over all of them (finite, no NaN in the backward) and is
            # zeroed below.
            weights = logits.masked_fill(~(allowed | (seen == 0)[:, None]), float("-inf")).softmax(-1)
        else:
            weights = POINTWISE[activation](logits) / (seen - first).clamp(min=1)[:, None]
        weights = weights.masked_fill(~allowed, 0.0)
        rows.append((weights @ vb).transpose(0, 1))  # [m, H, Dh]
    out = torch.cat(rows) if rows else q.new_zeros(q.shape)
    # Zero but connected to q, k and v when no target sees a key, so autograd still reaches them.
    return (out + 0 * (q.sum() + k.sum() + v.sum())).to(q.dtype)
