"""Read-only SQL over the lake: the one path `gem sql` and the `reports/sql_pack` asset run queries by.

A `LakeSQL` session is an in-memory DuckDB database that holds no data of its own: every Delta table
under `$GEM_HOME/lake/<layer>/<table>` is a view `<layer>.<table>` over a lazy Arrow scan of that
table (read through delta-rs, so filters on partitions push down), and `meta.models` and
`meta.table_history` are views over Arrow tables built here from the model manifests and the Delta
commit files. Then file system access, extension loading and every setting are locked off in the
engine itself, so a statement has nothing it could write to: the Arrow scans are read-only, the
database is memory, and files, extensions and configuration are out of reach. On top of that a text
is accepted only as `SET VARIABLE name = default` declarations followed by exactly one query, split
and typed by DuckDB's own parser (so `'a;b'` and `/* ; */` are not statement boundaries); anything
else is refused before anything runs, and so is a query whose parse tree holds a write (a data-modifying
CTE such as `WITH d AS (DELETE ... RETURNING *) SELECT ...`). Every statement runs under `SQLLimits`: a
time limit (the connection is interrupted past it), a memory limit and a cap on spilled bytes, with
rows read in batches; a session spills under a folder named for its process, which the next session
removes once that process is gone. A table delta-rs cannot open is skipped with a warning naming it,
and only the queries that read it fail. docs/SQL.md gives the dialect, the parameters, the limits and
why this is safe by construction.

    with LakeSQL(GemPaths.from_env()) as sql:
        rows = sql.query("SELECT count(*) FROM gold.training_examples").fetchall()
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from types import TracebackType

import duckdb
import pyarrow as pa
from deltalake import DeltaTable

from gem_lake.delta import existing_tables
from gem_lake.sql.limits import SQLLimits
from gem_model.config import TASKS
from gem_model.paths import LAYERS, GemPaths

META_SCHEMA = "meta"
SCHEMAS: tuple[str, ...] = (*LAYERS, META_SCHEMA)
_TIMESTAMP = pa.timestamp("us", tz="UTC")
MODELS_SCHEMA = pa.schema(
    [
        ("model_version", pa.string()),
        ("created_at", _TIMESTAMP),
        ("is_latest", pa.bool_()),
        ("preset", pa.string()),
        ("architecture", pa.string()),
        ("data_source", pa.string()),
        ("training_table", pa.string()),
        ("training_delta_version", pa.int64()),
        ("train_days", pa.list_(pa.date32())),
        ("first_train_day", pa.date32()),
        ("last_train_day", pa.date32()),
        ("holdout_days", pa.list_(pa.date32())),
        ("world_size", pa.int32()),
        ("train_seconds", pa.float64()),
        *((f"{task}_{metric}", pa.float64()) for task in TASKS for metric in ("auc", "ne", "calibration")),
        ("metrics", pa.map_(pa.string(), pa.float64())),
        ("manifest_path", pa.string()),
    ]
)
TABLE_HISTORY_SCHEMA = pa.schema(
    [
        ("table_name", pa.string()),
        ("version", pa.int64()),
        ("committed_at", _TIMESTAMP),
        ("operation", pa.string()),
        ("operation_parameters", pa.map_(pa.string(), pa.string())),
        ("operation_metrics", pa.map_(pa.string(), pa.string())),
        ("read_version", pa.int64()),
        ("is_blind_append", pa.bool_()),
        ("engine_info", pa.string()),
        ("user_metadata", pa.string()),
    ]
)
ALLOWED = (
    "`SET VARIABLE name = default` declarations, then exactly one query "
    "(SELECT, WITH ... SELECT, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE, PIVOT ... IN (...), UNPIVOT)"
)
_COMMIT_FILE = re.compile(r"^([0-9]+)\.json$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The parse tree's query nodes that only read; any other (DELETE_QUERY_NODE, INSERT_QUERY_NODE,
# UPDATE_QUERY_NODE, COPY_QUERY_NODE, a kind a later DuckDB adds, ...) refuses the text.
_READ_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "CTE_NODE", "RECURSIVE_CTE_NODE"})
_INTERRUPT_EVERY_S = 0.05  # past the deadline, how often the watchdog interrupts again
# Statements refused although DuckDB runs the same thing another way: how, by statement kind.
_ANOTHER_WAY = {
    "CALL": "`CALL f(...)` reads as `SELECT * FROM f(...)`",
    "PRAGMA": (
        "a PRAGMA that reads is a table function: `SELECT * FROM pragma_table_info('gold.t')` "
        "(or `DESCRIBE gold.t`), `SELECT * FROM pragma_version()`"
    ),
    "COPY": "to save rows, print them to a file: `gem sql ... --format csv --all > rows.csv`",
    "CREATE": "to name a query, use `WITH name AS (SELECT ...) SELECT ... FROM name`",
}
_PIVOT_WAY = (
    "a PIVOT without `IN (...)` after its ON column is two statements in DuckDB (the first reads the "
    "column's distinct values); list them, e.g. `PIVOT gold.t ON surface IN ('feed', 'stories') USING "
    "count(*)`, which is one query, also inside `SELECT * FROM (...)` or a WITH"
)


class LakeSQLError(ValueError):
    """A text refused before it ran (not one query, a write, a setting, ...), a bad variable or limit, or a
    lake table that delta-rs cannot open."""


class LakeSQLLimitError(LakeSQLError):
    """A statement stopped at one of the session's `SQLLimits` (time, memory, spilled bytes)."""


