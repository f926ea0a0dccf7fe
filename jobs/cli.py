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
    gem promote VERSION               point models/LATEST at VERSION if the promotion rule accepts it;
          [--force --reason TEXT]     --force waives only the comparison with the promoted model (a rollback)
    gem lake drop-columns TABLE COL...
                                      rewrite a lake table without columns a source no longer has
    gem export --ds D [--model-version V]
                                      the export_job for one day: scoring (torchrun), indexes, candidates

All commands use $GEM_HOME (default ./lakehouse) and $GEM_PRESET (default tiny). Arguments are checked
before anything starts (Spark, torchrun, a Dagster run); a bad one is one line naming it and what is allowed.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import warnings
from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import NoReturn

from gem_lake.sql.limits import SQLLimits
from gem_lake.sql.output import FORMATS, ROW_CAP, write_rows
from gem_model.config import ConfigError, GemConfig
from gem_model.paths import GemPaths

# A screenful of neighbours is what the command is for; FAISS's GPU search caps k at 2,048.
MAX_NEIGHBORS = 1000
MAX_ID = 2**63 - 1  # ids are int64 in the lake


def _print_rows(columns: list[str], rows: list[list[object]], fmt: str) -> None:
    write_rows(sys.stdout, columns, rows, fmt)


def run_sql(
    query: str, fmt: str, limit: int | None, variables: dict[str, str] | None = None, limits: SQLLimits | None = None
) -> None:
    """Stream the rows of `query` to stdout as DuckDB produces them: at most `limit` (None: every row),
    each statement under `limits` (default `SQLLimits()`)."""
    import duckdb

    from gem_lake.sql.query import LakeSQL, LakeSQLError

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
    given = {
        "timeout_s": ("--timeout", args.timeout),
        "memory_limit": ("--memory-limit", args.memory_limit),
        "max_temp_directory_size": ("--max-temp-size", args.max_temp_size),
    }
    for name, (option, value) in given.items():
        try:
            if value is not None:
                SQLLimits(**{name: value})
        except ValueError as error:
            parser.error(f"argument {option}: {value}: {error}")
    return SQLLimits(**{name: value for name, (_, value) in given.items() if value is not None})


def _variables(pairs: list[str], parser: argparse.ArgumentParser) -> dict[str, str]:
    variables = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip().isidentifier():
            parser.error(f"argument --var: {pair!r} must be NAME=VALUE, e.g. --var for_user_id=42")
        variables[name.strip()] = value
    return variables


def neighbors(paths: GemPaths, user_id: int, k: int, version: str, day: date) -> None:
    """Print the `k` ads nearest to `user_id` in the ads index of model `version` on `day` (both checked)."""
    import numpy as np

    from gem_model.export.index import read_index
    from gem_model.export.scoring import read_embeddings

    index, manifest = read_index(paths.index_dir("ads", version, day))
    ids, vectors = read_embeddings(paths, "gold.user_embeddings", "user_id", version, day, manifest["dimension"])
    match = np.flatnonzero(ids == user_id)
    if len(match) == 0:
        raise SystemExit(f"gem neighbors: user_id {user_id} has no embedding for model {version} on {day}")
    scores, found = index.search(vectors[match[:1]], k)
    _print_rows(
        ["rank", "ad_id", "score"],
        [[i + 1, int(a), round(float(s), 6)] for i, (a, s) in enumerate(zip(found[0], scores[0])) if a >= 0],
        "table",
    )


def promote(paths: GemPaths, version: str, force_reason: str) -> None:
    """Point models/LATEST at `version` under the teacher asset's own promotion rule; `force_reason` waives
    the comparison with the promoted model (a rollback) and is recorded with the decision."""
    from gem_model.integrity import CorruptArtefactError
    from gem_model.train.promotion import PromotionRefusedError
    from gem_model.train.promotion import promote as promote_version

    try:
        decision = promote_version(paths, version, GemConfig.from_env().promotion, "gem promote", force_reason)
    except (ConfigError, CorruptArtefactError) as error:
        raise SystemExit(f"gem promote: {error}") from None
    except PromotionRefusedError as error:
        rollback = (
            " To roll back past the promoted model anyway: gem promote VERSION --force --reason TEXT"
            if error.decision.regressions and not error.decision.problems
            else ""
        )
        raise SystemExit(f"gem promote: {error}.{rollback}") from None
    print(f"LATEST -> {version} ({decision.description})")


