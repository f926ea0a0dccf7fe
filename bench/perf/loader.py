"""Loader throughput against the training step: can the Delta -> KJT stream keep the trainer fed?

    GEM_HOME=lakehouse-bench-small .venv/bin/python -m bench.perf.loader --preset small  # after feature_build

Streams rank 0's shard of gold.user_timelines (world size 2, as under torchrun, with the
training shuffle buffer) and reports examples per second; then times the training step (forward,
backward, fused sparse + dense optimizer) of the TorchRec model on `--steps` of those batches in
a single-process gloo group, and reports examples per second and ms per step. The ratio says how
many trainer processes of this speed one loader process could feed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import torch  # noqa: E402

from gem_model.config import GemConfig  # noqa: E402
from gem_model.data.loader import TimelineStream  # noqa: E402
from gem_model.paths import GemPaths  # noqa: E402
from gem_model.train.trainer import _forward, build_sharded_model, init_distributed  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    cfg = GemConfig.from_preset(args.preset)
    path = GemPaths.from_env().table("gold.user_timelines")
    bs = cfg.train.batch_size

    stream = TimelineStream(path, cfg.features, bs, rank=0, world_size=2, shuffle_buffer=8 * bs, seed=0)
    started, rows, batches = time.monotonic(), 0, []
    for batch in stream:
        rows += int(batch.valid.sum())
        if len(batches) < args.steps:
            batches.append(batch)
    load_s = time.monotonic() - started
    seq_len = float(batches[0].features["seq_item_ids"].lengths().float().mean())

    env = init_distributed()
    dmp, optimizer = build_sharded_model(cfg, env)
    dmp.train()
    times = []
    for batch in batches:
        t0 = time.monotonic()
        loss, _ = _forward(dmp, batch, env, cfg)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.monotonic() - t0)
    step_s = sorted(times[3:])[len(times[3:]) // 2]  # median after warm-up
    loader_eps, step_eps = rows / load_s, bs / step_s
    print(
        json.dumps(
            {
                "preset": args.preset,
                "batch_size": bs,
                "shard_rows": rows,
                "mean_seq_len_first_batch": round(seq_len, 1),
                "loader_examples_per_s": round(loader_eps),
                "train_step_ms": round(step_s * 1000, 1),
                "train_examples_per_s": round(step_eps),
                "loader_to_step_ratio": round(loader_eps / step_eps, 2),
                "torch_threads": torch.get_num_threads(),
                "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
            }
        )
    )


if __name__ == "__main__":
    main()
