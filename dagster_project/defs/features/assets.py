"""Feature assets: a data source lands in bronze (with quarantine), Spark builds silver and gold.

`data.source` picks the source (the synthetic world or a real dataset, `gem_lake.sources`). Users
and ads are dimension tables (replaced whole); events, impressions, sequences and training
examples are daily partitions, each replaced atomically by its run. Sequences look back
`FeatureSpec.lookback_days` days, so they depend on that window of events.

A silver or gold step first checks that every input partition it reads was landed (or built) and
finished, before Spark starts: a missing day fails the step, naming it and the job that builds it,
instead of writing an empty or incomplete partition; the inputs' landed rows are in the metadata.

Quality checks run inside each asset on the data it has just written, so every partition is
checked when it is materialised: row conservation on bronze, point-in-time correctness and the
sequence-length distribution on gold, label and null rates on the training examples.
"""

import warnings
from datetime import date
from typing import TYPE_CHECKING

import dagster as dg

from dagster_project.defs.lake_tables import key, table_metadata
from dagster_project.defs.partitions import daily_partitions, partition_date
from dagster_project.resources.lake import LakeResource
from dagster_project.resources.spark import SparkResource
from gem_model.config import GemConfig

if TYPE_CHECKING:  # Spark is imported by the steps that run it, not when the code location loads
    from pyspark.sql import DataFrame

    from gem_lake.features.bronze import Landing

GROUP = "features"
REJECTED_ROWS = key("bronze.rejected_rows")
BRONZE = ("bronze.users", "bronze.ads", "bronze.events", "bronze.impressions")
ROW_CONSERVATION = "row_conservation"
POINT_IN_TIME = "point_in_time"
LABEL_RATES = "label_rates"


class LandingConfig(dg.Config):
    """What a landing may do to data already in bronze (docs/RELIABILITY.md)."""

    allow_row_drop: bool = False  # replace landed rows with an empty or much smaller batch
    allow_missing_columns: bool = False  # write nulls for columns the table has and the batch lacks


def _land(
    context: dg.AssetExecutionContext,
    config: LandingConfig,
    spark: SparkResource,
    lake: LakeResource,
    table: str,
    ds: date | None = None,
) -> dg.MaterializeResult:
    from gem_lake.features.build import land_bronze, landing_policy

    cfg = lake.config
    policy = landing_policy(cfg, config.allow_row_drop, config.allow_missing_columns)
    landing = land_bronze(spark.session(), cfg, lake.paths, table, ds, policy, holder=f"dagster run {context.run_id}")
    # The quarantine is written by every landing, so it is an asset none of them owns: each reports to it.
    context.log_event(
        dg.AssetMaterialization(
            asset_key=REJECTED_ROWS,
            metadata={
                "landing": f"{table} {ds or 'whole table'}",
                "rejected/this_landing": landing.rejected,
                **{f"rejected/{reason}": n for reason, n in landing.reasons.items()},
                **table_metadata(lake, "bronze.rejected_rows", landing.rejected),
            },
        )
    )
    return _landing_result(lake, table, landing)


def _silver(spark: SparkResource, lake: LakeResource, table: str) -> dg.MaterializeResult:
    from gem_lake.features.build import build_silver, require_inputs

    inputs = require_inputs(lake.config, lake.paths, table)  # before Spark starts
    rows = build_silver(spark.session(), lake.config, lake.paths, table)
    return dg.MaterializeResult(
        metadata={**table_metadata(lake, table, rows), "input_rows": dg.MetadataValue.json(inputs)}
    )


def _conservation(table: str, landing: "Landing") -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        check_name=ROW_CONSERVATION,
        asset_key=key(table),
        passed=landing.conserved,
        description=f"rows in {landing.rows_in} = accepted {landing.accepted} + rejected {landing.rejected}",
        metadata={
            "rows_in": landing.rows_in,
            "accepted": landing.accepted,
            "rejected": landing.rejected,
            **{f"rejected/{reason}": n for reason, n in landing.reasons.items()},
        },
    )


