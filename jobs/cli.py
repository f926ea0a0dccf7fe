"""`gem`: the command line of GEM Pipeline.

    gem demo                          materialise the whole asset graph and print a summary
    gem sql FILE | -e QUERY           Spark SQL over the lake (tables as <layer>.<table>, plus
          [--format table|json|csv]   meta.models and meta.table_history); runs the statements in
          [--limit N]                 order and prints the last one's rows; --var sets a variable
          [--var NAME=VALUE ...]      the file declares (docs/SQL.md), e.g. --var for_user_id=42
    gem neighbors --user-id N [--k 10] [--model-version V]
                                      nearest ads to a user from the FAISS ads index
    gem export --ds D [--model-version V]
                                      the export_job for one day: scoring (torchrun), indexes, candidates

All commands use $GEM_HOME (default ./lakehouse) and $GEM_PRESET (default tiny).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gem_model.config import ConfigError
from gem_model.paths import GemPaths

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def _print_rows(columns: list[str], rows: list[list[object]], fmt: str) -> None:
    if fmt == "json":
        for row in rows:
            print(json.dumps(dict(zip(columns, row)), default=str))
    elif fmt == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        writer.writerows(rows)
    else:
        cells = [[str(c) for c in columns]] + [["NULL" if v is None else str(v) for v in row] for row in rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
        for n, row in enumerate(cells):
            print("  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip())
            if n == 0:
                print("  ".join("-" * w for w in widths))
        print(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")


def strip_comments(sql: str) -> str:
    """Drop `--` line comments (outside quotes), so a `;` in a comment does not split statements."""
    lines = []
    for line in sql.splitlines():
        quoted, cut = None, len(line)
        for i, ch in enumerate(line):
            if quoted:
                quoted = None if ch == quoted else quoted
            elif ch in "'\"`":
                quoted = ch
            elif line.startswith("--", i):
                cut = i
                break
        lines.append(line[:cut])
    return "\n".join(lines)


def sql_statements(query: str) -> list[str]:
    return [s.strip() for s in strip_comments(query).split(";") if s.strip()]


def execute_sql(spark: SparkSession, query: str, variables: dict[str, str] | None = None) -> DataFrame:
    """Run `query`'s statements in order and return the last one's DataFrame.

    `variables` (name -> value, as text) are set with `SET VAR` just before the last statement, so they
    override the defaults the file's `DECLARE OR REPLACE VARIABLE` statements gave them; Spark casts the
    text to the declared type (BIGINT, DATE, ...) and names an undeclared variable in its error.
    """
    statements = sql_statements(query)
    if not statements:
        raise ValueError("the query is empty: give at least one SQL statement")
    for statement in statements[:-1]:
        spark.sql(statement)
    for name, value in (variables or {}).items():
        literal = value.replace("\\", "\\\\").replace("'", "\\'")
        spark.sql(f"SET VAR {name} = '{literal}'")
    return spark.sql(statements[-1])


def run_sql(query: str, fmt: str, limit: int | None, variables: dict[str, str] | None = None) -> None:
    from jobs.lake import register_tables
    from jobs.spark_session import build_spark_session

    spark = build_spark_session()
    spark.sparkContext.setLogLevel("ERROR")
    register_tables(spark, GemPaths.from_env())
    if not sql_statements(query):
        raise SystemExit("gem sql: the query is empty")
    df = execute_sql(spark, query, variables)
    if limit is not None:
        df = df.limit(limit)
    _print_rows(df.columns, [list(r) for r in df.collect()], fmt)


def _variables(pairs: list[str], parser: argparse.ArgumentParser) -> dict[str, str]:
    variables = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip().isidentifier():
            parser.error(f"gem sql: --var {pair!r} must be NAME=VALUE, e.g. --var for_user_id=42")
        variables[name.strip()] = value
    return variables


def neighbors(user_id: int, k: int, model_version: str | None) -> None:
    from datetime import date

    import numpy as np

    from gem_model.export.index import read_index
    from gem_model.export.scoring import read_embeddings

    paths = GemPaths.from_env()
    version = model_version or paths.latest_model_version()
    index, manifest = read_index(paths.index_dir("ads", version))
    ds = date.fromisoformat(manifest["ds"])
    ids, vectors = read_embeddings(paths, "gold.user_embeddings", "user_id", version, ds, manifest["dimension"])
    match = np.flatnonzero(ids == user_id)
    if len(match) == 0:
        raise SystemExit(f"gem neighbors: user_id {user_id} has no embedding for model {version} on {ds}")
    scores, found = index.search(vectors[match[:1]], k)
    _print_rows(["rank", "ad_id", "score"],
                [[i + 1, int(a), round(float(s), 6)] for i, (a, s) in enumerate(zip(found[0], scores[0])) if a >= 0],
                "table")


def export(ds: str, model_version: str | None) -> None:
    """Materialise one day's export assets in process, recorded in the Dagster instance like a UI run."""
    from dagster_project.definitions import build_definitions
    from dagster_project.defs.export.assets import EXPORT_OPS
    from dagster_project.demo import instance_for
    from dagster_project.resources.lake import LakeResource

    lake = LakeResource.from_env()
    version = model_version or lake.latest_model_version()
    result = build_definitions(lake=lake).resolve_job_def("export_job").execute_in_process(
        instance=instance_for(lake), partition_key=ds, raise_on_error=False,
        run_config={"ops": {op: {"config": {"model_version": version}} for op in EXPORT_OPS}})
    if not result.success:
        failures = [e.step_failure_data.error for e in result.all_events if e.is_step_failure]
        raise SystemExit(f"gem export: failed for ds={ds}, model {version}: "
                         + "; ".join(str(f.cause or f).strip().splitlines()[0] for f in failures if f))
    print(f"exported ds={ds} with model {version} (run {result.run_id})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gem", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("demo", help="materialise the whole asset graph and print a summary")
    sql = sub.add_parser("sql", help="run Spark SQL over the lake")
    sql.add_argument("file", nargs="?", type=Path, help="a .sql file (e.g. sql/row_counts.sql)")
    sql.add_argument("-e", "--execute", help="a query string instead of a file")
    sql.add_argument("--format", choices=("table", "json", "csv"), default="table")
    sql.add_argument("--limit", type=int, default=None)
    sql.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                     help="set a variable the file declares (repeatable), e.g. --var for_user_id=42")
    nb = sub.add_parser("neighbors", help="nearest ads to a user from the FAISS index")
    nb.add_argument("--user-id", type=int, required=True)
    nb.add_argument("--k", type=int, default=10)
    nb.add_argument("--model-version", default=None)
    ex = sub.add_parser("export", help="score, index and generate candidates for one day")
    ex.add_argument("--ds", required=True, help="the partition, e.g. 2026-11-06")
    ex.add_argument("--model-version", default=None, help="default: the latest teacher")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from dagster_project.demo import main as demo_main

        try:
            demo_main()
        except ConfigError as error:  # GEM_PRESET / GEM_CONFIG / GEM_DATA_SOURCE: the message names key and fix
            raise SystemExit(f"gem demo: {error}") from None
    elif args.command == "sql":
        if (args.file is None) == (args.execute is None):
            parser.error("gem sql: give exactly one of FILE or -e QUERY")
        run_sql(args.execute if args.execute is not None else args.file.read_text(), args.format, args.limit,
                _variables(args.var, parser))
    elif args.command == "export":
        try:
            export(args.ds, args.model_version)
        except ConfigError as error:
            raise SystemExit(f"gem export: {error}") from None
    else:
        neighbors(args.user_id, args.k, args.model_version)


if __name__ == "__main__":
    main()
