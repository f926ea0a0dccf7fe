"""Triton jagged attention: flash-attention tiling over the rows of a jagged batch, forward and backward.

q, k, v are [L, H, Dh] jagged values with offsets [B+1]; the grid is (B*H, ceil(N / BLOCK)) where N is
max_seq_len, and each program reads its row's start and length from offsets, so no token is padded and
programs past a row's end exit at once. `_jagged_attention_fwd` keeps one BLOCK_M x Dh query tile and
streams BLOCK_N key/value tiles: an online softmax for "softmax" (it stores the per-query logsumexp for
the backward), a direct accumulation of silu(scale * q.k) / n for HSTU's "silu". The backward recomputes
the attention weights from that state in two kernels, `_jagged_attention_bwd_dkdv` (one program per key
tile, looping over query tiles) and `_jagged_attention_bwd_dq` (one per query tile), so no atomics are
needed and the gradients are deterministic. Causal programs skip the tiles above the diagonal. Import this
module lazily (the entry point `kernels.jagged_attention` does): triton decides at import time whether
the kernels run compiled or, with TRITON_INTERPRET=1, in its CPU interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor


@triton.jit
def _jagged_attention_fwd(
    Q,
    K,
    V,
    Out,
    Lse,  # [L, H] float32, written for "softmax" only
    Offsets,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    scale,
    H,
    head_dim,
    CAUSAL: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    b = pid_bh // H
    h = pid_bh % H
    row_start = tl.load(Offsets + b)
    n = (tl.load(Offsets + b + 1) - row_start).to(tl.int32)
    # Pointers to token 0 of this row, head h; tiles add token offsets (the head dim is contiguous).
    q_base = Q + row_start * stride_qt + h * stride_qh
    k_base = K + row_start * stride_kt + h * stride_kh
    v_base = V + row_start * stride_vt + h * stride_vh
    out_base = Out + row_start * stride_ot + h * stride_oh
    lse_base = Lse + row_start * H + h
    start_m = tl.program_id(1) * BLOCK_M
    if start_m < n:
        rows = start_m + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        m_mask = rows < n
        d_mask = offs_d < head_dim
        qd_mask = m_mask[:, None] & d_mask[None, :]
        q = tl.load(q_base + rows[:, None] * stride_qt + offs_d[None, :], mask=qd_mask, other=0.0)
        inv_n = 1.0 / n.to(tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        # A finite floor instead of -inf: padding rows then stay NaN-free (they are never stored).
        m_i = tl.full([BLOCK_M], -1e30, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        hi = n
        if CAUSAL:
            hi = tl.minimum(n, start_m + BLOCK_M)
        for start_n in range(0, hi, BLOCK_N):
            cols = start_n + offs_n
            n_mask = cols < n
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = tl.load(k_base + cols[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0)
            qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * scale  # [BLOCK_M, BLOCK_N]
            allowed = m_mask[:, None] & n_mask[None, :]
            if CAUSAL:
                allowed = allowed & (rows[:, None] >= cols[None, :])
            if SILU:
                w = tl.where(allowed, qk * tl.sigmoid(qk), 0.0) * inv_n
                acc += tl.dot(w.to(v.dtype), v, input_precision=INPUT_PRECISION)
            else:
                qk = tl.where(allowed, qk, -1e30)
                m_new = tl.maximum(m_i, tl.max(qk, 1))
                alpha = tl.exp(m_i - m_new)
                p = tl.where(allowed, tl.exp(qk - m_new[:, None]), 0.0)
                l_i = l_i * alpha + tl.sum(p, 1)
                acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
                m_i = m_new
        if not SILU:
            l_safe = tl.where(l_i > 0.0, l_i, 1.0)
            acc = acc / l_safe[:, None]
            tl.store(lse_base + rows * H, m_i + tl.log(l_safe), mask=m_mask)
        tl.store(out_base + rows[:, None] * stride_ot + offs_d[None, :], acc.to(Out.dtype.element_ty), mask=qd_mask)


@triton.jit
def _jagged_attention_bwd_dkdv(
    Q,
    K,
    V,
    DO,
    Lse,
    Delta,  # [L, H] float32: rowsum(dO * O), "softmax" only
    DK,
    DV,
    Offsets,
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
    H,
    head_dim,
    CAUSAL: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    b = pid_bh // H
    h = pid_bh % H
    row_start = tl.load(Offsets + b)
    n = (tl.load(Offsets + b + 1) - row_start).to(tl.int32)
    # Pointers to token 0 of this row, head h; tiles add token offsets (the head dim is contiguous).
    q_base = Q + row_start * stride_qt + h * stride_qh
    k_base = K + row_start * stride_kt + h * stride_kh
    v_base = V + row_start * stride_vt + h * stride_vh
    do_base = DO + row_start * stride_dot + h * stride_doh
    lse_base = Lse + row_start * H + h
    delta_base = Delta + row_start * H + h
    dk_base = DK + row_start * stride_dkt + h * stride_dkh
    dv_base = DV + row_start * stride_dvt + h * stride_dvh
    start_n = tl.program_id(1) * BLOCK_N
    if start_n < n:
        cols = start_n + tl.arange(0, BLOCK_N)
        offs_m = tl.arange(0, BLOCK_M)
        offs_d = tl.arange(0, BLOCK_D)
        n_mask = cols < n
        d_mask = offs_d < head_dim
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_base + cols[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0)
        inv_n = 1.0 / n.to(tl.float32)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        lo = 0
        if CAUSAL:
            lo = (start_n // BLOCK_M) * BLOCK_M  # queries before this key tile cannot see it
        for start_m in range(lo, n, BLOCK_M):
            rows = start_m + offs_m
            m_mask = rows < n
            qd_mask = m_mask[:, None] & d_mask[None, :]
            q = tl.load(q_base + rows[:, None] * stride_qt + offs_d[None, :], mask=qd_mask, other=0.0)
            do = tl.load(
                do_base + rows[:, None] * stride_dot + offs_d[None, :], mask=qd_mask, other=0.0
            )
            qk_t = tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION) * scale  # [BLOCK_N, BLOCK_M]
            allowed = n_mask[:, None] & m_mask[None, :]
            if CAUSAL:
                allowed = allowed & (rows[None, :] >= cols[:, None])
            dp_t = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)  # dL/dweight, transposed
            if SILU:
                sig = tl.sigmoid(qk_t)
                w_t = tl.where(allowed, qk_t * sig, 0.0) * inv_n
                dz_t = tl.where(allowed, dp_t * sig * (1.0 + qk_t * (1.0 - sig)), 0.0) * inv_n
            else:
                lse = tl.load(lse_base + rows * H, mask=m_mask, other=0.0)
                delta = tl.load(delta_base + rows * H, mask=m_mask, other=0.0)
                w_t = tl.where(allowed, tl.exp(qk_t - lse[None, :]), 0.0)
                dz_t = w_t * (dp_t - delta[None, :])
            dv += tl.dot(w_t.to(do.dtype), do, input_precision=INPUT_PRECISION)
            dk += tl.dot(dz_t.to(q.dtype), q, input_precision=INPUT_PRECISION)
        tl.store(
            dk_base + cols[:, None] * stride_dkt + offs_d[None, :],
            (dk * scale).to(DK.dtype.element_ty),
            mask=kv_mask,
        )
        tl.store(
            dv_base + cols[:, None] * stride_dvt + offs_d[None, :],
            dv.to(DV.dtype.element_ty),
            mask=kv_mask,
        )


@triton.jit
def _jagged_attention_bwd_dq(
    Q,
    K,
    V,
    DO,
    Lse,
    Delta,
    DQ,
    Offsets,
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
    H,
    head_dim,
    CAUSAL: tl.constexpr,
    SILU: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    b = pid_bh // H
    h = pid_bh % H
    row_start = tl.load(Offsets + b)
    n = (tl.load(Offsets + b + 1) - row_start).to(tl.int32)
    # Pointers to token 0 of this row, head h; tiles add token offsets (the head dim is contiguous).
    q_base = Q + row_start * stride_qt + h * stride_qh
    k_base = K + row_start * stride_kt + h * stride_kh
    v_base = V + row_start * stride_vt + h * stride_vh
    do_base = DO + row_start * stride_dot + h * stride_doh
    lse_base = Lse + row_start * H + h
    delta_base = Delta + row_start * H + h
    dq_base = DQ + row_start * stride_dqt + h * stride_dqh
    start_m = tl.program_id(1) * BLOCK_M
    if start_m < n:
        rows = start_m + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        m_mask = rows < n
        d_mask = offs_d < head_dim
        qd_mask = m_mask[:, None] & d_mask[None, :]
        q = tl.load(q_base + rows[:, None] * stride_qt + offs_d[None, :], mask=qd_mask, other=0.0)
        do = tl.load(do_base + rows[:, None] * stride_dot + offs_d[None, :], mask=qd_mask, other=0.0)
        lse = tl.zeros([BLOCK_M], dtype=tl.float32)
        delta = tl.zeros([BLOCK_M], dtype=tl.float32)
        if not SILU:
            lse = tl.load(lse_base + rows * H, mask=m_mask, other=0.0)
            delta = tl.load(delta_base + rows * H, mask=m_mask, other=0.0)
        inv_n = 1.0 / n.to(tl.float32)
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        hi = n
        if CAUSAL:
            hi = tl.minimum(n, start_m + BLOCK_M)
        for start_n in range(0, hi, BLOCK_N):
            cols = start_n + offs_n
            n_mask = cols < n
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = tl.load(k_base + cols[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0)
            qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * scale  # [BLOCK_M, BLOCK_N]
            allowed = m_mask[:, None] & n_mask[None, :]
            if CAUSAL:
                allowed = allowed & (rows[:, None] >= cols[None, :])
            dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
            if SILU:
                sig = tl.sigmoid(qk)
                dz = tl.where(allowed, dp * sig * (1.0 + qk * (1.0 - sig)), 0.0) * inv_n
            else:
                p = tl.where(allowed, tl.exp(qk - lse[:, None]), 0.0)
                dz = p * (dp - delta[:, None])
            dq += tl.dot(dz.to(k.dtype), k, input_precision=INPUT_PRECISION)
        tl.store(
            dq_base + rows[:, None] * stride_dqt + offs_d[None, :],
            (dq * scale).to(DQ.dtype.element_ty),
            mask=qd_mask,
        )


def _is_interpreted() -> bool:
    """Whether triton turned the kernels into interpreter functions (TRITON_INTERPRET=1 at import)."""
    return type(_jagged_attention_fwd).__name__ == "InterpretedFunction"


def _launch_config(q: Tensor) -> dict[str, object]:
    """Tile sizes and launch options. Small tiles under the interpreter (fast, and rows span several tiles);
    on GPU 64-row query tiles, key tiles shrinking with the head dim to keep two pipeline stages in shared
    memory. Not autotuned yet: no GPU has measured them."""
    block_d = max(16, triton.next_power_of_2(q.shape[-1]))
    if not q.is_cuda:
        return {"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_D": block_d, "INPUT_PRECISION": "ieee"}
    # fp32 inputs follow torch's own switch, so the kernel is as exact as the matmul it replaces.
    precision = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"
    block_m, block_n = (64, 64) if block_d <= 64 else (64, 32) if block_d <= 128 else (32, 32)
    return {
        "BLOCK_M": block_m,
        "BLOCK_N": block_n,
        "BLOCK_D": block_d,
        "INPUT_PRECISION": precision,
        "num_warps": 4,
        "num_stages": 2,
    }


class _JaggedAttentionFunction(torch.autograd.Function):
    """Forward and backward Triton launches; the softmax logsumexp [L, H] is the only extra saved state."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        offsets: Tensor,
        max_seq_len: int,
        causal: bool,
        silu: bool,
        scale: float,
    ) -> Tensor:
        # Any token and head strides (e.g. q, k, v unbound from one fused [L, 3, H, Dh] projection); the
        # kernels only need a contiguous head dim.
        q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
        offsets = offsets.contiguous()
        L, H, Dh = q.shape
        B = offsets.numel() - 1
        out = torch.empty_like(q)
        lse = torch.empty((L, H), dtype=torch.float32, device=q.device)
        config = _launch_config(q)
        if L > 0 and max_seq_len > 0:
            grid = (B * H, triton.cdiv(max_seq_len, config["BLOCK_M"]))
            _jagged_attention_fwd[grid](
                q, k, v, out, lse, offsets,
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                out.stride(0), out.stride(1),
                scale, H, Dh, CAUSAL=causal, SILU=silu, **config,
            )
        ctx.save_for_backward(q, k, v, offsets, out, lse)
        ctx.max_seq_len, ctx.causal, ctx.silu, ctx.scale = max_seq_len, causal, silu, scale
        return out

    @staticmethod
    def backward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx, dout: Tensor
    ) -> tuple[Tensor | None, ...]:
        q, k, v, offsets, out, lse = ctx.saved_tensors
        dout = dout if dout.stride(-1) == 1 else dout.contiguous()
        L, H, Dh = q.shape
        B = offsets.numel() - 1
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        # rowsum(dO * O) [L, H]: the softmax backward's correction term; silu has none (lse is a placeholder).
        delta = lse if ctx.silu else (dout.float() * out.float()).sum(-1)
        config = _launch_config(q)
        if L > 0 and ctx.max_seq_len > 0:
            common = dict(CAUSAL=ctx.causal, SILU=ctx.silu, **config)
            strides = (
                q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                dout.stride(0), dout.stride(1),
            )
            grid_n = (B * H, triton.cdiv(ctx.max_seq_len, config["BLOCK_N"]))
            _jagged_attention_bwd_dkdv[grid_n](
                q, k, v, dout, lse, delta, dk, dv, offsets,
                *strides, dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
                ctx.scale, H, Dh, **common,
            )
            grid_m = (B * H, triton.cdiv(ctx.max_seq_len, config["BLOCK_M"]))
            _jagged_attention_bwd_dq[grid_m](
                q, k, v, dout, lse, delta, dq, offsets,
                *strides, dq.stride(0), dq.stride(1),
                ctx.scale, H, Dh, **common,
            )
        return dq, dk, dv, None, None, None, None, None


def triton_jagged_attention(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, *, max_seq_len: int, causal: bool, activation: str, scale: float
) -> Tensor:
    """Triton jagged attention of validated [L, H, Dh] q, k, v (see `kernels.jagged_attention`)."""
    return _JaggedAttentionFunction.apply(q, k, v, offsets, max_seq_len, causal, activation == "silu", scale)
