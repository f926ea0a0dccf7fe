"""Jagged self-attention over the rows of a jagged batch: the entry point, its validation and its PyTorch path.

`jagged_attention` takes jagged values q, k, v [L, H, Dh] (B rows concatenated, offsets [B+1]) and lets each
token attend within its own row, with standard "softmax" weights or generalized dot-product attention's
pointwise ones ("silu" as in HSTU; "gelu", "relu2", "identity" as in Kunlun's GDPA), optionally within a
sliding window whose rows keep a few global tokens. It replaces
padding the batch to [B, H, N, Dh] and running dense masked attention, whose cost grows with B * N^2
however short most rows are. kernel="triton" runs `kernels/triton/triton_jagged_attention.py` (CUDA, or
the CPU interpreter under TRITON_INTERPRET=1); kernel="pytorch" runs `_bucketed_jagged_attention` below,
which sorts rows by length and runs dense attention per bucket of similar lengths, padding only within a
bucket. The fp32 ground truth is `kernels/reference/pt_jagged_attention.py`.
"""

from __future__ import annotations

import bisect
import importlib
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.reference.pt_jagged_attention import POINTWISE

_ACTIVATIONS = ("softmax", "silu", "gelu", "relu2", "identity")
_KERNELS = ("auto", "pytorch", "triton")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# A bucket holds rows of lengths [m, max(_BUCKET_RATIO * m, _BUCKET_MIN_WIDTH)]: padding within a bucket is
# at most 1.25x its tokens (1.56x its attention pairs), and short rows share one bucket since padding them
# is cheaper than another round of small matmuls. Ratio 1.25 scores GEM at `small` 15% (fp32) and 28% (bf16)
# faster than 2.0 did; 1.125 is slower again (more, smaller rounds; docs/BENCHMARKS.md).
_BUCKET_RATIO = 1.25
_BUCKET_MIN_WIDTH = 16
_TRITON_MAX_HEAD_DIM = 256


def jagged_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    offsets: Tensor,
    *,
    max_seq_len: int,
    causal: bool = True,
    activation: Literal["softmax", "silu", "gelu", "relu2", "identity"] = "softmax",
    scale: float | None = None,
    window: int | None = None,
    n_global: int = 0,
    kernel: Literal["auto", "pytorch", "triton"] = "auto",
) -> Tensor:
    """Attention of each token to the tokens of its own row; returns [L, H, Dh] in q's dtype.

    q, k, v: [L, H, Dh] jagged values, one dtype (float32, bfloat16, float16) and device. offsets: [B+1]
    int64 on q's device, offsets[0] = 0, non-decreasing, offsets[-1] = L; rows may be empty. max_seq_len
    (N): an upper bound on row lengths, sizing the Triton grid. causal: token i of a row sees tokens
    j <= i of that row, position 0 being the row's first token. activation: "softmax", or a pointwise one
    (silu, gelu, relu2 = relu², identity) for w_ij = act(scale * q_i.k_j) / n_b (n_b the row's length, no
    normalisation over j). scale defaults to 1/sqrt(Dh). window: token i sees only tokens j with
    |i - j| <= window (sliding-window attention, Kunlun's for long histories), except that the row's last
    `n_global` tokens (e.g. CLS tokens appended to it) see and are seen by every token of the row; None
    attends to the whole row (and n_global must be 0). kernel: "auto" (Triton for CUDA tensors, else the
    bucketed PyTorch path), "pytorch", or "triton" (CUDA, or CPU tensors under TRITON_INTERPRET=1).
    Differentiable in q, k, v on every path.

    It replaces padding to [B, H, N, Dh] and dense masked attention, and wins whenever row lengths vary.
    Measured forward + backward on 2 AMD EPYC cores, 1 torch thread, bucket ratio 2.0 (docs/BENCHMARKS.md; B=128, H=2,
    Dh=32, float32, causal, log-normal lengths of median 38 clipped at 1024, so padding to N=1024 makes
    11.9x the real tokens and 33x the real attention pairs): the PyTorch path takes 83 ms (softmax) and
    133 ms (silu) against 1,367 ms and 6,380 ms padded, 16x and 48x faster, with 5x and 12x less peak
    memory. With equal lengths (64 rows of 256) it costs what padded attention costs (1.0x softmax,
    0.9x silu). On an H200 the Triton kernel (B=256, H=4, Dh=64, bf16) was 12x (softmax) and 118x (silu)
    faster than padded attention, with 1/18 and 1/330 of the memory.

    Validation reads offsets once (one device sync on CUDA) to check them against L and max_seq_len.
    """
    if kernel not in _KERNELS:
        raise ValueError(f"kernel={kernel!r} is not one of {_KERNELS}; pass 'auto' to choose by device")
    _validate(
        q,
        k,
        v,
        offsets,
        max_seq_len=max_seq_len,
        causal=causal,
        activation=activation,
        scale=scale,
        window=window,
        n_global=n_global,
    )
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    mask = _Mask(causal, window, n_global)
    if kernel == "triton" or (kernel == "auto" and q.is_cuda):
        triton_jagged_attention = _import_triton_kernel(q)
        return triton_jagged_attention(
            q,
            k,
            v,
            offsets,
            max_seq_len=max_seq_len,
            causal=causal,
            activation=activation,
            scale=scale,
            window=window,
            n_global=n_global,
        )
    return _bucketed_jagged_attention(q, k, v, offsets, mask=mask, activation=activation, scale=scale)


