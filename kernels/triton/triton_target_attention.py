"""Triton target attention: each target of a jagged row attends to a prefix of that row's keys.

Targets q [M, H, Dh] are jagged by q_offsets, keys and values k, v [L, H, Dh] by kv_offsets, and target i sees
its row's first visible[i] keys (the last `window` of them when window > 0); the output is [M, H, Dh]. The
grid is (B*H, ceil(max targets / BLOCK_M)): each program holds one tile of a row's targets and streams the
row's key/value tiles from the first any of them reads to the last, with the online softmax or the pointwise
weights of `triton_jagged_attention` (`_fwd_update`), each target masked to its own span. The backward runs
one program per key tile for dK and dV (looping over the row's target tiles that read it) and one per target
tile for dQ: no atomics, deterministic gradients. Import lazily
(the entry point `kernels.target_attention` does): triton decides at import time whether the kernels are
compiled or interpreted (TRITON_INTERPRET=1).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.triton.triton_jagged_attention import (
    ACTIVATION_CODES,
    _fwd_update,
    _is_interpreted,
    _launch_config,
    _pointwise,
    _pointwise_grad,
)

__all__ = ["_is_interpreted", "triton_target_attention"]  # _is_interpreted: the entry point's import check


@triton.jit
def _program_rows(QOffsets, KVOffsets, H):
    """(row b, head h, the row's first target, its targets m, its first key, its keys n) of grid axis 0."""
    pid_bh = tl.program_id(0)
    b = pid_bh // H
    q_start = tl.load(QOffsets + b)
    k_start = tl.load(KVOffsets + b)
    m = (tl.load(QOffsets + b + 1) - q_start).to(tl.int32)
    n = (tl.load(KVOffsets + b + 1) - k_start).to(tl.int32)
    return b, pid_bh % H, q_start, m, k_start, n


@triton.jit
def _rows(Ptr, first, rows, row_mask, stride_t, h, stride_h, offs_d, d_mask):
    """The [rows, BLOCK_D] tile of head h at tokens first + rows, zeros where masked."""
    mask = row_mask[:, None] & d_mask[None, :]
    return tl.load(Ptr + (first + rows[:, None]) * stride_t + h * stride_h + offs_d[None, :], mask=mask, other=0.0)


@triton.jit
def _targets(Visible, q_start, m, start_m, window, BLOCK_M: tl.constexpr):
    """A tile of a row's targets from start_m: their indices in the row, the mask of real ones, and the span of
    keys each reads, [first, seen): its visible keys, the last `window` of them when window > 0."""
    targets = start_m + tl.arange(0, BLOCK_M)
    t_mask = targets < m
    seen = tl.load(Visible + q_start + targets, mask=t_mask, other=0).to(tl.int32)
    first = tl.where(window > 0, tl.maximum(seen - window, 0), 0)
    return targets, t_mask, first, seen


@triton.jit
def _tile_span(t_mask, first, seen, BLOCK_N: tl.constexpr):
    """The key tiles a tile of targets reads: from the tile holding the least first to the most seen."""
    lo = tl.min(tl.where(t_mask, first, 2147483647), 0)
    return (lo // BLOCK_N) * BLOCK_N, tl.max(seen, 0)


@triton.jit
def _target_attention_fwd(
    Q,
    K,
    V,
    Out,
    Lse,
    QOffsets,
    KVOffsets,
    Visible,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    scale,
    window,
    H,
    head_dim,
    ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    b, h, q_start, m, k_start, n = _program_rows(QOffsets, KVOffsets, H)
    targets, t_mask, first, seen = _targets(Visible, q_start, m, tl.program_id(1) * BLOCK_M, window, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < head_dim
    q = _rows(Q, q_start, targets, t_mask, stride_qt, h, stride_qh, offs_d, d_mask)
    inv_n = (1.0 / tl.maximum(seen - first, 1).to(tl.float32))[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], -1e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    lo, hi = _tile_span(t_mask, first, seen, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = _rows(K, k_start, cols, cols < n, stride_kt, h, stride_kh, offs_d, d_mask)
        v = _rows(V, k_start, cols, cols < n, stride_vt, h, stride_vh, offs_d, d_mask)
        qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * scale  # [BLOCK_M, BLOCK_N]
        allowed = t_mask[:, None] & (cols[None, :] >= first[:, None]) & (cols[None, :] < seen[:, None])
        acc, m_i, l_i = _fwd_update(acc, m_i, l_i, qk, allowed, v, inv_n, ACT, INPUT_PRECISION)
    if ACT == 0:
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        acc = acc / l_safe[:, None]
        tl.store(Lse + (q_start + targets) * H + h, m_i + tl.log(l_safe), mask=t_mask)
    out = Out + (q_start + targets[:, None]) * stride_ot + h * stride_oh + offs_d[None, :]
    tl.store(out, acc.to(Out.dtype.element_ty), mask=t_mask[:, None] & d_mask[None, :])


@triton.jit
def _target_attention_bwd_dkdv(
    Q,
    K,
    V,
    DO,
    Lse,
    Delta,
    DK,
    DV,
    QOffsets,
    KVOffsets,
    Visible,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_dot,
    stride_doh,
    stride_dkt,
    stride_dkh,
    stride_dvt,
    stride_dvh,
    scale,
    window,
    H,
    head_dim,
    ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    b, h, q_start, m, k_start, n = _program_rows(QOffsets, KVOffsets, H)
    start_n = tl.program_id(1) * BLOCK_N
    if start_n < n:
        cols = start_n + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        n_mask = cols < n
        d_mask = offs_d < head_dim
        k = _rows(K, k_start, cols, n_mask, stride_kt, h, stride_kh, offs_d, d_mask)
        v = _rows(V, k_start, cols, n_mask, stride_vt, h, stride_vh, offs_d, d_mask)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        for start_m in range(0, m, BLOCK_M):
            targets, t_mask, first, seen = _targets(Visible, q_start, m, start_m, window, BLOCK_M)
            lo, hi = _tile_span(t_mask, first, seen, BLOCK_N)
            if (start_n >= lo) & (start_n < hi):  # a tile of targets that reads none of these keys adds nothing
                q = _rows(Q, q_start, targets, t_mask, stride_qt, h, stride_qh, offs_d, d_mask)
                do = _rows(DO, q_start, targets, t_mask, stride_dot, h, stride_doh, offs_d, d_mask)
                qk_t = tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION) * scale  # [BLOCK_N, BLOCK_M]
                allowed = (
                    n_mask[:, None]
                    & t_mask[None, :]
                    & (cols[:, None] >= first[None, :])
                    & (cols[:, None] < seen[None, :])
                )
                dp_t = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)
                if ACT == 0:
                    lse = tl.load(Lse + (q_start + targets) * H + h, mask=t_mask, other=0.0)
                    delta = tl.load(Delta + (q_start + targets) * H + h, mask=t_mask, other=0.0)
                    w_t = tl.exp(tl.where(allowed, qk_t - lse[None, :], -1e30))  # 0 where not allowed, no overflow
                    dz_t = w_t * (dp_t - delta[None, :])
                else:
                    inv_n = (1.0 / tl.maximum(seen - first, 1).to(tl.float32))[None, :]
                    w_t = tl.where(allowed, _pointwise(qk_t, ACT), 0.0) * inv_n
                    dz_t = tl.where(allowed, dp_t * _pointwise_grad(qk_t, ACT), 0.0) * inv_n
                dv += tl.dot(w_t.to(do.dtype), do, input_precision=INPUT_PRECISION)
                dk += tl.dot(dz_t.to(q.dtype), q, input_precision=INPUT_PRECISION)
        kv_mask = n_mask[:, None] & d_mask[None, :]
        tl.store(
            DK + (k_start + cols[:, None]) * stride_dkt + h * stride_dkh + offs_d[None, :],
            (dk * scale).to(DK.dtype.element_ty),
            mask=kv_mask,
        )
        tl.store(
            DV + (k_start + cols[:, None]) * stride_dvt + h * stride_dvh + offs_d[None, :],
            dv.to(DV.dtype.element_ty),
            mask=kv_mask,
        )


@triton.jit
def _target_attention_bwd_dq(
    Q,
    K,
    V,
    DO,
    Lse,
    Delta,
    DQ,
    QOffsets,
    KVOffsets,
    Visible,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_dot,
    stride_doh,
    stride_dqt,
    stride_dqh,
    scale,
    window,
    H,
    head_dim,
    ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    b, h, q_start, m, k_start, n = _program_rows(QOffsets, KVOffsets, H)
    targets, t_mask, first, seen = _targets(Visible, q_start, m, tl.program_id(1) * BLOCK_M, window, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < head_dim
    q = _rows(Q, q_start, targets, t_mask, stride_qt, h, stride_qh, offs_d, d_mask)
    do = _rows(DO, q_start, targets, t_mask, stride_dot, h, stride_doh, offs_d, d_mask)
    lse = tl.zeros([BLOCK_M], dtype=tl.float32)
    delta = tl.zeros([BLOCK_M], dtype=tl.float32)
    if ACT == 0:
        lse = tl.load(Lse + (q_start + targets) * H + h, mask=t_mask, other=0.0)
        delta = tl.load(Delta + (q_start + targets) * H + h, mask=t_mask, other=0.0)
    inv_n = (1.0 / tl.maximum(seen - first, 1).to(tl.float32))[:, None]
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    lo, hi = _tile_span(t_mask, first, seen, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        k = _rows(K, k_start, cols, cols < n, stride_kt, h, stride_kh, offs_d, d_mask)
        v = _rows(V, k_start, cols, cols < n, stride_vt, h, stride_vh, offs_d, d_mask)
        qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * scale
        allowed = t_mask[:, None] & (cols[None, :] >= first[:, None]) & (cols[None, :] < seen[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
        if ACT == 0:
            p = tl.exp(tl.where(allowed, qk - lse[:, None], -1e30))
            dz = p * (dp - delta[:, None])
        else:
            dz = tl.where(allowed, dp * _pointwise_grad(qk, ACT), 0.0) * inv_n
        dq += tl.dot(dz.to(k.dtype), k, input_precision=INPUT_PRECISION)
    tl.store(
        DQ + (q_start + targets[:, None]) * stride_dqt + h * stride_dqh + offs_d[None, :],
        (dq * scale).to(DQ.dtype.element_ty),
        mask=t_mask[:, None] & d_mask[None, :],
    )


class _TargetAttentionFunction(torch.autograd.Function):
    """Forward and backward launches; the softmax logsumexp [M, H] is the only extra saved state."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        q: Tensor,
        q_offsets: Tensor,
        k: Tensor,
        v: Tensor,
        kv_offsets: Tensor,
        visible: Tensor,
        max_targets: int,
        max_seq_len: int,
        activation: str,
        scale: float,
        window: int,
    ) -> Tensor:
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        q_offsets, kv_offsets, visible = q_offsets.contiguous(), kv_offsets.contiguous(), visible.contiguous()
        M, H, Dh = q.shape
        B = q_offsets.numel() - 1
        out = torch.zeros_like(q)
        lse = torch.zeros((M, H), dtype=torch.float32, device=q.device)
        config = _launch_config(q)
        act = ACTIVATION_CODES[activation]
        if B > 0 and max_targets > 0:
            _target_attention_fwd[(B * H, triton.cdiv(max_targets, config["BLOCK_M"]))](
                q,
                k,
                v,
                out,
                lse,
                q_offsets,
                kv_offsets,
                visible,
                q.stride(0),
                q.stride(1),
                k.stride(0),
                k.stride(1),
                v.stride(0),
                v.stride(1),
                out.stride(0),
                out.stride(1),
                scale,
                window,
                H,
                Dh,
                ACT=act,
                **config,
            )
        ctx.save_for_backward(q, q_offsets, k, v, kv_offsets, visible, out, lse)
        ctx.max_targets, ctx.max_seq_len, ctx.act, ctx.scale, ctx.window = max_targets, max_seq_len, act, scale, window
        return out

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, dout: Tensor
    ) -> tuple[Tensor | None, ...]:
        q, q_offsets, k, v, kv_offsets, visible, out, lse = ctx.saved_tensors
        dout = dout.contiguous()
        M, H, Dh = q.shape
        B = q_offsets.numel() - 1
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        delta = (dout.float() * out.float()).sum(-1) if ctx.act == 0 else lse
        config = _launch_config(q)
        inputs = (q, k, v, dout, lse, delta)
        rows = (q_offsets, kv_offsets, visible)
        strides = (
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            dout.stride(0),
            dout.stride(1),
        )
        if B > 0 and ctx.max_targets > 0 and ctx.max_seq_len > 0:
            _target_attention_bwd_dkdv[(B * H, triton.cdiv(ctx.max_seq_len, config["BLOCK_N"]))](
                *inputs,
                dk,
                dv,
                *rows,
                *strides,
                dk.stride(0),
                dk.stride(1),
                dv.stride(0),
                dv.stride(1),
                ctx.scale,
                ctx.window,
                H,
                Dh,
                ACT=ctx.act,
                **config,
            )
            _target_attention_bwd_dq[(B * H, triton.cdiv(ctx.max_targets, config["BLOCK_M"]))](
                *inputs,
                dq,
                *rows,
                *strides,
                dq.stride(0),
                dq.stride(1),
                ctx.scale,
                ctx.window,
                H,
                Dh,
                ACT=ctx.act,
                **config,
            )
        return dq, None, dk, dv, None, None, None, None, None, None, None


def triton_target_attention(
    q: Tensor,
    q_offsets: Tensor,
    k: Tensor,
    v: Tensor,
    kv_offsets: Tensor,
    visible: Tensor,
    *,
    max_targets: int,
    max_seq_len: int,
    activation: str,
    scale: float,
    window: int,
) -> Tensor:
    """Triton target attention of validated inputs (see `kernels.target_attention`); window 0: every visible key."""
    return _TargetAttentionFunction.apply(
        q, q_offsets, k, v, kv_offsets, visible, max_targets, max_seq_len, activation, scale, window
    )