@dataclass(frozen=True)
class ParsedSQL:
    """A text split by DuckDB's parser: its variable declarations (name -> statement) and its one query."""

    declarations: tuple[tuple[str, str], ...]
    query: str

    @property
    def variables(self) -> list[str]:
        return [name for name, _ in self.declarations]


def _tokens(text: str) -> list[tuple[str, duckdb.token_type]]:
    """The text's tokens (text, kind), comments dropped: DuckDB's own tokenizer."""
    marks = duckdb.tokenize(text)
    ends = [p for p, _ in marks[1:]] + [len(text)]
    return [(text[p:end].strip(), kind) for (p, kind), end in zip(marks, ends) if kind != duckdb.token_type.comment]


def _first_line(statement: str) -> str:
    marks = [p for p, kind in duckdb.tokenize(statement) if kind != duckdb.token_type.comment]
    text = statement[marks[0] :] if marks else statement
    line = text.strip().splitlines()[0].rstrip(";").rstrip() if text.strip() else ""
    return line if len(line) <= 100 else line[:97] + "..."


def _writes(tree: object, cte: str | None = None) -> list[tuple[str | None, str]]:
    """(the enclosing CTE's name, the node kind) of every query node of a `json_serialize_sql` tree that
    is not a read, at any depth: CTEs of CTEs, subqueries, set operations, recursive CTEs."""
    found: list[tuple[str | None, str]] = []
    if isinstance(tree, list):
        for item in tree:
            found += _writes(item, cte)
    elif isinstance(tree, dict):
        kind = tree.get("type")
        if isinstance(kind, str) and kind.endswith("_NODE") and kind not in _READ_NODES:
            found.append((cte, kind.removesuffix("_NODE").removesuffix("_QUERY")))
        for key, value in tree.items():
            if key == "cte_map" and isinstance(value, dict):
                for entry in value.get("map") or []:
                    found += _writes(entry.get("value"), str(entry.get("key")))
            else:
                found += _writes(value, cte)
    return found


def _check_tree(where: str, select: str) -> None:
    """Refuse `select` (one SELECT statement) if its parse tree holds anything but reads."""
    with duckdb.connect(":memory:") as parser:  # parses only: json_serialize_sql runs nothing it is given
        [(serialized,)] = parser.execute("SELECT json_serialize_sql(?)", [select]).fetchall()
    tree = json.loads(serialized)
    if tree.get("error"):
        raise LakeSQLError(
            f"{where} is refused: DuckDB's parser cannot give its tree to check "
            f"({tree.get('error_message')}); SQL over the lake accepts {ALLOWED}"
        )
    writes = _writes(tree.get("statements"))
    if writes:
        cte, kind = writes[0]
        what = f"its CTE `{cte}` writes ({kind})" if cte is not None else f"it writes ({kind})"
        raise LakeSQLError(f"{where} is refused: {what}; SQL over the lake is read-only and accepts {ALLOWED}")


