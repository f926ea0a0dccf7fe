"""The feature jobs, one function per table: what the Dagster assets and `jobs/build_features.py` run.

Each reads its inputs from the lake, writes its table (or one day of it) idempotently and
returns what the caller reports: a `Landing` for bronze, the row count otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, timedelta

from pyspark.sql import DataFrame, SparkSession

from gem_model.config import GemConfig
from gem_model.data.loader import MAPPING_KEY, require_mapping
from gem_model.paths import GemPaths
from jobs.features import tables
from jobs.features.bronze import Landing, land, require_landed
from jobs.features.quarantine import WHOLE_TABLE
from jobs.lake import WritePolicy, overwrite_table, read_table, replace_partition
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


def landing_policy(cfg: GemConfig, allow_row_drop: bool = False, allow_missing_columns: bool = False) -> WritePolicy:
    """How a landing treats a shrinking partition and dropped columns: the config's guard, and what the user allows."""
    return WritePolicy(max_row_drop_fraction=cfg.data.max_row_drop_fraction, allow_row_drop=allow_row_drop,
                       allow_missing_columns=allow_missing_columns)


def land_bronze(spark: SparkSession, cfg: GemConfig, paths: GemPaths, table: str, ds: date | None = None,
                policy: WritePolicy | None = None, holder: str = "") -> Landing:
    """Land the source's raw rows for `table` (and day `ds`) in bronze, quarantining malformed ones.

    `policy` defaults to `landing_policy(cfg)`; `holder` names the run in the landing's lock and journal.
    """
    paths.claim_source(cfg.data.source)
    return land(RAW[table](build_source(spark, cfg), ds), table, paths, cfg.world.surfaces, ds,
                policy=policy or landing_policy(cfg), holder=holder)


def _event_days(cfg: GemConfig, ds: date) -> list[str]:
    """The bronze.events partitions a sequence of day `ds` reads (its lookback window)."""
    return [(ds - timedelta(days=n)).isoformat() for n in range(cfg.features.lookback_days + 1)]


def build_silver(spark: SparkSession, cfg: GemConfig, paths: GemPaths, table: str) -> int:
    """silver.user_features or silver.ad_features from its bronze table."""
    source, transform = {"silver.user_features": ("bronze.users", tables.silver_user_features),
                         "silver.ad_features": ("bronze.ads", tables.silver_ad_features)}[table]
    require_landed(paths, source, [WHOLE_TABLE])
    bronze = read_table(spark, paths.table(source))
    return overwrite_table(transform(bronze, cfg.features), paths.table(table), commit_info=_mapped(cfg))


def _mapped(cfg: GemConfig) -> dict[str, str]:
    """The commit metadata that records the feature mapping of the rows written."""
    return {MAPPING_KEY: cfg.features.mapping}


def _replace_day(df: DataFrame, cfg: GemConfig, paths: GemPaths, table: str, ds: date) -> int:
    """Replace day `ds` of a daily feature table, refused if its other days were mapped another way."""
    path = paths.table(table)
    require_mapping(path, cfg.features.mapping)
    return replace_partition(df, path, {"ds": ds}, commit_info=_mapped(cfg))


def build_user_sequences(spark: SparkSession, cfg: GemConfig, paths: GemPaths, ds: date) -> int:
    require_landed(paths, "bronze.events", _event_days(cfg, ds))
    df = tables.user_sequences(read_table(spark, paths.table("bronze.events")),
                               read_table(spark, paths.table("silver.ad_features")), cfg.features, ds)
    return _replace_day(df, cfg, paths, "gold.user_sequences", ds)


def build_training_examples(spark: SparkSession, cfg: GemConfig, paths: GemPaths, ds: date) -> int:
    require_landed(paths, "bronze.impressions", [ds.isoformat()])
    require_landed(paths, "bronze.events", _event_days(cfg, ds))
    require_landed(paths, "bronze.users", [WHOLE_TABLE])
    require_landed(paths, "bronze.ads", [WHOLE_TABLE])
    df = tables.training_examples(
        read_table(spark, paths.table("bronze.impressions")), read_table(spark, paths.table("bronze.events")),
        read_table(spark, paths.table("silver.user_features")), read_table(spark, paths.table("silver.ad_features")),
        cfg.features, ds,
    )
    return _replace_day(df, cfg, paths, "gold.training_examples", ds)
