"""Triton broadcast-query attention: one shared query set (seeds) attending to every row of a jagged batch.

q [S, H, Dh] is read by every row, k, v [L, H, Dh] are jagged with offsets [B+1]; the output is [B, S, H, Dh].
The grid is (B*H, ceil(S / BLOCK_M)): each program holds one tile of seeds and streams its row's key/value
tiles, with the online softmax or the pointwise weights of `triton_jagged_attention` (`_fwd_update`), so the
seeds are never copied B times, which is what Meta's GDPA kernel does with `broadcast_q`. The backward runs
one program per key tile for dK and dV (looping over the seed tiles) and one per seed tile for each row's dQ,
written per row and summed over the rows afterwards: no atomics, deterministic gradients. Import lazily (the
entry point `kernels.seed_attention` does): triton decides at import time whether the kernels are compiled or
interpreted (TRITON_INTERPRET=1).
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
    _program_row,
)

__all__ = ["_is_interpreted", "triton_seed_attention"]  # _is_interpreted: the entry point's import check


@triton.jit
def _seed_attention_fwd(
    Q,
    K,
    V,
    Out,
    Lse,
    Offsets,
    stride_qs,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ob,
    stride_os,
    stride_oh,
    scale,
    S,
    H,
    head_dim,
    ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    b, h, row_start, n = _program_row(Offsets, H)
    k_base = K + row_start * stride_kt + h * stride_kh
    v_base = V + row_start * stride_vt + h * stride_vh
    seeds = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = seeds < S
    d_mask = offs_d < head_dim
    qd_mask = s_mask[:, None] & d_mask[None, :]
    q = tl.load(Q + seeds[:, None] * stride_qs + h * stride_qh + offs_d[None, :], mask=qd_mask, other=0.0)
    inv_n = 1.0 / tl.maximum(n, 1).to(tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], -1e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    for start_n in range(0, n, BLOCK_N):
        cols = start_n + offs_n
        kv_mask = (cols < n)[:, None] & d_mask[None, :]
        k = tl.load(k_base + cols[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * scale  # [BLOCK_M, BLOCK_N]
        allowed = s_mask[:, None] & (cols < n)[None, :]
        acc, m_i, l_i = _fwd_update(acc, m_i, l_i, qk, allowed, v, inv_n, ACT, INPUT_PRECISION)
    if ACT == 0:
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        acc = acc / l_safe[:, None]
        tl.store(Lse + (b * S + seeds) * H + h, m_i + tl.log(l_safe), mask=s_mask)
    out = Out + b * stride_ob + seeds[:, None] * stride_os + h * stride_oh + offs_d[None, :]
    tl.store(out, acc.to(Out.dtype.element_ty), mask=qd_mask)


@triton.jit
def _seed_attention_bwd_dkdv(
    Q,
    K,
    V,
    DO,
    Lse,
    Delta,
    DK,
    DV,
    Offsets,
    stride_qs,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_dob,
    stride_dos,
    stride_doh,
    stride_dkt,
    stride_dkh,
    stride_dvt,
    stride_dvh,
    scale,
    S,
    H,
    head_dim,
    ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    b, h, row_start, n = _program_row(Offsets, H)
    start_n = tl.program_id(1) * BLOCK_N
    if start_n < n:
        cols = start_n + tl.arange(0, BLOCK_N)
        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        n_mask = cols < n
        d_mask = offs_d < head_dim
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(
            K + (row_start + cols[:, None]) * stride_kt + h * stride_kh + offs_d[None, :], mask=kv_mask, other=0.0
        )
        v = tl.load(
            V + (row_start + cols[:, None]) * stride_vt + h * stride_vh + offs_d[None, :], mask=kv_mask, other=0.0
        )
        inv_n = 1.0 / n.to(tl.float32)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        for start_m in range(0, S, BLOCK_M):
            seeds = start_m + offs_m
            s_mask = seeds < S
            qd_mask = s_mask[:, None] & d_mask[None, :]
            q = tl.load(Q + seeds[:, None] * stride_qs + h * stride_qh + offs_d[None, :], mask=qd_mask, other=0.0)
            do = tl.load(
                DO + b * stride_dob + seeds[:, None] * stride_dos + h * stride_doh + offs_d[None, :],
                mask=qd_mask,
                other=0.0,
            )
            qk_t = tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION) * scale  # [BLOCK_N, BLOCK_M]
            allowed = n_mask[:, None] & s_mask[None, :]
            dp_t = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)
            if ACT == 0:
                lse = tl.load(Lse + (b * S + seeds) * H + h, mask=s_mask, other=0.0)
                delta = tl.load(Delta + (b * S + seeds) * H + h, mask=s_mask, other=0.0)
                w_t = tl.where(allowed, tl.exp(qk_t - lse[None, :]), 0.0)
                dz_t = w_t * (dp_t - delta[None, :])
            else:
                w_t = tl.where(allowed, _pointwise(qk_t, ACT), 0.0) * inv_n
                dz_t = tl.where(allowed, dp_t * _pointwise_grad(qk_t, ACT), 0.0) * inv_n
            dv += tl.dot(w_t.to(do.dtype), do, input_precision=INPUT_PRECISION)
            dk += tl.dot(dz_t.to(q.dtype), q, input_precision=INPUT_PRECISION)
        tl.store(
            DK + (row_start + cols[:, None]) * stride_dkt + h * stride_dkh + offs_d[None, :],
            (dk * scale).to(DK.dtype.element_ty),
            mask=kv_mask,
        )
        tl.store(
            DV + (row_start + cols[:, None]) * stride_dvt + h * stride_dvh + offs_d[None, :],
            dv.to(DV.dtype.element_ty),
            mask=kv_mask,
        )


@triton.jit
def _seed_attention_bwd_dq(
    Q,
    K,
    V,
    DO,
    Lse,
    Delta,
    DQ,
    Offsets,
    stride_qs,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_dob,
    stride_dos,
    stride_doh,
    stride_dqb,
    stride_dqs,
    stride_dqh,
    scale,
    S,
    H,
    head_dim,
    ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    """dQ of one row's seed tile into DQ [B, S, H, Dh]: the caller sums it over the rows."""
    b, h, row_start, n = _program_row(Offsets, H)
    seeds = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    s_mask = seeds < S
    d_mask = offs_d < head_dim
    qd_mask = s_mask[:, None] & d_mask[None, :]
    q = tl.load(Q + seeds[:, None] * stride_qs + h * stride_qh + offs_d[None, :], mask=qd_mask, other=0.0)
    do = tl.load(
        DO + b * stride_dob + seeds[:, None] * stride_dos + h * stride_doh + offs_d[None, :], mask=qd_mask, other=0.0
    )
    lse = tl.zeros([BLOCK_M], dtype=tl.float32)
    delta = tl.zeros([BLOCK_M], dtype=tl.float32)
    if ACT == 0:
        lse = tl.load(Lse + (b * S + seeds) * H + h, mask=s_mask, other=0.0)
        delta = tl.load(Delta + (b * S + seeds) * H + h, mask=s_mask, other=0.0)
    inv_n = 1.0 / tl.maximum(n, 1).to(tl.float32)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for start_n in range(0, n, BLOCK_N):
        cols = start_n + offs_n
        kv_mask = (cols < n)[:, None] & d_mask[None, :]
        k = tl.load(
            K + (row_start + cols[:, None]) * stride_kt + h * stride_kh + offs_d[None, :], mask=kv_mask, other=0.0
        )
        v = tl.load(
            V + (row_start + cols[:, None]) * stride_vt + h * stride_vh + offs_d[None, :], mask=kv_mask, other=0.0
        )
        qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * scale
        allowed = s_mask[:, None] & (cols < n)[None, :]
        dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
        if ACT == 0:
            p = tl.where(allowed, tl.exp(qk - lse[:, None]), 0.0)
            dz = p * (dp - delta[:, None])
        else:
            dz = tl.where(allowed, dp * _pointwise_grad(qk, ACT), 0.0) * inv_n
        dq += tl.dot(dz.to(k.dtype), k, input_precision=INPUT_PRECISION)
    tl.store(
        DQ + b * stride_dqb + seeds[:, None] * stride_dqs + h * stride_dqh + offs_d[None, :],
        (dq * scale).to(DQ.dtype.element_ty),
        mask=qd_mask,
    )