def _declared_value(declaration: str) -> str:
    """The default of `SET VARIABLE name = default` as a SELECT, for `_check_tree`."""
    marks = [p for p, kind in duckdb.tokenize(declaration) if kind != duckdb.token_type.comment]
    return "SELECT " + declaration[marks[3] + 1 :]  # marks: SET, VARIABLE, name, =


def _another_way(kind: str, tokens: list[str]) -> str:
    """How to run a refused statement as a query, where DuckDB has a way; '' where it has none."""
    words = {t.upper() for t in tokens}
    if kind == "MULTI" and words & {"PIVOT", "PIVOT_WIDER"}:
        return _PIVOT_WAY
    if kind == "CREATE" and ("AS" not in words or words & {"MACRO", "FUNCTION"}):
        return ""  # only CREATE TABLE/VIEW ... AS SELECT names a query
    return _ANOTHER_WAY.get(kind, "")


def parse_sql(text: str) -> ParsedSQL:
    """Split `text` into its declarations and its one query, or raise `LakeSQLError` naming the statement.

    Each statement is typed by DuckDB's parser, and the query and the declared defaults are refused if
    their parse tree holds a write at any depth (a data-modifying CTE).
    """
    try:
        statements = duckdb.extract_statements(text)
    except duckdb.Error as error:
        raise LakeSQLError(f"not DuckDB SQL: {str(error).strip()} (the dialect is DuckDB's, docs/SQL.md)") from error
    if not statements:
        raise LakeSQLError(f"the SQL is empty: give {ALLOWED}")
    declarations: list[tuple[str, str]] = []
    query = None
    for n, statement in enumerate(statements, 1):
        where = f"statement {n} `{_first_line(statement.query)}`"
        try:
            kind = statement.type
        except ValueError:  # a statement type the Python binding has no name for (e.g. UPDATE EXTENSIONS)
            kind = None
        tokens = [t for t, _ in _tokens(statement.query)]
        words = [t.upper() for t in tokens[:2]]
        if kind == duckdb.StatementType.SET and words == ["SET", "VARIABLE"]:
            if query is not None:
                raise LakeSQLError(f"{where} comes after the query: declare variables before it")
            if len(tokens) < 4 or not _NAME.match(tokens[2]) or tokens[3] != "=":
                raise LakeSQLError(f"{where}: declare a variable as `SET VARIABLE name = default` (a plain name)")
            _check_tree(where, _declared_value(statement.query))
            declarations.append((tokens[2], statement.query))
        elif kind == duckdb.StatementType.SELECT:
            if query is not None:
                raise LakeSQLError(f"{where} is a second query: give one query per text")
            _check_tree(where, statement.query)
            query = statement.query
        else:
            name = "a statement without a type name" if kind is None else f"{kind.name.replace('_', ' ')}"
            way = _another_way(kind.name if kind is not None else "", tokens)
            raise LakeSQLError(
                f"{where} is refused ({name}, not a query): SQL over the lake is read-only "
                f"and accepts {ALLOWED}" + (f"; {way}" if way else "")
            )
    if query is None:
        raise LakeSQLError(f"no query after the declarations: give {ALLOWED}")
    return ParsedSQL(tuple(declarations), query)


