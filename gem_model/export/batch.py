"""Batch scoring of one day with one model version: this rank's shard of every input, streamed in chunks.

`score_day` is what `jobs/score.py` runs on every rank under torchrun: each rank streams its share
of the users' scoring input and `silver.ad_features` in chunks of `export.chunk_rows` rows, and the
day's `gold.user_timelines` in chunks of whole timelines of at most `export.chunk_rows` impressions
(a user's events encoded once for all of the user's impressions), through the model and writes
`<out>/<table>/part-<rank>.parquet`; rank 0 writes `<out>/_SUCCESS.json` (row counts summed over
the ranks) after every rank finished.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import torch
import torch.distributed as dist

from gem_model.config import ExportConfig
from gem_model.data.loader import (
    Shard,
    ds_filter,
    impressions_in,
    open_delta,
    rank_fragments,
    scan_rows,
    scan_timelines,
    timeline_columns,
)
from gem_model.export.checkpoint import LoadedModel, load_model
from gem_model.export.layout import SUCCESS_FILE
from gem_model.export.scoring import score_embeddings, score_timelines
from gem_model.paths import GemPaths
from gem_model.train.trainer import DistEnv


@dataclass(frozen=True)
class ScoringInput:
    """One input of the scoring job: which rows, which columns, and how a chunk of them is scored. Rows of
    `timelines` are user timelines: a rank's share and its chunks are counted in impressions, the rows scored."""

    dataset: pads.Dataset
    filter: pc.Expression | None
    columns: list[str]
    score: Callable[[LoadedModel, pa.Table, date], pa.Table]
    timelines: bool = False

    def shard(self, rank: int, world_size: int) -> Shard:
        """This rank's row groups, sized by the rows it scores (timelines by their impressions)."""
        size = impressions_in if self.timelines else None
        return rank_fragments(self.dataset, self.filter, rank, world_size, size)

    def chunks(self, shard: Shard, chunk_rows: int) -> Iterator[pa.Table]:
        scan = scan_timelines if self.timelines else scan_rows
        return scan(self.dataset, shard, self.filter, self.columns, chunk_rows)


def scoring_inputs(paths: GemPaths, loaded: LoadedModel, ds: date, users: Path) -> dict[str, ScoringInput]:
    spec = loaded.config.features
    user, ad = ([f.idx_column for f in spec.side(side)] for side in ("user", "ad"))
    sequence = list(spec.sequence_columns)
    timelines = open_delta(paths.table("gold.user_timelines"), spec=spec)
    day = ds_filter(ds, ds + timedelta(days=1))
    if timelines.count_rows(filter=day) == 0:
        raise ValueError(f"gold.user_timelines has no rows for ds={ds}; materialise that partition first")
    if not users.is_dir():
        raise FileNotFoundError(
            f"no users' scoring input at {users}; write it with "
            "gem_lake.export_tables.write_user_input (the scored_tables asset does)"
        )
    return {
        "user_embeddings": ScoringInput(
            pads.dataset(users, format="parquet"),
            None,
            ["user_id", "ds", *user, *sequence],
            lambda m, t, d: score_embeddings(m, t, "user_id", d),
        ),
        "ad_embeddings": ScoringInput(
            open_delta(paths.table("silver.ad_features"), spec=spec),
            None,
            ["ad_id", *ad],
            lambda m, t, d: score_embeddings(m, t, "ad_id", d),
        ),
        "teacher_logits": ScoringInput(
            timelines, day, [c for part in timeline_columns(spec, labels=False) for c in part], score_timelines, True
        ),
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


def _score_input(
    loaded: LoadedModel,
    source: ScoringInput,
    shard: Shard,
    ds: date,
    chunk_rows: int,
    part: Path,
    progress: Progress | None,
) -> int:
    """Stream this rank's shard of `source` through the model into one Parquet part; returns its rows."""
    writer: pq.ParquetWriter | None = None
    rows = 0
    for chunk in source.chunks(shard, chunk_rows):
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


def score_day(
    paths: GemPaths,
    model_version: str,
    ds: date,
    users: Path,
    out: Path,
    env: DistEnv,
    export: ExportConfig,
    log: Callable[[str], None],
) -> dict[str, int]:
    """Score this rank's shards of the day; returns the row counts summed over all ranks."""
    loaded = load_model(paths.model_dir(model_version), env.device, bf16=export.bf16)
    counts = {}
    for name, source in scoring_inputs(paths, loaded, ds, users).items():
        shard = source.shard(env.rank, env.world_size)  # read once: sizing timelines reads a column of each
        share = sum(n for _, n in shard)
        progress = Progress(name, share, export.progress_every_chunks, log) if env.rank == 0 else None
        rows = _score_input(
            loaded, source, shard, ds, export.chunk_rows, out / name / f"part-{env.rank:05d}.parquet", progress
        )
        total = torch.tensor([rows], dtype=torch.int64)
        dist.all_reduce(total)
        counts[name] = int(total.item())
    if env.rank == 0:
        (out / SUCCESS_FILE).write_text(
            json.dumps(
                {"model_version": model_version, "ds": ds.isoformat(), "world_size": env.world_size, "rows": counts}
            )
        )
    return counts