def drop_columns(table: str, columns: list[str]) -> None:
    """Rewrite a lake table without `columns`: the fix a SchemaChangeError names for a column a source dropped."""
    from gem_lake.delta import drop_columns as drop
    from gem_lake.spark.session import build_spark_session

    paths = GemPaths.from_env()
    spark = build_spark_session()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        rows = drop(spark, paths.table(table), columns)
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"gem lake drop-columns: {error}") from None
    print(f"{table}: dropped {', '.join(columns)}; {rows:,} rows rewritten in one commit")


def export(ds: date, version: str) -> None:
    """Run one day's export_job as a run of the code location, as the UI would launch it (arguments checked)."""
    from dagster_project.code_location_runs import CodeLocationRuns, RunFailedError
    from dagster_project.defs.partitions import MODEL_VERSIONS, model_day_key
    from dagster_project.demo import instance_for
    from dagster_project.resources.lake import LakeResource

    lake = LakeResource.from_env()
    instance = instance_for(lake)
    if not instance.has_dynamic_partition(MODEL_VERSIONS.name, version):  # trained elsewhere, or by hand
        instance.add_dynamic_partitions(MODEL_VERSIONS.name, [version])
    try:
        with CodeLocationRuns(instance) as runs:
            run = runs.run("export_job", model_day_key(version, ds))
    except RunFailedError as error:
        raise SystemExit(f"gem export: failed for ds={ds}, model {version}: {error}") from None
    print(f"exported ds={ds} with model {version} (run {run.run_id})")


