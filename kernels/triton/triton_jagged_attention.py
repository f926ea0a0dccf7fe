"""Triton jagged attention: flash-attention tiling over the rows of a jagged batch, forward and backward.

q, k, v are [L, H, Dh] jagged values with offsets [B+1]; the grid is (B*H, ceil(N / BLOCK)) where N is
max_seq_len, and each program reads its row's start and length from offsets, so no token is padded and
programs past a row's end exit at once. `_jagged_attention_fwd` keeps one BLOCK_M x Dh query tile and
streams BLOCK_N key/value tiles: an online softmax for "softmax" (it stores the per-query logsumexp for
the backward), a direct accumulation of act(scale * q.k) / n for the pointwise activations (generalized
dot-product attention: silu, gelu, relu2, identity). The backward recomputes the attention weights from
that state in two kernels, `_jagged_attention_bwd_dkdv` (one program per key tile, looping over query
tiles) and `_jagged_attention_bwd_dq` (one per query tile), so no atomics are needed and the gradients
are deterministic. Causal programs skip the tiles above the diagonal, windowed ones (WINDOWED) the tiles
outside the window that hold no global token. Import this
module lazily (the entry point `kernels.jagged_attention` does): triton decides at import time whether
the kernels run compiled or, with TRITON_INTERPRET=1, in its CPU interpreter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

# Activation codes (constexpr ACT): 0 is softmax, the rest pointwise.
ACTIVATION_CODES = {"softmax": 0, "silu": 1, "gelu": 2, "relu2": 3, "identity": 4}
_INV_SQRT2, _INV_SQRT_2PI = 0.7071067811865476, 0.3989422804014327


@triton.jit
def _pointwise(x, ACT: tl.constexpr):
    if ACT == 1:
        y = x * tl.sigmoid(x)
    elif ACT == 2:
        y = 0.5 * x * (1.0 + tl.erf(x * _INV_SQRT2))
    elif ACT == 3:
        r = tl.maximum(x, 0.0)
        y = r * r
    else:
        y = x
    return y


@triton.jit
def _pointwise_grad(x, ACT: tl.constexpr):
    """d act(x) / dx."""
    if ACT == 1:
        sig = tl.sigmoid(x)
        g = sig * (1.0 + x * (1.0 - sig))
    elif ACT == 2:
        g = 0.5 * (1.0 + tl.erf(x * _INV_SQRT2)) + x * tl.exp(-0.5 * x * x) * _INV_SQRT_2PI
    elif ACT == 3:
        g = 2.0 * tl.maximum(x, 0.0)
    else:
        g = tl.full(x.shape, 1.0, tl.float32)
    return g


@triton.jit
def _program_row(Offsets, H):
    """(row b, head h, the row's first token, its length n) of the program on grid axis 0 (B * H)."""
    pid_bh = tl.program_id(0)
    b = pid_bh // H
    row_start = tl.load(Offsets + b)
    return b, pid_bh % H, row_start, (tl.load(Offsets + b + 1) - row_start).to(tl.int32)


@triton.jit
def _allowed(q_idx, k_idx, n, window, n_global, CAUSAL: tl.constexpr, WINDOWED: tl.constexpr):
    """May query q_idx attend to key k_idx (broadcast index tensors of one row of n tokens)."""
    allowed = (q_idx < n) & (k_idx < n)
    if CAUSAL:
        allowed = allowed & (q_idx >= k_idx)
    if WINDOWED:
        first_global = n - n_global
        near = ((q_idx - k_idx) <= window) & ((k_idx - q_idx) <= window)
        allowed = allowed & (near | (q_idx >= first_global) | (k_idx >= first_global))
    return allowed


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
    window,
    n_global,
    CAUSAL: tl.constexpr,
    WINDOWED: tl.constexpr,
    ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    b, h, row_start, n = _program_row(Offsets, H)
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
        lo, hi, near_hi, global_lo = _key_range(start_m, n, window, n_global, CAUSAL, WINDOWED, BLOCK_M, BLOCK_N)
        for start_n in range(lo, hi, BLOCK_N):
            if (start_n < near_hi) | (start_n >= global_lo):
                cols = start_n + offs_n
                kv_mask = (cols < n)[:, None] & d_mask[None, :]
                k = tl.load(k_base + cols[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)
                v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0)
                qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * scale  # [BLOCK_M, BLOCK_N]
                allowed = _allowed(rows[:, None], cols[None, :], n, window, n_global, CAUSAL, WINDOWED)
                acc, m_i, l_i = _fwd_update(acc, m_i, l_i, qk, allowed, v, inv_n, ACT, INPUT_PRECISION)
        if ACT == 0:
            l_safe = tl.where(l_i > 0.0, l_i, 1.0)
            acc = acc / l_safe[:, None]
            tl.store(lse_base + rows * H, m_i + tl.log(l_safe), mask=m_mask)
        tl.store(out_base + rows[:, None] * stride_ot + offs_d[None, :], acc.to(Out.dtype.element_ty), mask=qd_mask)


@triton.jit
def _fwd_update(acc, m_i, l_i, qk, allowed, v, inv_n, ACT: tl.constexpr, INPUT_PRECISION: tl.constexpr):
    """One key tile into the running (acc, max, sum): online softmax, or the pointwise weights' direct sum."""
    if ACT == 0:
        qk = tl.where(allowed, qk, -1e30)
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.where(allowed, tl.exp(qk - m_new[:, None]), 0.0)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=INPUT_PRECISION)
        m_i = m_new
    else:
        w = tl.where(allowed, _pointwise(qk, ACT), 0.0) * inv_n
        acc += tl.dot(w.to(v.dtype), v, input_precision=INPUT_PRECISION)
    return acc, m_i, l_i


