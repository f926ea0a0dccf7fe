"""Shared pieces of the table assets: asset keys, materialisation metadata, contract checks.

An asset's key is its table's SQL name split in two (`gold.training_examples` ->
["gold", "training_examples"]), so the Dagster UI, the lake path and SQL all use one name.

The definitions modules import no Spark, torch or FAISS when the code location loads (every
process of `dagster dev`, the daemon and each run worker loads it); a step imports the library it
runs inside its own body.
"""

from typing import TYPE_CHECKING

import dagster as dg

from dagster_project.defs.partitions import partition_columns
from dagster_project.resources.lake import LakeResource
from dagster_project.resources.spark import SparkResource
from jobs.table_contract import CONTRACT, schema_violations

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def key(table: str) -> dg.AssetKey:
    return dg.AssetKey(table.split("."))


def table_metadata(spark: "SparkSession", lake: LakeResource, table: str, rows: int) -> dict[str, object]:
    from jobs.lake import read_table, table_rows, table_version

    path = lake.paths.table(table)
    df = read_table(spark, path)
    return {
        "dagster/row_count": rows,  # this materialisation's rows (its partition's, for a partitioned table)
        "table_rows": table_rows(path),
        "path": dg.MetadataValue.path(str(path)),
        "delta_version": table_version(path),
        "dagster/column_schema": column_schema(table, [(f.name, f.dataType.simpleString()) for f in df.schema.fields]),
    }


def column_schema(table: str, columns: list[tuple[str, str]]) -> dg.TableSchema:
    """The written table's (column, type) pairs with the contract's descriptions; keys are non-null.

    A column the contract does not describe (a dataset's own feature) keeps no description.
    """
    contract = CONTRACT.get(table)
    keys = contract.keys if contract else ()
    described = contract.descriptions if contract else {}

    def description(name: str) -> str | None:
        text = described.get(name)
        return (f"key: {text}" if text else "key") if name in keys else text

    return dg.TableSchema(columns=[
        dg.TableColumn(name, type_, description=description(name),
                       constraints=dg.TableColumnConstraints(nullable=False) if name in keys else None)
        for name, type_ in columns])


def contract_check(table: str, partitions_def: dg.PartitionsDefinition | None = None,
                   blocking: bool = True) -> dg.AssetChecksDefinition:
    """Schema matches the contract, and the partition checked (the table, if unpartitioned) is non-empty and
    has no null keys."""
    scope = "partition" if partitions_def else "table"

    @dg.asset_check(asset=key(table), name="contract", blocking=blocking, partitions_def=partitions_def,
                    description=f"{table}: contract schema, non-empty {scope}, no null keys")
    def _check(context: dg.AssetCheckExecutionContext, spark: SparkResource,
               lake: LakeResource) -> dg.AssetCheckResult:
        from pyspark.sql import functions as F

        from jobs.lake import read_table

        session = spark.session()
        df = read_table(session, lake.paths.table(table))
        if partitions_def is not None:
            for column, value in partition_columns(partitions_def, context.partition_key).items():
                df = df.where(F.col(column) == F.lit(value))
        problems = schema_violations(table, {f.name: f.dataType.simpleString() for f in df.schema.fields})
        keys = CONTRACT[table].keys
        counts = df.agg(F.count(F.lit(1)).alias("rows"),
                        *[F.sum(F.col(k).isNull().cast("long")).alias(k) for k in keys]).first()
        rows = int(counts["rows"])
        nulls = {k: int(counts[k] or 0) for k in keys}
        if rows == 0:
            problems.append(f"{scope} is empty")
        problems += [f"{n} null values in key column {k}" for k, n in nulls.items() if n]
        return dg.AssetCheckResult(
            passed=not problems,
            description="; ".join(problems) or "ok",
            metadata={"rows": rows, **{f"null_{k}": n for k, n in nulls.items()}},
        )

    return _check
