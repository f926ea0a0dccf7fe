"""The Spark side of the export: the users' scoring input, and committing what scoring produced.

Scoring itself (`jobs/score.py`) runs under torchrun without Spark; these functions prepare its
one input that needs a join and commit its outputs to Delta. Every commit replaces exactly one
partition, so a re-run (or a crash and a re-run) never duplicates rows:

- `write_user_input`: silver.user_features left-joined with gold.user_sequences of `ds` (users with no
  history get an empty sequence), in `files` Parquet files so each scoring rank gets a share.
- `commit_scored`: the scoring job's parts -> gold.{user_embeddings,ad_embeddings,teacher_logits},
  refusing a run that did not finish (no `_SUCCESS.json`) or that scored another version or day.
- `write_candidates`: the top-k ads of every user from the ads index -> gold.user_ad_candidates.
- `record_index_build`: an index manifest -> its row of gold.index_builds.
"""

from __future__ import annotations

import json
import shutil
from datetime import date, datetime
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from gem_lake.delta import read_table, replace_partition
from gem_model.config import FeatureSpec
from gem_model.data.loader import require_mapping
from gem_model.export.layout import SCORED_TABLES, SUCCESS_FILE
from gem_model.paths import GemPaths


def write_user_input(spark: SparkSession, paths: GemPaths, spec: FeatureSpec, ds: date, out: Path, files: int) -> int:
    """Write the users' scoring input for `ds` to `out` (Parquet); returns its row count."""
    sequence = list(spec.sequence_columns)
    for table in ("silver.user_features", "gold.user_sequences"):
        require_mapping(paths.table(table), spec.mapping, reader=True)
    users = read_table(spark, paths.table("silver.user_features")).select(
        "user_id", *(f.idx_column for f in spec.side("user"))
    )
    sequences = (
        read_table(spark, paths.table("gold.user_sequences"))
        .where(F.col("ds") == F.lit(ds))
        .select("user_id", *sequence)
    )
    # The day names the instant the sequences' ages count to: its end (a user without a sequence has it too).
    df = users.join(sequences, "user_id", "left").withColumn("ds", F.lit(ds)).repartition(files, "user_id")
    df.write.mode("overwrite").parquet(str(out))
    return spark.read.parquet(str(out)).count()


def commit_scored(
    spark: SparkSession, paths: GemPaths, out: Path, model_version: str, ds: date, lineage: dict[str, str] | None = None
) -> dict[str, int]:
    """Commit a finished scoring run's parts; returns rows written per table (`gold.<name>`).

    `lineage` (e.g. the Dagster run id) is recorded with each table's commit.
    """
    marker = out / SUCCESS_FILE
    if not marker.is_file():
        raise RuntimeError(
            f"scoring output {out} has no {SUCCESS_FILE}: the scoring job did not finish; "
            "re-run the scored_tables asset (nothing was committed)"
        )
    done = json.loads(marker.read_text())
    if (done["model_version"], done["ds"]) != (model_version, ds.isoformat()):
        raise RuntimeError(
            f"scoring output {out} is of model {done['model_version']} on {done['ds']}, "
            f"not {model_version} on {ds}; clear it and re-run"
        )
    rows = {}
    for name in SCORED_TABLES:
        df = spark.read.parquet(str(out / name))
        written = replace_partition(
            df, paths.table(f"gold.{name}"), {"model_version": model_version, "ds": ds}, commit_info=lineage
        )
        if written != done["rows"][name]:
            raise RuntimeError(f"gold.{name}: committed {written} rows but scoring reported {done['rows'][name]}")
        rows[f"gold.{name}"] = written
    return rows


def write_candidates(
    spark: SparkSession,
    paths: GemPaths,
    index: faiss.Index,
    user_ids: np.ndarray,
    user_vectors: np.ndarray,
    k: int,
    model_version: str,
    ds: date,
    staging: Path,
    lineage: dict[str, str] | None = None,
    chunk_rows: int = 4096,
) -> int:
    """Search the ads index for every user (in chunks) and replace that day's gold.user_ad_candidates.

    `staging` must belong to this run alone (`GemPaths.run_staging`); it is removed afterwards.
    """
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    k = min(k, index.ntotal)
    for n, start in enumerate(range(0, len(user_ids), chunk_rows)):
        queries = np.ascontiguousarray(user_vectors[start : start + chunk_rows], dtype=np.float32)
        scores, found = index.search(queries, k)
        users = np.repeat(user_ids[start : start + chunk_rows].astype(np.int64), k)
        keep = found.ravel() >= 0  # fewer than k ads in the index: no placeholder rows
        table = pa.table(
            {
                "user_id": users[keep],
                "ad_id": found.ravel()[keep].astype(np.int64),
                "rank": np.tile(np.arange(1, k + 1, dtype=np.int32), len(queries))[keep],
                "score": scores.ravel()[keep].astype(np.float32),
            }
        )
        pq.write_table(table, staging / f"part-{n:05d}.parquet")
    df = spark.read.parquet(str(staging)).withColumn("model_version", F.lit(model_version)).withColumn("ds", F.lit(ds))
    try:
        return replace_partition(
            df, paths.table("gold.user_ad_candidates"), {"model_version": model_version, "ds": ds}, commit_info=lineage
        )
    finally:
        shutil.rmtree(staging)


def record_index_build(
    spark: SparkSession, paths: GemPaths, manifest: dict[str, Any], k: int, lineage: dict[str, str] | None = None
) -> None:
    """Replace the (index, model version, day) row of gold.index_builds with this build's manifest."""
    ds = date.fromisoformat(manifest["ds"])
    row = {
        "index_name": manifest["name"],
        "model_version": manifest["model_version"],
        "ds": ds,
        "factory": manifest["factory"],
        "configured_factory": manifest["configured_factory"],
        "dimension": int(manifest["dimension"]),
        "row_count": int(manifest["row_count"]),
        "recall_at_k": float(manifest[f"recall_at_{k}"]),
        "k": k,
        "queries_per_second": float(manifest["queries_per_second"]),
        "build_seconds": float(manifest["build_seconds"]),
        "sha256": manifest["sha256"],
        "created_at": datetime.fromisoformat(manifest["created_at"]),
    }
    schema = (
        "index_name string, model_version string, ds date, factory string, configured_factory string, "
        "dimension int, row_count bigint, recall_at_k double, k int, queries_per_second double, "
        "build_seconds double, sha256 string, created_at timestamp"
    )
    replace_partition(
        spark.createDataFrame([row], schema),
        paths.table("gold.index_builds"),
        {"index_name": row["index_name"], "model_version": row["model_version"], "ds": ds},
        commit_info=lineage,
    )
