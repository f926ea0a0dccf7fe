"""Shared pieces of the table assets: asset keys, materialisation metadata, contract checks.

An asset's key is its table's SQL name split in two (`gold.training_examples` ->
["gold", "training_examples"]), so the Dagster UI, the lake path and SQL all use one name.

The definitions modules import no Spark, torch or FAISS when the code location loads (every
process of `dagster dev`, the daemon and each run worker loads it); a step imports the library it
runs inside its own body.
"""

import dagster as dg

from dagster_project.defs.partitions import partition_columns
from dagster_project.resources.lake import LakeResource
from gem_lake.table_contract import CONTRACT, schema_violations


def key(table: str) -> dg.AssetKey:
    return dg.AssetKey(table.split("."))


def table_metadata(lake: LakeResource, table: str, rows: int) -> dict[str, object]:
    """A materialisation's metadata: its rows, and the table's as of its newest Delta version (read from the log
    by `gem_lake.delta.table_stats`: no Spark job)."""
    from gem_lake.delta import table_stats

    path = lake.paths.table(table)
    stats = table_stats(path)
    return {
        "dagster/row_count": rows,  # this materialisation's rows (its partition's, for a partitioned table)
        "table_rows": stats.rows,
        "path": dg.MetadataValue.path(str(path)),
        "delta_version": stats.version,
        "dagster/column_schema": column_schema(table, list(stats.schema.items())),
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

    return dg.TableSchema(
        columns=[
            dg.TableColumn(
                name,
                type_,
                description=description(name),
                constraints=dg.TableColumnConstraints(nullable=False) if name in keys else None,
            )
            for name, type_ in columns
        ]
    )


def contract_check(
    table: str, partitions_def: dg.PartitionsDefinition | None = None, blocking: bool = True
) -> dg.AssetChecksDefinition:
    """Schema matches the contract, and the partition checked (the table, if unpartitioned) is non-empty, has
    no null keys (read from the Delta log's per-file statistics by `gem_lake.delta.table_stats`: no Spark job) and,
    where the keys identify a row, no repeated key (read from the key columns' files)."""
    scope = "partition" if partitions_def else "table"
    contract = CONTRACT[table]
    unique = ", unique keys" if contract.unique else ""

    @dg.asset_check(
        asset=key(table),
        name="contract",
        blocking=blocking,
        partitions_def=partitions_def,
        description=f"{table}: contract schema, non-empty {scope}, no null keys{unique}",
    )
    def _check(context: dg.AssetCheckExecutionContext, lake: LakeResource) -> dg.AssetCheckResult:
        from gem_lake.delta import table_stats

        partition = partition_columns(partitions_def, context.partition_key) if partitions_def else None
        stats = table_stats(lake.paths.table(table), partition, contract.keys, contract.keys if contract.unique else ())
        problems = schema_violations(table, stats.schema)
        if stats.rows == 0:
            problems.append(f"{scope} is empty")
        problems += [f"{n} null values in key column {k}" for k, n in stats.nulls.items() if n]
        if stats.repeated_keys:
            problems.append(f"{stats.repeated_keys} rows repeat the key ({', '.join(contract.keys)}) of an earlier row")
        return dg.AssetCheckResult(
            passed=not problems,
            description="; ".join(problems) or "ok",
            metadata={
                "rows": stats.rows,
                **{f"null_{k}": n for k, n in stats.nulls.items()},
                **({"repeated_keys": stats.repeated_keys} if contract.unique else {}),
                "delta_version": stats.version,
            },
        )

    return _check
