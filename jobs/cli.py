"""`gem`: the command line of GEM Pipeline.

    gem demo [--verbose]              materialise the whole asset graph and print a summary
    gem sql FILE | -e QUERY           read-only SQL (DuckDB) over the lake: tables as <layer>.<table>,
          [--format table|json|csv]   plus meta.models and meta.table_history; one query, after the
          [--var NAME=VALUE ...]      SET VARIABLE defaults it declares; --var overrides one of them
          [--limit N | --all]         (docs/SQL.md), e.g. --var for_user_id=42. Rows stream out, the
          [--timeout SECONDS]         first 1000 unless --limit N or --all; a statement is stopped
          [--memory-limit SIZE]       past its time limit (default 300 s) and spills to disk beyond
          [--max-temp-size SIZE]      its memory limit (4GB), up to a spill limit (16GB)
    gem neighbors --user-id N [--k 10] [--model-version V] [--ds D]
                                      nearest ads to a user from the FAISS ads index of a day
    gem promote VERSION               point models/LATEST at VERSION if its holdout check passes
    gem lake drop-columns TABLE COL...
                                      rewrite a lake table without columns a source no longer has
    gem export --ds D [--model-version V]
                                      the export_job for one day: scoring (torchrun), indexes, candidates

All commands use $GEM_HOME (default ./lakehouse) and $GEM_PRESET (default tiny).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gem_model.config import ConfigError
from gem_model.paths import GemPaths

if TYPE_CHECKING:
    from jobs.sql_limits import SQLLimits


def _print_rows(columns: list[str], rows: list[list[object]], fmt: str) -> None:
    from jobs.sql_output import write_rows

    write_rows(sys.stdout, columns, rows, fmt)


def run_sql(query: str, fmt: str, limit: int | None, variables: dict[str, str] | None = None,
            limits: SQLLimits | None = None) -> None:
    """Stream the rows of `query` to stdout as DuckDB produces them: at most `limit` (None: every row),
    each statement under `limits` (default `SQLLimits()`)."""
    import os
    import warnings

    import duckdb

    from jobs.lake_sql import LakeSQL, LakeSQLError
    from jobs.sql_output import write_rows

    try:
        with warnings.catch_warnings(record=True) as skipped:
            warnings.simplefilter("always")
            sql = LakeSQL(GemPaths.from_env(), limits)
        for warning in skipped:  # an unreadable table, a corrupt commit: on stderr, the rest still queries
            print(f"gem sql: warning: {warning.message}", file=sys.stderr)
        with sql:
            result = sql.query(query, variables)
            batches = result.batches(limit=None if limit is None else limit + 1)  # one more: are there more?
            shown, more = write_rows(sys.stdout, result.columns, (row for b in batches for row in b), fmt, limit)
            sys.stdout.flush()
        if more and fmt != "table":  # stdout holds only the rows
            print(f"gem sql: {shown} rows shown; more exist: --limit N shows N, --all every row", file=sys.stderr)
    except BrokenPipeError:  # the reader left (`| head`): stop quietly, as other Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
    except (LakeSQLError, duckdb.Error) as error:
        raise SystemExit(f"gem sql: {str(error).strip()}") from error


def _sql_limits(args: argparse.Namespace, parser: argparse.ArgumentParser) -> SQLLimits:
    """`SQLLimits` from the options given; an option left out keeps the default `SQLLimits` defines."""
    from jobs.sql_limits import SQLLimits

    given = {"timeout_s": ("--timeout", args.timeout), "memory_limit": ("--memory-limit", args.memory_limit),
             "max_temp_directory_size": ("--max-temp-size", args.max_temp_size)}
    for name, (option, value) in given.items():
        try:
            if value is not None:
                SQLLimits(**{name: value})
        except ValueError as error:
            parser.error(f"gem sql: {option} {value}: {error}")
    return SQLLimits(**{name: value for name, (_, value) in given.items() if value is not None})


def _variables(pairs: list[str], parser: argparse.ArgumentParser) -> dict[str, str]:
    variables = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip().isidentifier():
            parser.error(f"gem sql: --var {pair!r} must be NAME=VALUE, e.g. --var for_user_id=42")
        variables[name.strip()] = value
    return variables


def neighbors(user_id: int, k: int, model_version: str | None, ds: str | None) -> None:
    from datetime import date

    import numpy as np

    from gem_model.export.index import read_index
    from gem_model.export.scoring import read_embeddings

    paths = GemPaths.from_env()
    version = model_version or paths.latest_model_version()
    days = paths.index_days("ads", version)
    if not days:
        raise SystemExit(f"gem neighbors: model {version} has no ads index; run gem export --ds D first")
    index, manifest = read_index(paths.index_dir("ads", version, date.fromisoformat(ds) if ds else days[-1]))
    day = date.fromisoformat(manifest["ds"])
    ids, vectors = read_embeddings(paths, "gold.user_embeddings", "user_id", version, day, manifest["dimension"])
    match = np.flatnonzero(ids == user_id)
    if len(match) == 0:
        raise SystemExit(f"gem neighbors: user_id {user_id} has no embedding for model {version} on {day}")
    scores, found = index.search(vectors[match[:1]], k)
    _print_rows(["rank", "ad_id", "score"],
                [[i + 1, int(a), round(float(s), 6)] for i, (a, s) in enumerate(zip(found[0], scores[0])) if a >= 0],
                "table")


def promote(version: str) -> None:
    """Point models/LATEST at `version` if its holdout check passes (the teacher asset's own rule)."""
    from gem_model.train.promotion import PromotionRefusedError
    from gem_model.train.promotion import promote as promote_version

    try:
        check = promote_version(GemPaths.from_env(), version)
    except (PromotionRefusedError, FileNotFoundError) as error:
        raise SystemExit(f"gem promote: {error}") from None
    print(f"LATEST -> {version} ({check.description})")


def drop_columns(table: str, columns: list[str]) -> None:
    """Rewrite a lake table without `columns`: the fix a SchemaChangeError names for a column a source dropped."""
    from jobs.lake import drop_columns as drop
    from jobs.spark_session import build_spark_session

    paths = GemPaths.from_env()
    spark = build_spark_session()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        rows = drop(spark, paths.table(table), columns)
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"gem lake drop-columns: {error}") from None
    print(f"{table}: dropped {', '.join(columns)}; {rows:,} rows rewritten in one commit")


