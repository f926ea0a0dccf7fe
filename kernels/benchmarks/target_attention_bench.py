"""Target attention against what it replaces: every impression attending over its own copy of the history.

    .venv/bin/python kernels/benchmarks/target_attention_bench.py --users 8 --impressions 27 \\
        --lengths 64,256,1024,2048

Each of --users users has L events (L from --lengths) and --impressions impressions spread evenly over its
history, so impression i sees the first visible_i = round((i + 1) * L / (impressions + 1)) events. Two ways
to give every impression an attention layer over the events before it, forward + backward:
- per impression (today's gold layout: each impression row carries its own history): one jagged
  self-attention row per impression holding its visible events, so the work grows with sum(visible_i^2);
- per user: one causal jagged self-attention over the user's L events (`jagged_attention(causal=True)`),
  then `target_attention`: each impression's query over the encoded events before it, so the work grows
  with L^2 / 2 per user plus sum(visible_i) per impression.
Both run `kernel="auto"` (the PyTorch paths on CPU, Triton on CUDA). Time is the median of --reps steps
after --warmup, reported per impression; the per-user time is split into its two parts. Prints one JSON line
per length.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable

import torch

from kernels.jagged_attention import jagged_attention
from kernels.target_attention import target_attention


def _timed(step: Callable[[], None], warmup: int, reps: int) -> float:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _leaves(rows: int, heads: int, dim: int, g: torch.Generator) -> list[torch.Tensor]:
    return [torch.randn(rows, heads, dim, generator=g).requires_grad_() for _ in range(3)]


def measure(users: int, impressions: int, length: int, heads: int, dim: int, warmup: int, reps: int) -> dict:
    g = torch.Generator().manual_seed(length)
    visible = [round((i + 1) * length / (impressions + 1)) for i in range(impressions)] * users
    total = users * impressions

    copies = torch.tensor([0, *visible]).cumsum(0)
    q, k, v = _leaves(int(copies[-1]), heads, dim, g)

    def per_impression() -> None:
        out = jagged_attention(q, k, v, copies, max_seq_len=length)
        out.sum().backward()

    events = torch.arange(0, users + 1) * length
    targets = torch.arange(0, users + 1) * impressions
    eq, ek, ev = _leaves(users * length, heads, dim, g)
    tq = torch.randn(total, heads, dim, generator=g).requires_grad_()
    seen = torch.tensor(visible)

    def encode() -> torch.Tensor:
        return jagged_attention(eq, ek, ev, events, max_seq_len=length, causal=True)

    def per_user() -> None:
        encoded = encode()
        out = target_attention(tq, targets, encoded, encoded, events, seen, max_targets=impressions, max_seq_len=length)
        out.sum().backward()

    def encode_only() -> None:
        encode().sum().backward()

    per_impression_s = _timed(per_impression, warmup, reps)
    per_user_s = _timed(per_user, warmup, reps)
    encode_s = _timed(encode_only, warmup, reps)
    return {
        "events_per_user": length,
        "impressions_per_user": impressions,
        "users": users,
        "attention_pairs_per_impression": {
            "per_impression": round(sum(n * n for n in visible) / total),
            "per_user": round((users * length * (length + 1) / 2 + sum(visible)) / total),
        },
        "ms_per_impression": {
            "per_impression": round(1e3 * per_impression_s / total, 4),
            "per_user": round(1e3 * per_user_s / total, 4),
            "per_user_encoding": round(1e3 * encode_s / total, 4),
            "per_user_targets": round(1e3 * max(per_user_s - encode_s, 0.0) / total, 4),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--impressions", type=int, default=27, help="impressions per user")
    parser.add_argument("--lengths", default="64,256,1024,2048", help="events per user, comma-separated")
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=16, help="head dim")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    for length in (int(x) for x in args.lengths.split(",")):
        result = measure(args.users, args.impressions, length, args.heads, args.dim, args.warmup, args.reps)
        result["machine"] = f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
