"""Asset checks on the feature tables beyond the contract: point-in-time correctness."""

import dagster as dg
from pyspark.sql import functions as F

from dagster_project.defs.lake_tables import contract_check, key
from dagster_project.resources.lake import LakeResource
from dagster_project.resources.spark import SparkResource
from jobs.lake import read_table


@dg.asset_check(asset=key("gold.training_examples"), blocking=True,
                description="Every sequence event is strictly before its impression and most recent first")
def sequence_before_impression(spark: SparkResource, lake: LakeResource) -> dg.AssetCheckResult:
    df = read_table(spark.session(), lake.paths.table("gold.training_examples"))
    cfg = lake.config.features
    stats = df.select(
        F.exists("seq_ts", lambda t: t >= F.col("ts")).alias("leak"),
        (F.col("seq_ts") != F.sort_array("seq_ts", asc=False)).alias("unordered"),
        (F.size("seq_ts") > cfg.max_seq_len).alias("too_long"),
        F.size("seq_ts").alias("length"),
    ).agg(
        F.sum(F.col("leak").cast("long")).alias("leaks"),
        F.sum(F.col("unordered").cast("long")).alias("unordered"),
        F.sum(F.col("too_long").cast("long")).alias("too_long"),
        F.percentile_approx("length", [0.5, 0.9, 0.99]).alias("pct"),
        F.max("length").alias("max_len"),
    ).first()
    leaks, unordered, too_long = (int(stats[c] or 0) for c in ("leaks", "unordered", "too_long"))
    return dg.AssetCheckResult(
        passed=leaks == 0 and unordered == 0 and too_long == 0,
        metadata={"rows_with_future_events": leaks, "unordered_sequences": unordered,
                  "sequences_over_max_len": too_long, "seq_len_p50": int(stats["pct"][0]),
                  "seq_len_p90": int(stats["pct"][1]), "seq_len_p99": int(stats["pct"][2]),
                  "seq_len_max": int(stats["max_len"])},
    )


FEATURE_TABLES = ("bronze.users", "bronze.ads", "bronze.events", "bronze.impressions", "silver.users",
                  "silver.ads", "gold.user_sequences", "gold.training_examples")


def build_feature_checks() -> list[dg.AssetChecksDefinition]:
    return [*(contract_check(t) for t in FEATURE_TABLES), sequence_before_impression]
