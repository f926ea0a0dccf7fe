"""Delta Lake reads and writes (Spark) for the `$GEM_HOME/lake` tables; SQL over them is `gem_lake.sql.query`.

Writes are idempotent: a daily table replaces exactly the partition it writes (`replaceWhere`),
so re-running a day never duplicates rows, and each write is one atomic Delta commit, made while
holding the table's commit lock (`gem_lake.locks.table_commit_lock`: Delta on a local or shared POSIX
file system does not arbitrate two Spark drivers committing at once). A concurrent commit that
Delta still detects (a writer outside this lock) is a `ConcurrentWriteError`, never a silent mix.

Schema policy (docs/tables.md): a write is compared with the table's schema first. New columns
are additive and allowed: Delta adds them (`mergeSchema`), older partitions read them as null, and
the table history records the change. A column the table has but the new rows lack is refused
with a `SchemaChangeError` naming it and the two fixes (write nulls for it with
`WritePolicy.allow_missing_columns`, or drop it from the table with `drop_columns`, which
`gem lake drop-columns` runs); a changed type is refused too. A deliberate breaking change is a
whole-table rewrite with `allow_schema_change=True` (Delta `overwriteSchema`). Nothing is coerced
silently.

Row-drop guard (`WritePolicy.max_row_drop_fraction`): replacing a partition (or a whole table)
that has rows with none, or with a larger drop than that fraction, is refused with a
`RowDropError` unless `allow_row_drop` says the caller means it: an empty or truncated source file
must not wipe good data.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from datetime import date
from functools import reduce
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from delta.exceptions.base import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    MetadataChangedException,
    ProtocolChangedException,
)
from delta.tables import DeltaTable
from deltalake import DeltaTable as LogReader
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gem_lake.locks import table_commit_lock
from gem_model.paths import LAYERS, GemPaths

_CONFLICTS = (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    MetadataChangedException,
    ProtocolChangedException,
)


def _predicate(partition: dict[str, object]) -> str:
    parts = []
    for key, value in partition.items():
        literal = f"DATE'{value.isoformat()}'" if isinstance(value, date) else f"'{value}'"
        parts.append(f"{key} = {literal}")
    return " AND ".join(parts)


def table_name(path: Path) -> str:
    """`<layer>.<table>` of a lake table's path."""
    return f"{path.parent.name}.{path.name}"


class SchemaChangeError(ValueError):
    pass


class RowDropError(ValueError):
    pass


class ConcurrentWriteError(RuntimeError):
    pass


@dataclass(frozen=True)
class WritePolicy:
    """What a write may do to what is already there (module docstring).

    `max_row_drop_fraction`: None turns the row-drop guard off (derived tables, whose inputs are
    guarded); `allow_row_drop` and `allow_missing_columns` are the explicit requests a user gives
    through the assets' config or `jobs.build_features` flags.
    """

    max_row_drop_fraction: float | None = None
    allow_row_drop: bool = False
    allow_missing_columns: bool = False


UNGUARDED = WritePolicy()  # no row-drop guard, no missing columns: derived tables and tests


def _schema(df: DataFrame) -> dict[str, str]:
    return {f.name: f.dataType.simpleString() for f in df.schema.fields}


def _conform(
    spark: SparkSession, df: DataFrame, path: Path, policy: WritePolicy, allow_schema_change: bool
) -> tuple[DataFrame, bool]:
    """(`df` ready to write, whether it adds columns); raises on a schema change the policy does not allow."""
    if not DeltaTable.isDeltaTable(spark, str(path)):
        return df, False
    current, new = _schema(spark.read.format("delta").load(str(path))), _schema(df)
    missing = [c for c in current if c not in new]
    changed = sorted(f"{c}: {current[c]} -> {new[c]}" for c in set(current) & set(new) if current[c] != new[c])
    if changed and not allow_schema_change:
        raise SchemaChangeError(
            f"writing {table_name(path)} would change column types ({changed}); restore the types in the job "
            "that writes it, or rebuild the whole table (see the schema policy in docs/tables.md)"
        )
    if missing and not allow_schema_change:
        if not policy.allow_missing_columns:
            name = table_name(path)
            raise SchemaChangeError(
                f"{name} has columns that the new rows lack: {missing} (added by an earlier write). Either keep "
                "them and write nulls for these rows: re-run with allow_missing_columns (the asset's config "
                "`allow_missing_columns: true` in Dagster, or `python -m jobs.build_features "
                f"--allow-missing-columns`); or drop them from the table: `gem lake drop-columns {name} "
                f"{' '.join(missing)}`"
            )
        df = df.select("*", *[F.lit(None).cast(current[c]).alias(c) for c in missing])
    return df, bool(set(new) - set(current))


