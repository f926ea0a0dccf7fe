"""FLOP counting for the benches: torch.utils.flop_counter, plus the CPU attention kernels it leaves out.

torch's FlopCounterMode counts matmuls and the CUDA attention kernels, but not
`_scaled_dot_product_flash_attention_for_cpu` (forward or backward), which is what the sequence arch
runs on a CPU: without these formulas every CPU FLOP figure misses the attention. Counted as torch counts
the CUDA kernels: the executed (padded) shapes, the causal half not discounted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.flop_counter import (
    FlopCounterMode,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

_aten = torch.ops.aten


@register_flop_formula(_aten._scaled_dot_product_flash_attention_for_cpu)
def _cpu_attention(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


@register_flop_formula(_aten._scaled_dot_product_flash_attention_for_cpu_backward)
def _cpu_attention_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                            **kwargs) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


def count_flops(fn: Callable[[], Any]) -> tuple[int, dict[str, int]]:
    """(total FLOPs, FLOPs per operator) of one call of `fn`."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops(), {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}


def matmul_peak(dtype: torch.dtype = torch.float32, n: int = 2048, reps: int = 10) -> float:
    """FLOP/s of the best of `reps` n x n matmuls in `dtype` with torch's threads: the utilisation denominator."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        started = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - started)
    return 2 * n**3 / best
