"""The feature jobs, one function per table: what the Dagster assets and `jobs/build_features.py` run.

Each reads its inputs from the lake, writes its table (or one day of it) idempotently and
returns what the caller reports: a `Landing` for bronze, the row count otherwise. Silver and gold
builds first check every input partition they read (`require_inputs`: the landing journals and
the tables' logs, no Spark): one never landed or built, or half-landed, fails the build before
anything is written, naming the partition and how to build it. A partition landed with no rows is
an input like any other: its day legitimately has none.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, timedelta

from pyspark.sql import DataFrame, SparkSession

from gem_lake.delta import WritePolicy, overwrite_table, read_table, replace_partition
from gem_lake.features import tables
from gem_lake.features.bronze import Landing, MissingLandingError, land, require_landed
from gem_lake.quarantine import WHOLE_TABLE
from gem_lake.sources import Source, build_source
from gem_model.config import FeatureSpec, GemConfig
from gem_model.data.loader import MAPPING_KEY, require_mapping
from gem_model.paths import GemPaths

DIMENSIONS = ("bronze.users", "bronze.ads")
DAILY_BRONZE = ("bronze.events", "bronze.impressions")
# Each silver table: its bronze table and the transform between them.
SILVER: dict[str, tuple[str, Callable[[DataFrame, FeatureSpec], DataFrame]]] = {
    "silver.user_features": ("bronze.users", tables.silver_user_features),
    "silver.ad_features": ("bronze.ads", tables.silver_ad_features),
}
# The Dagster job that materialises each input table (dagster_project.defs.automation), named in the error of a
# build whose input is missing.
BUILT_BY = {
    "bronze.users": "build_dimensions_job",
    "bronze.ads": "build_dimensions_job",
    "silver.user_features": "build_dimensions_job",
    "silver.ad_features": "build_dimensions_job",
    "bronze.events": "build_features_job",
    "bronze.impressions": "build_features_job",
}

# What each bronze table lands from the source (dimensions ignore the day).
RAW: dict[str, Callable[[Source, date | None], DataFrame]] = {
    "bronze.users": lambda source, ds: source.users(),
    "bronze.ads": lambda source, ds: source.ads(),
    "bronze.events": lambda source, ds: source.events(ds),
    "bronze.impressions": lambda source, ds: source.impressions(ds),
}


class MissingInputError(FileNotFoundError):
    """A silver or gold build's input table or partition was never landed or built: nothing was written."""


def landing_policy(cfg: GemConfig, allow_row_drop: bool = False, allow_missing_columns: bool = False) -> WritePolicy:
    """How a landing treats a shrinking partition and dropped columns: the config's guard, and what the user allows."""
    return WritePolicy(
        max_row_drop_fraction=cfg.data.max_row_drop_fraction,
        allow_row_drop=allow_row_drop,
        allow_missing_columns=allow_missing_columns,
    )


def land_bronze(
    spark: SparkSession,
    cfg: GemConfig,
    paths: GemPaths,
    table: str,
    ds: date | None = None,
    policy: WritePolicy | None = None,
    holder: str = "",
) -> Landing:
    """Land the source's raw rows for `table` (and day `ds`) in bronze, quarantining malformed ones.

    `policy` defaults to `landing_policy(cfg)`; `holder` names the run in the landing's lock and journal.
    """
    paths.claim_source(cfg.data.source)
    return land(
        RAW[table](build_source(spark, cfg), ds),
        table,
        paths,
        cfg.world.surfaces,
        ds,
        policy=policy or landing_policy(cfg),
        holder=holder,
    )


def _event_days(cfg: GemConfig, ds: date) -> list[str]:
    """The bronze.events partitions a sequence of day `ds` reads: its lookback window, from the calendar's start."""
    days = (ds - timedelta(days=n) for n in range(cfg.features.lookback_days + 1))
    return sorted(d.isoformat() for d in days if d >= cfg.world.start_date)