def _landing_result(lake: LakeResource, table: str, landing: "Landing") -> dg.MaterializeResult:
    metadata = table_metadata(lake, table, landing.accepted)
    return dg.MaterializeResult(
        metadata={**metadata, "rejected_rows": landing.rejected}, check_results=[_conservation(table, landing)]
    )


def _sequence_check(table: str, df: "DataFrame", max_seq_len: int, as_of: str | None) -> dg.AssetCheckResult:
    from gem_lake.features.quality import sequence_stats

    stats = sequence_stats(df, max_seq_len, as_of)
    return dg.AssetCheckResult(
        check_name=POINT_IN_TIME,
        asset_key=key(table),
        passed=stats.point_in_time,
        description="sequences hold only earlier events, most recent first, within max_seq_len",
        metadata={
            "rows": stats.rows,
            "rows_with_future_events": stats.future_events,
            "unordered_sequences": stats.unordered,
            "sequences_over_max_len": stats.over_max_len,
            "seq_len_p50": stats.p50,
            "seq_len_p90": stats.p90,
            "seq_len_p99": stats.p99,
            "seq_len_max": stats.max,
        },
    )


def _timeline_check(df: "DataFrame", max_seq_len: int) -> dg.AssetCheckResult:
    from gem_lake.features.quality import timeline_stats

    stats = timeline_stats(df, max_seq_len)
    return dg.AssetCheckResult(
        check_name=POINT_IN_TIME,
        asset_key=key("gold.user_timelines"),
        passed=stats.point_in_time,
        description="each impression sees exactly the events strictly before it; events and impressions in time "
        "order, arrays aligned, at most max_seq_len events before a user's first impression",
        metadata={
            "rows": stats.rows,
            "impressions": stats.impressions,
            "events": stats.events,
            "rows_with_wrong_visible_events": stats.future_events,
            "unordered_rows": stats.unordered,
            "misaligned_rows": stats.misaligned,
            "rows_over_max_len": stats.over_max_len,
            "events_p50": stats.events_p50,
            "events_p90": stats.events_p90,
            "events_max": stats.events_max,
            "impressions_p50": stats.impressions_p50,
            "impressions_max": stats.impressions_max,
        },
    )


def _label_check(df: "DataFrame", cfg: GemConfig) -> dg.AssetCheckResult:
    from gem_lake.features.quality import label_rates, null_rates

    rates = label_rates(df)
    bounds, min_rows = cfg.data.click_rate_bounds, cfg.data.label_check_min_rows
    out_of_bounds = [r.surface for r in rates if not r.within(bounds, min_rows)]
    attributes = [f.name for f in cfg.features.features if f.name not in ("user_id", "ad_id")]
    nulls = null_rates(df, attributes)
    return dg.AssetCheckResult(
        check_name=LABEL_RATES,
        asset_key=key("gold.training_examples"),
        passed=not out_of_bounds,
        severity=dg.AssetCheckSeverity.WARN,
        description=(
            f"click rate per surface within {bounds} (surfaces with >= {min_rows} rows)"
            + (f"; out of bounds: {out_of_bounds}" if out_of_bounds else "")
        ),
        metadata={
            **{f"{r.surface}/rows": r.rows for r in rates},
            **{f"{r.surface}/click_rate": round(r.click_rate, 5) for r in rates},
            **{f"{r.surface}/conversion_rate": round(r.conversion_rate, 5) for r in rates},
            **{f"null_rate/{c}": round(v, 5) for c, v in nulls.items()},
        },
    )


def _partition(df: "DataFrame", ds: date) -> "DataFrame":
    from pyspark.sql import functions as F

    return df.where(F.col("ds") == F.lit(ds))


