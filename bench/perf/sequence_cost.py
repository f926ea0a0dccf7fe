"""The cost of long sequences: training time per example against sequence length, pyramid vs full-length layers.

    .venv/bin/python -m bench.perf.sequence_cost                       # lengths 256 ... 8192, the default config
    .venv/bin/python -m bench.perf.sequence_cost --lengths 256,1024 --json seq.json

Each row of the batch holds a history of exactly L events. Three sequence arches, each made of the
model's own `SequenceLayer`s (the interleaved pyramid's low-rank PFFN, CLS tokens, jagged attention
block, keep the newest tokens) with the default `model.sequence` and `model.experimental` configs:
- pyramid: the default layers (`pyramid` = (64, 16)): the first sees all L tokens, later ones the
  kept 64 (+1 pooled) tokens;
- one full layer: a single layer over all L tokens, keeping them all;
- full stack: as many full-length layers as the pyramid has, keeping every token.
Time is forward + backward (sum of the outputs) per example, the median of --reps steps after one
warm-up, with a batch of about --tokens tokens (at least 1 row). The log-log slope of time against
L between each pair of lengths is printed: 1 is linear, 2 quadratic. torch's default threads.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch

from gem_model.config import ExperimentalConfig, SequenceConfig
from gem_model.modules.sequence import SequenceLayer


def arches(
    config: SequenceConfig, experimental: ExperimentalConfig, length: int
) -> dict[str, list[tuple[SequenceLayer, int]]]:
    """Each arch as (layer, max row length entering it)."""
    pyramid, entering = [], length
    for keep in config.pyramid:
        pyramid.append((SequenceLayer(config, experimental, keep, personalised=True), entering))
        entering = keep + 1
    full = [(SequenceLayer(config, experimental, length, personalised=True), length) for _ in config.pyramid]
    return {"pyramid": pyramid, "one full layer": full[:1], "full stack": full}


def step_seconds(
    layers: list[tuple[SequenceLayer, int]], config: SequenceConfig, rank: int, rows: int, length: int, reps: int
) -> float:
    lengths = torch.full((rows,), length, dtype=torch.int64)
    times = []
    for _ in range(reps + 1):
        tokens = torch.randn(rows * length, config.dim, requires_grad=True)
        cls = torch.randn(rows, config.n_cls, config.dim, requires_grad=True)
        gate = torch.randn(rows, rank, requires_grad=True)
        started = time.perf_counter()
        x, lens, total = tokens, lengths, 0.0
        for layer, max_len in layers:
            x, lens, cls_out, _ = layer(x, lens, max_len, cls, gate)
            total = total + cls_out.sum()
        (total + x.sum()).backward()
        times.append(time.perf_counter() - started)
    return statistics.median(times[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="256,512,1024,2048,4096,8192")
    parser.add_argument("--tokens", type=int, default=32768, help="tokens a batch (rows = tokens // L, at least 1)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    config, experimental = SequenceConfig(), ExperimentalConfig()
    lengths = [int(x) for x in args.lengths.split(",")]
    torch.manual_seed(0)
    results = []
    for length in lengths:
        rows = max(1, args.tokens // length)
        for name, layers in arches(config, experimental, length).items():
            seconds = step_seconds(layers, config, experimental.pffn_rank, rows, length, args.reps)
            results.append({"arch": name, "length": length, "rows": rows, "ms_per_example": 1e3 * seconds / rows})
            print(json.dumps(results[-1]), flush=True)
    names = list(dict.fromkeys(r["arch"] for r in results))
    by = {(r["arch"], r["length"]): r["ms_per_example"] for r in results}
    print(
        f"\nthreads {torch.get_num_threads()}, sequence dim {config.dim}, heads {config.heads}, "
        f"pyramid {config.pyramid}; forward + backward, ms per example\n"
    )
    print("| L | " + " | ".join(names) + " | pyramid / full stack |")
    print("|---|" + "---|" * (len(names) + 1))
    for length in lengths:
        cells = [f"{by[(n, length)]:.2f}" for n in names]
        ratio = by[("pyramid", length)] / by[("full stack", length)]
        print(f"| {length:,} | " + " | ".join(cells) + f" | {ratio:.2f} |")
    print("\nlog-log slope of time per example against L (1 linear, 2 quadratic):\n")
    print("| from L | to L | " + " | ".join(names) + " |")
    print("|---|---|" + "---|" * len(names))
    for a, b in zip(lengths, lengths[1:]):
        slopes = [math.log(by[(n, b)] / by[(n, a)]) / math.log(b / a) for n in names]
        print(f"| {a:,} | {b:,} | " + " | ".join(f"{s:.2f}" for s in slopes) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