@triton.jit
def _key_range(
    start_m,
    n,
    window,
    n_global,
    CAUSAL: tl.constexpr,
    WINDOWED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Key tiles for the query tile at start_m: loop over [lo, hi) and visit a tile only when it starts
    before near_hi (the window's end) or at or after global_lo (the tile of the first global key)."""
    lo = start_m * 0  # tensors from the start: a runtime branch must not change a variable's type
    hi = n
    if CAUSAL:
        hi = tl.minimum(n, start_m + BLOCK_M)
    near_hi = hi
    global_lo = hi
    if WINDOWED:
        if start_m + BLOCK_M <= n - n_global:  # no global query in the tile: the window and the global keys
            lo = tl.maximum(start_m - window, 0) // BLOCK_N * BLOCK_N
            near_hi = tl.minimum(hi, start_m + BLOCK_M + window)
            global_lo = (n - n_global) // BLOCK_N * BLOCK_N
    return lo, hi, near_hi, global_lo


@triton.jit
def _query_range(
    start_n,
    n,
    window,
    n_global,
    CAUSAL: tl.constexpr,
    WINDOWED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Query tiles that can see the key tile at start_n, as `_key_range` gives key tiles."""
    lo = start_n * 0
    if CAUSAL:
        lo = (start_n // BLOCK_M) * BLOCK_M  # queries before this key tile cannot see it
    near_hi = n
    global_lo = n
    if WINDOWED:
        if start_n + BLOCK_N <= n - n_global:  # no global key in the tile: the window and the global queries
            lo = tl.maximum(lo, tl.maximum(start_n - window, 0) // BLOCK_M * BLOCK_M)
            near_hi = tl.minimum(n, start_n + BLOCK_N + window)
            global_lo = (n - n_global) // BLOCK_M * BLOCK_M
    return lo, near_hi, global_lo


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
    window,
    n_global,
    CAUSAL: tl.constexpr,
    WINDOWED: tl.constexpr,
    ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    b, h, row_start, n = _program_row(Offsets, H)
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
        lo, near_hi, global_lo = _query_range(start_n, n, window, n_global, CAUSAL, WINDOWED, BLOCK_M, BLOCK_N)
        for start_m in range(lo, n, BLOCK_M):
            if (start_m < near_hi) | (start_m >= global_lo):
                rows = start_m + offs_m
                m_mask = rows < n
                qd_mask = m_mask[:, None] & d_mask[None, :]
                q = tl.load(q_base + rows[:, None] * stride_qt + offs_d[None, :], mask=qd_mask, other=0.0)
                do = tl.load(do_base + rows[:, None] * stride_dot + offs_d[None, :], mask=qd_mask, other=0.0)
                qk_t = tl.dot(k, tl.trans(q), input_precision=INPUT_PRECISION) * scale  # [BLOCK_N, BLOCK_M]
                allowed = _allowed(rows[None, :], cols[:, None], n, window, n_global, CAUSAL, WINDOWED)
                dp_t = tl.dot(v, tl.trans(do), input_precision=INPUT_PRECISION)  # dL/dweight, transposed
                if ACT == 0:
                    lse = tl.load(lse_base + rows * H, mask=m_mask, other=0.0)
                    delta = tl.load(delta_base + rows * H, mask=m_mask, other=0.0)
                    w_t = tl.where(allowed, tl.exp(qk_t - lse[None, :]), 0.0)
                    dz_t = w_t * (dp_t - delta[None, :])
                else:
                    w_t = tl.where(allowed, _pointwise(qk_t, ACT), 0.0) * inv_n
                    dz_t = tl.where(allowed, dp_t * _pointwise_grad(qk_t, ACT), 0.0) * inv_n
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
    window,
    n_global,
    CAUSAL: tl.constexpr,
    WINDOWED: tl.constexpr,
    ACT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    b, h, row_start, n = _program_row(Offsets, H)
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
        if ACT == 0:
            lse = tl.load(lse_base + rows * H, mask=m_mask, other=0.0)
            delta = tl.load(delta_base + rows * H, mask=m_mask, other=0.0)
        inv_n = 1.0 / n.to(tl.float32)
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        lo, hi, near_hi, global_lo = _key_range(start_m, n, window, n_global, CAUSAL, WINDOWED, BLOCK_M, BLOCK_N)
        for start_n in range(lo, hi, BLOCK_N):
            if (start_n < near_hi) | (start_n >= global_lo):
                cols = start_n + offs_n
                kv_mask = (cols < n)[:, None] & d_mask[None, :]
                k = tl.load(k_base + cols[:, None] * stride_kt + offs_d[None, :], mask=kv_mask, other=0.0)
                v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :], mask=kv_mask, other=0.0)
                qk = tl.dot(q, tl.trans(k), input_precision=INPUT_PRECISION) * scale  # [BLOCK_M, BLOCK_N]
                allowed = _allowed(rows[:, None], cols[None, :], n, window, n_global, CAUSAL, WINDOWED)
                dp = tl.dot(do, tl.trans(v), input_precision=INPUT_PRECISION)
                if ACT == 0:
                    p = tl.where(allowed, tl.exp(qk - lse[:, None]), 0.0)
                    dz = p * (dp - delta[:, None])
                else:
                    dz = tl.where(allowed, dp * _pointwise_grad(qk, ACT), 0.0) * inv_n
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
        activation: str,
        scale: float,
        window: int | None,
        n_global: int,
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
                scale,
                H,
                Dh,
                *_mask_args(causal, activation, window, n_global),
                **config,
            )
        ctx.save_for_backward(q, k, v, offsets, out, lse)
        ctx.max_seq_len, ctx.scale = max_seq_len, scale
        ctx.mask = (causal, activation, window, n_global)
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
        # rowsum(dO * O) [L, H]: the softmax backward's correction term; pointwise weights have none (lse is a
        # placeholder).
        softmax = ctx.mask[1] == "softmax"
        delta = (dout.float() * out.float()).sum(-1) if softmax else lse
        config = _launch_config(q)
        if L > 0 and ctx.max_seq_len > 0:
            mask_args = _mask_args(*ctx.mask)
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
            grid_n = (B * H, triton.cdiv(ctx.max_seq_len, config["BLOCK_N"]))
            _jagged_attention_bwd_dkdv[grid_n](
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
                H,
                Dh,
                *mask_args,
                **config,
            )
            grid_m = (B * H, triton.cdiv(ctx.max_seq_len, config["BLOCK_M"]))
            _jagged_attention_bwd_dq[grid_m](
                q,
                k,
                v,
                dout,
                lse,
                delta,
                dq,
                offsets,
                *strides,
                dq.stride(0),
                dq.stride(1),
                ctx.scale,
                H,
                Dh,
                *mask_args,
                **config,
            )
        return dq, dk, dv, None, None, None, None, None, None, None


def _mask_args(causal: bool, activation: str, window: int | None, n_global: int) -> tuple[object, ...]:
    """The kernels' (window, n_global, CAUSAL, WINDOWED, ACT) arguments."""
    return (0 if window is None else window, n_global, causal, window is not None, ACTIVATION_CODES[activation])


def triton_jagged_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    offsets: Tensor,
    *,
    max_seq_len: int,
    causal: bool,
    activation: str,
    scale: float,
    window: int | None = None,
    n_global: int = 0,
) -> Tensor:
    """Triton jagged attention of validated [L, H, Dh] q, k, v (see `kernels.jagged_attention`)."""
    return _JaggedAttentionFunction.apply(q, k, v, offsets, max_seq_len, causal, activation, scale, window, n_global)
