"""Split raw source rows into accepted bronze rows and quarantined `bronze.rejected_rows`.

Each bronze table has an ordered list of rules; a row's `reason` is the first rule it breaks
(`null_<column>`, `negative_<column>`, `unknown_surface`, `ts_outside_partition`,
`conversion_without_click`, `duplicate_<key>`). Rejected rows keep their full content as JSON
in `record`, so nothing is lost and a fixed source can be replayed. Row conservation — rows in =
accepted + rejected — is checked by the bronze assets after both writes land.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

REJECTED_TABLE = "bronze.rejected_rows"
WHOLE_TABLE = "all"  # the `source_partition` value of rejections from unpartitioned (dimension) tables


@dataclass(frozen=True)
class Rules:
    """What a bronze table requires of a raw row."""

    not_null: tuple[str, ...]
    non_negative: tuple[str, ...] = ()
    unique: str | None = None  # rows after the first (in a deterministic order) with this key are rejected
    checks_surface: bool = False
    checks_partition: bool = False  # `ts` must fall on the partition's day
    checks_funnel: bool = False  # converted implies clicked


RULES: dict[str, Rules] = {
    "bronze.users": Rules(not_null=("user_id",), non_negative=("user_id",), unique="user_id"),
    "bronze.ads": Rules(not_null=("ad_id",), non_negative=("ad_id", "advertiser_id"), unique="ad_id"),
    "bronze.events": Rules(not_null=("user_id", "item_id", "action", "surface", "ts"),
                           non_negative=("user_id", "item_id"), checks_surface=True, checks_partition=True),
    "bronze.impressions": Rules(not_null=("impression_id", "user_id", "ad_id", "surface", "ts", "clicked",
                                          "converted"),
                                non_negative=("user_id", "ad_id"), unique="impression_id", checks_surface=True,
                                checks_partition=True, checks_funnel=True),
}


def rejection_reason(df: DataFrame, table: str, surfaces: tuple[str, ...], ds: date | None) -> Column:
    """The first rule of `table` each row breaks, or null for a good row."""
    rules = RULES[table]
    tests: list[tuple[str, Column]] = [(f"null_{c}", F.col(c).isNull()) for c in rules.not_null]
    tests += [(f"negative_{c}", F.col(c) < 0) for c in rules.non_negative]
    if rules.checks_surface:
        tests.append(("unknown_surface", ~F.col("surface").isin(*surfaces)))
    if rules.checks_partition:
        if ds is None:
            raise ValueError(f"{table} is partitioned by day: pass the partition's ds")
        tests.append(("ts_outside_partition", F.to_date("ts") != F.lit(ds)))
    if rules.checks_funnel:
        tests.append(("conversion_without_click", F.col("converted") & ~F.col("clicked")))
    if rules.unique:
        # Deterministic order (the whole row as JSON), so a re-run keeps the same copy.
        order = F.to_json(F.struct(*[F.col(c) for c in df.columns]))
        first = F.row_number().over(Window.partitionBy(rules.unique).orderBy(order)) == 1
        tests.append((f"duplicate_{rules.unique}", ~first))
    reason = None
    for name, test in tests:
        reason = F.when(test, F.lit(name)) if reason is None else reason.when(test, F.lit(name))
    return reason


def split(df: DataFrame, table: str, surfaces: tuple[str, ...],
          ds: date | None = None) -> tuple[DataFrame, DataFrame]:
    """(accepted rows with `df`'s columns, rejected rows in the `bronze.rejected_rows` schema)."""
    columns = df.columns
    annotated = df.select("*", rejection_reason(df, table, surfaces, ds).alias("_reason"))
    accepted = annotated.where(F.col("_reason").isNull()).select(*columns)
    rejected = annotated.where(F.col("_reason").isNotNull()).select(
        F.lit(table).alias("source_table"),
        F.lit(ds.isoformat() if ds else WHOLE_TABLE).alias("source_partition"),
        F.col("_reason").alias("reason"),
        F.to_json(F.struct(*[F.col(c) for c in columns])).alias("record"),
    )
    return accepted, rejected