@dataclass(frozen=True)
class _Mask:
    """Which pairs of a row may attend: causal, and a sliding window with `n_global` global tokens at the end."""

    causal: bool
    window: int | None
    n_global: int

    def allowed(self, n: int, lengths: Tensor, valid: Tensor) -> Tensor | None:
        """[b, 1, n, n] bool for a bucket of rows padded to n (lengths [b], valid [b, n]), or None when every
        pair is allowed or the causal flag alone decides (rows are padded at the end, so under a causal mask no
        real query sees a padding key)."""
        if self.window is None:
            return None if self.causal or bool(valid.all()) else valid[:, None, None, :]
        i = torch.arange(n, device=valid.device)
        first_global = (lengths - self.n_global)[:, None, None]
        near = ((i[:, None] - i[None, :]).abs() <= self.window)[None]
        allowed = (near | (i[None, :, None] >= first_global) | (i[None, None, :] >= first_global)) & valid[:, None, :]
        if self.causal:
            allowed = allowed & (i[None, :] <= i[:, None])[None]
        return allowed[:, None]


def _bucketed_jagged_attention(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, *, mask: _Mask, activation: str, scale: float
) -> Tensor:
    """Rows sorted by length, dense attention per bucket of similar lengths [b, H, n, Dh], scattered back to [L]."""
    buckets = length_buckets(offsets)
    if not buckets:  # L == 0: an empty result that still has a grad_fn to q, k and v
        return (q + k + v) * 0
    # One gather of every bucket's padded tokens and one gather back. index_select, not t[index]: on CPU
    # it runs 2-3x faster than advanced indexing in both directions.
    index = torch.cat([bucket_index.flatten() for bucket_index, _, _ in buckets]).to(q.device)
    valid = torch.cat([valid.flatten() for _, valid, _ in buckets])
    source = torch.empty(q.shape[0], dtype=torch.int64)
    source[index.cpu()[valid]] = valid.nonzero().squeeze(1)  # token t's (only) real padded slot is source[t]
    source = source.to(q.device)
    qg, kg, vg = (_GatherPadded.apply(t, index, source) for t in (q, k, v))  # [P, H, Dh], P: padded tokens
    outs = []
    first = 0
    for bucket_index, valid, lengths in buckets:
        b, n = bucket_index.shape
        qb, kb, vb = (t[first : first + b * n].view(b, n, *t.shape[1:]).transpose(1, 2) for t in (qg, kg, vg))
        out = _dense_attention(qb, kb, vb, valid.to(q.device), lengths.to(q.device), mask, activation, scale)
        outs.append(out.reshape(b * n, *q.shape[1:]))
        first += b * n
    return torch.cat(outs).index_select(0, source)