class _Parser(argparse.ArgumentParser):
    """argparse's parser with one-line errors (`gem neighbors: error: argument --k: ...`, exit status 2): the
    line names the argument and what it allows; `gem COMMAND --help` has the rest."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _day(text: str) -> date:
    """An ISO day, YYYY-MM-DD only (`date.fromisoformat` also takes 20261106 and week dates)."""
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            return date.fromisoformat(text)
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"{text!r} is not a day: give an ISO date YYYY-MM-DD, e.g. 2026-11-06")


def _int_from(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed: give a whole number from {low} to {high:,}")
        return value

    return parse


def _model_version(paths: GemPaths, version: str | None, argument: str, parser: argparse.ArgumentParser) -> str:
    """`version`, or the promoted one where it is None, if it names a finished model; a parser error naming the
    known versions if not (a path such as ../models/V included)."""
    try:
        return paths.require_model_version(version) if version is not None else paths.latest_model_version()
    except (ValueError, FileNotFoundError) as error:
        parser.error(
            f"argument {argument}: {error}" if version is not None else f"argument {argument} not given, and {error}"
        )


def _listing(days: list[date]) -> str:
    if len(days) <= 6:
        return ", ".join(d.isoformat() for d in days)
    return f"{len(days)} days from {days[0]} to {days[-1]}"


def _index_day(paths: GemPaths, version: str, ds: date | None, parser: argparse.ArgumentParser) -> date:
    """`ds`, or the newest day, if model `version` has a published ads index for it; a parser error if not."""
    days = paths.index_days("ads", version)
    if not days:
        parser.error(
            f"argument --model-version: model {version} has no ads index; export a day first: gem export --ds D"
        )
    if ds is not None and ds not in days:
        parser.error(f"argument --ds: model {version} has no ads index for {ds}; its indexes: {_listing(days)}")
    return ds or days[-1]


def _export_day(paths: GemPaths, cfg: GemConfig, ds: date, parser: argparse.ArgumentParser) -> date:
    """`ds` if it is a day of the calendar with user timelines (what scoring reads); a parser error if not."""
    from dagster_project.defs.partitions import daily_partitions
    from gem_lake.delta import partition_days

    calendar = daily_partitions(cfg)
    days = [d for d in partition_days(paths.table("gold.user_timelines")) if calendar.has_partition_key(str(d))]
    if ds not in days:
        parser.error(
            f"argument --ds: {ds} has no data to export; the days with gold.user_timelines rows: "
            f"{_listing(days) or 'none yet (materialise build_features_job for a day first)'}"
        )
    return ds


def main(argv: list[str] | None = None) -> None:
    parser = _Parser(prog="gem", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="materialise the whole asset graph and print a summary")
    demo.add_argument("--verbose", action="store_true", help="print the runs' DEBUG events too")
    sql = sub.add_parser("sql", help="run a read-only query (DuckDB SQL) over the lake")
    sql.add_argument("file", nargs="?", type=Path, help="a .sql file (e.g. sql/row_counts.sql)")
    sql.add_argument("-e", "--execute", help="a query string instead of a file")
    sql.add_argument("--format", choices=FORMATS, default="table")
    rows = sql.add_mutually_exclusive_group()
    rows.add_argument(
        "--limit",
        type=int,
        default=ROW_CAP,
        metavar="N",
        help=f"print at most N rows (default {ROW_CAP}); the output says when more exist",
    )
    rows.add_argument("--all", action="store_true", help="print every row, streamed as they come")
    sql.add_argument(
        "--var",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a variable the file declares (repeatable), e.g. --var for_user_id=42",
    )
    sql.add_argument(
        "--timeout",
        type=float,
        metavar="SECONDS",
        help=f"stop a statement past SECONDS, its rows' output included (default {SQLLimits.timeout_s:g})",
    )
    sql.add_argument(
        "--memory-limit",
        metavar="SIZE",
        help=f"DuckDB's memory, e.g. 2GB (default "
        f"{SQLLimits.memory_limit}); beyond it a query spills to disk under $TMPDIR",
    )
    sql.add_argument(
        "--max-temp-size",
        metavar="SIZE",
        help=f"most a query may spill, e.g. 50GB (default {SQLLimits.max_temp_directory_size})",
    )
    nb = sub.add_parser("neighbors", help="nearest ads to a user from the FAISS index")
    nb.add_argument("--user-id", type=_int_from(0, MAX_ID), required=True)
    nb.add_argument("--k", type=_int_from(1, MAX_NEIGHBORS), default=10, help=f"1 to {MAX_NEIGHBORS} (default 10)")
    nb.add_argument("--model-version", default=None, help="default: the promoted one")
    nb.add_argument("--ds", type=_day, default=None, help="the index's day (default: the newest the version has)")
    pr = sub.add_parser("promote", help="point models/LATEST at a version the promotion rule accepts")
    pr.add_argument("version", metavar="VERSION", help="a model version name (gem sql: meta.models)")
    pr.add_argument(
        "--force", action="store_true", help="waive the comparison with the promoted model (a rollback); needs --reason"
    )
    pr.add_argument("--reason", default="", help="why the comparison is waived, recorded with the decision")
    lk = sub.add_parser("lake", help="maintain the lake's tables").add_subparsers(dest="lake_command", required=True)
    dc = lk.add_parser("drop-columns", help="rewrite a table without some columns (one Delta commit)")
    dc.add_argument("table", help="<layer>.<table>, e.g. bronze.impressions")
    dc.add_argument("columns", nargs="+")
    ex = sub.add_parser("export", help="score, index and generate candidates for one day")
    ex.add_argument("--ds", type=_day, required=True, help="the partition, e.g. 2026-11-06")
    ex.add_argument("--model-version", default=None, help="default: the promoted teacher")
    args = parser.parse_args(argv)
    paths = GemPaths.from_env()
    if args.command == "demo":
        from dagster_project.demo import main as demo_main

        try:
            demo_main(verbose=args.verbose)
        except ConfigError as error:  # GEM_PRESET / GEM_CONFIG / GEM_DATA_SOURCE: the message names key and fix
            raise SystemExit(f"gem demo: {error}") from None
    elif args.command == "sql":
        if (args.file is None) == (args.execute is None):
            sql.error("give exactly one of FILE or -e QUERY")
        if args.limit < 0:
            sql.error(f"argument --limit: {args.limit} must be 0 or more (--all prints every row)")
        run_sql(
            args.execute if args.execute is not None else args.file.read_text(),
            args.format,
            None if args.all else args.limit,
            _variables(args.var, sql),
            _sql_limits(args, sql),
        )
    elif args.command == "export":
        try:
            cfg = GemConfig.from_env()
            version = _model_version(paths, args.model_version, "--model-version", ex)
            export(_export_day(paths, cfg, args.ds, ex), version)
        except ConfigError as error:
            raise SystemExit(f"gem export: {error}") from None
    elif args.command == "promote":
        if args.force != bool(args.reason.strip()):
            pr.error(
                "argument --reason: --force and a non-empty --reason go together: the reason is recorded "
                "with the decision, e.g. --force --reason 'roll back: serving regression'"
            )
        promote(paths, _model_version(paths, args.version, "VERSION", pr), args.reason.strip())
    elif args.command == "lake":
        drop_columns(args.table, args.columns)
    else:
        version = _model_version(paths, args.model_version, "--model-version", nb)
        neighbors(paths, args.user_id, args.k, version, _index_day(paths, version, args.ds, nb))


if __name__ == "__main__":
    main()
