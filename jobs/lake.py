"""Delta Lake reads and writes for the `$GEM_HOME/lake` tables, and their SQL names.

Writes are idempotent: a daily table replaces exactly the partition it writes (`replaceWhere`),
so re-running a day never duplicates rows, and each write is one atomic Delta commit. Schema
policy: a write whose schema differs from the table's fails with Delta's schema-mismatch error;
a deliberate change is made with `allow_schema_change=True` (Delta `overwriteSchema`, whole-table
writes only) and is visible in the table history.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from gem_model.paths import LAYERS, GemPaths


def _predicate(partition: dict[str, object]) -> str:
    parts = []
    for key, value in partition.items():
        literal = f"DATE'{value.isoformat()}'" if isinstance(value, date) else f"'{value}'"
        parts.append(f"{key} = {literal}")
    return " AND ".join(parts)


def replace_partition(df: DataFrame, path: Path, partition: dict[str, object]) -> int:
    """Atomically replace the rows of `partition` (column -> value) in the Delta table at `path`.

    Delta checks that every written row satisfies the predicate, so a row of another day fails
    the write instead of landing in the wrong partition.
    """
    df = df.cache()
    rows = df.count()
    (df.write.format("delta").mode("overwrite")
       .option("replaceWhere", _predicate(partition))
       .partitionBy(*partition).save(str(path)))
    df.unpersist()
    return rows


def overwrite_table(df: DataFrame, path: Path, allow_schema_change: bool = False) -> int:
    """Atomically replace the whole (unpartitioned) Delta table at `path`."""
    df = df.cache()
    rows = df.count()
    writer = df.write.format("delta").mode("overwrite")
    if allow_schema_change:
        writer = writer.option("overwriteSchema", "true")
    writer.save(str(path))
    df.unpersist()
    return rows


def read_table(spark: SparkSession, path: Path) -> DataFrame:
    if not DeltaTable.isDeltaTable(spark, str(path)):
        raise FileNotFoundError(f"no Delta table at {path}; materialise the asset that writes it first")
    return spark.read.format("delta").load(str(path))


def table_version(spark: SparkSession, path: Path) -> int:
    return int(DeltaTable.forPath(spark, str(path)).history(1).collect()[0]["version"])


def existing_tables(paths: GemPaths) -> dict[str, Path]:
    """`<layer>.<table>` -> path, for every Delta table present under the lake."""
    found = {}
    for layer in LAYERS:
        for table_dir in sorted((paths.lake / layer).glob("*/_delta_log")):
            found[f"{layer}.{table_dir.parent.name}"] = table_dir.parent
    return found


def register_tables(spark: SparkSession, paths: GemPaths) -> list[str]:
    """Make every lake table queryable in SQL as `<layer>.<table>` in this session."""
    names = []
    for name, path in existing_tables(paths).items():
        layer, _, _ = name.partition(".")
        spark.sql(f"CREATE SCHEMA IF NOT EXISTS {layer}")
        spark.sql(f"CREATE TABLE IF NOT EXISTS {name} USING DELTA LOCATION '{path}'")
        names.append(name)
    return names
