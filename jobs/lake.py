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


def register_tables(spark: SparkSession, paths: GemPaths) -> list[str]:
    """Make every lake table queryable in SQL as `<layer>.<table>` in this session, and the `meta.*`
    views over the model manifests and the tables' Delta history (`register_meta_views`)."""
    previous = spark.conf.get(_REGISTERED_LAKE, None)
    if previous is not None and previous != str(paths.lake):
        _unregister(spark)  # this session registered another lake before: its names must not linger
    spark.conf.set(_REGISTERED_LAKE, str(paths.lake))
    names = []
    for name, path in existing_tables(paths).items():
        layer, _, _ = name.partition(".")
        spark.sql(f"CREATE SCHEMA IF NOT EXISTS {layer}")
        spark.sql(f"CREATE TABLE IF NOT EXISTS {name} USING DELTA LOCATION '{path}'")
        names.append(name)
    return names + register_meta_views(spark, paths)


def _unregister(spark: SparkSession) -> None:
    """Drop the catalog entries of a previously registered lake; every one is external, so no data is deleted."""
    for schema in (*LAYERS, META_SCHEMA):
        if spark.catalog.databaseExists(schema):
            for table in spark.catalog.listTables(schema):
                kind = "VIEW" if table.tableType == "VIEW" else "TABLE"
                spark.sql(f"DROP {kind} IF EXISTS {schema}.{table.name}")


# Lineage in SQL. `DESCRIBE HISTORY` is a command, not a relation (it cannot be joined), and Delta has no
# history table-valued function, so the history is read from the commit files themselves (the Delta
# protocol's `_delta_log/<version>.json`, one `commitInfo` action each): a lazy JSON scan with a fixed
# schema, so registering costs a file listing, not a Spark job per table. Manifests are read the same way.
META_SCHEMA = "meta"
_REGISTERED_LAKE = "gem.sql.registeredLake"
_MANIFEST_SCHEMA = (
    "model_version STRING, created_at STRING, config STRUCT<preset: STRING, data: STRUCT<source: STRING>, "
    "model: STRUCT<architecture: STRING>>, training_data STRUCT<`table`: STRING, path: STRING, delta_version: BIGINT, "
    "train_days: ARRAY<DATE>, holdout_days: ARRAY<DATE>>, world_size INT, train_seconds DOUBLE, "
    "metrics MAP<STRING, DOUBLE>"
)
_COMMIT_SCHEMA = (
    "commitInfo STRUCT<timestamp: BIGINT, inCommitTimestamp: BIGINT, operation: STRING, "
    "operationParameters: MAP<STRING, STRING>, readVersion: BIGINT, isBlindAppend: BOOLEAN, "
    "operationMetrics: MAP<STRING, STRING>, engineInfo: STRING>"
)
_COMMIT_FILE = "'/([^/]+)/([^/]+)/_delta_log/([0-9]+)[.]json$'"
# (column, type, expression over meta.model_manifests); the LATEST pointer is substituted for {latest}.
MODEL_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("model_version", "STRING", "model_version"),
    ("created_at", "TIMESTAMP", "cast(created_at AS TIMESTAMP)"),
    ("is_latest", "BOOLEAN", "coalesce(model_version = {latest}, false)"),
    ("preset", "STRING", "config.preset"),
    ("architecture", "STRING", "config.model.architecture"),
    ("data_source", "STRING", "config.data.source"),
    ("training_table", "STRING", "training_data.`table`"),
    ("training_delta_version", "BIGINT", "training_data.delta_version"),
    ("train_days", "ARRAY<DATE>", "training_data.train_days"),
    ("first_train_day", "DATE", "array_min(training_data.train_days)"),
    ("last_train_day", "DATE", "array_max(training_data.train_days)"),
    ("holdout_days", "ARRAY<DATE>", "training_data.holdout_days"),
    ("world_size", "INT", "world_size"),
    ("train_seconds", "DOUBLE", "train_seconds"),
    *((f"{task}_{metric}", "DOUBLE", f"metrics['{task}/{metric}']")
      for task in ("ctr", "cvr") for metric in ("auc", "ne", "calibration")),
    ("metrics", "MAP<STRING, DOUBLE>", "metrics"),
    ("manifest_path", "STRING", "_metadata.file_path"),
)
# (column, type, expression over meta.delta_commits)
HISTORY_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("table_name", "STRING", f"concat(regexp_extract(_metadata.file_path, {_COMMIT_FILE}, 1), '.', "
                             f"regexp_extract(_metadata.file_path, {_COMMIT_FILE}, 2))"),
    ("version", "BIGINT", f"cast(regexp_extract(_metadata.file_path, {_COMMIT_FILE}, 3) AS BIGINT)"),
    ("committed_at", "TIMESTAMP", "timestamp_millis(coalesce(commitInfo.inCommitTimestamp, commitInfo.timestamp))"),
    ("operation", "STRING", "commitInfo.operation"),
    ("operation_parameters", "MAP<STRING, STRING>", "commitInfo.operationParameters"),
    ("operation_metrics", "MAP<STRING, STRING>", "commitInfo.operationMetrics"),
    ("read_version", "BIGINT", "commitInfo.readVersion"),
    ("is_blind_append", "BOOLEAN", "commitInfo.isBlindAppend"),
    ("engine_info", "STRING", "commitInfo.engineInfo"),
)


