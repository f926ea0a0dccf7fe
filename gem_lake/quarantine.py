"""Split raw source rows into accepted bronze rows and quarantined `bronze.rejected_rows`.

Each bronze table has an ordered list of rules; a row's `reason` is the first rule it breaks.
First comes the source line's own failure when the row was read from a text file (`_line.error`,
set by `gem_lake.sources.lines`: `invalid_utf8`, `too_few_fields`, `too_many_fields`,
`unparsable_<column>`, `invalid_label_<column>`, `duplicate_<key>`), then the table's rules
(`null_<column>`, `negative_<column>`, `unknown_surface`, `ts_outside_partition`,
`conversion_without_click`, `duplicate_<key>`: the key's columns joined by `_`). Rejected rows keep
their full content as JSON in `record` and, where they came from a line, the raw line, its file and
its line number, so nothing is lost and a fixed source can be replayed. Accepted rows never carry
`_line`. Row conservation — rows in = accepted + rejected — is checked by the bronze assets after
both writes land.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

REJECTED_TABLE = "bronze.rejected_rows"
WHOLE_TABLE = "all"  # the `source_partition` value of rejections from unpartitioned (dimension) tables
# A raw row's source line, when it was read from a text file: struct<file string, number bigint,
# raw string, error string> (gem_lake.sources.lines); `error` is null when the line parsed.
LINE_COLUMN = "_line"


@dataclass(frozen=True)
class Rules:
    """What a bronze table requires of a raw row."""

    not_null: tuple[str, ...]
    non_negative: tuple[str, ...] = ()
    unique: tuple[str, ...] = ()  # the key: rows after the first (in a deterministic order) with it are rejected
    checks_surface: bool = False
    checks_partition: bool = False  # `ts` must fall on the partition's day
    checks_funnel: bool = False  # converted implies clicked


RULES: dict[str, Rules] = {
    "bronze.users": Rules(not_null=("user_id",), non_negative=("user_id",), unique=("user_id",)),
    "bronze.ads": Rules(not_null=("ad_id",), non_negative=("ad_id", "advertiser_id"), unique=("ad_id",)),
    # One action of a user on an item at one time is one event: a repeat (a log written twice) would count twice
    # in every sequence.
    "bronze.events": Rules(
        not_null=("user_id", "item_id", "action", "surface", "ts"),
        non_negative=("user_id", "item_id"),
        unique=("user_id", "item_id", "action", "ts"),
        checks_surface=True,
        checks_partition=True,
    ),
    "bronze.impressions": Rules(
        not_null=("impression_id", "user_id", "ad_id", "surface", "ts", "clicked", "converted"),
        non_negative=("user_id", "ad_id"),
        unique=("impression_id",),
        checks_surface=True,
        checks_partition=True,
        checks_funnel=True,
    ),
}


def data_columns(df: DataFrame) -> list[str]:
    """The columns a bronze table receives: all but the internal `_line`."""
    return [c for c in df.columns if c != LINE_COLUMN]


def rejection_reason(df: DataFrame, table: str, surfaces: tuple[str, ...], ds: date | None) -> Column:
    """The first rule of `table` each row breaks, or null for a good row."""
    rules = RULES[table]
    tests: list[tuple[Column, Column]] = []  # (broken, reason)
    has_line = LINE_COLUMN in df.columns
    if has_line:
        line_error = F.col(f"{LINE_COLUMN}.error")
        tests.append((line_error.isNotNull(), line_error))
    tests += [(F.col(c).isNull(), F.lit(f"null_{c}")) for c in rules.not_null]
    tests += [(F.col(c) < 0, F.lit(f"negative_{c}")) for c in rules.non_negative]
    if rules.checks_surface:
        tests.append((~F.col("surface").isin(*surfaces), F.lit("unknown_surface")))
    if rules.checks_partition:
        if ds is None:
            raise ValueError(f"{table} is partitioned by day: pass the partition's ds")
        tests.append((F.to_date("ts") != F.lit(ds), F.lit("ts_outside_partition")))
    if rules.checks_funnel:
        tests.append((F.col("converted") & ~F.col("clicked"), F.lit("conversion_without_click")))
    reason = _first(tests)
    if rules.unique:
        # Only rows that break no other rule compete for a key, so a malformed copy never displaces a
        # good one. The first is kept: the earliest source line, else the smallest row as JSON
        # (deterministic, so a re-run keeps the same copy).
        order = [F.col(f"{LINE_COLUMN}.file"), F.col(f"{LINE_COLUMN}.number")] if has_line else []
        order.append(F.to_json(F.struct(*[F.col(c) for c in data_columns(df)])))
        first = Window.partitionBy(*[F.col(c) for c in rules.unique], reason.isNull()).orderBy(*order)
        repeated = reason.isNull() & (F.row_number().over(first) > 1)
        reason = F.when(repeated, F.lit("duplicate_" + "_".join(rules.unique))).otherwise(reason)
    return reason


def _first(tests: list[tuple[Column, Column]]) -> Column:
    """The reason of the first test that holds, or null."""
    reason = None
    for broken, name in tests:
        reason = F.when(broken, name) if reason is None else reason.when(broken, name)
    return reason if reason is not None else F.lit(None).cast("string")


def split(df: DataFrame, table: str, surfaces: tuple[str, ...], ds: date | None = None) -> tuple[DataFrame, DataFrame]:
    """(accepted rows with `df`'s data columns, rejected rows in the `bronze.rejected_rows` schema)."""
    columns = data_columns(df)
    annotated = df.select("*", rejection_reason(df, table, surfaces, ds).alias("_reason"))
    accepted = annotated.where(F.col("_reason").isNull()).select(*columns)
    if LINE_COLUMN in df.columns:
        line = [F.col(f"{LINE_COLUMN}.raw"), F.col(f"{LINE_COLUMN}.file"), F.col(f"{LINE_COLUMN}.number")]
    else:
        line = [F.lit(None).cast("string"), F.lit(None).cast("string"), F.lit(None)]
    raw_line, source_file, source_line = line
    rejected = annotated.where(F.col("_reason").isNotNull()).select(
        F.lit(table).alias("source_table"),
        F.lit(ds.isoformat() if ds else WHOLE_TABLE).alias("source_partition"),
        F.col("_reason").alias("reason"),
        F.to_json(F.struct(*[F.col(c) for c in columns])).alias("record"),
        raw_line.cast("string").alias("raw_line"),
        source_file.cast("string").alias("source_file"),
        source_line.cast("bigint").alias("source_line"),
    )
    return accepted, rejected
