"""`gem`: the command line of GEM Pipeline.

    gem demo                          materialise the whole asset graph and print a summary
    gem sql FILE | -e QUERY           Spark SQL over the lake (tables as <layer>.<table>)
          [--format table|json|csv] [--limit N]
    gem neighbors --user-id N [--k 10] [--model-version V]
                                      nearest ads to a user from the FAISS ads index

All commands use $GEM_HOME (default ./lakehouse) and $GEM_PRESET (default tiny).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from gem_model.paths import GemPaths


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


def run_sql(query: str, fmt: str, limit: int | None) -> None:
    from jobs.lake import register_tables
    from jobs.spark_session import build_spark_session

    spark = build_spark_session()
    spark.sparkContext.setLogLevel("ERROR")
    register_tables(spark, GemPaths.from_env())
    statements = [s.strip() for s in strip_comments(query).split(";") if s.strip()]
    if not statements:
        raise SystemExit("gem sql: the query is empty")
    for statement in statements:
        df = spark.sql(statement)
        if limit is not None:
            df = df.limit(limit)
        _print_rows(df.columns, [list(r) for r in df.collect()], fmt)


def neighbors(user_id: int, k: int, model_version: str | None) -> None:
    from datetime import date

    import numpy as np

    from gem_model.export.index import read_index
    from gem_model.export.scoring import read_embeddings

    paths = GemPaths.from_env()
    version = model_version or paths.latest_model_version()
    index, manifest = read_index(paths.index_dir("ads", version))
    ds = date.fromisoformat(manifest["ds"])
    ids, vectors = read_embeddings(paths, "gold.user_embeddings", "user_id", version, ds)
    match = np.flatnonzero(ids == user_id)
    if len(match) == 0:
        raise SystemExit(f"gem neighbors: user_id {user_id} has no embedding for model {version} on {ds}")
    scores, found = index.search(vectors[match[:1]], k)
    _print_rows(["rank", "ad_id", "score"],
                [[i + 1, int(a), round(float(s), 6)] for i, (a, s) in enumerate(zip(found[0], scores[0])) if a >= 0],
                "table")


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
    nb = sub.add_parser("neighbors", help="nearest ads to a user from the FAISS index")
    nb.add_argument("--user-id", type=int, required=True)
    nb.add_argument("--k", type=int, default=10)
    nb.add_argument("--model-version", default=None)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from dagster_project.demo import main as demo_main

        demo_main()
    elif args.command == "sql":
        if (args.file is None) == (args.execute is None):
            parser.error("gem sql: give exactly one of FILE or -e QUERY")
        run_sql(args.execute if args.execute is not None else args.file.read_text(), args.format, args.limit)
    else:
        neighbors(args.user_id, args.k, args.model_version)


if __name__ == "__main__":
    main()
