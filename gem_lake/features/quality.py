"""Data-quality statistics of the feature tables, computed on one partition at a time.

Pure functions from a DataFrame to plain numbers, so the Dagster checks (which turn them into
pass/fail plus UI metadata) and the tests share one implementation.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


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