def _sql_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _view(spark: SparkSession, name: str, columns: tuple[tuple[str, str, str], ...], source: str | None,
          where: str) -> None:
    """`name` over `source` (a table), or an empty view of the same columns and types when there is none."""
    if source is None:
        select = ", ".join(f"CAST(NULL AS {kind}) AS {column}" for column, kind, _ in columns)
        spark.sql(f"CREATE OR REPLACE VIEW {name} AS SELECT {select} WHERE false")
    else:
        select = ", ".join(f"CAST({expression} AS {kind}) AS {column}" for column, kind, expression in columns)
        spark.sql(f"CREATE OR REPLACE VIEW {name} AS SELECT {select} FROM {source} WHERE {where}")


def _json_table(spark: SparkSession, name: str, schema: str, path: str, options: dict[str, str]) -> None:
    spark.sql(f"DROP TABLE IF EXISTS {name}")  # external (a path): only the catalog entry goes
    opts = ", ".join(f"{k} {_sql_string(v)}" for k, v in {**options, "path": path}.items())
    spark.sql(f"CREATE TABLE {name} ({schema}) USING json OPTIONS ({opts})")


def register_meta_views(spark: SparkSession, paths: GemPaths) -> list[str]:
    """Register `meta.models` (one row per model manifest) and `meta.table_history` (one row per Delta
    commit of every lake table); each is an empty view with the same columns when there is nothing yet."""
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {META_SCHEMA}")
    manifests = None
    if any(paths.models.glob("*/manifest.json")):
        manifests = f"{META_SCHEMA}.model_manifests"
        _json_table(spark, manifests, _MANIFEST_SCHEMA, str(paths.models / "*" / "manifest.json"),
                    {"multiLine": "true"})
    pointer = paths.models / "LATEST"
    latest = _sql_string(pointer.read_text().strip()) if pointer.is_file() else "NULL"
    model_columns = tuple((c, k, e.replace("{latest}", latest)) for c, k, e in MODEL_COLUMNS)
    # A model directory appears by rename from `<version>.partial`; a manifest seen there is not a model yet.
    _view(spark, f"{META_SCHEMA}.models", model_columns, manifests,
          "_metadata.file_path NOT LIKE '%.partial/manifest.json'")
    commits = None
    if any(paths.lake.glob("*/*/_delta_log/*.json")):
        commits = f"{META_SCHEMA}.delta_commits"
        _json_table(spark, commits, _COMMIT_SCHEMA, str(paths.lake / "*" / "*" / "_delta_log" / "*.json"), {})
    _view(spark, f"{META_SCHEMA}.table_history", HISTORY_COLUMNS, commits, "commitInfo IS NOT NULL")
    return [f"{META_SCHEMA}.models", f"{META_SCHEMA}.table_history"]