def export(ds: str, model_version: str | None) -> None:
    """Run one day's export_job as a run of the code location, as the UI would launch it."""
    from datetime import date

    from dagster_project.code_location_runs import CodeLocationRuns, RunFailedError
    from dagster_project.defs.partitions import MODEL_VERSIONS, model_day_key
    from dagster_project.demo import instance_for
    from dagster_project.resources.lake import LakeResource
    from gem_model.train.manifest import read_manifest

    lake = LakeResource.from_env()
    version = model_version or lake.latest_model_version()
    read_manifest(lake.paths.model_dir(version))  # an unknown version fails here, naming the known ones
    instance = instance_for(lake)
    if not instance.has_dynamic_partition(MODEL_VERSIONS.name, version):  # trained elsewhere, or by hand
        instance.add_dynamic_partitions(MODEL_VERSIONS.name, [version])
    try:
        with CodeLocationRuns(instance) as runs:
            run = runs.run("export_job", model_day_key(version, date.fromisoformat(ds)))
    except RunFailedError as error:
        raise SystemExit(f"gem export: failed for ds={ds}, model {version}: {error}") from None
    print(f"exported ds={ds} with model {version} (run {run.run_id})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gem", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="materialise the whole asset graph and print a summary")
    demo.add_argument("--verbose", action="store_true", help="print the runs' DEBUG events too")
    sql = sub.add_parser("sql", help="run a read-only query (DuckDB SQL) over the lake")
    sql.add_argument("file", nargs="?", type=Path, help="a .sql file (e.g. sql/row_counts.sql)")
    sql.add_argument("-e", "--execute", help="a query string instead of a file")
    from jobs.sql_limits import SQLLimits
    from jobs.sql_output import FORMATS, ROW_CAP

    sql.add_argument("--format", choices=FORMATS, default="table")
    rows = sql.add_mutually_exclusive_group()
    rows.add_argument("--limit", type=int, default=ROW_CAP, metavar="N",
                      help=f"print at most N rows (default {ROW_CAP}); the output says when more exist")
    rows.add_argument("--all", action="store_true", help="print every row, streamed as they come")
    sql.add_argument("--var", action="append", default=[], metavar="NAME=VALUE",
                     help="set a variable the file declares (repeatable), e.g. --var for_user_id=42")
    sql.add_argument("--timeout", type=float, metavar="SECONDS", help="stop a statement past SECONDS, "
                     f"its rows' output included (default {SQLLimits.timeout_s:g})")
    sql.add_argument("--memory-limit", metavar="SIZE", help=f"DuckDB's memory, e.g. 2GB (default "
                     f"{SQLLimits.memory_limit}); beyond it a query spills to disk under $TMPDIR")
    sql.add_argument("--max-temp-size", metavar="SIZE", help="most a query may spill, e.g. 50GB (default "
                     f"{SQLLimits.max_temp_directory_size})")
    nb = sub.add_parser("neighbors", help="nearest ads to a user from the FAISS index")
    nb.add_argument("--user-id", type=int, required=True)
    nb.add_argument("--k", type=int, default=10)
    nb.add_argument("--model-version", default=None)
    nb.add_argument("--ds", default=None, help="the index's day (default: the newest the version has)")
    pr = sub.add_parser("promote", help="point models/LATEST at a version whose holdout check passes")
    pr.add_argument("version")
    lk = sub.add_parser("lake", help="maintain the lake's tables").add_subparsers(dest="lake_command", required=True)
    dc = lk.add_parser("drop-columns", help="rewrite a table without some columns (one Delta commit)")
    dc.add_argument("table", help="<layer>.<table>, e.g. bronze.impressions")
    dc.add_argument("columns", nargs="+")
    ex = sub.add_parser("export", help="score, index and generate candidates for one day")
    ex.add_argument("--ds", required=True, help="the partition, e.g. 2026-11-06")
    ex.add_argument("--model-version", default=None, help="default: the latest teacher")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from dagster_project.demo import main as demo_main

        try:
            demo_main(verbose=args.verbose)
        except ConfigError as error:  # GEM_PRESET / GEM_CONFIG / GEM_DATA_SOURCE: the message names key and fix
            raise SystemExit(f"gem demo: {error}") from None
    elif args.command == "sql":
        if (args.file is None) == (args.execute is None):
            parser.error("gem sql: give exactly one of FILE or -e QUERY")
        if args.limit < 0:
            parser.error(f"gem sql: --limit {args.limit} must be 0 or more (--all prints every row)")
        run_sql(args.execute if args.execute is not None else args.file.read_text(), args.format,
                None if args.all else args.limit, _variables(args.var, parser), _sql_limits(args, parser))
    elif args.command == "export":
        try:
            export(args.ds, args.model_version)
        except ConfigError as error:
            raise SystemExit(f"gem export: {error}") from None
    elif args.command == "promote":
        promote(args.version)
    elif args.command == "lake":
        drop_columns(args.table, args.columns)
    else:
        neighbors(args.user_id, args.k, args.model_version, args.ds)


if __name__ == "__main__":
    main()