def _partition_filter(partition: dict[str, object] | None, prefix: str = "") -> pc.Expression | None:
    """The rows (or, with prefix "partition.", the log's file entries) of `partition`."""
    terms = [
        pc.field(prefix + k) == (pa.scalar(v, pa.date32()) if isinstance(v, date) else v)
        for k, v in (partition or {}).items()
    ]
    return reduce(lambda a, b: a & b, terms) if terms else None


def table_rows(path: Path, partition: dict[str, object] | None = None) -> int:
    """Rows of `partition` (None: the whole table) now in the table (`table_stats`; 0 when there is no table yet):
    no Spark job."""
    if not (path / "_delta_log").is_dir():
        return 0
    return table_stats(path, partition).rows


def partition_days(path: Path) -> list[date]:
    """The days (`ds` partitions) the Delta table at `path` holds rows in, oldest first, from its log's file
    entries (delta-rs: no Spark job, no data file read); none where there is no table yet."""
    if not (path / "_delta_log").is_dir():
        return []
    files = pa.table(LogReader(str(path)).get_add_actions(flatten=True))
    # A file without statistics (null num_records) counts as holding rows: its reader will find out.
    holding = files.filter(pc.field("num_records").is_null() | (pc.field("num_records") > 0))
    return sorted(set(holding["partition.ds"].to_pylist()))


def value_counts(path: Path, column: str, partition: dict[str, object] | None = None) -> dict[str, int]:
    """Rows per value of `column` in `partition` (None: the whole table) now in the table, read by delta-rs
    one batch at a time (only that column of that partition's files): no Spark job."""
    if not (path / "_delta_log").is_dir():
        return {}
    counts: Counter[str] = Counter()
    scanner = LogReader(str(path)).to_pyarrow_dataset().scanner(columns=[column], filter=_partition_filter(partition))
    for batch in scanner.to_batches():
        for entry in pc.value_counts(batch.column(0)).to_pylist():
            counts[entry["values"]] += entry["counts"]
    return dict(counts)


@dataclass(frozen=True)
class TableStats:
    """A table's (or one partition's) schema, rows and null counts, as of one Delta version."""

    version: int
    schema: dict[str, str]  # column -> Spark's name of its type (`DataType.simpleString`), as `_schema` gives
    rows: int
    nulls: dict[str, int]  # the columns asked for -> their null values
    repeated_keys: int = 0  # rows beyond the first of each value of the key asked for