class _SeedAttentionFunction(torch.autograd.Function):
    """Forward and backward launches; the softmax logsumexp [B, S, H] is the only extra saved state."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        offsets: Tensor,
        max_seq_len: int,
        activation: str,
        scale: float,
    ) -> Tensor:
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        offsets = offsets.contiguous()
        S, H, Dh = q.shape
        B = offsets.numel() - 1
        out = torch.zeros((B, S, H, Dh), dtype=q.dtype, device=q.device)
        lse = torch.empty((B, S, H), dtype=torch.float32, device=q.device)
        config = _launch_config(q)
        act = ACTIVATION_CODES[activation]
        if B > 0 and S > 0:
            _seed_attention_fwd[(B * H, triton.cdiv(S, config["BLOCK_M"]))](
                q,
                k,
                v,
                out,
                lse,
                offsets,
                q.stride(0),
                q.stride(1),
                k.stride(0),
                k.stride(1),
                v.stride(0),
                v.stride(1),
                out.stride(0),
                out.stride(1),
                out.stride(2),
                scale,
                S,
                H,
                Dh,
                ACT=act,
                **config,
            )
        ctx.save_for_backward(q, k, v, offsets, out, lse)
        ctx.max_seq_len, ctx.act, ctx.scale = max_seq_len, act, scale
        return out

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, dout: Tensor
    ) -> tuple[Tensor | None, ...]:
        q, k, v, offsets, out, lse = ctx.saved_tensors
        dout = dout.contiguous()
        S, H, Dh = q.shape
        B = offsets.numel() - 1
        dq_rows = torch.zeros((B, S, H, Dh), dtype=torch.float32, device=q.device)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        delta = (dout.float() * out.float()).sum(-1) if ctx.act == 0 else lse
        config = _launch_config(q)
        strides = (
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            dout.stride(0),
            dout.stride(1),
            dout.stride(2),
        )
        if B > 0 and S > 0 and ctx.max_seq_len > 0:
            _seed_attention_bwd_dkdv[(B * H, triton.cdiv(ctx.max_seq_len, config["BLOCK_N"]))](
                q,
                k,
                v,
                dout,
                lse,
                delta,
                dk,
                dv,
                offsets,
                *strides,
                dk.stride(0),
                dk.stride(1),
                dv.stride(0),
                dv.stride(1),
                ctx.scale,
                S,
                H,
                Dh,
                ACT=ctx.act,
                **config,
            )
            _seed_attention_bwd_dq[(B * H, triton.cdiv(S, config["BLOCK_M"]))](
                q,
                k,
                v,
                dout,
                lse,
                delta,
                dq_rows,
                offsets,
                *strides,
                dq_rows.stride(0),
                dq_rows.stride(1),
                dq_rows.stride(2),
                ctx.scale,
                S,
                H,
                Dh,
                ACT=ctx.act,
                **config,
            )
        return dq_rows.sum(0).to(q.dtype), dk, dv, None, None, None, None


def triton_seed_attention(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, *, max_seq_len: int, activation: str, scale: float
) -> Tensor:
    """Triton broadcast-query attention of validated q [S, H, Dh] over jagged k, v (see `kernels.seed_attention`)."""
    return _SeedAttentionFunction.apply(q, k, v, offsets, max_seq_len, activation, scale)