def referenced_tables(text: str) -> list[str]:
    """The `<layer>.<table>` and `meta.<view>` names `text` mentions outside comments and strings.

    From DuckDB's tokenizer, not `duckdb.get_table_names`: that one binds the query, and refuses a
    valid one (e.g. `grouping()` in ORDER BY) without any table to bind it to.
    """
    names = {"identifier", "keyword"}
    tokens = [(t[1:-1].replace('""', '"') if t.startswith('"') else t, kind.name) for t, kind in _tokens(text)]
    found = set()
    for (schema, kind), (dot, _), (table, table_kind) in zip(tokens, tokens[1:], tokens[2:]):
        if kind in names and table_kind in names and dot == "." and schema in SCHEMAS:
            found.add(f"{schema}.{table}")
    return sorted(found)


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _date(value: object) -> date | None:
    try:
        return date.fromisoformat(str(value)[:10]) if value is not None else None
    except ValueError:
        return None


def _dates(values: object) -> list[date | None] | None:
    return [_date(v) for v in values] if isinstance(values, list) else None


def _timestamp(value: object) -> datetime | None:
    """An ISO timestamp as UTC; one without an offset is taken as UTC (as the pipeline writes them)."""
    try:
        parsed = datetime.fromisoformat(str(value)) if value is not None else None
    except ValueError:
        return None
    if parsed is None:
        return None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _number(value: object, kind: type[int] | type[float]) -> int | float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return kind(value)


def models_table(paths: GemPaths) -> pa.Table:
    """`meta.models`: one row per `models/<version>/manifest.json`; a `<version>.partial` directory (a
    model mid-training, published by rename) is not a model yet."""
    pointer = paths.models / "LATEST"
    latest = pointer.read_text().strip() if pointer.is_file() else None
    rows = []
    for path in sorted(paths.models.glob("*/manifest.json")):
        if path.parent.name.endswith(".partial"):
            continue
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            warnings.warn(f"meta.models skips {path}: not readable JSON ({error})", stacklevel=2)
            continue
        config, data = manifest.get("config") or {}, manifest.get("training_data") or {}
        raw = manifest.get("metrics") if isinstance(manifest.get("metrics"), dict) else {}
        metrics = {str(k): _number(v, float) for k, v in raw.items()}
        train_days = _dates(data.get("train_days"))
        known_days = [d for d in train_days or [] if d is not None]
        version = manifest.get("model_version")
        rows.append(
            {
                "model_version": version,
                "created_at": _timestamp(manifest.get("created_at")),
                "is_latest": version is not None and version == latest,
                "preset": config.get("preset"),
                "architecture": (config.get("model") or {}).get("architecture"),
                "data_source": (config.get("data") or {}).get("source"),
                "training_table": data.get("table"),
                "training_delta_version": _number(data.get("delta_version"), int),
                "train_days": train_days,
                "first_train_day": min(known_days, default=None),
                "last_train_day": max(known_days, default=None),
                "holdout_days": _dates(data.get("holdout_days")),
                "world_size": _number(manifest.get("world_size"), int),
                "train_seconds": _number(manifest.get("train_seconds"), float),
                **{
                    f"{task}_{metric}": metrics.get(f"{task}/{metric}")
                    for task in TASKS
                    for metric in ("auc", "ne", "calibration")
                },
                "metrics": list(metrics.items()),
                "manifest_path": str(path),
            }
        )
    return pa.Table.from_pylist(rows, schema=MODELS_SCHEMA)


def _text_map(values: object) -> list[tuple[str, str | None]] | None:
    """A commit's parameter map as text: Delta writes the values as strings, other writers as JSON values."""
    if not isinstance(values, dict):
        return None
    return [(str(k), v if isinstance(v, str) or v is None else json.dumps(v)) for k, v in values.items()]


def _commit_info(commit: Path) -> object:
    """A commit file's `commitInfo` action; None, with a warning naming the file, where it is unreadable."""
    try:
        with commit.open() as lines:
            for line in lines:
                if '"commitInfo"' in line:
                    info = json.loads(line).get("commitInfo")
                    if info is not None:
                        return info
    except (OSError, ValueError) as error:  # a truncated or corrupt commit hides one row, not the view
        warnings.warn(f"meta.table_history skips {commit}: not a readable Delta commit ({error})", stacklevel=3)
    return None


