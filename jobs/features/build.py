"""The feature jobs, one function per table: what the Dagster assets and `jobs/build_features.py` run.

Each reads its inputs from the lake, writes its table (or one day of it) idempotently and
returns what the caller reports: a `Landing` for bronze, the row count otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date

from pyspark.sql import DataFrame, SparkSession

from gem_model.config import GemConfig
from gem_model.paths import GemPaths
from jobs.features import tables
from jobs.features.bronze import Landing, land
from jobs.lake import overwrite_table, read_table, replace_partition
from jobs.sources import Source, build_source

DIMENSIONS = ("bronze.users", "bronze.ads")
DAILY_BRONZE = ("bronze.events", "bronze.impressions")

# What each bronze table lands from the source (dimensions ignore the day).
RAW: dict[str, Callable[[Source, date | None], DataFrame]] = {
    "bronze.users": lambda source, ds: source.users(),
    "bronze.ads": lambda source, ds: source.ads(),
    "bronze.events": lambda source, ds: source.events(ds),
    "bronze.impressions": lambda source, ds: source.impressions(ds),
}


def land_bronze(spark: SparkSession, cfg: GemConfig, paths: GemPaths, table: str, ds: date | None = None) -> Landing:
    """Land the source's raw rows for `table` (and day `ds`) in bronze, quarantining malformed ones."""
    paths.claim_source(cfg.data.source)
    return land(spark, RAW[table](build_source(spark, cfg), ds), table, paths, cfg.world.surfaces, ds)


def build_silver(spark: SparkSession, cfg: GemConfig, paths: GemPaths, table: str) -> int:
    """silver.users or silver.ads from its bronze table."""
    transform = {"silver.users": tables.silver_users, "silver.ads": tables.silver_ads}[table]
    bronze = read_table(spark, paths.table(table.replace("silver.", "bronze.")))
    return overwrite_table(transform(bronze, cfg.features), paths.table(table))


def build_user_sequences(spark: SparkSession, cfg: GemConfig, paths: GemPaths, ds: date) -> int:
    df = tables.user_sequences(read_table(spark, paths.table("bronze.events")),
                               read_table(spark, paths.table("silver.ads")), cfg.features, ds)
    return replace_partition(df, paths.table("gold.user_sequences"), {"ds": ds})


def build_training_examples(spark: SparkSession, cfg: GemConfig, paths: GemPaths, ds: date) -> int:
    df = tables.training_examples(
        read_table(spark, paths.table("bronze.impressions")), read_table(spark, paths.table("bronze.events")),
        read_table(spark, paths.table("silver.users")), read_table(spark, paths.table("silver.ads")),
        cfg.features, ds,
    )
    return replace_partition(df, paths.table("gold.training_examples"), {"ds": ds})
