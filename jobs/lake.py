"""Delta Lake reads and writes for the `$GEM_HOME/lake` tables, and their SQL names (with `meta.models`
and `meta.table_history` over the model manifests and the Delta logs, docs/SQL.md).

Writes are idempotent: a daily table replaces exactly the partition it writes (`replaceWhere`),
so re-running a day never duplicates rows, and each write is one atomic Delta commit.

Schema policy (docs/tables.md): a write is compared with the table's schema first. New columns
are additive and allowed: Delta adds them (`mergeSchema`), older partitions read them as null, and
the table history records the change. A removed column or a changed type is refused with a
`SchemaChangeError` naming the columns; a deliberate breaking change is a whole-table rewrite
with `allow_schema_change=True` (Delta `overwriteSchema`). Nothing is coerced silently.
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


class SchemaChangeError(ValueError):
    pass


def _schema(df: DataFrame) -> dict[str, str]:
    return {f.name: f.dataType.simpleString() for f in df.schema.fields}


def _check_schema(spark: SparkSession, df: DataFrame, path: Path, allow_schema_change: bool) -> bool:
    """Whether the write adds columns; raises on a breaking change unless it is allowed."""
    if not DeltaTable.isDeltaTable(spark, str(path)):
        return False
    current, new = _schema(spark.read.format("delta").load(str(path))), _schema(df)
    removed = sorted(set(current) - set(new))
    changed = sorted(f"{c}: {current[c]} -> {new[c]}" for c in set(current) & set(new) if current[c] != new[c])
    if (removed or changed) and not allow_schema_change:
        raise SchemaChangeError(
            f"writing {path} would break its schema (removed columns {removed}, changed types {changed}); "
            "restore the columns or their types in the job, or rebuild the whole table with "
            "allow_schema_change=True (see the schema policy in docs/tables.md)"
        )
    return bool(set(new) - set(current))


def replace_partition(df: DataFrame, path: Path, partition: dict[str, object]) -> int:
    """Atomically replace the rows of `partition` (column -> value) in the Delta table at `path`.

    Delta checks that every written row satisfies the predicate, so a row of another day fails
    the write instead of landing in the wrong partition.
    """
    adds_columns = _check_schema(df.sparkSession, df, path, allow_schema_change=False)
    df = df.cache()
    rows = df.count()
    (df.write.format("delta").mode("overwrite")
       .option("replaceWhere", _predicate(partition))
       .option("mergeSchema", str(adds_columns).lower())
       .partitionBy(*partition).save(str(path)))
    df.unpersist()
    return rows


def overwrite_table(df: DataFrame, path: Path, allow_schema_change: bool = False) -> int:
    """Atomically replace the whole (unpartitioned) Delta table at `path`."""
    adds_columns = _check_schema(df.sparkSession, df, path, allow_schema_change)
    df = df.cache()
    rows = df.count()
    writer = df.write.format("delta").mode("overwrite")
    if allow_schema_change:
        writer = writer.option("overwriteSchema", "true")
    elif adds_columns:
        writer = writer.option("mergeSchema", "true")
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