def table_history_table(paths: GemPaths) -> pa.Table:
    """`meta.table_history`: one row per commit (`_delta_log/<version>.json`, its `commitInfo` action) of
    every lake table; the commits still in the log, as `DESCRIBE HISTORY` lists them."""
    rows = []
    for name, path in existing_tables(paths).items():
        for commit in sorted((path / "_delta_log").glob("*.json")):
            match = _COMMIT_FILE.match(commit.name)
            if match is None:
                continue
            info = _commit_info(commit)
            if not isinstance(info, dict):
                continue
            millis = _number(info.get("inCommitTimestamp"), int) or _number(info.get("timestamp"), int)
            rows.append(
                {
                    "table_name": name,
                    "version": int(match.group(1)),
                    "committed_at": None if millis is None else datetime.fromtimestamp(millis / 1000, UTC),
                    "operation": info.get("operation"),
                    "operation_parameters": _text_map(info.get("operationParameters")),
                    "operation_metrics": _text_map(info.get("operationMetrics")),
                    "read_version": _number(info.get("readVersion"), int),
                    "is_blind_append": info.get("isBlindAppend")
                    if isinstance(info.get("isBlindAppend"), bool)
                    else None,
                    "engine_info": info.get("engineInfo"),
                    "user_metadata": info.get("userMetadata"),
                }
            )
    return pa.Table.from_pylist(rows, schema=TABLE_HISTORY_SCHEMA)


def default_spill_root() -> Path:
    """Where sessions spill: `$TMPDIR/gem-sql-<uid>/`, one folder `<pid>-<random>` per session in it."""
    return Path(tempfile.gettempdir()) / f"gem-sql-{os.getuid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # PermissionError: another user's process, alive
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def remove_dead_spills(root: Path) -> None:
    """Remove the spill folders under `root` whose process has ended (a session SIGKILLed mid-spill never
    ran its `close`); a live session's folder is kept."""
    for folder in sorted(root.glob("*-*")) if root.is_dir() else []:
        pid = folder.name.partition("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


class _Watchdog:
    """Interrupts `connection` once `seconds` have passed, and again every `_INTERRUPT_EVERY_S` until it is
    stopped: an interrupt that lands while Python is between two DuckDB calls (printing a batch) is dropped
    by DuckDB, so the next call must be interrupted too. `expired` says whether the deadline passed."""

    def __init__(self, connection: duckdb.DuckDBPyConnection, seconds: float) -> None:
        self._connection, self._seconds = connection, seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="gem-sql-watchdog", daemon=True)
        self.expired = False

    def _watch(self) -> None:
        if self._stop.wait(self._seconds):
            return
        self.expired = True
        while not self._stop.is_set():
            self._connection.interrupt()
            self._stop.wait(_INTERRUPT_EVERY_S)

    def __enter__(self) -> _Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


class LakeQuery:
    """One query of a `LakeSQL` session. Nothing has run yet: each read (`batches`, `fetchall`, `count`,
    `head`) runs it once, as one statement under the session's limits.

    Read it before the next `query` on the session: that one resets the variables.
    """

    def __init__(self, session: LakeSQL, text: str) -> None:
        self._session = session
        self._text = _body(text)

    @property
    def columns(self) -> list[str]:
        with self._session._bounded():
            return list(self._session._con.sql(self._text).columns)

    def batches(self, rows: int = 1024, limit: int | None = None) -> Iterator[list[tuple[object, ...]]]:
        """The rows, `rows` at a time as DuckDB produces them (the result is never held whole), at most
        `limit` of them (pushed into the query: an `ORDER BY` under a limit is a top-N, not a full sort).

        The time limit runs from the first batch to the last, the caller's time between batches included.
        """
        if rows < 1 or (limit is not None and limit < 0):
            raise LakeSQLError(f"batches(rows={rows}, limit={limit}): rows must be 1 or more, limit 0 or more")
        text = self._text if limit is None else f"SELECT * FROM (\n{self._text}\n) LIMIT {int(limit)}"
        return self._session._stream(text, rows)

    def fetchall(self) -> list[tuple[object, ...]]:
        """Every row, in Python memory (outside DuckDB's memory limit): for a large result, use `batches`."""
        return [row for batch in self.batches() for row in batch]

    def head(self, n: int) -> list[tuple[object, ...]]:
        return [row for batch in self.batches(limit=n) for row in batch]

    def count(self) -> int:
        [(count,)] = self._session._run(f"SELECT count(*) FROM (\n{self._text}\n)")
        return int(count)


