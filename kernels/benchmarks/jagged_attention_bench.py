"""Jagged attention against padded dense attention: forward + backward time and peak memory, heavy-tailed rows.

    .venv/bin/python kernels/benchmarks/jagged_attention_bench.py --batch 128 --heads 2 --dim 32 --max-len 1024
    .venv/bin/python kernels/benchmarks/jagged_attention_bench.py --batch 128 --heads 2 --dim 32 --max-len 1024 \\
        --device cuda   # the Triton kernel, on the CPU run's batch
    .venv/bin/python kernels/benchmarks/jagged_attention_bench.py --batch 256 --heads 4 --dim 64 --max-len 2048 \\
        --dtype bfloat16 --device cuda --json $OUT/jagged_attention.json   # larger, bf16

Row lengths are log-normal (median --median-len, log-space sigma --sigma) clipped to [1, --max-len], so most
rows are 10-100 tokens and a few are 10x-100x longer. The jagged path is `jagged_attention(kernel="auto")`:
the bucketed PyTorch path on CPU, the Triton kernel on CUDA. The padded baseline is what it replaces: gather
the rows into [B, H, N, Dh] (N = the batch's longest row), dense attention (scaled_dot_product_attention,
fused causal or with a key-padding mask, for softmax; matmul, silu, mask, matmul for silu), gather the real
tokens back; the gathers are timed too. Both paths share the same tricks (no padding mask under causal,
in-place silu masking), so the difference is the padding alone. Each (path, activation) runs in its own
subprocess so that peak memory is its own: CUDA reports torch.cuda.max_memory_allocated above the inputs;
CPU reports the growth of the process's peak RSS (resource.getrusage ru_maxrss) over its value once the
inputs exist, i.e. every intermediate, saved activation and gradient of a step (after a 2-row warm-up step,
so that one-time library set-up is not counted). Time is the median of --reps steps after --warmup. The
ideal ratio is what padding wastes: padded tokens / real tokens, and padded / real attention pairs. Prints
a markdown table; --json also writes every measurement as a JSON list.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from kernels.jagged_attention import jagged_attention

PATHS = ("jagged", "padded")


def _lengths(args: argparse.Namespace) -> list[int]:
    if args.sigma == 0:  # equal lengths: the case where padding costs nothing
        return [min(round(args.median_len), args.max_len)] * args.batch
    g = torch.Generator().manual_seed(args.seed)
    raw = torch.empty(args.batch).log_normal_(math.log(args.median_len), args.sigma, generator=g)
    return raw.round().clamp(1, args.max_len).long().tolist()


def _inputs(args: argparse.Namespace, device: torch.device) -> tuple[list[int], Tensor, list[Tensor], Tensor]:
    """Row lengths, offsets [B+1], leaves q, k, v [L, H, Dh] and the upstream gradient [L, H, Dh]."""
    lengths = _lengths(args)
    offsets = torch.tensor([0, *lengths]).cumsum(0).to(device)
    g = torch.Generator().manual_seed(args.seed + 1)
    dtype = getattr(torch, args.dtype)
    shape = (sum(lengths), args.heads, args.dim)
    qkv = [torch.randn(shape, generator=g).to(device, dtype).requires_grad_() for _ in range(3)]
    dout = torch.randn(shape, generator=g).to(device, dtype)
    return lengths, offsets, qkv, dout


def padded_attention(
    q: Tensor, k: Tensor, v: Tensor, offsets: Tensor, lengths: list[int], *, causal: bool, activation: str
) -> Tensor:
    """The dense baseline: [L, H, Dh] -> [B, H, N, Dh], masked attention, back to [L, H, Dh]."""
    n_max = max(lengths)
    row_lengths = torch.tensor(lengths, device=q.device)
    position = torch.arange(n_max, device=q.device)
    valid = position[None, :] < row_lengths[:, None]  # [B, N]
    index = offsets[:-1, None] + torch.where(valid, position[None, :], 0)
    qp, kp, vp = (t[index].transpose(1, 2) for t in (q, k, v))  # [B, H, N, Dh]
    # Causal: a real query never sees a padding key (rows are padded at the end), so the causal mask
    # alone is exact for the real tokens, and softmax takes SDPA's fused causal path.
    mask = torch.ones(n_max, n_max, dtype=torch.bool, device=q.device).tril() if causal else valid[:, None, None, :]
    scale = 1.0 / math.sqrt(q.shape[-1])
    if activation == "softmax":
        out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=None if causal else mask, is_causal=causal)
    else:
        weights = F.silu((qp * scale) @ kp.transpose(-1, -2))  # [B, H, N, N]
        weights.masked_fill_(~mask, 0.0)
        out = (weights @ vp) / row_lengths.to(q.dtype)[:, None, None, None]
    return out.transpose(1, 2)[valid]  # real tokens, in jagged order


def _peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def measure(args: argparse.Namespace, path: str, activation: str) -> dict[str, object]:
    """One (path, activation): median fwd+bwd ms and peak memory above the inputs; runs in a worker process."""
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    causal = not args.no_causal

    def step(lengths: list[int], offsets: Tensor, qkv: list[Tensor], dout: Tensor) -> Tensor:
        if path == "jagged":
            out = jagged_attention(*qkv, offsets, max_seq_len=max(lengths), causal=causal, activation=activation)
        else:
            out = padded_attention(*qkv, offsets, lengths, causal=causal, activation=activation)
        out.backward(dout)
        for t in qkv:
            t.grad = None
        return out.detach()

    # A 2-row step first, so that one-time library set-up (thread pools, kernel compilation) is not counted.
    tiny = argparse.Namespace(**{**vars(args), "batch": 2, "max_len": 32})
    step(*_inputs(tiny, device))
    inputs = _inputs(args, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else _peak_bytes(device)
    times = []
    for _ in range(args.warmup + args.reps):
        start = time.perf_counter()
        out = step(*inputs)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return {
        "path": path,
        "kernel": ("triton" if device.type == "cuda" else "pytorch") if path == "jagged" else "dense",
        "activation": activation,
        "ms": 1000 * statistics.median(times[args.warmup :]),
        "peak_mib": (_peak_bytes(device) - base) / 2**20,
        "memory": "cuda max_memory_allocated" if device.type == "cuda" else "peak RSS growth",
        "mean_abs_out": float(out.float().abs().mean()),  # equal across paths: a cheap agreement check
    }


def batch_stats(args: argparse.Namespace) -> dict[str, float]:
    lengths = _lengths(args)
    n_max, real = max(lengths), sum(lengths)
    if args.no_causal:
        pairs, padded_pairs = sum(n * n for n in lengths), len(lengths) * n_max * n_max
    else:
        pairs, padded_pairs = sum(n * (n + 1) // 2 for n in lengths), len(lengths) * n_max * (n_max + 1) // 2
    return {
        "B": len(lengths),
        "L": real,
        "N": n_max,
        "median_len": statistics.median(lengths),
        "token_ratio": len(lengths) * n_max / real,
        "pair_ratio": padded_pairs / pairs,
    }


def _arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=128, help="B, rows per batch")
    parser.add_argument("--heads", type=int, default=2, help="H")
    parser.add_argument("--dim", type=int, default=32, help="Dh, the head dim")
    parser.add_argument("--max-len", type=int, default=1024, help="rows are clipped to this length (max_seq_len)")
    parser.add_argument("--median-len", type=float, default=40.0)
    parser.add_argument("--sigma", type=float, default=1.2, help="log-normal sigma; 0: all rows --median-len long")
    parser.add_argument("--activation", choices=["softmax", "silu", "both"], default="both")
    parser.add_argument("--no-causal", action="store_true")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads for the CPU runs (default: torch's)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # "path,activation": measure one, print JSON
    args = parser.parse_args(argv)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def main(argv: list[str] | None = None) -> None:
    args = _arguments(argv)
    if args.worker:
        print(json.dumps(measure(args, *args.worker.split(","))))
        return
    stats = batch_stats(args)
    given = argv if argv is not None else sys.argv[1:]
    # Every argument but --device (as "--device X" or "--device=X"), which is passed resolved.
    forwarded = [
        a for i, a in enumerate(given) if not a.startswith("--device") and (i == 0 or given[i - 1] != "--device")
    ]
    forwarded = [*forwarded, "--device", args.device]
    activations = ["softmax", "silu"] if args.activation == "both" else [args.activation]
    rows = []
    for activation in activations:
        for path in PATHS:
            command = [sys.executable, __file__, *forwarded, "--worker", f"{path},{activation}"]
            result = subprocess.run(command, capture_output=True, text=True, check=True)
            rows.append(json.loads(result.stdout.strip().splitlines()[-1]) | stats)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    threads = f"{args.threads or torch.get_num_threads()} torch threads"
    print(
        f"B={stats['B']} L={stats['L']} N={stats['N']} median row={stats['median_len']:g} H={args.heads} "
        f"Dh={args.dim} {args.dtype} causal={not args.no_causal} on {device_name} ({threads}); ideal ratio: "
        f"padded/real tokens {stats['token_ratio']:.1f}x, padded/real attention pairs {stats['pair_ratio']:.0f}x\n"
    )
    print("| activation | path | kernel | fwd+bwd ms | peak MiB | padded / jagged time | padded / jagged memory |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        padded = next(r for r in rows if r["activation"] == row["activation"] and r["path"] == "padded")
        speedup = f"{padded['ms'] / row['ms']:.1f}x" if row["path"] == "jagged" else ""
        memory = f"{padded['peak_mib'] / max(row['peak_mib'], 1e-9):.1f}x" if row["path"] == "jagged" else ""
        print(
            f"| {row['activation']} | {row['path']} | {row['kernel']} | {row['ms']:,.1f} | {row['peak_mib']:,.0f} "
            f"| {speedup} | {memory} |"
        )
    print(f"\npeak memory: {rows[0]['memory']} above the inputs")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
