"""Batch-score one day with one model version; one shard of every input per rank under torchrun.

Local, 2 CPU processes::

    torchrun --standalone --nproc-per-node 2 -m jobs.score --model-version V --ds 2026-11-06 \\
        --users $GEM_HOME/staging/score/V/2026-11-06/input/users --out $GEM_HOME/staging/score/V/2026-11-06/output

Multi-node: the same command with `--nnodes N --node-rank I --rdzv-backend c10d --rdzv-endpoint
HOST:29400 --rdzv-id JOB`. Single process: `python -m jobs.score ...`.

Inputs: `--users`, the users' scoring input (silver.user_features joined with gold.user_sequences as of
`ds`, written by Spark: `jobs.export_tables.write_user_input`), `silver.ad_features`, and
`gold.training_examples` of `ds`. Each rank streams its share of every input's row groups in
chunks of `export.chunk_rows` (memory is bounded by a chunk, not by the day) and writes
`<out>/<table>/part-<rank>.parquet` for `user_embeddings`, `ad_embeddings` and
`teacher_logits`; rank 0 writes `<out>/_SUCCESS.json` (row counts) after every rank finished.
The export assets commit the parts to their Delta tables, replacing exactly the (model_version,
ds) partition, so a re-run never duplicates rows and a crashed run commits nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from dagster_pipes import DAGSTER_PIPES_CONTEXT_ENV_VAR, open_dagster_pipes

from gem_model.config import ExportConfig, GemConfig
from gem_model.data.loader import ds_filter, open_delta, rank_fragments, scan_rank
from gem_model.export.checkpoint import LoadedModel, load_model
from gem_model.export.layout import SUCCESS_FILE
from gem_model.export.scoring import score_embeddings, score_impressions
from gem_model.paths import GemPaths
from gem_model.train.trainer import DistEnv, init_distributed


@dataclass(frozen=True)
class ScoringInput:
    """One input of the scoring job: which rows, which columns, and how a chunk of them is scored."""

    dataset: pads.Dataset
    filter: pc.Expression | None
    columns: list[str]
    score: Callable[[LoadedModel, pa.Table, date], pa.Table]


def scoring_inputs(paths: GemPaths, loaded: LoadedModel, ds: date, users: Path) -> dict[str, ScoringInput]:
    spec = loaded.config.features
    user, ad = ([f.idx_column for f in spec.side(side)] for side in ("user", "ad"))
    sequence = [spec.sequence_idx_column, *spec.sequence_side_columns]
    examples = open_delta(paths.table("gold.training_examples"), spec=spec)
    day = ds_filter(ds, ds + timedelta(days=1))
    if examples.count_rows(filter=day) == 0:
        raise ValueError(f"gold.training_examples has no rows for ds={ds}; materialise that partition first")
    if not users.is_dir():
        raise FileNotFoundError(f"no users' scoring input at {users}; write it with "
                                "jobs.export_tables.write_user_input (the scored_tables asset does)")
    return {
        "user_embeddings": ScoringInput(pads.dataset(users, format="parquet"), None, ["user_id", *user, *sequence],
                                        lambda m, t, d: score_embeddings(m, t, "user_id", d)),
        "ad_embeddings": ScoringInput(open_delta(paths.table("silver.ad_features"), spec=spec), None, ["ad_id", *ad],
                                      lambda m, t, d: score_embeddings(m, t, "ad_id", d)),
        "teacher_logits": ScoringInput(examples, day, ["impression_id", "user_id", "ad_id", "surface",
                                                       *(f.idx_column for f in spec.features), *sequence],
                                       score_impressions),
    }


class Progress:
    """Rank 0's rows scored, rows/s and ETA for its share, every `every` chunks."""

    def __init__(self, name: str, total_rows: int, every: int, log: Callable[[str], None]) -> None:
        self.name, self.total, self.every, self.log = name, total_rows, every, log
        self.rows, self.chunks, self.started = 0, 0, time.monotonic()

    def update(self, rows: int) -> None:
        self.rows, self.chunks = self.rows + rows, self.chunks + 1
        if self.chunks % self.every == 0 or self.rows == self.total:
            rate = self.rows / max(time.monotonic() - self.started, 1e-9)
            eta = (self.total - self.rows) / rate if rate else math.inf
            self.log(f"{self.name}: {self.rows:,}/{self.total:,} rows on rank 0, {rate:,.0f} rows/s, ETA {eta:.0f}s")


def _score_input(loaded: LoadedModel, source: ScoringInput, ds: date, env: DistEnv, chunk_rows: int,
                 part: Path, progress: Progress | None) -> int:
    """Stream this rank's share of `source` through the model into one Parquet part; returns its rows."""
    writer: pq.ParquetWriter | None = None
    rows = 0
    for chunk in scan_rank(source.dataset, source.filter, env.rank, env.world_size, source.columns, chunk_rows):
        table = source.score(loaded, chunk, ds)
        if writer is None:
            part.parent.mkdir(parents=True, exist_ok=True)
            writer = pq.ParquetWriter(part, table.schema)
        writer.write_table(table)
        rows += table.num_rows
        if progress is not None:
            progress.update(table.num_rows)
    if writer is not None:
        writer.close()
    return rows


def score_day(paths: GemPaths, model_version: str, ds: date, users: Path, out: Path, env: DistEnv,
              export: ExportConfig, log: Callable[[str], None]) -> dict[str, int]:
    """Score this rank's shards of the day; returns the row counts summed over all ranks."""
    loaded = load_model(paths.model_dir(model_version), env.device, bf16=export.bf16)
    counts = {}
    for name, source in scoring_inputs(paths, loaded, ds, users).items():
        share = sum(f.count_rows(filter=source.filter) for f in
                    rank_fragments(source.dataset, source.filter, env.rank, env.world_size))
        progress = Progress(name, share, export.progress_every_chunks, log) if env.rank == 0 else None
        rows = _score_input(loaded, source, ds, env, export.chunk_rows, out / name / f"part-{env.rank:05d}.parquet",
                            progress)
        total = torch.tensor([rows], dtype=torch.int64)
        dist.all_reduce(total)
        counts[name] = int(total.item())
    if env.rank == 0:
        (out / SUCCESS_FILE).write_text(json.dumps({"model_version": model_version, "ds": ds.isoformat(),
                                                    "world_size": env.world_size, "rows": counts}))
    return counts


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
    pipes_cm = (open_dagster_pipes() if env.rank == 0 and DAGSTER_PIPES_CONTEXT_ENV_VAR in os.environ
                else nullcontext(None))
    with pipes_cm as pipes:
        def log(message: str) -> None:
            print(message, flush=True)
            if pipes is not None:
                pipes.log.info(message)

        started = time.monotonic()
        counts = score_day(GemPaths.from_env(), args.model_version, args.ds, args.users, args.out, env, export, log)
        if env.rank == 0:
            seconds = time.monotonic() - started
            log(f"scored ds={args.ds} with {args.model_version} on {env.world_size} rank(s) in {seconds:.1f}s: "
                f"{counts}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
