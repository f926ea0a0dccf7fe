"""Target attention: each target of a jagged row attends to a prefix of the same row's keys.

`target_attention` takes targets q [M, H, Dh] jagged by q_offsets [B+1], keys and values k, v [L, H, Dh]
jagged by kv_offsets [B+1], and visible [M]: how many of its row's keys (the first ones) each target may
see; with `window`, only the last `window` of those, so a target's cost stays flat however long its row. It
returns [M, H, Dh]. With a user's events as the keys, in time order, and the impressions of that
user as the targets, visible[i] = the events strictly before impression i: the events are encoded once per
user and every impression reads them, the shape of HSTU's targets (generative-recommenders'
`num_targets`) for targets that fall at many times. kernel="triton" runs
`kernels/triton/triton_target_attention.py` (CUDA, or CPU under TRITON_INTERPRET=1); kernel="pytorch" cuts each
row's keys to the span its targets read, sorts the rows by that span and, per bucket of similar lengths, pads
them to [b, max targets, max keys] and runs torch's attention with each target's mask. The fp32 ground
truth is `kernels/reference/pt_target_attention.py`.
"""

from __future__ import annotations

import bisect
import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.jagged_attention import (
    _BUCKET_MIN_WIDTH,
    _BUCKET_RATIO,
    _KERNELS,
    _import_triton_kernel,
    _validate_cross,
    _validate_offsets,
)
from kernels.reference.pt_jagged_attention import POINTWISE


def target_attention(
    q: Tensor,
    q_offsets: Tensor,
    k: Tensor,
    v: Tensor,
    kv_offsets: Tensor,
    visible: Tensor,
    *,
    max_targets: int,
    max_seq_len: int,
    activation: Literal["softmax", "silu", "gelu", "relu2", "identity"] = "softmax",
    scale: float | None = None,
    window: int | None = None,
    kernel: Literal["auto", "pytorch", "triton"] = "auto",
) -> Tensor:
    """[M, H, Dh] attention of each target q_i to the first visible[i] keys of its row of k, v (the last `window`
    of them when window is set).

    q_offsets and kv_offsets [B+1] int64 as for `kernels.jagged_attention` (rows may be empty); max_targets and
    max_seq_len bound a row's targets and keys (the Triton grid). visible [M] int64 with 0 <= visible[i] <= its
    row's keys; a target that sees no key gives zeros. activation: "softmax" over the keys seen, or a
    pointwise one, w_ij = act(scale * q_i.k_j) / (keys seen). scale defaults to 1/sqrt(Dh). window: None (every
    visible key) or an int >= 1, the newest visible keys a target reads. kernel: "auto"
    (Triton for CUDA tensors, else PyTorch), "pytorch" or "triton". Differentiable in q, k, v on every path.
    """
    if kernel not in _KERNELS:
        raise ValueError(f"kernel={kernel!r} is not one of {_KERNELS}; pass 'auto' to choose by device")
    _validate_cross(q, k, v, activation)
    _validate_offsets(q_offsets, q, max_targets, name="q", bound="max_targets")
    _validate_offsets(kv_offsets, k, max_seq_len, name="k")
    _validate_visible(visible, q_offsets, kv_offsets, q)
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be None (every visible key) or an int >= 1, got window={window!r}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if kernel == "triton" or (kernel == "auto" and q.is_cuda):
        triton_target_attention = _import_triton_kernel(q, "triton_target_attention")
        return triton_target_attention(
            q,
            q_offsets,
            k,
            v,
            kv_offsets,
            visible,
            max_targets=max_targets,
            max_seq_len=max_seq_len,
            activation=activation,
            scale=scale,
            window=window or 0,
        )
    first = (visible - window).clamp(min=0) if window is not None else torch.zeros_like(visible)
    return _bucketed_target_attention(
        q, q_offsets, k, v, kv_offsets, first, visible, activation=activation, scale=scale
    )


