"""Feature build throughput: impressions per second per core, through every feature job.

    GEM_HOME=lakehouse-bench-small .venv/bin/python -m bench.perf.feature_build --preset small --days 3
    GEM_HOME=lakehouse-bench-medium .venv/bin/python -m bench.perf.feature_build --preset medium --days 2

Builds the dimensions, then for each day: bronze events and impressions (with quarantine),
gold.user_sequences, gold.training_examples and gold.user_timelines, into a fresh $GEM_HOME.
Throughput counts the day's impressions over the wall time of that day's five jobs, divided by the
Spark cores. The first day is the coldest (shortest histories); later days carry more history per
user. Each day reports the bytes its three gold partitions hold on disk (the Parquet files of the
partition, from the Delta log).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import time
from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from gem_lake.features.build import (
    DAILY_BRONZE,
    DIMENSIONS,
    build_silver,
    build_training_examples,
    build_user_sequences,
    build_user_timelines,
    land_bronze,
)
from gem_lake.spark.session import build_spark_session
from gem_model.config import GemConfig
from gem_model.paths import GemPaths


def partition_bytes(table: Path, day: date) -> int:
    """The bytes of the Parquet files that hold `day`'s rows of the Delta table at `table` now."""
    files = pa.table(DeltaTable(str(table)).get_add_actions(flatten=True))
    return int(pc.sum(files.filter(pc.field("partition.ds") == day)["size_bytes"]).as_py() or 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--days", type=int, default=2)
    args = parser.parse_args()
    cfg = GemConfig.from_preset(args.preset)
    paths = GemPaths.from_env()
    shutil.rmtree(paths.lake, ignore_errors=True)
    spark = build_spark_session()
    spark.sparkContext.setLogLevel("ERROR")
    cores = spark.sparkContext.defaultParallelism

    started = time.monotonic()
    for table in DIMENSIONS:
        land_bronze(spark, cfg, paths, table)
    for table in ("silver.user_features", "silver.ad_features"):
        build_silver(spark, cfg, paths, table)
    dimensions_s = time.monotonic() - started

    days = []
    for day in cfg.world.days[: args.days]:
        t0 = time.monotonic()
        landed = {t: land_bronze(spark, cfg, paths, t, day) for t in DAILY_BRONZE}
        t1 = time.monotonic()
        build_user_sequences(spark, cfg, paths, day)
        t2 = time.monotonic()
        examples = build_training_examples(spark, cfg, paths, day)
        t3 = time.monotonic()
        timelines = build_user_timelines(spark, cfg, paths, day)
        t4 = time.monotonic()
        imps = landed["bronze.impressions"].rows_in
        days.append(
            {
                "ds": str(day),
                "impressions": imps,
                "events": landed["bronze.events"].rows_in,
                "training_examples": examples,
                "user_timelines": timelines,
                "bronze_s": round(t1 - t0, 1),
                "sequences_s": round(t2 - t1, 1),
                "examples_s": round(t3 - t2, 1),
                "timelines_s": round(t4 - t3, 1),
                "sequences_mb": round(partition_bytes(paths.table("gold.user_sequences"), day) / 1e6, 2),
                "examples_mb": round(partition_bytes(paths.table("gold.training_examples"), day) / 1e6, 2),
                "timelines_mb": round(partition_bytes(paths.table("gold.user_timelines"), day) / 1e6, 2),
                "impressions_per_s_per_core": round(imps / (t4 - t0) / cores, 1),
            }
        )
        print(json.dumps(days[-1]), flush=True)
    spark.stop()
    total_imps = sum(d["impressions"] for d in days)
    total_s = sum(d["bronze_s"] + d["sequences_s"] + d["examples_s"] + d["timelines_s"] for d in days)
    print(
        json.dumps(
            {
                "preset": args.preset,
                "days": args.days,
                "cores": cores,
                "dimensions_s": round(dimensions_s, 1),
                "impressions": total_imps,
                "daily_jobs_s": round(total_s, 1),
                "impressions_per_s_per_core": round(total_imps / total_s / cores, 1),
                "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
            }
        )
    )


if __name__ == "__main__":
    main()
