"""Pure DataFrame -> DataFrame transforms from bronze to the silver and gold feature tables.

Categorical columns are mapped to embedding rows here, once, as `<feature>_idx` =
pmod(xxhash64(string value), buckets) from the shared `FeatureSpec`; the loader and the model
only read those columns. Sequences are point-in-time correct: an impression's sequence holds
only events strictly before its `ts`, most recent first, within `lookback_days`, truncated to
`max_seq_len`.
"""

from __future__ import annotations

from datetime import date, timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from gem_model.config import FeatureSpec


def hashed(col: Column, buckets: int) -> Column:
    """Embedding row of a categorical value: stable across Spark versions, languages and runs."""
    return F.pmod(F.xxhash64(col.cast("string")), F.lit(buckets))


def with_feature_indices(df: DataFrame, spec: FeatureSpec, side: str) -> DataFrame:
    cols = [hashed(F.col(f.name), f.buckets).alias(f.idx_column) for f in spec.side(side)]
    return df.select("*", *cols)


def observable(df: DataFrame) -> DataFrame:
    """Drop a generator's latent truth (`true_*` columns): it must never become a feature."""
    return df.select(*[c for c in df.columns if not c.startswith("true_")])


def silver_users(bronze_users: DataFrame, spec: FeatureSpec) -> DataFrame:
    """silver.users: observable user attributes plus their embedding rows."""
    return with_feature_indices(observable(bronze_users).dropDuplicates(["user_id"]), spec, "user")


def silver_ads(bronze_ads: DataFrame, spec: FeatureSpec) -> DataFrame:
    """silver.ads: observable ad attributes plus their embedding rows."""
    return with_feature_indices(observable(bronze_ads).dropDuplicates(["ad_id"]), spec, "ad")


def _events_window(events: DataFrame, spec: FeatureSpec, ds: date) -> DataFrame:
    """Events that can appear in a sequence for day `ds` (lookback window up to the end of ds)."""
    first = ds - timedelta(days=spec.lookback_days)
    return events.where((F.col("ds") >= F.lit(first)) & (F.col("ds") <= F.lit(ds)))


def _sequence_columns(spec: FeatureSpec) -> list[Column]:
    """Turn a collected `history` array<struct<ts, item_id>> into the sequence columns."""
    table = spec.by_name(spec.sequence_table)
    recent = F.slice(F.sort_array(F.coalesce(F.col("history"), F.array()), asc=False), 1, spec.max_seq_len)
    items = F.transform(recent, lambda e: e["item_id"])
    return [
        items.cast("array<bigint>").alias(spec.sequence_feature),
        F.transform(recent, lambda e: e["ts"]).cast("array<timestamp>").alias("seq_ts"),
        F.transform(items, lambda x: hashed(x, table.buckets)).alias(spec.sequence_idx_column),
    ]


def user_sequences(events: DataFrame, spec: FeatureSpec, ds: date) -> DataFrame:
    """gold.user_sequences for `ds`: each active user's sequence as of the end of day `ds`."""
    window = _events_window(events, spec, ds)
    history = window.groupBy("user_id").agg(F.collect_list(F.struct("ts", "item_id")).alias("history"))
    return history.select("user_id", F.lit(ds).alias("ds"), *_sequence_columns(spec))


def training_examples(impressions: DataFrame, events: DataFrame, users: DataFrame, ads: DataFrame,
                      spec: FeatureSpec, ds: date) -> DataFrame:
    """gold.training_examples for `ds`: impressions joined with silver features and sequences."""
    imps = impressions.where(F.col("ds") == F.lit(ds))
    ev = _events_window(events, spec, ds).select(
        "user_id", F.col("ts").alias("event_ts"), "item_id"
    )
    # Strictly-before join: an event at the impression's own timestamp is not history.
    history = (
        imps.select("impression_id", "user_id", "ts")
        .join(ev, "user_id")
        .where(F.col("event_ts") < F.col("ts"))
        .groupBy("impression_id")
        .agg(F.collect_list(F.struct(F.col("event_ts").alias("ts"), "item_id")).alias("history"))
    )
    surface = spec.by_name("surface")
    user_cols = users.columns
    ad_cols = ads.columns
    return (
        imps.join(users.select(*user_cols), "user_id", "left")
        .join(ads.select(*ad_cols), "ad_id", "left")
        .join(history, "impression_id", "left")
        .select(
            "impression_id", "ts", "ds", "user_id", "ad_id", "surface", "position",
            "clicked", "converted", "p_click", "p_convert",
            *[c for c in user_cols + ad_cols if c not in ("user_id", "ad_id")],
            hashed(F.col("surface"), surface.buckets).alias(surface.idx_column),
            *_sequence_columns(spec),
        )
    )