class _GatherPadded(torch.autograd.Function):
    """x.index_select(0, index) into the buckets' padded slots, whose backward gathers each token's gradient
    from its real slot, source[t], instead of autograd's zero-filled buffer and index_add over every slot.

    Exact because the padding slots' gradients are zero: their outputs are dropped (zero grad_out, so zero
    dQ), and no real query attends to a padding key (the causal mask or the key mask gives it weight 0).
    """

    @staticmethod
    def forward(ctx, x: Tensor, index: Tensor, source: Tensor) -> Tensor:
        ctx.save_for_backward(source)
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        (source,) = ctx.saved_tensors
        return grad.index_select(0, source), None, None


def length_buckets(offsets: Tensor) -> list[tuple[Tensor, Tensor, Tensor]]:
    """Buckets of non-empty rows of similar lengths: (token index [b, n], valid [b, n], lengths [b]), on CPU.

    Padding slots of a row re-read its first token; their outputs are discarded and get no gradient.
    """
    starts, lengths = offsets[:-1].cpu(), offsets.diff().cpu()
    sorted_lengths, order = torch.sort(lengths, stable=True)
    sorted_list = sorted_lengths.tolist()
    buckets = []
    first = bisect.bisect_right(sorted_list, 0)  # rows of length 0 produce nothing
    while first < len(sorted_list):
        last = bisect.bisect_right(sorted_list, max(int(_BUCKET_RATIO * sorted_list[first]), _BUCKET_MIN_WIDTH))
        rows = order[first:last]
        position = torch.arange(sorted_list[last - 1])
        valid = position[None, :] < lengths[rows][:, None]
        buckets.append((starts[rows][:, None] + torch.where(valid, position[None, :], 0), valid, lengths[rows]))
        first = last
    return buckets


def _dense_attention(
    q: Tensor, k: Tensor, v: Tensor, valid: Tensor, lengths: Tensor, mask: _Mask, activation: str, scale: float
) -> Tensor:
    """Attention of one bucket: q, k, v [b, H, n, Dh], valid [b, n], lengths [b]; returns [b, n, H, Dh].

    Rows are padded at the end, so under a causal mask a real query never sees a padding key: causal needs
    no padding mask (and softmax takes SDPA's fused causal path). Padding queries see at least key 0 (no
    empty softmax, no NaN); their outputs are garbage that the caller drops.
    """
    n = q.shape[2]
    # Banded once a row spans more than two blocks, where it does less work than the masked [n, n]; level with it
    # at 4 blocks of 257 tokens, 0.44x the unwindowed fused attention's time at 32 (bench.perf.sequence_cost).
    if mask.causal and mask.window is not None and not mask.n_global and n > 2 * (mask.window + 1):
        return _banded_attention(q, k, v, lengths, mask.window, activation, scale)
    allowed = mask.allowed(n, lengths, valid)  # [b, 1, n | 1, n] or None
    causal_only = mask.causal and allowed is None
    if activation == "softmax":
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, is_causal=causal_only, scale=scale)
    else:
        # In place: no activation's backward needs its output, so one [b, H, n, n] buffer is saved.
        weights = POINTWISE[activation]((q * scale) @ k.transpose(-1, -2))  # [b, H, n, n]
        if causal_only:
            weights.masked_fill_(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), 0.0)
        elif allowed is not None:
            weights.masked_fill_(~allowed, 0.0)
        # Dividing the [b, H, n, Dh] output by n_b is cheaper than dividing the [b, H, n, n] weights.
        out = (weights @ v) / lengths.to(q.dtype)[:, None, None, None]
    return out.transpose(1, 2)


