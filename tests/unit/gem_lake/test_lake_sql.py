"""`gem_lake.sql.query`: SQL over the lake is read-only by construction, and bounded.

Every attack class is run against a small Spark-written lake, and each must fail with a clear error
AND leave the data as it was: the sha256 of every file under GEM_HOME (lake and models) and of a
folder outside it, and every Delta table's version and history length, are compared before and
after. The statement filter is tested through `LakeSQL.query`; the engine's own locks are tested
underneath it, on the session's connection, so that neither layer is the only one. The queries that
would exhaust the machine (a cross join, a recursive CTE without end, a sort that spills) are run
under small limits, in a `gem sql` subprocess where its peak memory or a SIGKILL matters.
"""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from gem_lake.delta import existing_tables
from gem_lake.sql.limits import SQLLimits
from gem_lake.sql.query import LakeSQL, LakeSQLError, LakeSQLLimitError, parse_sql, referenced_tables
from gem_model.paths import GemPaths

pytestmark = pytest.mark.spark
D1, D2 = date(2026, 11, 1), date(2026, 11, 2)
SECRET = "not-for-sql"


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory) -> GemPaths:
    """gold.training_examples (2 commits, partitioned by ds), bronze.impressions (1 commit), one model."""
    paths = GemPaths(tmp_path_factory.mktemp("lake_sql") / "gem")
    schema = "impression_id string, ds date, clicked boolean"
    for rows in ([("i1", D1, True), ("i2", D1, False)], [("i3", D2, True)]):
        (
            spark.createDataFrame(rows, schema)
            .coalesce(1)
            .write.format("delta")
            .mode("append")
            .partitionBy("ds")
            .save(str(paths.table("gold.training_examples")))
        )
    (
        spark.createDataFrame([("i1", D1, True)], schema)
        .coalesce(1)
        .write.format("delta")
        .save(str(paths.table("bronze.impressions")))
    )
    (paths.model_dir("m1")).mkdir(parents=True)
    (paths.model_dir("m1") / "manifest.json").write_text(
        json.dumps(
            {
                "model_version": "m1",
                "created_at": "2026-11-03T00:00:00+00:00",
                "training_data": {"table": "gold.training_examples", "delta_version": 1, "train_days": ["2026-11-01"]},
            }
        )
    )
    paths.set_latest_model_version("m1")
    return paths


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder outside the lake with a file SQL must not read, and where it must not write."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.csv").write_text(f"secret\n{SECRET}\n")
    return folder


@pytest.fixture
def sql(lake: GemPaths) -> Iterator[LakeSQL]:
    with LakeSQL(lake) as session:
        yield session