def _ranges(starts: Tensor, lengths: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """(the indices of `rows`' values, row r's at starts[r] .. starts[r] + lengths[r], in row order, [N]; their
    offsets [len(rows) + 1])."""
    lengths = lengths.index_select(0, rows)
    sub = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    owner = torch.repeat_interleave(torch.arange(rows.numel(), device=rows.device), lengths)
    place = torch.arange(int(sub[-1]), device=rows.device) - sub[:-1].index_select(0, owner)
    return starts.index_select(0, rows).index_select(0, owner) + place, sub


def _bucketed_target_attention(
    q: Tensor,
    q_offsets: Tensor,
    k: Tensor,
    v: Tensor,
    kv_offsets: Tensor,
    first: Tensor,
    visible: Tensor,
    *,
    activation: str,
    scale: float,
) -> Tensor:
    """Each row's keys cut to the span its targets read (from the least `first` to the most `visible`), the rows
    sorted by that span and padded per bucket of similar lengths (as `kernels.jagged_attention` buckets its rows),
    so neither a long row nor a long history before a window pads the batch."""
    targets = q_offsets.diff()
    owner = torch.repeat_interleave(torch.arange(targets.numel(), device=q.device), targets)
    lo = kv_offsets.diff().scatter_reduce(0, owner, first, "amin", include_self=True)
    hi = torch.zeros_like(lo).scatter_reduce(0, owner, visible, "amax", include_self=True)
    span = (hi - lo).clamp(min=0)
    rows = ((span > 0) & (targets > 0)).nonzero().squeeze(1)
    out = q.new_zeros(q.shape) + 0 * (q.sum() + k.sum() + v.sum())  # targets that see no key: zeros, connected
    if rows.numel() == 0:
        return out
    rows = rows.index_select(0, torch.sort(span.index_select(0, rows), stable=True).indices)
    lengths = span.index_select(0, rows).tolist()
    shift = lo.index_select(0, owner)  # each target's row's first key read
    first, visible, key_starts = first - shift, visible - shift, kv_offsets[:-1] + lo  # in the cut rows
    bucket_first = 0
    while bucket_first < len(rows):
        last = bisect.bisect_right(
            lengths, max(int(_BUCKET_RATIO * lengths[bucket_first]), _BUCKET_MIN_WIDTH), lo=bucket_first
        )
        bucket = rows[bucket_first:last]
        q_index, q_sub = _ranges(q_offsets[:-1], targets, bucket)
        kv_index, kv_sub = _ranges(key_starts, span, bucket)
        part = _padded_target_attention(
            q.index_select(0, q_index),
            q_sub,
            k.index_select(0, kv_index),
            v.index_select(0, kv_index),
            kv_sub,
            first.index_select(0, q_index),
            visible.index_select(0, q_index),
            activation=activation,
            scale=scale,
        )
        out = out.index_copy(0, q_index, part)
        bucket_first = last
    return out


def _padded(values: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """values [N, H, Dh] as [B, H, longest row, Dh] (zeros past each row's end), and each value's (row, place)."""
    lengths = offsets.diff()
    rows = torch.repeat_interleave(torch.arange(lengths.numel(), device=values.device), lengths)
    places = torch.arange(values.shape[0], device=values.device) - offsets[:-1].index_select(0, rows)
    longest = int(lengths.max()) if lengths.numel() else 0
    padded = values.new_zeros(lengths.numel(), longest, *values.shape[1:]).index_put((rows, places), values)
    return padded.transpose(1, 2), rows, places


def _padded_target_attention(
    q: Tensor,
    q_offsets: Tensor,
    k: Tensor,
    v: Tensor,
    kv_offsets: Tensor,
    first: Tensor,
    visible: Tensor,
    *,
    activation: str,
    scale: float,
) -> Tensor:
    (qp, rows, places), (kp, _, _), (vp, _, _) = (
        _padded(t, o) for t, o in ((q, q_offsets), (k, kv_offsets), (v, kv_offsets))
    )
    seen, start = (
        q.new_zeros(qp.shape[0], qp.shape[2], dtype=torch.int64).index_put((rows, places), t) for t in (visible, first)
    )
    key_places = torch.arange(kp.shape[2], device=q.device)[None, None, :]
    allowed = (key_places >= start[:, :, None]) & (key_places < seen[:, :, None])  # [B, m, n]
    if activation == "softmax":
        # A target that sees no key (and a padded one) attends to every key, padding included, so the
        # attention stays finite in both passes; its output is dropped below.
        mask = (allowed | (seen == 0)[:, :, None])[:, None]
        out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, scale=scale)
    else:
        weights = (
            POINTWISE[activation](scale * qp @ kp.transpose(-1, -2)) / (seen - start).clamp(min=1)[:, None, :, None]
        )
        out = weights.masked_fill(~allowed[:, None], 0.0) @ vp
    out = out.transpose(1, 2)[rows, places]  # [M, H, Dh]
    out = out.masked_fill((visible == 0)[:, None, None], 0.0)
    return out + 0 * (q.sum() + k.sum() + v.sum())  # connected to q, k and v when no target sees a key


def _validate_visible(visible: Tensor, q_offsets: Tensor, kv_offsets: Tensor, q: Tensor) -> None:
    """visible [M] int64 on q's device, each between 0 and its row's keys; the two offsets of one batch."""
    if q_offsets.numel() != kv_offsets.numel():
        raise ValueError(
            f"q_offsets has {q_offsets.numel() - 1} rows and kv_offsets {kv_offsets.numel() - 1}: the targets and "
            "the keys must come from the same rows"
        )
    if not isinstance(visible, Tensor) or visible.dtype != torch.int64 or visible.shape != (q.shape[0],):
        shape = (visible.dtype, tuple(visible.shape)) if isinstance(visible, Tensor) else type(visible).__name__
        raise ValueError(f"visible must be an int64 tensor [M={q.shape[0]}] (a key count per target), got {shape}")
    if visible.device != q.device:
        raise ValueError(f"visible.device={visible.device} must equal q.device={q.device}; move it with .to(q.device)")
    keys = kv_offsets.diff().repeat_interleave(q_offsets.diff())  # each target's row length
    bad = ((visible < 0) | (visible > keys)).nonzero()
    if bad.numel():
        i = int(bad[0])
        raise ValueError(
            f"visible[{i}]={int(visible[i])} must be between 0 and its row's {int(keys[i])} keys: it counts the "
            "keys (in time order) before the target"
        )
