"""Build every feature table for some days without Dagster: the batch entry point for a cluster.

    python -m jobs.build_features --preset small --days 2
    python -m jobs.build_features --data-source taobao          # a real dataset (docs/datasets.md)
    GEM_SPARK_MASTER=yarn python -m jobs.spark_submit jobs/build_features.py --preset medium  # spark-submit

Runs the same per-table jobs as the Dagster assets (`gem_lake.features.build`), in dependency order,
into $GEM_HOME, and prints one line per table with rows and seconds. Exits non-zero when a
landing is refused (e.g. by the row-drop guard: `--allow-row-drop` overrides it;
`--allow-missing-columns` writes nulls for bronze columns a batch lacks) or lands no rows.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # spark-submit runs this file as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gem_lake.features.build import (
    DAILY_BRONZE,
    DIMENSIONS,
    build_silver,
    build_training_examples,
    build_user_sequences,
    build_user_timelines,
    land_bronze,
    landing_policy,
)
from gem_lake.spark.progress import SparkProgress
from gem_lake.spark.session import build_spark_session
from gem_model.config import ConfigError, GemConfig
from gem_model.paths import GemPaths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--config", help="JSON file of overrides")
    parser.add_argument("--data-source", help="override data.source (synthetic, taobao, criteo, ...)")
    parser.add_argument("--days", type=int, help="only the first N days of the calendar")
    parser.add_argument(
        "--allow-row-drop",
        action="store_true",
        help="let a landing replace bronze rows with an empty or much smaller batch",
    )
    parser.add_argument(
        "--allow-missing-columns",
        action="store_true",
        help="write nulls for bronze columns that a batch lacks instead of refusing it",
    )
    args = parser.parse_args(argv)
    try:
        cfg = GemConfig.load(args.preset, args.config, args.data_source)
    except ConfigError as error:
        parser.error(str(error))
    paths = GemPaths.from_env()
    policy = landing_policy(cfg, args.allow_row_drop, args.allow_missing_columns)
    spark = build_spark_session()
    empty: list[str] = []

    def timed(name: str, job) -> None:
        started = time.monotonic()
        result = job()
        rows = result if isinstance(result, int) else result.accepted
        extra = "" if isinstance(result, int) else f"  rejected {result.rejected:,}"
        print(f"{name:<36} {rows:>12,} rows {time.monotonic() - started:8.1f}s{extra}", flush=True)
        if rows == 0:
            empty.append(name)

    with SparkProgress(spark.sparkContext, lambda line: print(f"  {line}", flush=True)):
        for table in DIMENSIONS:
            timed(table, lambda t=table: land_bronze(spark, cfg, paths, t, policy=policy))
        for table in ("silver.user_features", "silver.ad_features"):
            timed(table, lambda t=table: build_silver(spark, cfg, paths, t))
        for day in cfg.world.days[: args.days]:
            for table in DAILY_BRONZE:
                timed(f"{table} [{day}]", lambda t=table, d=day: land_bronze(spark, cfg, paths, t, d, policy))
            timed(f"gold.user_sequences [{day}]", lambda d=day: build_user_sequences(spark, cfg, paths, d))
            timed(f"gold.training_examples [{day}]", lambda d=day: build_training_examples(spark, cfg, paths, d))
            timed(f"gold.user_timelines [{day}]", lambda d=day: build_user_timelines(spark, cfg, paths, d))
    spark.stop()
    if empty:
        sys.exit(f"build_features: no rows in {', '.join(empty)}; check the source ({cfg.data.source}) for empty files")


if __name__ == "__main__":
    main()