def _files(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _state(paths: GemPaths, outside: Path) -> dict[str, object]:
    """Every file of GEM_HOME and of `outside` by content, and every Delta table's version and history."""
    tables = {}
    for name, path in existing_tables(paths).items():
        table = DeltaTable(str(path))
        tables[name] = (table.version(), len(table.history()))
    return {"home": _files(paths.home), "outside": _files(outside), "tables": tables}


def test_queries_read_the_current_lake_and_leave_it_unchanged(lake, outside):
    before = _state(lake, outside)
    assert before["tables"] == {"gold.training_examples": (1, 2), "bronze.impressions": (0, 1)}
    with LakeSQL(lake) as sql:
        assert sql.tables == ("bronze.impressions", "gold.training_examples", "meta.models", "meta.table_history")
        rows = sql.query("SELECT ds, count(*) AS n FROM gold.training_examples GROUP BY ds ORDER BY ds").fetchall()
        assert rows == [(D1, 2), (D2, 1)]
        history = sql.query("SELECT table_name, version, operation FROM meta.table_history ORDER BY ALL").fetchall()
        assert history == [
            ("bronze.impressions", 0, "WRITE"),
            ("gold.training_examples", 0, "WRITE"),
            ("gold.training_examples", 1, "WRITE"),
        ]
        assert sql.query("SELECT model_version, is_latest, last_train_day FROM meta.models").fetchall() == [
            ("m1", True, D1)
        ]
    assert _state(lake, outside) == before


def test_statements_are_split_by_the_parser_not_by_semicolons(sql):
    assert sql.query("SELECT 'a;b' AS x").fetchall() == [("a;b",)]
    assert sql.query("SELECT 1 /* ; SELECT 2; */ AS x -- ; SELECT 3").fetchall() == [(1,)]
    text = "-- the default; with a semicolon\nSET VARIABLE s = 'x;y';\n/* ; */ SELECT getvariable('s') AS s;"
    assert parse_sql(text).variables == ["s"]
    assert sql.query(text).fetchall() == [("x;y",)]
    assert referenced_tables("-- gold.in_a_comment\nSELECT 'gold.in_a_string' FROM gold.x /* meta.y */") == ["gold.x"]


def test_variables_override_declared_defaults_with_their_type(sql):
    text = (
        "SET VARIABLE for_ds = NULL::DATE; SET VARIABLE top_k = 10::INTEGER;\n"
        "SELECT getvariable('for_ds') AS d, getvariable('top_k') AS k, typeof(getvariable('top_k')) AS t"
    )
    assert sql.query(text).fetchall() == [(None, 10, "INTEGER")]
    assert sql.query(text, {"for_ds": "2026-11-02", "top_k": "3"}).fetchall() == [(D2, 3, "INTEGER")]
    # the next query starts from its own defaults: a variable never leaks from one text to the next
    assert sql.query("SELECT getvariable('top_k') AS k").fetchall() == [(None,)]
    with pytest.raises(LakeSQLError, match=r"variable 'k' is not declared by this SQL \(it declares: for_ds, top_k\)"):
        sql.query(text, {"k": "3"})
    with pytest.raises(LakeSQLError, match=r"variable for_ds='yesterday' is not a DATE"):
        sql.query(text, {"for_ds": "yesterday"})


def test_a_variable_value_is_data_never_sql(lake, outside, sql):
    before = _state(lake, outside)
    value = "x'; DROP VIEW gold.training_examples; COPY (SELECT 1) TO 'evil.csv'; --"
    text = "SET VARIABLE v = NULL::VARCHAR; SELECT getvariable('v') AS v"
    assert sql.query(text, {"v": value}).fetchall() == [(value,)]
    assert sql.query("SELECT count(*) FROM gold.training_examples").fetchall() == [(3,)]
    assert _state(lake, outside) == before


REFUSED = r"is refused \({kind}, not a query\): SQL over the lake is read-only"
NOT_DUCKDB = r"not DuckDB SQL: Parser Error"
NO_FILES = r"file system operations are disabled by configuration"
CTE_WRITES = r"is refused: its CTE `{cte}` writes \({kind}\)"
# (id, SQL with {lake} / {outside} placeholders, what the error says)
ATTACKS = [
    (
        "insert",
        "INSERT INTO gold.training_examples SELECT * FROM gold.training_examples",
        REFUSED.format(kind="INSERT"),
    ),
    (
        "insert-with-cte",
        "WITH r AS (SELECT * FROM gold.training_examples) INSERT INTO gold.training_examples SELECT * FROM r",
        REFUSED.format(kind="INSERT"),
    ),
    ("update", "UPDATE gold.training_examples SET clicked = true", REFUSED.format(kind="UPDATE")),
    ("delete", "DELETE FROM gold.training_examples", REFUSED.format(kind="DELETE")),
    (
        "merge",
        "MERGE INTO gold.training_examples t USING bronze.impressions s ON t.impression_id = s.impression_id "
        "WHEN MATCHED THEN DELETE",
        REFUSED.format(kind="MERGE INTO"),
    ),
    ("truncate", "TRUNCATE gold.training_examples", REFUSED.format(kind="DELETE")),
    ("alter-table", "ALTER TABLE gold.training_examples ADD COLUMN x INTEGER", REFUSED.format(kind="ALTER")),
    ("alter-view", "ALTER VIEW gold.training_examples RENAME TO gone", REFUSED.format(kind="ALTER")),
    ("optimize", "OPTIMIZE gold.training_examples", NOT_DUCKDB),
    ("restore", "RESTORE TABLE gold.training_examples TO VERSION AS OF 0", NOT_DUCKDB),
    ("vacuum", "VACUUM gold.training_examples", REFUSED.format(kind="VACUUM")),
    ("vacuum-retain", "VACUUM gold.training_examples RETAIN 0 HOURS", NOT_DUCKDB),
    (
        "set-then-vacuum",
        "SET spark.databricks.delta.retentionDurationCheck.enabled = false; "
        "VACUUM gold.training_examples RETAIN 0 HOURS",
        NOT_DUCKDB,
    ),
    ("create-table", "CREATE TABLE gold.copy AS SELECT * FROM gold.training_examples", REFUSED.format(kind="CREATE")),
    ("create-table-at-a-path", "CREATE TABLE t USING delta LOCATION '{outside}/t'", NOT_DUCKDB),
    ("create-view", "CREATE VIEW gold.v AS SELECT 1 AS x", REFUSED.format(kind="CREATE")),
    (
        "replace-a-lake-view",
        "CREATE OR REPLACE VIEW gold.training_examples AS SELECT 1 AS x",
        REFUSED.format(kind="CREATE"),
    ),
    ("create-macro", "CREATE MACRO evil(x) AS x", REFUSED.format(kind="CREATE")),
    ("drop-view", "DROP VIEW gold.training_examples", REFUSED.format(kind="DROP")),
    ("drop-schema", "DROP SCHEMA gold CASCADE", REFUSED.format(kind="DROP")),
    ("set-config", "SET enable_external_access = true", REFUSED.format(kind="SET")),
    ("set-memory", "SET memory_limit = '1TB'", REFUSED.format(kind="SET")),
    ("reset", "RESET enable_external_access", REFUSED.format(kind="SET")),
    ("use", "USE gold", REFUSED.format(kind="SET")),
    ("pragma", "PRAGMA enable_profiling", REFUSED.format(kind="PRAGMA")),
    ("call", "CALL enable_logging()", REFUSED.format(kind="CALL")),
    ("checkpoint", "CHECKPOINT", REFUSED.format(kind="CALL")),
    ("attach", "ATTACH '{lake}/gold/evil.duckdb' AS evil", REFUSED.format(kind="ATTACH")),
    ("install", "INSTALL httpfs", REFUSED.format(kind="LOAD")),
    ("load", "LOAD '{outside}/evil.duckdb_extension'", REFUSED.format(kind="LOAD")),
    ("update-extensions", "UPDATE EXTENSIONS", r"is refused \(a statement without a type name, not a query\)"),
    (
        "copy-into-the-lake",
        "COPY gold.training_examples TO '{lake}/gold/training_examples/evil.parquet'",
        REFUSED.format(kind="COPY"),
    ),
    (
        "copy-to-a-file",
        "COPY (SELECT * FROM gold.training_examples) TO '{outside}/out.csv'",
        REFUSED.format(kind="COPY"),
    ),
    ("copy-from-a-file", "COPY gold.training_examples FROM '{outside}/secret.csv'", REFUSED.format(kind="COPY")),
    ("export-database", "EXPORT DATABASE '{outside}/export'", REFUSED.format(kind="EXPORT")),
    ("prepare", "PREPARE p AS DELETE FROM gold.training_examples", REFUSED.format(kind="PREPARE")),
    ("transaction", "BEGIN TRANSACTION", REFUSED.format(kind="TRANSACTION")),
    ("read-csv", "SELECT * FROM read_csv('{outside}/secret.csv')", NO_FILES),
    ("read-text", "SELECT content FROM read_text('{outside}/secret.csv')", NO_FILES),
    ("read-blob", "SELECT content FROM read_blob('{outside}/secret.csv')", NO_FILES),
    ("read-parquet-of-the-lake", "SELECT * FROM read_parquet('{lake}/gold/training_examples/*/*.parquet')", NO_FILES),
    ("path-as-a-table", "SELECT * FROM '{outside}/secret.csv'", NO_FILES),
    ("glob", "SELECT * FROM glob('{outside}/*')", NO_FILES),
    (
        "file-in-a-variable",
        "SET VARIABLE s = (SELECT content FROM read_text('{outside}/secret.csv'));\nSELECT getvariable('s')",
        NO_FILES,
    ),
    ("file-in-a-nested-query", "SELECT * FROM query('SELECT * FROM read_text(''{outside}/secret.csv'')')", NO_FILES),
    ("two-queries", "SELECT 1; SELECT 2", r"statement 2 `SELECT 2` is a second query"),
    (
        "query-then-write",
        "SELECT count(*) FROM gold.training_examples; DELETE FROM gold.training_examples",
        REFUSED.format(kind="DELETE"),
    ),
    ("declaration-after-the-query", "SELECT 1; SET VARIABLE x = 1", r"comes after the query"),
    ("add-jar", "ADD JAR '{outside}/evil.jar'", NOT_DUCKDB),
    ("temporary-function", "CREATE TEMPORARY FUNCTION evil AS 'com.example.Evil'", NOT_DUCKDB),
    ("reflect", "SELECT reflect('java.lang.Runtime', 'getRuntime')", r"Scalar Function with name reflect does not"),
    ("java-method", "SELECT java_method('java.lang.System', 'exit', 1)", r"with name java_method does not exist"),
    ("execute-immediate", "EXECUTE IMMEDIATE 'DELETE FROM gold.training_examples'", NOT_DUCKDB),
    ("spark-variable", "DECLARE OR REPLACE VARIABLE x INT DEFAULT 1; SELECT x", NOT_DUCKDB),
    # data-modifying CTEs: typed SELECT by the parser, refused by their parse tree at any depth
    (
        "cte-delete",
        "WITH d AS (DELETE FROM gold.training_examples RETURNING *) SELECT count(*) FROM d",
        CTE_WRITES.format(cte="d", kind="DELETE"),
    ),
    (
        "cte-update",
        "WITH u AS (UPDATE gold.training_examples SET clicked = NOT clicked RETURNING *) SELECT * FROM u",
        CTE_WRITES.format(cte="u", kind="UPDATE"),
    ),
    (
        "cte-insert",
        "WITH i AS (INSERT INTO gold.training_examples SELECT * FROM gold.training_examples "
        "RETURNING *) SELECT * FROM i",
        CTE_WRITES.format(cte="i", kind="INSERT"),
    ),
    (
        "cte-delete-never-read",
        "WITH d AS MATERIALIZED (DELETE FROM gold.training_examples RETURNING *) SELECT 1",
        CTE_WRITES.format(cte="d", kind="DELETE"),
    ),
    (
        "cte-delete-in-a-cte",
        "WITH a AS (WITH d AS (DELETE FROM gold.training_examples RETURNING *) SELECT * FROM d) SELECT * FROM a",
        CTE_WRITES.format(cte="d", kind="DELETE"),
    ),
    (
        "cte-delete-in-a-subquery",
        "SELECT (WITH d AS (DELETE FROM gold.training_examples RETURNING *) SELECT count(*) FROM d) AS n",
        CTE_WRITES.format(cte="d", kind="DELETE"),
    ),
    (
        "cte-delete-in-a-union",
        "SELECT 1 AS n UNION ALL (WITH d AS (DELETE FROM gold.training_examples RETURNING *) SELECT count(*) FROM d)",
        CTE_WRITES.format(cte="d", kind="DELETE"),
    ),
    (
        "cte-delete-in-a-recursive-cte",
        "WITH RECURSIVE r AS (SELECT 1 AS n UNION ALL (WITH d AS (DELETE FROM "
        "gold.training_examples RETURNING *) SELECT n + 1 FROM r, d)) SELECT * FROM r",
        CTE_WRITES.format(cte="d", kind="DELETE"),
    ),
    (
        "cte-delete-in-a-declaration",
        "SET VARIABLE n = (WITH d AS (DELETE FROM gold.training_examples RETURNING *) "
        "SELECT count(*) FROM d);\nSELECT getvariable('n')",
        CTE_WRITES.format(cte="d", kind="DELETE"),
    ),
    (
        "cte-copy",
        "WITH c AS (COPY gold.training_examples TO '{outside}/out.csv') SELECT * FROM c",
        CTE_WRITES.format(cte="c", kind="COPY"),
    ),
    (
        "cte-delete-in-a-nested-query",
        "SELECT * FROM query('WITH d AS (DELETE FROM gold.training_examples RETURNING *) SELECT * FROM d')",
        r"data-modifying statement must be at the top level",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("attack", "match"), [(a, m) for _, a, m in ATTACKS], ids=[i for i, _, _ in ATTACKS])
def test_every_attack_fails_and_leaves_the_data_unchanged(lake, outside, sql, attack, match):
    before = _state(lake, outside)
    with pytest.raises((LakeSQLError, duckdb.Error), match=match):
        sql.query(attack.format(lake=lake.lake, outside=outside)).fetchall()
    assert _state(lake, outside) == before
    assert sql.query("SELECT count(*) FROM gold.training_examples").fetchall() == [(3,)]  # the session still reads


@pytest.mark.parametrize(
    ("statement", "match"),
    [
        ("COPY gold.training_examples TO '{lake}/gold/training_examples/evil.parquet'", NO_FILES),
        ("COPY (SELECT 1) TO '{outside}/out.csv'", NO_FILES),
        ("EXPORT DATABASE '{outside}/export'", NO_FILES),
        ("ATTACH '{lake}/gold/evil.duckdb' AS evil", r"disabled|Permission"),
        ("INSTALL httpfs", r"disabled|Permission"),
        ("LOAD '{outside}/evil.duckdb_extension'", r"disabled|Permission"),
        ("SET enable_external_access = true", r"the configuration has been locked"),
        ("SET lock_configuration = false", r"the configuration has been locked"),
        ("RESET memory_limit", r"the configuration has been locked"),
        # a lake table is a view over a read-only Arrow scan: there is no table to write to
        ("INSERT INTO gold.training_examples SELECT * FROM gold.training_examples", r"is not an table"),
        ("DELETE FROM gold.training_examples", r"Can only delete from base table"),
        (
            "WITH d AS (DELETE FROM gold.training_examples RETURNING *) SELECT count(*) FROM d",
            r"Can only delete from base table",
        ),
        ("SELECT * FROM read_csv('{outside}/secret.csv')", NO_FILES),
    ],
)
def test_the_engine_itself_refuses_files_extensions_and_settings(lake, outside, sql, statement, match):
    """Below the statement filter: the locked DuckDB connection refuses these on its own."""
    before = _state(lake, outside)
    with pytest.raises(duckdb.Error, match=match):
        sql._con.execute(statement.format(lake=lake.lake, outside=outside)).fetchall()
    assert _state(lake, outside) == before


def test_a_query_cannot_reach_the_callers_python_objects(sql):
    secret_frame = pa.table({"secret": [SECRET]})  # a replacement scan would find it by its name
    with pytest.raises(duckdb.CatalogException, match="secret_frame does not exist"):
        sql._con.sql("SELECT * FROM secret_frame").fetchall()
    assert secret_frame.num_rows == 1


def test_gem_sql_refuses_a_write_with_a_message_and_no_traceback(lake, outside, monkeypatch):
    from jobs.cli import main

    monkeypatch.setenv("GEM_HOME", str(lake.home))
    before = _state(lake, outside)
    with pytest.raises(SystemExit, match=r"^gem sql: statement 1 `DELETE FROM gold.training_examples` is refused"):
        main(["sql", "-e", "DELETE FROM gold.training_examples"])
    with pytest.raises(SystemExit, match=r"^gem sql: variable 'nope' is not declared"):
        main(["sql", "-e", "SELECT 1", "--var", "nope=1"])
    assert _state(lake, outside) == before


@pytest.mark.parametrize(
    ("refused", "says", "instead", "rows"),
    [
        (
            "PIVOT gold.training_examples ON clicked USING count(*) GROUP BY ds",
            r"a PIVOT without `IN \(\.\.\.\)` after its ON column is two statements",
            "SELECT * FROM (PIVOT gold.training_examples ON clicked IN (true, false) USING count(*) GROUP BY ds) "
            "ORDER BY ds",
            [(D1, 1, 1), (D2, 1, 0)],
        ),
        (
            "CALL pragma_table_info('gold.training_examples')",
            r"`CALL f\(\.\.\.\)` reads as `SELECT \* FROM f\(\.\.\.\)`",
            "SELECT name FROM pragma_table_info('gold.training_examples') ORDER BY cid",
            [("impression_id",), ("ds",), ("clicked",)],
        ),
        (
            "PRAGMA table_info('gold.training_examples')",
            r"`SELECT \* FROM pragma_table_info\('gold.t'\)`",
            "SELECT name FROM pragma_table_info('gold.training_examples') ORDER BY cid",
            [("impression_id",), ("ds",), ("clicked",)],
        ),
        (
            "CREATE TABLE clicks AS SELECT * FROM gold.training_examples WHERE clicked",
            r"use `WITH name AS \(SELECT \.\.\.\) SELECT \.\.\. FROM name`",
            "WITH clicks AS (SELECT * FROM gold.training_examples WHERE clicked) SELECT count(*) FROM clicks",
            [(2,)],
        ),
    ],
)
def test_a_refused_statement_duckdb_runs_another_way_says_how(sql, refused, says, instead, rows):
    with pytest.raises(LakeSQLError, match=says):
        sql.query(refused)
    assert sql.query(instead).fetchall() == rows  # and the way it names runs, in the locked session


def test_a_query_is_read_in_batches_with_its_limit_pushed_into_it(sql):
    query = sql.query("SELECT range AS n FROM range(2500) ORDER BY n DESC;  -- a trailing comment")
    assert query.columns == ["n"]
    assert [len(b) for b in query.batches(rows=1000)] == [1000, 1000, 500]
    assert [n for b in query.batches(rows=2, limit=3) for (n,) in b] == [2499, 2498, 2497]
    assert query.count() == 2500
    assert query.head(2) == [(2499,), (2498,)]
    with pytest.raises(LakeSQLError, match=r"batches\(rows=0, limit=None\): rows must be 1 or more"):
        query.batches(rows=0)
    stream = sql.query("SELECT * FROM range(100000000)").batches(rows=10)
    assert next(stream) == [(n,) for n in range(10)]
    stream.close()  # left early: the connection is free for the next statement at once
    assert sql.query("SELECT count(*) FROM gold.training_examples").fetchall() == [(3,)]


NEVER_ENDS = "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"


def _slowly(query) -> None:
    """Read one row at a time, spending longer on each than DuckDB does: the reader's time counts too."""
    for _ in query.batches(rows=1):
        time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.parametrize(
    "run",
    [
        lambda sql: sql.query(NEVER_ENDS).fetchall(),
        lambda sql: sql.query(f"SET VARIABLE n = ({NEVER_ENDS});\nSELECT getvariable('n')"),
        lambda sql: _slowly(sql.query("SELECT * FROM range(1000000)")),
    ],
    ids=["query", "declaration", "slow-reader"],
)
def test_a_statement_is_stopped_at_its_time_limit_naming_it(lake, run):
    timeout = 2.0
    with LakeSQL(lake, SQLLimits(timeout_s=timeout)) as sql:
        start = time.monotonic()
        with pytest.raises(LakeSQLLimitError, match=r"ran past its time limit of 2 s .* `gem sql --timeout SECONDS`"):
            run(sql)
        elapsed = time.monotonic() - start
        # Stopped by the limit: not before it, and long before the statement's own end (never, or hours away);
        # the upper bound leaves a loaded machine a minute of delay.
        assert timeout <= elapsed < timeout + 60
        assert sql.query("SELECT count(*) FROM gold.training_examples").fetchall() == [(3,)]


@pytest.mark.slow
def test_a_long_statement_prints_nothing_on_stdout(lake):
    """DuckDB draws a progress bar on stdout after 2 s (in a plain process, not under pytest's capture),
    which would land among the rows of `gem sql --format csv > file` and in the pack's run logs."""
    code = (
        "import sys; from gem_model.paths import GemPaths\n"
        "from gem_lake.sql.query import LakeSQL, LakeSQLLimitError\n"
        "from gem_lake.sql.limits import SQLLimits\n"
        "with LakeSQL(GemPaths.from_env(), SQLLimits(timeout_s=3)) as sql:\n"
        "    try:\n"
        "        sql.query('SELECT count(DISTINCT a.range * 1000000 + b.range) FROM range(1000000) a, '\n"
        "                  'range(1000000) b').count()\n"
        "    except LakeSQLLimitError as error:\n"
        "        print(error, file=sys.stderr)\n"
    )
    env = dict(os.environ, GEM_HOME=str(lake.home), PYTHONPATH=str(Path(__file__).parents[3]))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.stderr.startswith("the statement ran past its time limit of 3 s")
    assert done.stdout == ""


def test_a_query_past_the_memory_and_spill_limits_is_stopped_naming_them(lake, tmp_path):
    doubling = (
        "WITH RECURSIVE r(n, pad) AS (SELECT 1, repeat('x', 1000) UNION ALL "
        "SELECT n + 1, pad FROM r, range(2) WHERE n < 40) SELECT count(*) FROM r"
    )  # 2^40 rows of 1 kB
    with LakeSQL(lake, SQLLimits(memory_limit="64MB", max_temp_directory_size="64MB"), spill_root=tmp_path) as sql:
        with pytest.raises(
            LakeSQLLimitError,
            match=r"Out of Memory.*memory_limit is 64MB and "
            r"max_temp_directory_size 64MB; raise them with `gem sql",
        ):
            sql.query(doubling).fetchall()
        assert sql.query("SELECT count(*) FROM gold.training_examples").fetchall() == [(3,)]
    assert list(tmp_path.iterdir()) == []  # close removed the spill folder


def _gem_sql_child(args: list[str], home: Path, tmp: Path, stderr: int) -> subprocess.Popen:
    """`gem sql ARGS` in a child process over the lake at `home`, spilling under `tmp`; stdout discarded."""
    env = dict(os.environ, GEM_HOME=str(home), TMPDIR=str(tmp), PYTHONPATH=str(Path(__file__).parents[3]))
    return subprocess.Popen(
        [sys.executable, "-m", "jobs.cli", "sql", *args], env=env, stdout=subprocess.DEVNULL, stderr=stderr
    )


def _gem_sql(args: list[str], home: Path, tmp: Path) -> tuple[float, float, int, str]:
    """Run `gem sql ARGS` to its end: (the child's peak RSS in MiB, seconds, exit status, stderr)."""
    start = time.monotonic()
    child = _gem_sql_child(args, home, tmp, subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage, not every child's of pytest
    elapsed = time.monotonic() - start
    return usage.ru_maxrss / 1024, elapsed, os.waitstatus_to_exitcode(status), child.stderr.read().decode()


@pytest.mark.slow
@pytest.mark.parametrize(
    "attack",
    [
        "SELECT * FROM gold.training_examples a, range(100000) b, range(100000) c",  # 3e10 rows
        "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT * FROM r",
    ],
    ids=["cross-join", "recursive-cte"],
)
def test_gem_sql_memory_and_time_stay_bounded_under_the_attacks(lake, tmp_path, attack):
    """`--all` streams every row to stdout: the child's peak memory stays within DuckDB's limit above
    what a trivial query needs (the rows are never held in Python), and it stops at its time limit."""
    timeout, memory_mib = 4, 256
    limits = ["--timeout", str(timeout), "--memory-limit", f"{memory_mib}MB", "--format", "csv"]
    trivial_rss, trivial_s, status, _ = _gem_sql(["-e", "SELECT 1", *limits], lake.home, tmp_path)
    assert status == 0
    rss, elapsed, status, stderr = _gem_sql(["-e", attack, "--all", *limits], lake.home, tmp_path)
    assert status == 1
    assert "gem sql: the statement ran past its time limit of 4 s" in stderr
    assert rss < trivial_rss + memory_mib, (rss, trivial_rss)
    assert elapsed < trivial_s + timeout + 60  # stopped by the limit (the attack alone runs for hours), with slack
    # without --all the same attack prints the first rows and says more exist, at once
    _, elapsed, status, stderr = _gem_sql(["-e", attack, *limits], lake.home, tmp_path)
    assert (status, stderr) == (0, "gem sql: 1000 rows shown; more exist: --limit N shows N, --all every row\n")


def test_a_killed_gem_sql_leaves_no_spill_folder_behind(lake, tmp_path):
    root = tmp_path / f"gem-sql-{os.getuid()}"  # the child's default_spill_root() under TMPDIR=tmp_path
    spilling = "SELECT a.range AS a, repeat('x', 100) AS pad FROM range(3000000) a ORDER BY pad, random()"
    child = _gem_sql_child(
        ["-e", spilling, "--all", "--timeout", "900", "--memory-limit", "32MB", "--max-temp-size", "4GB"],
        lake.home,
        tmp_path,
        subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 600  # a child that never spills, however loaded the machine
        while not list(root.glob("*/duckdb_temp_*storage*")) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert list(root.glob("*/duckdb_temp_*storage*")), "the child never spilled"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    [killed] = root.iterdir()  # SIGKILL: no `close` ran, the folder is still there
    assert killed.name.startswith(f"{child.pid}-")
    with LakeSQL(lake) as live:  # a session in this (live) process: the next session must keep its folder
        with LakeSQL(lake, spill_root=root) as sql:
            assert not killed.exists()  # the next session removed the dead one's folder
            assert [p.name for p in root.iterdir()] == [sql.spill.name]
            assert live.spill.is_dir()
    assert list(root.iterdir()) == []


def test_an_unreadable_table_is_skipped_naming_it_and_the_others_still_query(lake, tmp_path, monkeypatch, capsys):
    home = tmp_path / "gem"
    shutil.copytree(lake.home, home)
    paths = GemPaths(home)
    (paths.table("silver.stray") / "_delta_log").mkdir(parents=True)  # a log that never got a commit
    corrupt = paths.table("silver.corrupt")
    shutil.copytree(paths.table("bronze.impressions"), corrupt)
    [commit] = (corrupt / "_delta_log").glob("*.json")
    commit.write_text('{"commitInfo": {"timestamp": 17')  # truncated mid-write
    with pytest.warns(UserWarning) as caught, LakeSQL(paths) as sql:
        assert sql.tables == ("bronze.impressions", "gold.training_examples", "meta.models", "meta.table_history")
        assert set(sql.unreadable) == {"silver.corrupt", "silver.stray"}
        assert sql.query("SELECT count(*) FROM gold.training_examples").fetchall() == [(3,)]
        assert sql.query("SELECT DISTINCT table_name FROM meta.table_history ORDER BY 1").fetchall() == [
            ("bronze.impressions",),
            ("gold.training_examples",),
        ]
        for name in ("silver.corrupt", "silver.stray"):
            with pytest.raises(
                LakeSQLError,
                match=rf"the query reads {name}, but {paths.table(name)} cannot be "
                r"read by delta-rs \(.+\); the other tables can be queried",
            ):
                sql.query(f"SELECT count(*) FROM {name} JOIN gold.training_examples USING (impression_id)")
    warned = [str(w.message) for w in caught]
    assert any(m.startswith(f"silver.stray is skipped: {paths.table('silver.stray')} cannot be read") for m in warned)
    assert any(m.startswith(f"silver.corrupt is skipped: {corrupt} cannot be read") for m in warned)
    assert any(m.startswith(f"meta.table_history skips {commit}") for m in warned)
    from jobs.cli import main

    monkeypatch.setenv("GEM_HOME", str(home))
    main(["sql", "-e", "SELECT count(*) AS n FROM bronze.impressions"])
    printed = capsys.readouterr()
    assert printed.out == "n\n-\n1\n(1 row)\n"
    assert f"gem sql: warning: silver.stray is skipped: {paths.table('silver.stray')} cannot be read" in printed.err


def test_gem_sql_prints_the_first_rows_by_default_and_every_row_on_request(lake, monkeypatch, capsys):
    from jobs.cli import main

    monkeypatch.setenv("GEM_HOME", str(lake.home))
    main(["sql", "-e", "SELECT range AS n, 'x' AS s FROM range(1500)"])
    out = capsys.readouterr().out.splitlines()
    assert out[:3] == ["n    s", "---  -", "0    x"]  # aligned on the first block of rows
    assert out[-2:] == ["999  x", "(1000 rows shown; more exist: --limit N shows N, --all every row)"]
    main(["sql", "-e", "SELECT range AS n, 'x' AS s FROM range(1500)", "--all"])
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 + 1500 + 1 and out[-1] == "(1500 rows)"
    assert out[2 + 999 : 2 + 1001] == ["999  x", "1000  x"]  # later rows keep the first block's widths
    main(["sql", "-e", "SELECT range AS n FROM range(1000)"])  # exactly the cap: nothing more exists
    assert capsys.readouterr().out.splitlines()[-1] == "(1000 rows)"
    main(["sql", "-e", "SELECT range AS n FROM range(5)", "--limit", "2", "--format", "json"])
    printed = capsys.readouterr()
    assert printed.out == '{"n": 0}\n{"n": 1}\n'
    assert printed.err == "gem sql: 2 rows shown; more exist: --limit N shows N, --all every row\n"
    main(["sql", "-e", "SELECT range AS n FROM range(3)", "--all", "--format", "csv"])
    assert capsys.readouterr() == ("n\r\n0\r\n1\r\n2\r\n", "")
    with pytest.raises(SystemExit):
        main(["sql", "-e", "SELECT 1", "--limit", "5", "--all"])
    assert "not allowed with argument --limit" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sql", "-e", "SELECT 1", "--memory-limit", "lots"])
    assert (
        "gem sql: error: argument --memory-limit: lots: memory_limit='lots' must be a size with a unit"
        in capsys.readouterr().err
    )
