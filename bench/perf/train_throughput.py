"""Training throughput and the dense part's achieved FLOP/s against this machine's matmul peak.

    GEM_HOME=lakehouse-small python -m bench.research.model_quality --preset small --config one_epoch.json
    GEM_HOME=lakehouse-small python -m bench.perf.train_throughput --preset small --config one_epoch.json

Reads the training runs `bench/research/model_quality.py` left in $GEM_HOME/models for the same preset
and overrides (examples/s over the training steps, all ranks together, from each manifest),
counts the dense FLOPs of one training step per example with torch.utils.flop_counter on a real
batch (forward + backward of every matmul, bmm and attention, the CPU attention kernel included:
bench/common.py; embedding lookups are memory-bound and not counted), and measures the peak as the
best fp32 2048x2048 matmul rate with all cores. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from bench.common import VARIANTS, dense_flops_per_example, matmul_peak, variant_version
from gem_model.config import GemConfig
from gem_model.export.checkpoint import teacher_config
from gem_model.paths import GemPaths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--data-source")
    parser.add_argument("--config", help="the overrides the runs were trained with")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args(argv)
    base = GemConfig.load(args.preset, args.config, args.data_source)
    paths = GemPaths.from_env()
    torch.set_num_threads(os.cpu_count() or 1)
    peak = matmul_peak()
    print(f"fp32 matmul peak on {os.cpu_count()} cores: {peak / 1e9:.1f} GFLOP/s\n")
    print("| model | examples/s (training) | dense MFLOP / example | achieved GFLOP/s | of peak |")
    print("|---|---|---|---|---|")
    for name in args.variants.split(","):
        manifest_path = paths.model_dir(variant_version(base, name)) / "manifest.json"
        if not manifest_path.is_file():
            print(f"| {name} | not trained: run bench/research/model_quality.py with the same arguments first | | | |")
            continue
        manifest = json.loads(manifest_path.read_text())
        rate = manifest["train_examples_per_second"]
        flops = dense_flops_per_example(teacher_config(manifest), paths)
        print(f"| {name} | {rate:,.0f} | {flops / 1e6:.2f} | {flops * rate / 1e9:.2f} | {flops * rate / peak:.1%} |")


if __name__ == "__main__":
    main()
