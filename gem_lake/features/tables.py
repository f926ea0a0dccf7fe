"""Pure DataFrame -> DataFrame transforms from bronze to the silver and gold feature tables.

Categorical columns are mapped to embedding rows here, once, from the shared `FeatureSpec`:
`<feature>_idx` = 1 + pmod(xxhash64(string value), buckets - 1) for a hashed feature, 1 + pmod(id,
buckets - 1) for an integer id by modulo (`SparseFeature.encoding`), and row 0 is reserved for a
missing value (null attribute, or an impression whose user or ad has no dimension row). Neither
needs a vocabulary, so an id never seen in training (a cold-start ad) still gets a row; the loader
and the model only read these columns.

Sequences are point-in-time correct: an impression sees only events strictly before its `ts`,
within `lookback_days`, at most `max_seq_len` of those before the day's first impression. Each
user's window of events is collected once, so the cost grows with events per user, not with
impressions x events (no exploding join). gold.user_timelines stores that window once per user and
day, not once per impression: its impressions say how many of the (oldest first) events each may
see. gold.training_examples holds the impressions alone; `impression_sequences` gives an analysis
one impression's own sequence from the timelines.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import IntegralType

from gem_model.config import ConfigError, FeatureSpec, SparseFeature

MISSING_ROW = 0
SEQUENCE_FIELDS = ("ts", "item_id", "action")
HOUR_OF_DAY = "hour_of_day"  # derived from the impression's `ts` in the session time zone (UTC)


def _or_missing(col: Column, row: Column) -> Column:
    return F.when(col.isNull(), F.lit(MISSING_ROW).cast("bigint")).otherwise(row)


def hashed(col: Column, buckets: int) -> Column:
    """Embedding row of a categorical value: stable across Spark versions, languages and runs."""
    return _or_missing(col, F.pmod(F.xxhash64(col.cast("string")), F.lit(buckets - 1)) + 1)


def embedding_row(col: Column, feature: SparseFeature) -> Column:
    """The row of `feature`'s value `col` by its encoding (the column must be integral for `modulo`)."""
    if feature.encoding == "hash":
        return hashed(col, feature.buckets)
    return _or_missing(col, (F.pmod(col, F.lit(feature.buckets - 1)) + 1).cast("bigint"))


def require_integral(df: DataFrame, features: tuple[SparseFeature, ...]) -> None:
    """A ConfigError naming each `modulo` feature whose column holds no integers (pmod would make them null)."""
    wrong = {
        f.name: df.schema[f.name].dataType.simpleString()
        for f in features
        if f.encoding == "modulo" and not isinstance(df.schema[f.name].dataType, IntegralType)
    }
    if wrong:
        raise ConfigError(
            f"features.features: {wrong} use encoding 'modulo', which maps integer ids; give these "
            "columns integer values or set their encoding to 'hash'"
        )


# Where each side's feature values come from, for the error that names a missing one.
SIDE_TABLES = {"user": "bronze.users", "ad": "bronze.ads", "context": "bronze.impressions"}


def require_features(df: DataFrame, spec: FeatureSpec, side: str) -> None:
    """A ConfigError naming each `side` feature that `df` (that side's table) has no column for."""
    missing = [f.name for f in spec.side(side) if f.name not in df.columns]
    if missing:
        own = sorted(set(df.columns) - {f.name for f in spec.features})
        raise ConfigError(
            f"features.features: {side} feature(s) {missing} have no column in {SIDE_TABLES[side]} "
            f"(data source's columns not yet used as features: {own}); name one of those, or add the column "
            "to the source (a mapping's `features` lists, docs/datasets.md), or drop the feature"
        )


def with_feature_indices(df: DataFrame, spec: FeatureSpec, *sides: str) -> DataFrame:
    features = tuple(f for side in sides for f in spec.side(side))
    require_integral(df, features)
    return df.select("*", *[embedding_row(F.col(f.name), f).alias(f.idx_column) for f in features])