def table_stats(
    path: Path,
    partition: dict[str, object] | None = None,
    null_columns: tuple[str, ...] = (),
    unique_key: tuple[str, ...] = (),
) -> TableStats:
    """The schema, rows and null counts of `partition` (None: the whole table; values as Python values or their
    ISO strings) from one snapshot of the Delta log and the per-file statistics Delta writes beside each file
    (delta-rs: no Spark job). A column without statistics (Delta keeps them for the first 32 columns) or a file
    without any is counted from the Parquet files themselves. With `unique_key`, also how many rows repeat a
    key value: that needs the key's columns of the partition, read from its files."""
    if not (path / "_delta_log").is_dir():
        raise FileNotFoundError(f"no Delta table at {path}; materialise the asset that writes it first")
    log = LogReader(str(path))
    fields = {f["name"]: f["type"] for f in json.loads(log.schema().to_json())["fields"]}
    unknown = sorted(set(partition or {}) - set(fields))
    if unknown:
        raise ValueError(f"{table_name(path)} has no column {unknown} to select a partition by")
    typed = {k: _typed(v, fields[k]) for k, v in (partition or {}).items()}
    files = pa.table(log.get_add_actions(flatten=True))
    if typed:
        files = files.filter(_partition_filter(typed, "partition."))
    partitioned_by = set(log.metadata().partition_columns)
    nulls: dict[str, int | None] = {}
    for column in null_columns:
        if column in typed:
            nulls[column] = 0
        elif column in partitioned_by:
            nulls[column] = _stat_sum(files.filter(pc.field(f"partition.{column}").is_null()), "num_records")
        else:
            nulls[column] = _stat_sum(files, f"null_count.{column}")
    rows = _stat_sum(files, "num_records")
    unread = [c for c, n in nulls.items() if n is None]
    repeated = 0
    if rows is None or unread or unique_key:  # one scan of the files for every column the statistics lack
        columns = list(dict.fromkeys([*unread, *unique_key]))
        data = log.to_pyarrow_dataset().to_table(columns=columns, filter=_partition_filter(typed))
        rows = data.num_rows
        nulls.update({c: data[c].null_count for c in unread})
        if unique_key:
            repeated = rows - data.group_by(list(unique_key)).aggregate([]).num_rows
    return TableStats(
        log.version(),
        {k: _spark_type(t) for k, t in fields.items()},
        rows,
        {c: int(n or 0) for c, n in nulls.items()},
        repeated,
    )


def _stat_sum(files: pa.Table, column: str) -> int | None:
    """The sum of a per-file statistic; None when a file lacks it."""
    if column not in files.column_names or files[column].null_count:
        return None
    return int(pc.sum(files[column]).as_py() or 0)


# Delta's names of types (the log's schema) where Spark's differ.
_SPARK_NAMES = {"long": "bigint", "integer": "int", "short": "smallint", "byte": "tinyint"}


def _spark_type(delta_type: str | dict) -> str:
    if isinstance(delta_type, str):
        return _SPARK_NAMES.get(delta_type, delta_type)
    kind = delta_type["type"]
    if kind == "array":
        return f"array<{_spark_type(delta_type['elementType'])}>"
    if kind == "map":
        return f"map<{_spark_type(delta_type['keyType'])},{_spark_type(delta_type['valueType'])}>"
    return "struct<" + ",".join(f"{f['name']}:{_spark_type(f['type'])}" for f in delta_type["fields"]) + ">"


def _typed(value: object, delta_type: str | dict) -> object:
    """A partition value (a Dagster partition key's string, or already typed) as the column's Python value."""
    if not isinstance(value, str):
        return value
    if delta_type == "date":
        return date.fromisoformat(value)
    return int(value) if delta_type in ("long", "integer", "short", "byte") else value


def check_row_drop(path: Path, partition: dict[str, object] | None, rows: int, policy: WritePolicy) -> None:
    """Raise `RowDropError` if writing `rows` rows to `partition` (None: the whole table) breaks the guard."""
    if policy.max_row_drop_fraction is None or policy.allow_row_drop:
        return
    predicate = _predicate(partition) if partition else None
    existing = table_rows(path, partition)
    if existing and (rows == 0 or rows < existing * (1 - policy.max_row_drop_fraction)):
        where = f" where {predicate}" if predicate else ""
        raise RowDropError(
            f"{table_name(path)}{where}: the new rows ({rows:,}) would replace {existing:,} rows, a drop beyond "
            f"data.max_row_drop_fraction={policy.max_row_drop_fraction}; nothing was written. Check the source "
            "(an empty or truncated file?). If the drop is real, re-run with allow_row_drop (the asset's config "
            "`allow_row_drop: true` in Dagster, or `python -m jobs.build_features --allow-row-drop`)"
        )


def _commit(writer, path: Path, commit_info: dict[str, str] | None) -> None:
    if commit_info:  # lineage in the Delta log (meta.table_history): which run wrote this commit
        writer = writer.option("userMetadata", json.dumps(commit_info, sort_keys=True))
    try:
        writer.save(str(path))
    except _CONFLICTS as err:
        raise ConcurrentWriteError(
            f"another writer committed to {table_name(path)} while this one wrote (Delta: "
            f"{type(err).__name__}); nothing of this write was committed: re-run it once the other has finished"
        ) from err