def _banded_attention(
    q: Tensor, k: Tensor, v: Tensor, lengths: Tensor, window: int, activation: str, scale: float
) -> Tensor:
    """Causal sliding-window attention of one bucket in O(n * window): q, k, v [b, H, n, Dh] cut into blocks of
    c = window + 1 tokens, each block's queries against the keys of that block and the one before (every key a
    query may see), so no [n, n] matrix is formed. Returns [b, n, H, Dh] as `_dense_attention` does."""
    b, h, n, dh = q.shape
    c = window + 1
    blocks = -(-n // c)
    pad = blocks * c - n

    def split(t: Tensor) -> Tensor:  # [b, H, n, Dh] -> [b, H, blocks, c, Dh]
        return F.pad(t, (0, 0, 0, pad)).view(b, h, blocks, c, dh)

    qb, kb, vb = split(q), split(k), split(v)
    # Each block's keys: the block before (zeros before the first) and its own, [b, H, blocks, 2c, Dh].
    kk, vv = (torch.cat([F.pad(t, (0, 0, 0, 0, 1, 0))[:, :, :-1], t], dim=3) for t in (kb, vb))
    a = torch.arange(c, device=q.device)[:, None]  # query place in its block
    t = torch.arange(2 * c, device=q.device)[None, :]  # key place in the two blocks
    near = (t > a) & (t <= a + c)  # key position within [query - window, query]
    allowed = near[None].expand(blocks, c, 2 * c).clone()
    allowed[0, :, :c] = False  # the first block has no block before it
    if activation == "softmax":
        out = F.scaled_dot_product_attention(qb, kk, vv, attn_mask=allowed, scale=scale)
    else:
        weights = POINTWISE[activation]((qb * scale) @ kk.transpose(-1, -2)).masked_fill_(~allowed, 0.0)
        out = (weights @ vv) / lengths.to(q.dtype)[:, None, None, None, None]
    return out.reshape(b, h, blocks * c, dh)[:, :, :n].transpose(1, 2)


def _import_triton_kernel(q: Tensor, name: str = "triton_jagged_attention") -> Callable[..., Tensor]:
    """The Triton implementation `kernels.triton.<name>.<name>`, imported on first use so that importing the
    entry points never imports triton."""
    interpret = os.environ.get("TRITON_INTERPRET")
    if not q.is_cuda and interpret != "1":
        raise ValueError(
            f"kernel='triton' got q on {q.device} with TRITON_INTERPRET={interpret!r}: the Triton kernel needs "
            "CUDA tensors, or TRITON_INTERPRET=1 set before triton is imported to run it on CPU; pass "
            "kernel='pytorch' (or 'auto') for CPU tensors"
        )
    if not q.is_cuda and q.dtype == torch.bfloat16:
        raise ValueError(
            "kernel='triton' got bfloat16 CPU tensors: triton's interpreter multiplies the raw bits of bfloat16 "
            "operands in tl.dot (triton-lang/triton#11584, unsupported upstream); test it on CPU in float32 or "
            "float16, or pass kernel='pytorch'"
        )
    if q.shape[-1] > _TRITON_MAX_HEAD_DIM:
        raise ValueError(
            f"kernel='triton' supports a head dim up to {_TRITON_MAX_HEAD_DIM}, got q.shape[-1]={q.shape[-1]}; "
            "pass kernel='pytorch' or split the heads"
        )
    try:
        module = importlib.import_module(f"kernels.triton.{name}")
    except ImportError as error:
        raise ImportError(
            "kernel='triton' needs the triton package (pinned in pyproject.toml: pip install triton==3.7.1); "
            "pass kernel='pytorch' to run without it"
        ) from error
    if not q.is_cuda and not module._is_interpreted():
        raise ValueError(
            f"kernel='triton' got CPU tensors, but kernels.triton.{name} was imported before "
            "TRITON_INTERPRET=1 was set, so its kernels are compiled for GPU; set TRITON_INTERPRET=1 before "
            "anything imports triton, or pass kernel='pytorch'"
        )
    return getattr(module, name)


def _validate(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    offsets: Tensor,
    *,
    max_seq_len: int,
    causal: bool,
    activation: str,
    scale: float | None,
    window: int | None,
    n_global: int,
) -> None:
    """Raise ValueError naming the argument, its value and the fix for any input the kernels cannot take."""
    for name, t in (("q", q), ("k", k), ("v", v), ("offsets", offsets)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 3:
        raise ValueError(f"q must be [L, H, Dh] jagged values, got q.shape={tuple(q.shape)}; reshape to [L, H, Dh]")
    for name, t in (("k", k), ("v", v)):
        if t.shape != q.shape:
            raise ValueError(f"{name}.shape={tuple(t.shape)} must equal q.shape={tuple(q.shape)} ([L, H, Dh])")
        if t.dtype != q.dtype:
            raise ValueError(f"{name}.dtype={t.dtype} must equal q.dtype={q.dtype}; cast with .to(q.dtype)")
        if t.device != q.device:
            raise ValueError(f"{name}.device={t.device} must equal q.device={q.device}; move with .to(q.device)")
    if q.dtype not in _DTYPES:
        raise ValueError(f"q.dtype={q.dtype} is not one of {_DTYPES}; cast q, k, v with .float()")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not one of {_ACTIVATIONS}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be a bool, got causal={causal!r}")
    if scale is not None and (
        isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale)
    ):
        raise ValueError(f"scale must be a finite float or None (for 1/sqrt(Dh)), got scale={scale!r}")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 0):
        raise ValueError(f"window must be None (the whole row) or an int >= 0, got window={window!r}")
    if isinstance(n_global, bool) or not isinstance(n_global, int) or n_global < 0:
        raise ValueError(f"n_global must be an int >= 0, got n_global={n_global!r}")
    if n_global and window is None:
        raise ValueError(
            f"n_global={n_global} needs a window: without one every token is already global; "
            "pass window=<int> or n_global=0"
        )
    _validate_offsets(offsets, q, max_seq_len)