def observable(df: DataFrame) -> DataFrame:
    """Drop a generator's latent truth (`true_*` columns): it must never become a feature."""
    return df.select(*[c for c in df.columns if not c.startswith("true_")])


def silver_user_features(bronze_users: DataFrame, spec: FeatureSpec) -> DataFrame:
    """silver.user_features: observable user attributes plus their embedding rows."""
    require_features(bronze_users, spec, "user")
    return with_feature_indices(observable(bronze_users), spec, "user")


def silver_ad_features(bronze_ads: DataFrame, spec: FeatureSpec) -> DataFrame:
    """silver.ad_features: observable ad attributes plus their embedding rows."""
    require_features(bronze_ads, spec, "ad")
    return with_feature_indices(observable(bronze_ads), spec, "ad")


def _events_window(events: DataFrame, spec: FeatureSpec, ds: date) -> DataFrame:
    """Events that can appear in a sequence for day `ds` (lookback window up to the end of ds)."""
    first = ds - timedelta(days=spec.lookback_days)
    return events.where((F.col("ds") >= F.lit(first)) & (F.col("ds") <= F.lit(ds)))


def _histories(events: DataFrame, ads: DataFrame, spec: FeatureSpec, ds: date) -> DataFrame:
    """user_id -> `history`: the user's window of events as array<struct<ts, item_id, action, *item
    attributes>>, newest first; an item that is no ad of `ads` has null attributes."""
    attributes = list(spec.sequence_item_attributes)
    items = ads.select(F.col("ad_id").alias("item_id"), *attributes)
    window = _events_window(events, spec, ds).join(items, "item_id", "left")
    return window.groupBy("user_id").agg(
        F.sort_array(F.collect_list(F.struct(*SEQUENCE_FIELDS, *attributes)), asc=False).alias("history")
    )


def age_bucket(event_ts: Column, as_of: Column, buckets: int) -> Column:
    """floor(log2(1 + minutes from the event to `as_of`)), capped at `buckets - 1`: recency as a small id."""
    minutes = F.greatest((F.unix_timestamp(as_of) - F.unix_timestamp(event_ts)) / 60.0, F.lit(0.0))
    return F.least(F.floor(F.log2(minutes + 1.0)), F.lit(buckets - 1)).cast("bigint")


def _sequence_columns(history: Column, spec: FeatureSpec, as_of: Column) -> list[Column]:
    """The sequence columns from a newest-first `history` array, truncated to `max_seq_len`."""
    return _event_columns(F.slice(F.coalesce(history, F.array()), 1, spec.max_seq_len), spec, as_of)


def _event_columns(events: Column, spec: FeatureSpec, as_of: Column) -> list[Column]:
    """The aligned per-event columns of an array of `_histories` structs, in the array's order; ages as of `as_of`."""
    table = spec.item_feature
    items = F.transform(events, lambda e: e["item_id"])
    return [
        items.cast("array<bigint>").alias(spec.sequence_feature),
        F.transform(events, lambda e: e["ts"]).cast("array<timestamp>").alias("seq_ts"),
        F.transform(events, lambda e: e["action"]).cast("array<string>").alias("seq_actions"),
        F.transform(items, lambda x: embedding_row(x, table)).alias(spec.sequence_idx_column),
        F.transform(events, lambda e: hashed(e["action"], spec.action_buckets)).alias(spec.action_idx_column),
        F.transform(events, lambda e: age_bucket(e["ts"], as_of, spec.age_buckets)).alias(spec.age_idx_column),
        *(
            F.transform(events, _field_row(spec.by_name(name))).alias(column)
            for name, column in spec.sequence_attribute_columns.items()
        ),
    ]


def _field_row(feature: SparseFeature) -> Callable[[Column], Column]:
    """An element function for F.transform (which passes the index to a second parameter)."""
    return lambda e: embedding_row(e[feature.name], feature)


