"""Data-quality statistics of the feature tables, computed on one partition at a time.

Pure functions from a DataFrame to plain numbers, so the Dagster checks (which turn them into
pass/fail plus UI metadata) and the tests share one implementation.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType


@dataclass(frozen=True)
class SequenceStats:
    rows: int
    future_events: int  # rows whose sequence holds an event at or after the impression
    unordered: int  # rows whose sequence is not most recent first
    over_max_len: int
    p50: int
    p90: int
    p99: int
    max: int

    @property
    def point_in_time(self) -> bool:
        return self.future_events == 0 and self.unordered == 0 and self.over_max_len == 0


def sequence_stats(df: DataFrame, max_seq_len: int, as_of: str | None = "ts") -> SequenceStats:
    """Leakage, order and length distribution of `seq_ts`; `as_of` is the row's cut-off column.

    With `as_of=None` (user sequences as of the end of a day) only order and length are checked.
    """
    leak = F.exists("seq_ts", lambda t: t >= F.col(as_of)) if as_of else F.lit(False)
    row = (
        df.select(
            leak.alias("leak"),
            (F.col("seq_ts") != F.sort_array("seq_ts", asc=False)).alias("unordered"),
            (F.size("seq_ts") > max_seq_len).alias("too_long"),
            F.size("seq_ts").alias("length"),
        )
        .agg(
            F.count(F.lit(1)).alias("rows"),
            *[F.sum(F.col(c).cast("long")).alias(c) for c in ("leak", "unordered", "too_long")],
            F.percentile_approx("length", [0.5, 0.9, 0.99]).alias("pct"),
            F.max("length").alias("max_len"),
        )
        .first()
    )
    pct = row["pct"] or [0, 0, 0]
    return SequenceStats(
        int(row["rows"]),
        int(row["leak"] or 0),
        int(row["unordered"] or 0),
        int(row["too_long"] or 0),
        int(pct[0]),
        int(pct[1]),
        int(pct[2]),
        int(row["max_len"] or 0),
    )


@dataclass(frozen=True)
class TimelineStats:
    rows: int
    impressions: int
    events: int
    future_events: int  # rows where an impression sees an event at or after its ts, or misses an earlier one
    unordered: int  # rows whose events or impressions are not in time order
    misaligned: int  # rows whose per-impression or per-event arrays differ in length
    over_max_len: int  # rows holding more than max_seq_len events before their first impression
    events_p50: int
    events_p90: int
    events_max: int
    impressions_p50: int
    impressions_p90: int
    impressions_max: int

    @property
    def point_in_time(self) -> bool:
        return self.future_events == 0 and self.unordered == 0 and self.misaligned == 0 and self.over_max_len == 0


def timeline_stats(df: DataFrame, max_seq_len: int | None = None) -> TimelineStats:
    """The point-in-time check of gold.user_timelines, and its sizes.

    Per row: events (`seq_ts`) and impressions (`ts`) ascending; the `seq_*` arrays as long as `seq_ts` and every
    other array as long as `impression_id`; for each impression i, the events before position `visible[i]` all
    earlier than its ts and the one at `visible[i]` (if any) not. With `max_seq_len`, at most that many events
    precede the first impression.
    """
    arrays = [f.name for f in df.schema.fields if isinstance(f.dataType, ArrayType)]
    lengths = [F.size(c) != F.size("seq_ts" if c.startswith("seq_") else "impression_id") for c in arrays]
    if "impression_count" in df.columns:
        lengths.append(F.col("impression_count") != F.size("impression_id"))
    too_long = F.get(F.col("visible"), 0) > max_seq_len if max_seq_len is not None else F.lit(False)
    row = (
        df.select(
            F.exists(F.zip_with("ts", "visible", _sees_wrong_events), lambda wrong: wrong).alias("leak"),
            ((F.col("seq_ts") != F.sort_array("seq_ts")) | (F.col("ts") != F.sort_array("ts"))).alias("unordered"),
            reduce(operator.or_, lengths).alias("misaligned"),
            F.coalesce(too_long, F.lit(False)).alias("too_long"),
            F.size("seq_ts").alias("events"),
            F.size("impression_id").alias("impressions"),
        )
        .agg(
            F.count(F.lit(1)).alias("rows"),
            *[F.sum(F.col(c).cast("long")).alias(c) for c in ("leak", "unordered", "misaligned", "too_long")],
            *[F.sum(c).alias(f"{c}_total") for c in ("events", "impressions")],
            *[F.percentile_approx(c, [0.5, 0.9]).alias(f"{c}_pct") for c in ("events", "impressions")],
            *[F.max(c).alias(f"{c}_max") for c in ("events", "impressions")],
        )
        .first()
    )
    events, impressions = row["events_pct"] or [0, 0], row["impressions_pct"] or [0, 0]
    return TimelineStats(
        int(row["rows"]),
        int(row["impressions_total"] or 0),
        int(row["events_total"] or 0),
        int(row["leak"] or 0),
        int(row["unordered"] or 0),
        int(row["misaligned"] or 0),
        int(row["too_long"] or 0),
        int(events[0]),
        int(events[1]),
        int(row["events_max"] or 0),
        int(impressions[0]),
        int(impressions[1]),
        int(row["impressions_max"] or 0),
    )


def _sees_wrong_events(ts: Column, visible: Column) -> Column:
    """Whether an impression at `ts` seeing the first `visible` events (of the row's `seq_ts`) breaks the boundary."""
    seq_ts = F.col("seq_ts")
    seen = F.slice(seq_ts, 1, F.greatest(visible, F.lit(0)))
    broken = (
        (visible < 0)
        | (visible > F.size(seq_ts))
        | F.exists(seen, lambda t: t >= ts)
        | F.coalesce(F.get(seq_ts, visible) < ts, F.lit(False))  # the first event it does not see
    )
    return F.coalesce(broken, F.lit(True))  # a null ts or visible (arrays of unequal length) is wrong too


@dataclass(frozen=True)
class SurfaceLabels:
    surface: str
    rows: int
    click_rate: float
    conversion_rate: float  # conversions per impression

    def within(self, click_bounds: tuple[float, float], min_rows: int) -> bool:
        """Too few rows to judge counts as within bounds; the rate is still reported."""
        low, high = click_bounds
        return self.rows < min_rows or (low <= self.click_rate <= high and self.conversion_rate <= self.click_rate)


def label_rates(df: DataFrame) -> list[SurfaceLabels]:
    """Click and conversion rate per surface."""
    rows = (
        df.groupBy("surface")
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.avg(F.col("clicked").cast("double")).alias("ctr"),
            F.avg(F.col("converted").cast("double")).alias("cvr"),
        )
        .orderBy("surface")
        .collect()
    )
    return [SurfaceLabels(r["surface"], int(r["rows"]), float(r["ctr"]), float(r["cvr"])) for r in rows]


def null_rates(df: DataFrame, columns: list[str]) -> dict[str, float]:
    """Share of null values per column."""
    row = df.agg(*[F.avg(F.col(c).isNull().cast("double")).alias(c) for c in columns]).first()
    return {c: float(row[c] or 0.0) for c in columns}
