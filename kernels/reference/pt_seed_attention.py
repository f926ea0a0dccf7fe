"""Reference broadcast-query attention: one query set shared by every row of a jagged batch, a Python loop over rows.

q [S, H, Dh] (the seeds: the same queries for every row) attends to each row's keys and values k, v [L, H, Dh]
(row b spanning offsets[b]:offsets[b+1]); the output is [B, S, H, Dh]. "softmax" normalises over the row's
keys; a pointwise activation (silu, gelu, relu2, identity) gives w_sj = act(scale * q_s.k_j) / n_b. An empty
row gives zeros. The ground truth of the parity tests, in float32; `kernels.seed_attention` validates inputs.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kernels.reference.pt_jagged_attention import POINTWISE


def pt_seed_attention(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, *, activation: str = "softmax", scale: float | None = None
) -> Tensor:
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    qh = q.float().transpose(0, 1)  # [H, S, Dh]
    rows = []
    for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        n = end - start
        if n == 0:
            rows.append(torch.zeros(q.shape, dtype=torch.float32, device=q.device))
            continue
        kb, vb = (t[start:end].float().transpose(0, 1) for t in (k, v))  # [H, n, Dh]
        logits = scale * qh @ kb.transpose(-1, -2)  # [H, S, n]
        weights = logits.softmax(-1) if activation == "softmax" else POINTWISE[activation](logits) / n
        rows.append((weights @ vb).transpose(0, 1))  # [S, H, Dh]
    out = torch.stack(rows) if rows else q.new_zeros(0, *q.shape)
    # Zero but connected to q, k and v when no row has a key, so autograd still reaches them.
    return (out + 0 * (q.sum() + k.sum() + v.sum())).to(q.dtype)