def user_sequences(events: DataFrame, ads: DataFrame, spec: FeatureSpec, ds: date) -> DataFrame:
    """gold.user_sequences for `ds`: each active user's sequence as of the end of day `ds`."""
    history = _histories(events, ads, spec, ds)
    return history.select("user_id", F.lit(ds).alias("ds"), *_sequence_columns(F.col("history"), spec, _end_of(ds)))


def _end_of(ds: date) -> Column:
    """Midnight after day `ds`: the one instant a row shared by all of the day's impressions measures ages from."""
    return F.lit(f"{ds + timedelta(days=1)} 00:00:00").cast("timestamp")


def _attributes(df: DataFrame, key: str, spec: FeatureSpec, side: str) -> DataFrame:
    return df.select(key, *[f.name for f in spec.side(side) if f.name != key])


def training_examples(
    impressions: DataFrame, users: DataFrame, ads: DataFrame, spec: FeatureSpec, ds: date
) -> DataFrame:
    """gold.training_examples for `ds`: impressions joined with user and ad attributes, one row each.

    Impression columns (a dataset's extras included) are kept, with `hour_of_day` derived from `ts` (a context
    every source has); user and ad extras stay in silver. The user's events are in gold.user_timelines, once per
    user and day rather than once per impression.
    """
    impressions = impressions.withColumn(HOUR_OF_DAY, F.hour("ts"))
    require_features(impressions, spec, "context")
    imps = impressions.where(F.col("ds") == F.lit(ds))
    joined = imps.join(_attributes(users, "user_id", spec, "user"), "user_id", "left").join(
        _attributes(ads, "ad_id", spec, "ad"), "ad_id", "left"
    )
    attributes = [f.name for f in spec.features if f.side != "context" and f.name not in ("user_id", "ad_id")]
    return with_feature_indices(joined.select(*imps.columns, *attributes), spec, "user", "ad", "context")


# A timeline's per-impression fields besides the feature rows: `ts` then `impression_id` lead, so that sorting the
# structs orders a user's impressions by time, ties by id.
IMPRESSION_FIELDS = ("ts", "impression_id", "ad_id", "surface", "clicked", "converted")
TRUE_RATES = ("p_click", "p_convert")
# Each impression's age bucket before the end of its day, the instant the timeline's event ages count to, so that
# the model reads how long before the impression an event happened from the two buckets.
TARGET_AGE = "target_age_idx"


def user_timelines(
    impressions: DataFrame, events: DataFrame, users: DataFrame, ads: DataFrame, spec: FeatureSpec, ds: date
) -> DataFrame:
    """gold.user_timelines for `ds`: one row per user with impressions on `ds`, holding the user's events once,
    oldest first, and the day's impressions in time order, each with `visible`: how many of the events precede it,
    and its own age bucket (`target_age_idx`).

    Events at or after the user's last impression are dropped (no impression sees them), and of those before the
    first impression only the newest `max_seq_len` are kept, so an impression sees at least its newest
    `max_seq_len` earlier events (`impression_sequences`). Ages are as of the end of `ds`, the one instant all the
    impressions share.
    """
    impressions = impressions.withColumn(HOUR_OF_DAY, F.hour("ts"))
    require_features(impressions, spec, "context")
    imps = impressions.where(F.col("ds") == F.lit(ds)).join(_attributes(ads, "ad_id", spec, "ad"), "ad_id", "left")
    fields = [
        *IMPRESSION_FIELDS,
        *(c for c in TRUE_RATES if c in imps.columns),
        HOUR_OF_DAY,
        *(f.idx_column for f in (*spec.side("ad"), *spec.side("context"))),
    ]
    per_user = (
        with_feature_indices(imps, spec, "ad", "context")
        .groupBy("user_id")
        .agg(F.sort_array(F.collect_list(F.struct(*fields))).alias("impressions"))
    )
    user_attributes = _attributes(users, "user_id", spec, "user")
    joined = per_user.join(user_attributes, "user_id", "left").join(
        _histories(events, ads, spec, ds), "user_id", "left"
    )
    imp, seen = F.col("impressions"), F.col("events")
    timelines = joined.select(
        *user_attributes.columns,
        imp,
        _seen_events(F.col("history"), imp, spec.max_seq_len).alias("events"),
    ).select(
        "user_id",
        F.lit(ds).alias("ds"),
        *user_attributes.columns[1:],
        F.size(imp).alias("impression_count"),
        *[imp[f].alias(f) for f in fields],
        _visible(seen["ts"], imp["ts"]).alias("visible"),
        F.transform(imp["ts"], lambda t: age_bucket(t, _end_of(ds), spec.age_buckets)).alias(TARGET_AGE),
        *_event_columns(seen, spec, _end_of(ds)),
    )
    return with_feature_indices(timelines, spec, "user")


