"""The partitions of the assets: days, and (model version, day) for what a model produces.

Feature tables are partitioned by day. What a teacher version produces (scored tables, indexes,
candidates) is partitioned by (model_version, ds), and its students by model_version, so the
Dagster UI shows which version exists for which day and a sensor requests exactly the missing
pairs. Model versions are a dynamic dimension: the teacher asset adds each version it trains.

The calendar starts at `world.start_date`. An open-ended calendar (`GemConfig.calendar_end` is
None: the synthetic world by default) has a partition for every day up to the last one that has
ended, so the daily schedule always has a new day to build; a real dataset's calendar ends with
its files.
"""

import warnings
from datetime import date, timedelta

import dagster as dg

from gem_model.config import GemConfig

MODEL_VERSIONS = dg.DynamicPartitionsDefinition(name="model_versions")

# Checks are partitioned like their assets, so the UI shows each partition's check (Dagster calls
# partitioned checks a preview and would say so at every load of the code location).
warnings.filterwarnings(
    "ignore", message="Specifying a partitions_def on an AssetCheckSpec", category=dg.PreviewWarning
)


def daily_partitions(cfg: GemConfig) -> dg.DailyPartitionsDefinition:
    end = cfg.calendar_end
    return dg.DailyPartitionsDefinition(
        start_date=cfg.world.start_date.isoformat(), end_date=(end + timedelta(days=1)).isoformat() if end else None
    )


def model_day_partitions(cfg: GemConfig) -> dg.MultiPartitionsDefinition:
    return dg.MultiPartitionsDefinition({"model_version": MODEL_VERSIONS, "ds": daily_partitions(cfg)})


def model_day_key(model_version: str, ds: date) -> dg.MultiPartitionKey:
    return dg.MultiPartitionKey({"model_version": model_version, "ds": ds.isoformat()})


def partition_date(context: dg.AssetExecutionContext) -> date:
    return date.fromisoformat(context.partition_key)


def model_day(context: dg.AssetExecutionContext) -> tuple[str, date]:
    """The (model version, day) of a run of a (model_version, ds)-partitioned asset."""
    keys = context.partition_key.keys_by_dimension
    return keys["model_version"], date.fromisoformat(keys["ds"])


def partition_columns(partitions_def: dg.PartitionsDefinition, partition_key: str) -> dict[str, str]:
    """The table columns and values that hold one partition: each dimension is named after its column."""
    if isinstance(partitions_def, dg.MultiPartitionsDefinition):
        return dict(partitions_def.get_partition_key_from_str(partition_key).keys_by_dimension)
    return {"model_version" if partitions_def == MODEL_VERSIONS else "ds": partition_key}
