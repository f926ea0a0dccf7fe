"""The `reports/sql_pack` asset: every query of the SQL pack (`sql/*.sql`, docs/SQL.md) run over the lake.

Each query's row count and first rows are attached as metadata (a Markdown table per query), so the
calibration, coverage, logit shift, lineage and recall reports of the latest export are readable in
the Dagster UI. The queries run read-only through `gem_lake.sql.query`, the same path as `gem sql`. A
query whose tables are not in the lake yet (e.g. `gold.index_builds` before any index was built), or
that reads a table delta-rs cannot open (a corrupt log), is reported as skipped, naming them and why;
any other failure (a refused statement, a query past its time or memory limit) fails the asset,
naming the file. Unpartitioned: the queries span every day and model version.
"""

import json
import math
from dataclasses import dataclass
from datetime import date, datetime
from pathlib import Path

import dagster as dg

from dagster_project.defs.lake_tables import key
from dagster_project.resources.lake import LakeResource
from gem_model.paths import GemPaths

GROUP = "reports"
SQL_PACK = dg.AssetKey(["reports", "sql_pack"])
SQL_DIR = Path(__file__).resolve().parents[3] / "sql"
PREVIEW_ROWS = 20
EXPORTED = [
    key("gold.teacher_logits"),
    key("gold.user_embeddings"),
    key("gold.ad_embeddings"),
    dg.AssetKey(["indexes", "ad_index"]),
    dg.AssetKey(["indexes", "user_index"]),
]


class ReportQueryError(RuntimeError):
    pass


@dataclass(frozen=True)
class QueryReport:
    """One query's outcome: `rows` and a `preview` of them, or the `missing` tables it was skipped for, or
    the `unreadable` ones (each with why delta-rs cannot open it)."""

    name: str
    columns: list[str]
    rows: int | None = None
    preview: tuple[tuple[object, ...], ...] = ()
    missing: tuple[str, ...] = ()
    unreadable: tuple[str, ...] = ()

    @property
    def skipped(self) -> tuple[str, ...]:
        return self.missing + self.unreadable

    def markdown(self) -> str:
        if self.skipped:
            missing = [f"table {', '.join(self.missing)} not materialised"] if self.missing else []
            return "skipped: " + "; ".join([*missing, *self.unreadable])
        if not self.preview:
            return "(0 rows)"
        lines = ["| " + " | ".join(self.columns) + " |", "|" + "---|" * len(self.columns)]
        lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in self.preview]
        shown = f"first {len(self.preview)} of " if self.rows > len(self.preview) else ""
        return "\n".join([*lines, "", f"({shown}{self.rows} rows)"])


def _cell(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return "NaN" if math.isnan(value) else f"{value:.6g}"
    if isinstance(value, list | tuple):  # an embedding: its length and first values
        head = ", ".join(_cell(v) for v in value[:3])
        text = f"[{head}{', …' if len(value) > 3 else ''}] ({len(value)})"
    elif isinstance(value, dict):
        text = json.dumps(value, default=str, sort_keys=True)
    elif isinstance(value, datetime | date):
        text = value.isoformat()
    else:
        text = str(value)
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= 80 else text[:77] + "…"


def run_report_queries(paths: GemPaths, sql_dir: Path = SQL_DIR, preview_rows: int = PREVIEW_ROWS) -> list[QueryReport]:
    """Run every `*.sql` in `sql_dir` over the lake at `paths`, with each file's own variable defaults."""
    import duckdb

    from gem_lake.sql.query import LakeSQL, LakeSQLError, referenced_tables

    files = sorted(sql_dir.glob("*.sql"))
    if not files:
        raise FileNotFoundError(f"no *.sql files in {sql_dir}; the SQL pack lives in the repository's sql/")
    reports = []
    with LakeSQL(paths) as sql:
        for file in files:
            text = file.read_text()
            try:
                tables = referenced_tables(text)
                unreadable = tuple(f"{t}: {sql.unreadable[t]}" for t in tables if t in sql.unreadable)
                missing = tuple(t for t in tables if t not in sql.tables and t not in sql.unreadable)
                if missing or unreadable:
                    reports.append(QueryReport(file.stem, [], missing=missing, unreadable=unreadable))
                    continue
                result = sql.query(text)
                # two passes (the count, then the first rows) instead of holding every row of a large report
                rows = result.count()
                preview = tuple(result.head(preview_rows))
                columns = result.columns
            except (LakeSQLError, duckdb.Error) as error:
                raise ReportQueryError(f"{file.name} failed: {str(error).strip().splitlines()[0]}") from error
            reports.append(QueryReport(file.stem, columns, rows, preview))
    return reports


@dg.asset(key=SQL_PACK, group_name=GROUP, deps=EXPORTED, kinds={"duckdb", "sql"})
def sql_pack(context: dg.AssetExecutionContext, lake: LakeResource) -> dg.MaterializeResult:
    """The SQL pack's reports over the lake: per query (`sql/<name>.sql`) its rows and the first of them."""
    reports = run_report_queries(lake.paths)
    skipped = [r for r in reports if r.skipped]
    for r in skipped:
        context.log.warning(f"sql/{r.name}.sql {r.markdown()}")
    metadata: dict[str, object] = {
        "queries_run": len(reports) - len(skipped),
        "queries_skipped": dg.MetadataValue.json({r.name: list(r.skipped) for r in skipped}),
        "sql_dir": dg.MetadataValue.path(str(SQL_DIR)),
    }
    for r in reports:
        metadata[r.name] = dg.MetadataValue.md(r.markdown())
        if r.rows is not None:
            metadata[f"{r.name}/rows"] = r.rows
    return dg.MaterializeResult(metadata=metadata)