def _inputs(cfg: GemConfig, table: str, ds: date | None) -> dict[str, list[str]]:
    """The input tables of a build of `table` (day `ds` for gold) -> the partitions it reads."""
    if table in SILVER:
        return {SILVER[table][0]: [WHOLE_TABLE]}
    if ds is None:
        raise ValueError(f"{table} is built one day at a time: pass its ds")
    sequences = {"bronze.events": _event_days(cfg, ds), "silver.ad_features": [WHOLE_TABLE]}
    if table == "gold.user_sequences":
        return sequences
    # gold.training_examples: the day's impressions with their users and ads; gold.user_timelines: and sequences.
    examples = {
        "bronze.impressions": [ds.isoformat()],
        "bronze.users": [WHOLE_TABLE],
        "bronze.ads": [WHOLE_TABLE],
        "silver.user_features": [WHOLE_TABLE],
        "silver.ad_features": [WHOLE_TABLE],
    }
    return examples if table == "gold.training_examples" else {**examples, **sequences}


def require_inputs(cfg: GemConfig, paths: GemPaths, table: str, ds: date | None = None) -> dict[str, int]:
    """Refuse to build `table` (day `ds`) when an input partition was never landed or built, or its landing never
    finished; return the accepted rows of each bronze input partition (`<table>/<partition>` -> rows).

    Reads only the landing journals and whether the silver tables exist, so a caller can run it before starting
    Spark."""
    what = f"{table} for {ds}" if ds else table
    rows: dict[str, int] = {}
    for source, partitions in _inputs(cfg, table, ds).items():
        if source.startswith("silver."):
            if not (paths.table(source) / "_delta_log").is_dir():
                raise MissingInputError(
                    f"cannot build {what}: its input {source} does not exist; materialise "
                    f"{_asset(source)} first ({BUILT_BY[source]}); nothing was written"
                )
            continue
        try:
            landed = require_landed(paths, source, partitions)
        except MissingLandingError as missing:
            window = (
                f" (its sequences look back {cfg.features.lookback_days} days)" if source == "bronze.events" else ""
            )
            days = "" if missing.partitions == [WHOLE_TABLE] else " for " + ", ".join(missing.partitions)
            raise MissingInputError(
                f"cannot build {what}: {missing}{window}. Land {'them' if len(missing.partitions) > 1 else 'it'} "
                f"first: materialise {_asset(source)}{days} ({BUILT_BY[source]}, or python -m jobs.build_features), "
                f"then build {what} again; nothing was written"
            ) from None
        rows.update({f"{source}/{p}": n for p, n in landed.items()})
    return rows


def _asset(table: str) -> str:
    """The Dagster asset key of a lake table, as the UI shows it."""
    return table.replace(".", "/")


def build_silver(spark: SparkSession, cfg: GemConfig, paths: GemPaths, table: str) -> int:
    """silver.user_features or silver.ad_features from its bronze table."""
    source, transform = SILVER[table]
    require_inputs(cfg, paths, table)
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
    require_inputs(cfg, paths, "gold.user_sequences", ds)
    df = tables.user_sequences(
        read_table(spark, paths.table("bronze.events")),
        read_table(spark, paths.table("silver.ad_features")),
        cfg.features,
        ds,
    )
    return _replace_day(df, cfg, paths, "gold.user_sequences", ds)


def build_training_examples(spark: SparkSession, cfg: GemConfig, paths: GemPaths, ds: date) -> int:
    require_inputs(cfg, paths, "gold.training_examples", ds)
    df = tables.training_examples(
        read_table(spark, paths.table("bronze.impressions")),
        read_table(spark, paths.table("silver.user_features")),
        read_table(spark, paths.table("silver.ad_features")),
        cfg.features,
        ds,
    )
    return _replace_day(df, cfg, paths, "gold.training_examples", ds)


def build_user_timelines(spark: SparkSession, cfg: GemConfig, paths: GemPaths, ds: date) -> int:
    require_inputs(cfg, paths, "gold.user_timelines", ds)
    df = tables.user_timelines(
        read_table(spark, paths.table("bronze.impressions")),
        read_table(spark, paths.table("bronze.events")),
        read_table(spark, paths.table("silver.user_features")),
        read_table(spark, paths.table("silver.ad_features")),
        cfg.features,
        ds,
    )
    return _replace_day(df, cfg, paths, "gold.user_timelines", ds)
