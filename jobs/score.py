"""Batch-score one day with one model version; one shard of every input per rank under torchrun.

Local, 2 CPU processes::

    torchrun --standalone --nproc-per-node 2 -m jobs.score --model-version V --ds 2026-11-06 \\
        --users $GEM_HOME/staging/score/V/2026-11-06/input/users --out $GEM_HOME/staging/score/V/2026-11-06/output

Multi-node: the same command with `--nnodes N --node-rank I --rdzv-backend c10d --rdzv-endpoint
HOST:29400 --rdzv-id JOB`. Single process: `python -m jobs.score ...`.

Inputs: `--users`, the users' scoring input (silver.user_features joined with gold.user_sequences as of
`ds`, written by Spark: `gem_lake.export_tables.write_user_input`), `silver.ad_features`, and
`gold.user_timelines` of `ds`. Each rank streams its share of every input's row groups in
chunks of `export.chunk_rows` rows (timelines: whole timelines of at most that many impressions; memory is
bounded by a chunk, not by the day) and writes
`<out>/<table>/part-<rank>.parquet` for `user_embeddings`, `ad_embeddings` and
`teacher_logits`; rank 0 writes `<out>/_SUCCESS.json` (row counts) after every rank finished.
The export assets commit the parts to their Delta tables, replacing exactly the (model_version,
ds) partition, so a re-run never duplicates rows and a crashed run commits nothing.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import date
from pathlib import Path

import torch.distributed as dist

from gem_model.config import GemConfig
from gem_model.export.batch import score_day
from gem_model.paths import GemPaths
from gem_model.pipes import open_pipes
from gem_model.train.trainer import init_distributed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-version", required=True)
    parser.add_argument("--ds", type=date.fromisoformat, required=True)
    parser.add_argument("--users", type=Path, required=True, help="the users' scoring input (Parquet folder)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--export-config", default="{}", help="ExportConfig fields as JSON (chunk_rows, ...)")
    args = parser.parse_args(argv)
    export = GemConfig.from_dict({"export": json.loads(args.export_config)}).export
    env = init_distributed()
    with open_pipes(reports=env.rank == 0) as pipes:

        def log(message: str) -> None:
            print(message, flush=True)
            if pipes is not None:
                pipes.log.info(message)

        started = time.monotonic()
        counts = score_day(GemPaths.from_env(), args.model_version, args.ds, args.users, args.out, env, export, log)
        if env.rank == 0:
            seconds = time.monotonic() - started
            log(
                f"scored ds={args.ds} with {args.model_version} on {env.world_size} rank(s) in {seconds:.1f}s: {counts}"
            )
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
