"""Strict reading of Parquet files and Delta tables, the columnar inputs of a source mapping.

The same contract as `gem_lake.sources.lines` for delimited text, where a columnar format allows it:
the declared columns must all be there (another schema means the format changed:
`SourceFormatError`, and nothing lands; columns not declared are not read), and each row is
checked in this order, the first failure being its reason:

- `unparsable_<column>`: a non-null value that is no value of its declared type (text in a
  number, an overflowing id); a null stays null for the quarantine's `null_<column>` rules;
- `invalid_label_<column>`: a label whose value, as text, is in neither of its value sets;
- `duplicate_<key>`: as for text (`lines._flag_duplicates`).

A row's "line" in `bronze.rejected_rows` is its declared columns as JSON, its number its place in
the file. Column names are a mapping's (`[a-z0-9_]`), so they need no quoting. Rows are numbered
in a fixed order: a Parquet file's own row order (Spark's `_metadata.row_index`; a folder's files
in path order), a Delta table's rows (which have no order of their own) sorted by every declared
column, so impression ids never depend on partitioning. `version` pins a Delta table's version
(time travel) for reproducible landings.
"""

from __future__ import annotations

from functools import reduce
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from gem_lake.sources.files import TextFile


def load(spark: SparkSession, path: Path, layout: TextFile) -> DataFrame:
    """The Parquet file or folder, or the Delta table (at `layout.version` when pinned), at `path`."""
    if layout.format == "delta":
        reader = spark.read.format("delta")
        return (reader.option("versionAsOf", layout.version) if layout.version is not None else reader).load(str(path))
    return spark.read.parquet(str(path))


def numbered_rows(
    spark: SparkSession, folder: Path, source: str, files: list[tuple[int, TextFile]], layout: TextFile
) -> DataFrame:
    """Rows of the columnar `files` ((place, TextFile) of one layout), typed and checked, with the columns
    `lines._parse` gives text lines (`_file`, `_row`, `impression_id`, `_source_file`, `_number`, `_raw`,
    `_error`, `_key`, `_duplicate_reason`)."""
    declared = [F.col(f.name) for f in layout.fields]
    if layout.format == "parquet":  # the file's own order; a folder's files in path order
        order = [F.col("_metadata.file_path"), F.col("_metadata.row_index")]
    else:
        order = [F.to_json(F.struct(*declared))]
    parts = []
    for place, table in files:
        df = load(spark, folder / table.name, layout)
        number = F.row_number().over(Window.orderBy(*order)).cast("bigint")
        rows = df.select(*declared, number.alias("_number"))
        row = F.col("_number") - 1
        parts.append(
            rows.select(
                "*",
                F.lit(place).alias("_file"),
                row.alias("_row"),
                F.lit(f"{folder.name}/{table.name}").alias("_source_file"),
                F.concat(F.lit(f"{source}-{Path(table.name).stem}-"), row.cast("string")).alias("impression_id"),
                F.lit(table.name if table.key else "").alias("_scope"),
            )
        )
    return _checked(reduce(DataFrame.unionByName, parts), layout)


def _checked(rows: DataFrame, layout: TextFile) -> DataFrame:
    typed = [_typed(F.col(f.name), f.type).alias(f.name) for f in layout.fields]
    failures: list[tuple[Column, str]] = []
    for f in layout.fields:
        value = F.col(f.name)
        if f.name in layout.labels:
            failures.append(
                (value.isNull() | ~value.cast("string").isin(*layout.label_values), f"invalid_label_{f.name}")
            )
        elif f.type != "string":
            failures.append((value.isNotNull() & _typed(value, f.type).isNull(), f"unparsable_{f.name}"))
    error = F.lit(None).cast("string")
    for failed, reason in reversed(failures):  # the first failing column's reason
        error = F.when(failed, F.lit(reason)).otherwise(error)
    raw = F.to_json(F.struct(*[F.col(f.name) for f in layout.fields]))
    with_checks = rows.select("*", raw.alias("_raw"), error.alias("_error"))
    if layout.key:  # as for text: a key left empty identifies nothing
        known = reduce(lambda a, b: a & b, [F.col(c).isNotNull() for c in layout.key])
        key_value = F.when(known, F.to_json(F.struct(*[F.col(c) for c in layout.key])))
    else:
        key_value = F.col("_raw")
    key = F.struct(F.col("_scope").alias("scope"), key_value.alias("value"))
    return with_checks.select(
        *typed,
        "_file",
        "_row",
        "impression_id",
        "_source_file",
        "_number",
        "_raw",
        "_error",
        key.alias("_key"),
        F.lit(layout.duplicate_reason).alias("_duplicate_reason"),
    )


def _typed(value: Column, kind: str) -> Column:
    return value.cast("string") if kind == "string" else value.try_cast(kind)