def _body(statement: str) -> str:
    """`statement` without a trailing `;` and comments, so it can stand inside `SELECT * FROM (...)`."""
    marks = duckdb.tokenize(statement)
    ends = [p for p, _ in marks[1:]] + [len(statement)]
    last = [
        end
        for (p, kind), end in zip(marks, ends)
        if kind != duckdb.token_type.comment and statement[p:end].strip() != ";"
    ]
    return statement[: last[-1]].strip() if last else statement.strip()


class LakeSQL:
    """A read-only SQL session over the lake at `paths` (see the module docstring).

    `tables` names every view it registered (`<layer>.<table>`, `meta.models`, `meta.table_history`);
    `unreadable` maps each lake table delta-rs could not open to why (with a warning naming it at open):
    the other tables are there, and a query that names an unreadable one is refused naming it.
    Every statement runs under `limits` (`SQLLimits()` by default: bounded time, memory and spill),
    fixed for the session's life like every other setting. It spills under `spill_root` (default
    `default_spill_root()`), in a folder named for this process that `close` (or `with`) removes; opening a
    session removes the folders of sessions whose process was killed.
    """

    def __init__(self, paths: GemPaths, limits: SQLLimits | None = None, spill_root: Path | None = None) -> None:
        self.paths = paths
        self.limits = limits if limits is not None else SQLLimits()
        root = spill_root if spill_root is not None else default_spill_root()
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        remove_dead_spills(root)
        self.spill = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root))
        self.unreadable: dict[str, str] = {}
        self._con = duckdb.connect(":memory:")
        try:
            self.tables = self._register()
            self._lock()
        except BaseException:
            self.close()
            raise

    def _register(self) -> tuple[str, ...]:
        for schema in SCHEMAS:
            self._con.execute(f"CREATE SCHEMA {_quote(schema)}")
        sources: dict[str, object] = {}
        for name, path in existing_tables(self.paths).items():
            try:
                sources[name] = DeltaTable(str(path)).to_pyarrow_dataset()
            except Exception as error:  # delta-rs raises several types; the first line says what is wrong
                reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                self.unreadable[name] = f"{path} cannot be read by delta-rs ({reason})"
                warnings.warn(
                    f"{name} is skipped: {self.unreadable[name]}; the other tables can be queried", stacklevel=3
                )
        sources[f"{META_SCHEMA}.models"] = models_table(self.paths)
        sources[f"{META_SCHEMA}.table_history"] = table_history_table(self.paths)
        for name, source in sources.items():
            schema, _, table = name.partition(".")
            scan = f"_scan_{schema}_{table}"
            self._con.register(scan, source)
            self._con.execute(f"CREATE VIEW {_quote(schema)}.{_quote(table)} AS SELECT * FROM {_quote(scan)}")
        return tuple(sources)

    def _lock(self) -> None:
        settings: dict[str, object] = {
            "TimeZone": "UTC",  # as the Spark session writes them: timestamps print in UTC
            "temp_directory": str(self.spill),
            "memory_limit": self.limits.memory_limit,
            "max_temp_directory_size": self.limits.max_temp_directory_size,
            "python_enable_replacements": False,  # no Python variable of the caller is a table
            "enable_progress_bar": False,  # it prints to stdout, where `gem sql --format csv` writes rows
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "allow_community_extensions": False,
        }
        if self.limits.threads is not None:
            settings["threads"] = self.limits.threads
        for name, value in settings.items():
            try:
                self._con.execute(f"SET {name} = {_literal(value)}")
            except duckdb.Error as error:
                raise LakeSQLError(f"{name}={value!r} is refused by DuckDB ({str(error).strip()})") from error
        # Last: no file, extension or attached database from here on, and no setting can change again.
        self._con.execute("SET enable_external_access = false")
        self._con.execute("SET lock_configuration = true")

    @contextmanager
    def _bounded(self) -> Iterator[_Watchdog]:
        """Run one statement under the limits: DuckDB's errors for them become `LakeSQLLimitError`s that
        say which limit stopped it and how to raise it."""
        watchdog = _Watchdog(self._con, self.limits.timeout_s)
        try:
            with watchdog:
                yield watchdog
        except duckdb.InterruptException as error:
            if not watchdog.expired:
                raise
            raise LakeSQLLimitError(
                f"the statement ran past its time limit of {self.limits.timeout_s:g} s and was stopped; "
                f"raise it with `gem sql --timeout SECONDS` (SQLLimits.timeout_s)"
            ) from error
        except duckdb.OutOfMemoryException as error:
            raise LakeSQLLimitError(
                f"{str(error).strip().splitlines()[0]} (the session's memory_limit is "
                f"{self.limits.memory_limit} and max_temp_directory_size {self.limits.max_temp_directory_size}; "
                "raise them with `gem sql --memory-limit SIZE --max-temp-size SIZE` (SQLLimits))"
            ) from error

    def _run(self, statement: str, parameters: list[object] | None = None) -> list[tuple[object, ...]]:
        with self._bounded():
            return self._con.execute(statement, parameters).fetchall()

    def _stream(self, statement: str, rows: int) -> Iterator[list[tuple[object, ...]]]:
        try:
            with self._bounded() as watchdog:
                self._con.execute(statement)
                while batch := self._con.fetchmany(rows):
                    yield batch
                    if watchdog.expired:  # the caller spent the rest of the time on the last batch
                        raise duckdb.InterruptException("the time limit passed between two batches")
        finally:
            self._con.abort()  # a stream left early: DuckDB stops producing the rest (after the watchdog stopped)

    def query(self, text: str, variables: Mapping[str, object] | None = None) -> LakeQuery:
        """Run `text`'s declarations, override them with `variables` (name -> value as text, cast to the
        declared type) and return its query, to be read (`.columns`, `.batches()`, `.fetchall()`, ...).
        """
        parsed = parse_sql(text)
        for name in referenced_tables(text):
            if name in self.unreadable:
                raise LakeSQLError(
                    f"the query reads {name}, but {self.unreadable[name]}; the other tables can be queried"
                )
        for (name,) in self._run("SELECT name FROM duckdb_variables()"):
            self._run(f"RESET VARIABLE {_quote(name)}")
        for _, declaration in parsed.declarations:
            self._run(declaration)
        for name, value in (variables or {}).items():
            self._set_variable(parsed, name, value)
        return LakeQuery(self, parsed.query)

    def _set_variable(self, parsed: ParsedSQL, name: str, value: object) -> None:
        if name not in parsed.variables:
            declared = ", ".join(parsed.variables) or "none"
            raise LakeSQLError(
                f"variable {name!r} is not declared by this SQL (it declares: {declared}); "
                "a file declares its parameters with `SET VARIABLE name = default`"
            )
        [(kind,)] = self._run("SELECT typeof(getvariable(?))", [name])
        kind = "VARCHAR" if kind == '"NULL"' else kind  # an untyped NULL default takes the text as it is
        try:
            self._run(f"SET VARIABLE {name} = CAST(? AS {kind})", [str(value)])
        except duckdb.Error as error:
            raise LakeSQLError(
                f"variable {name}={str(value)!r} is not a {kind}, the type its default declares "
                f"({str(error).strip().splitlines()[0]})"
            ) from error

    def close(self) -> None:
        self._con.close()
        shutil.rmtree(self.spill, ignore_errors=True)

    def __enter__(self) -> LakeSQL:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def _literal(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"
