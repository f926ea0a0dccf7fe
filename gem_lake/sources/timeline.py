"""Shared pieces of the real-dataset adapters: derived ids, the calendar layout, clicks as events.

Public samples have no usable timestamps (or ones years ago), so an adapter orders its rows
(by the dataset's own time where it has one, else by file order) and spreads them evenly over
the configured days: `ts = start + lead + rank / n * (span - lead)`. The `lead` keeps the first
impression an hour into the first day so that history placed just before it stays on the calendar.
"""

from __future__ import annotations

from datetime import timedelta
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from gem_lake.quarantine import LINE_COLUMN
from gem_model.config import WorldConfig

LEAD_SECONDS = 3600


def spread_over_days(
    df: DataFrame, order: list[Column], world: WorldConfig, first_day: int = 0, n_days: int | None = None
) -> DataFrame:
    """`df` with `ts` and `ds` columns: rows in `order` spread evenly over `world.days`, or over the
    `n_days` of them from the `first_day`-th (0-based) on.

    The ordering must be total (end it with a unique column) so the layout is deterministic.
    """
    span = (world.n_days if n_days is None else n_days) * 86400 - LEAD_SECONDS
    # One global window: fine at sample scale (thousands of rows), which is what these adapters read.
    rank = (F.row_number().over(Window.orderBy(*order)) - 1).cast("bigint")  # rank x seconds overflows int
    n = F.count(F.lit(1)).over(Window.partitionBy())
    start = F.to_timestamp(F.lit((world.start_date + timedelta(days=first_day)).isoformat()))
    with_rank = df.select("*", rank.alias("_rank"), n.alias("_n"))
    ts = start + F.make_interval(secs=F.lit(LEAD_SECONDS) + F.floor(F.col("_rank") * span / F.col("_n")))
    return with_rank.select("*", ts.alias("ts")).select(
        *[c for c in with_rank.columns if c not in ("_rank", "_n")], "ts", F.to_date("ts").alias("ds")
    )


def click_events(impressions: DataFrame) -> DataFrame:
    """Behaviour events from clicked impressions (item = the ad), at the impression's own time.

    An event at the impression's timestamp is not history for that impression (sequences are
    strictly before), but is for every later one of the user. Only impressions whose source line
    parsed click (`gem_lake.sources.lines`): a garbled or repeated line is rejected once, as an impression.
    """
    clicked = F.col("clicked")
    if LINE_COLUMN in impressions.columns:
        clicked = clicked & F.col(f"{LINE_COLUMN}.error").isNull()
    return impressions.where(clicked).select(
        "user_id", F.col("ad_id").alias("item_id"), F.lit("click").alias("action"), "surface", "ts", "ds"
    )


def derived_id(*fields: Column) -> Column:
    """A stable id in [1, 2^62] for datasets without one; null when any field is empty (identity unknown)."""
    known = reduce(lambda a, b: a & b, [f.isNotNull() for f in fields])
    return F.when(known, F.pmod(F.xxhash64(*fields), F.lit(2**62)) + 1)