def build_feature_assets(cfg: GemConfig) -> list[dg.AssetsDefinition]:
    daily = daily_partitions(cfg)
    # The first days' windows reach before the calendar. The parameter is beta, which Dagster would
    # announce at every load of the code location.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        event_window = dg.TimeWindowPartitionMapping(
            start_offset=-cfg.features.lookback_days, end_offset=0, allow_nonexistent_upstream_partitions=True
        )

    def conservation_spec(table: str, partitions_def: dg.PartitionsDefinition | None = None) -> list[dg.AssetCheckSpec]:
        return [
            dg.AssetCheckSpec(
                ROW_CONSERVATION,
                asset=key(table),
                blocking=True,
                partitions_def=partitions_def,
                description="rows in = accepted + rejected (bronze.rejected_rows)",
            )
        ]

    @dg.asset(
        key=key("bronze.users"),
        group_name=GROUP,
        kinds={"spark", "delta"},
        check_specs=conservation_spec("bronze.users"),
    )
    def bronze_users(
        context: dg.AssetExecutionContext, config: LandingConfig, spark: SparkResource, lake: LakeResource
    ) -> dg.MaterializeResult:
        """Users of the data source with demographic and device attributes (malformed rows quarantined)."""
        return _land(context, config, spark, lake, "bronze.users")

    @dg.asset(
        key=key("bronze.ads"), group_name=GROUP, kinds={"spark", "delta"}, check_specs=conservation_spec("bronze.ads")
    )
    def bronze_ads(
        context: dg.AssetExecutionContext, config: LandingConfig, spark: SparkResource, lake: LakeResource
    ) -> dg.MaterializeResult:
        """Ads with advertiser, category, creative format and objective (malformed rows quarantined)."""
        return _land(context, config, spark, lake, "bronze.ads")

    @dg.asset(
        key=key("bronze.events"),
        group_name=GROUP,
        partitions_def=daily,
        kinds={"spark", "delta"},
        check_specs=conservation_spec("bronze.events", daily),
    )
    def bronze_events(
        context: dg.AssetExecutionContext, config: LandingConfig, spark: SparkResource, lake: LakeResource
    ) -> dg.MaterializeResult:
        """One day of behaviour events (user, item, action, surface, ts); malformed rows quarantined."""
        return _land(context, config, spark, lake, "bronze.events", partition_date(context))

    @dg.asset(
        key=key("bronze.impressions"),
        group_name=GROUP,
        partitions_def=daily,
        kinds={"spark", "delta"},
        check_specs=conservation_spec("bronze.impressions", daily),
    )
    def bronze_impressions(
        context: dg.AssetExecutionContext, config: LandingConfig, spark: SparkResource, lake: LakeResource
    ) -> dg.MaterializeResult:
        """One day of ad impressions with click/conversion labels (and true probabilities where known)."""
        return _land(context, config, spark, lake, "bronze.impressions", partition_date(context))

    @dg.asset(key=key("silver.user_features"), group_name=GROUP, deps=[key("bronze.users")], kinds={"spark", "delta"})
    def silver_user_features(spark: SparkResource, lake: LakeResource) -> dg.MaterializeResult:
        """Observable user attributes with their embedding rows (`<feature>_idx`)."""
        return _silver(spark, lake, "silver.user_features")

    @dg.asset(key=key("silver.ad_features"), group_name=GROUP, deps=[key("bronze.ads")], kinds={"spark", "delta"})
    def silver_ad_features(spark: SparkResource, lake: LakeResource) -> dg.MaterializeResult:
        """Observable ad attributes with their embedding rows (`<feature>_idx`)."""
        return _silver(spark, lake, "silver.ad_features")

    @dg.asset(
        key=key("gold.user_sequences"),
        group_name=GROUP,
        partitions_def=daily,
        deps=[key("silver.ad_features"), dg.AssetDep(key("bronze.events"), partition_mapping=event_window)],
        kinds={"spark", "delta"},
        check_specs=[
            dg.AssetCheckSpec(
                POINT_IN_TIME,
                asset=key("gold.user_sequences"),
                partitions_def=daily,
                description="most recent first, within max_seq_len; length stats",
            )
        ],
    )
    def user_sequences(
        context: dg.AssetExecutionContext, spark: SparkResource, lake: LakeResource
    ) -> dg.MaterializeResult:
        """Each active user's behaviour sequence as of the end of the day, most recent first."""
        from gem_lake.delta import read_table
        from gem_lake.features.build import build_user_sequences, require_inputs

        ds, spec = partition_date(context), lake.config.features
        inputs = require_inputs(lake.config, lake.paths, "gold.user_sequences", ds)  # before Spark starts
        s = spark.session()
        rows = build_user_sequences(s, lake.config, lake.paths, ds)
        written = _partition(read_table(s, lake.paths.table("gold.user_sequences")), ds)
        return dg.MaterializeResult(
            metadata={**table_metadata(lake, "gold.user_sequences", rows), "input_rows": dg.MetadataValue.json(inputs)},
            check_results=[_sequence_check("gold.user_sequences", written, spec.max_seq_len, None)],
        )

    @dg.asset(
        key=key("gold.training_examples"),
        group_name=GROUP,
        partitions_def=daily,
        deps=[
            key("bronze.impressions"),
            key("silver.user_features"),
            key("silver.ad_features"),
        ],
        kinds={"spark", "delta"},
        check_specs=[
            dg.AssetCheckSpec(
                LABEL_RATES,
                asset=key("gold.training_examples"),
                partitions_def=daily,
                description="click/conversion rate per surface in bounds; null rates",
            ),
        ],
    )
    def training_examples(
        context: dg.AssetExecutionContext, spark: SparkResource, lake: LakeResource
    ) -> dg.MaterializeResult:
        """Impressions of the day with user/ad features, one row each: the students' examples (the teacher reads a
        user's events from gold.user_timelines)."""
        from gem_lake.delta import read_table
        from gem_lake.features.build import build_training_examples, require_inputs

        ds, cfg = partition_date(context), lake.config
        inputs = require_inputs(cfg, lake.paths, "gold.training_examples", ds)  # before Spark starts
        s = spark.session()
        rows = build_training_examples(s, cfg, lake.paths, ds)
        written = _partition(read_table(s, lake.paths.table("gold.training_examples")), ds)
        return dg.MaterializeResult(
            metadata={
                **table_metadata(lake, "gold.training_examples", rows),
                "input_rows": dg.MetadataValue.json(inputs),
            },
            check_results=[_label_check(written, cfg)],
        )

    @dg.asset(
        key=key("gold.user_timelines"),
        group_name=GROUP,
        partitions_def=daily,
        deps=[
            key("bronze.impressions"),
            key("silver.user_features"),
            key("silver.ad_features"),
            dg.AssetDep(key("bronze.events"), partition_mapping=event_window),
        ],
        kinds={"spark", "delta"},
        check_specs=[
            dg.AssetCheckSpec(
                POINT_IN_TIME,
                asset=key("gold.user_timelines"),
                blocking=True,
                partitions_def=daily,
                description="each impression sees exactly the events strictly before it",
            )
        ],
    )
    def user_timelines(
        context: dg.AssetExecutionContext, spark: SparkResource, lake: LakeResource
    ) -> dg.MaterializeResult:
        """Each user's day as one row: the events once, oldest first, and the day's impressions in time order,
        each with how many of the events precede it. What the teacher trains on: a user's history is encoded once,
        not once per impression."""
        from gem_lake.delta import read_table
        from gem_lake.features.build import build_user_timelines, require_inputs

        ds, cfg = partition_date(context), lake.config
        inputs = require_inputs(cfg, lake.paths, "gold.user_timelines", ds)  # before Spark starts
        s = spark.session()
        rows = build_user_timelines(s, cfg, lake.paths, ds)
        written = _partition(read_table(s, lake.paths.table("gold.user_timelines")), ds)
        return dg.MaterializeResult(
            metadata={**table_metadata(lake, "gold.user_timelines", rows), "input_rows": dg.MetadataValue.json(inputs)},
            check_results=[_timeline_check(written, cfg.features.max_seq_len)],
        )

    rejected_rows = dg.AssetSpec(
        REJECTED_ROWS,
        group_name=GROUP,
        kinds={"delta"},
        deps=[key(t) for t in BRONZE],
        description="The quarantine: every raw row a landing rejected, with its reason, raw line, file and line "
        "number. Written by each bronze landing, which reports a materialisation here.",
    )
    return [
        bronze_users,
        bronze_ads,
        bronze_events,
        bronze_impressions,
        rejected_rows,
        silver_user_features,
        silver_ad_features,
        user_sequences,
        training_examples,
        user_timelines,
    ]