def impression_sequences(timelines: DataFrame, spec: FeatureSpec) -> DataFrame:
    """One row per impression of gold.user_timelines rows: its `impression_id`, `user_id`, `ds`, `ts` and its own
    sequence, the newest `max_seq_len` events before `ts`, newest first, with ages as of `ts`.

    For analyses that read one impression's history (the research benches); the model reads the timelines.
    """
    events = [spec.sequence_feature, "seq_ts", "seq_actions", spec.sequence_idx_column, spec.action_idx_column]
    events += list(spec.sequence_attribute_columns.values())
    exploded = timelines.select(
        "user_id", "ds", "ts", "visible", *events, F.posexplode("impression_id").alias("i", "impression_id")
    ).select("*", F.col("ts")[F.col("i")].alias("impression_ts"), F.col("visible")[F.col("i")].alias("seen"))
    seen, ts = F.col("seen"), F.col("impression_ts")
    start = F.greatest(seen - spec.max_seq_len, F.lit(0))

    def own(column: str) -> Column:
        return F.reverse(F.slice(F.col(column), start + 1, seen - start))

    return exploded.select(
        "impression_id",
        "user_id",
        "ds",
        ts.alias("ts"),
        *(own(c).alias(c) for c in events),
        F.transform(own("seq_ts"), lambda t: age_bucket(t, ts, spec.age_buckets)).alias(spec.age_idx_column),
    )


def _seen_events(history: Column, impressions: Column, max_seq_len: int) -> Column:
    """The events of a newest-first `history` that some of the time-ordered `impressions` sees, oldest first:
    those before the last impression, of which those before the first are cut to the newest `max_seq_len`."""
    first, last = impressions[0]["ts"], F.element_at(impressions, -1)["ts"]
    before_last = F.filter(F.coalesce(history, F.array()), lambda e: e["ts"] < last)
    between = F.size(F.filter(before_last, lambda e: e["ts"] >= first))
    return F.reverse(F.slice(before_last, 1, between + max_seq_len))


def _visible(seq_ts: Column, impression_ts: Column) -> Column:
    """Per impression (`impression_ts` ascending), how many of the ascending `seq_ts` are strictly earlier.

    One sorted merge of the two arrays rather than a count over the events per impression (impressions x events
    per user): (ts, 0) for an impression sorts before (ts, 1) for an event at the same instant, so the i-th
    impression's position in the merge, less i, is the number of events before it.
    """

    def tagged(ts: Column, kind: int) -> Column:
        return F.transform(ts, lambda t: F.struct(t.alias("ts"), F.lit(kind).alias("kind")))

    merged = F.sort_array(F.concat(tagged(impression_ts, 0), tagged(seq_ts, 1)))
    positions = F.filter(F.transform(merged, lambda m, k: F.when(m["kind"] == 0, k)), lambda k: k.isNotNull())
    return F.transform(positions, lambda k, i: k - i)