def replace_partition(
    df: DataFrame,
    path: Path,
    partition: dict[str, object],
    policy: WritePolicy = UNGUARDED,
    commit_info: dict[str, str] | None = None,
) -> int:
    """Atomically replace the rows of `partition` (column -> value) in the Delta table at `path`.

    Delta checks that every written row satisfies the predicate, so a row of another day fails
    the write instead of landing in the wrong partition. `commit_info` is recorded with the commit.
    """
    spark, predicate = df.sparkSession, _predicate(partition)
    df = df.cache()
    rows = df.count()
    with table_commit_lock(path):
        conformed, adds_columns = _conform(spark, df, path, policy, allow_schema_change=False)
        check_row_drop(path, partition, rows, policy)
        writer = (
            conformed.write.format("delta")
            .mode("overwrite")
            .option("replaceWhere", predicate)
            .option("mergeSchema", str(adds_columns).lower())
            .partitionBy(*partition)
        )
        _commit(writer, path, commit_info)
    df.unpersist()
    return rows


def overwrite_table(
    df: DataFrame,
    path: Path,
    allow_schema_change: bool = False,
    policy: WritePolicy = UNGUARDED,
    commit_info: dict[str, str] | None = None,
) -> int:
    """Atomically replace the whole (unpartitioned) Delta table at `path`."""
    spark = df.sparkSession
    df = df.cache()
    rows = df.count()
    with table_commit_lock(path):
        conformed, adds_columns = _conform(spark, df, path, policy, allow_schema_change)
        check_row_drop(path, None, rows, policy)
        writer = conformed.write.format("delta").mode("overwrite")
        if allow_schema_change:
            writer = writer.option("overwriteSchema", "true")
        elif adds_columns:
            writer = writer.option("mergeSchema", "true")
        _commit(writer, path, commit_info)
    df.unpersist()
    return rows


def drop_columns(spark: SparkSession, path: Path, columns: list[str]) -> int:
    """Rewrite the table at `path` without `columns`, in one commit (earlier versions stay readable by
    time travel until vacuumed); returns its rows. Partitioning is kept."""
    table = read_table(spark, path)
    unknown = sorted(set(columns) - set(table.columns))
    if unknown:
        raise ValueError(f"{table_name(path)} has no column(s) {unknown}; its columns are {table.columns}")
    partitioned_by = DeltaTable.forPath(spark, str(path)).detail().first()["partitionColumns"]
    kept = [c for c in partitioned_by if c in columns]
    if kept:
        raise ValueError(f"{table_name(path)} is partitioned by {kept}: a partition column cannot be dropped")
    df = table.drop(*columns).cache()
    rows = df.count()
    with table_commit_lock(path):
        writer = df.write.format("delta").mode("overwrite").option("overwriteSchema", "true")
        _commit(writer.partitionBy(*partitioned_by) if partitioned_by else writer, path, None)
    df.unpersist()
    return rows


def read_table(spark: SparkSession, path: Path) -> DataFrame:
    if not DeltaTable.isDeltaTable(spark, str(path)):
        raise FileNotFoundError(f"no Delta table at {path}; materialise the asset that writes it first")
    return spark.read.format("delta").load(str(path))


def table_version(path: Path) -> int:
    """The table's current Delta version, read from its log (delta-rs: no Spark job)."""
    if not (path / "_delta_log").is_dir():
        raise FileNotFoundError(f"no Delta table at {path}; materialise the asset that writes it first")
    return LogReader(str(path)).version()


def existing_tables(paths: GemPaths) -> dict[str, Path]:
    """`<layer>.<table>` -> path, for every Delta table present under the lake."""
    found = {}
    for layer in LAYERS:
        for table_dir in sorted((paths.lake / layer).glob("*/_delta_log")):
            found[f"{layer}.{table_dir.parent.name}"] = table_dir.parent
    return found