def _validate_offsets(
    offsets: Tensor, values: Tensor, max_seq_len: int, name: str = "q", bound: str = "max_seq_len"
) -> None:
    """Check offsets [B+1] against the jagged `values` (argument `name`) they split, and max_seq_len (the
    argument `bound`)."""
    if not isinstance(offsets, Tensor):
        raise ValueError(f"offsets must be a torch.Tensor, got {type(offsets).__name__}")
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 0:
        raise ValueError(f"{bound} must be an int >= 0 (an upper bound on row lengths), got {max_seq_len!r}")
    if offsets.dtype != torch.int64 or offsets.dim() != 1 or offsets.numel() == 0:
        raise ValueError(
            f"offsets must be a 1-D int64 tensor [B+1], got dtype={offsets.dtype}, shape={tuple(offsets.shape)}; "
            "build it with torch.tensor(..., dtype=torch.int64) or lengths.cumsum(0) after a leading 0"
        )
    if offsets.device != values.device:
        raise ValueError(
            f"offsets.device={offsets.device} must equal {name}.device={values.device}; move it with .to({name}.device)"
        )
    lengths = offsets.diff()
    # One read-back for all value checks: a single device sync when offsets live on CUDA.
    summary = torch.stack(
        [
            offsets[0],
            offsets[-1],
            lengths.min() if lengths.numel() else offsets.new_zeros(()),
            lengths.max() if lengths.numel() else offsets.new_zeros(()),
        ]
    )
    first, last, shortest, longest = summary.tolist()
    if first != 0:
        raise ValueError(f"offsets[0] must be 0, got offsets[0]={first}; prepend a 0 to the cumulative lengths")
    if shortest < 0:
        at = int((lengths < 0).nonzero()[0])
        raise ValueError(
            f"offsets must be non-decreasing, got offsets[{at}]={int(offsets[at])} > offsets[{at + 1}]="
            f"{int(offsets[at + 1])}; offsets are the cumulative sum of the row lengths"
        )
    if last != values.shape[0]:
        raise ValueError(
            f"offsets[-1]={last} must equal L={name}.shape[0]={values.shape[0]}; offsets and {name} "
            "describe different batches"
        )
    if longest > max_seq_len:
        raise ValueError(
            f"{bound}={max_seq_len} is below the longest row ({longest} tokens); pass {bound} >= {longest}"
        )


def _validate_cross(q: Tensor, k: Tensor, v: Tensor, activation: str) -> None:
    """Checks of an attention whose queries q [M, H, Dh] are not the rows of k, v [L, H, Dh] (target attention);
    the offsets are checked by `_validate_offsets`."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dim() != 3:
            shape = tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a [rows, H, Dh] tensor, got {shape}")
    if k.shape != v.shape:
        raise ValueError(f"v.shape={tuple(v.shape)} must equal k.shape={tuple(k.shape)} ([L, H, Dh])")
    if q.shape[1:] != k.shape[1:]:
        raise ValueError(f"q.shape={tuple(q.shape)} must be [M, H, Dh] with k's H and Dh, k.shape={tuple(k.shape)}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} is {t.dtype} on {t.device}, q is {q.dtype} on {q.device}: they must match")
    if q.dtype not in _DTYPES:
        raise ValueError(f"q.dtype={q.dtype} is not one of {_DTYPES}; cast q, k, v with .float()")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not one of {_ACTIVATIONS}")
