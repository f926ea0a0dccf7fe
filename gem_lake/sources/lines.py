"""Strict reading of a dataset's delimited text files: every data line becomes one row, parsed or marked bad.

Spark's CSV reader is permissive: a line with a missing field is padded with null and an extra
field is dropped (the rest shifted into the wrong columns), a value that does not parse (an
overflowing id, text in a number) silently becomes null, and bytes that are not UTF-8 become
ids of users and ads that do not exist. Here each file is read as text lines instead
(`spark.read.text` keeps a line's raw bytes, ends lines at LF, CR LF or a bare CR, and its scan
partitions keep a file's lines in order), its header must be exactly the expected one (another
header means the format changed: `SourceFormatError`, and nothing lands), and each data line is
checked in this order, the first failure being its reason:

- `invalid_utf8`: the line is not valid UTF-8;
- `too_few_fields` / `too_many_fields`: fields counted outside double quotes (a truncated line
  has too few);
- `unparsable_<column>`: a non-empty field that is no value of its column's type (an overflowing
  id, text in a number, a malformed timestamp); an empty field is null, as in CSV;
- `invalid_label_<column>`: a label field that is not exactly `0` or `1` (2, -1, empty, ...);
- `duplicate_<key>`: the line repeats the key of an earlier line that parsed, the key being the
  file's (`TextFile.key`) or, where the format has none, the whole line within the source
  (`duplicate_line`); the first copy in read order is kept.

Every row carries `_line` (`LINE_COLUMN`: struct of `file`, `number`, `raw`, `error`), which the
adapters pass on to `gem_lake.quarantine`: it rejects a row with an `error` first, with that
reason, and keeps the raw line, its file and its line number in `bronze.rejected_rows`. Columns
of a line whose structure is broken (encoding, field count) are null: their positions are unknown.
Rows that derive from lines (users, ads, events) must use only lines without an error
(`parsed`), so a garbled or repeated line creates nothing.
"""

from __future__ import annotations

import csv
import dataclasses
import re
from collections.abc import Sequence
from functools import reduce
from pathlib import Path
from typing import NamedTuple

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from gem_lake.quarantine import LINE_COLUMN
from gem_lake.sources import columnar
from gem_lake.sources.files import TextFile

# A header line is the column names: one longer than this means a file that is not delimited text at all.
MAX_HEADER_BYTES = 1 << 20


class SourceFormatError(ValueError):
    """A dataset file whose header is not the one its adapter reads: the format changed."""


def parsed() -> Column:
    """Rows whose line parsed: the only ones users, ads and events may be derived from."""
    return F.col(f"{LINE_COLUMN}.error").isNull()


def check_columns(spark: SparkSession, path: Path, table: TextFile, quote: bool = True) -> None:
    """Raise `SourceFormatError` unless the columnar input at `path` exists and has every declared column;
    the columns it has are listed only when `quote` (the input lies inside the data root)."""
    if not path.exists():
        raise SourceFormatError(
            f"{path} does not exist; point the mapping's files at an existing {table.format} "
            f"{'table' if table.format == 'delta' else 'file or folder'}"
        )
    found = columnar.load(spark, path, table).columns  # the footer or the log only
    missing = [f.name for f in table.fields if f.name not in found]
    if missing:
        has = (
            f"its columns are {found}"
            if quote
            else f"it has {len(found)} columns (not listed: it lies outside the data root)"
        )
        raise SourceFormatError(
            f"{path}: the {table.format} input lacks column(s) {missing}: the format changed "
            f"and nothing landed; {has}: map those, or restore these"
        )


def check_header(path: Path, text_file: TextFile, quote: bool = True) -> None:
    """Raise `SourceFormatError` unless the first line of `path` is `text_file.header` exactly; the line
    found is quoted only when `quote` (the file lies inside the data root: `/etc/passwd` is not quoted)."""
    if text_file.header is None:
        return
    first = _first_line(path).decode("utf-8", errors="replace").removeprefix("\ufeff")
    try:
        found = tuple(next(csv.reader([first], delimiter=text_file.separator), []))
    except csv.Error as e:  # e.g. a field over the csv module's limit: no header of this layout
        raise SourceFormatError(
            f"{path}: line 1, the header, is not a delimited line ({e}); the file's format "
            "changed and nothing was landed; restore the file"
        ) from None
    if found != text_file.header:
        missing = [c for c in text_file.header if c not in found]
        unexpected = [c for c in found if c not in text_file.header]
        seen = (
            f"{list(found)} (missing {missing}, unexpected {unexpected})"
            if quote
            else f"(not quoted: the file lies outside the data root; missing {missing})"
        )
        raise SourceFormatError(
            f"{path}: the header is not the one this adapter reads, so the file's format changed and nothing was "
            f"landed; expected {len(text_file.header)} columns {list(text_file.header)}, found {len(found)} "
            f"{seen}; update the adapter's layout in gem_lake/sources/ for the new format, or restore the file"
        )


def _first_line(path: Path) -> bytes:
    """The first line of `path`, ended as Spark's text reader ends lines (at LF, CR LF or a bare CR, as old
    Mac files end them), so the header checked is the very line Spark skips."""
    with path.open("rb") as fh:
        head = fh.read(MAX_HEADER_BYTES + 1)
    end = re.search(rb"[\r\n]", head)
    if end is None and len(head) > MAX_HEADER_BYTES:
        raise SourceFormatError(
            f"{path}: line 1, the header, runs past {MAX_HEADER_BYTES} bytes without a line "
            "end; this is no delimited text file: point at the right file"
        )
    return head if end is None else head[: end.start()]


def read_text_files(
    spark: SparkSession, folder: Path, source: str, files: Sequence[TextFile], root: Path | None = None
) -> DataFrame:
    """Every data line of `files` (in that order) under `folder`, strictly parsed (module docstring).

    Columns: each file's fields (united by name; a column a file lacks is null), `_file` (place in
    `files`), `_row` (0-based data line in its file), `impression_id` = `<source>-<file stem>-<_row>`
    and `_line`. A file's header is checked before anything is read, and quoted in the error only
    when the file lies inside the data `root` (None: `folder`) once its links are followed. Files of
    one layout are parsed together, so a plan holds one parse per layout, not per file.

    The parse is persisted (memory, spilling to disk) for the Spark application's life, keyed by the
    files' size, modification time and inode: every landing of a run (users, ads, each day's events
    and impressions) reads the same lines, and parsing them each time cost several seconds a use.
    """
    inside = (root or folder).resolve()
    for text_file in files:
        path = folder / text_file.name
        quote = path.resolve().is_relative_to(inside)
        if text_file.format == "text":
            check_header(path, text_file, quote)
        else:
            check_columns(spark, path, text_file, quote)
    key = _ParseKey(
        spark.sparkContext.applicationId,
        str(folder),
        source,
        tuple(files),
        tuple(_stamp(folder / f.name) for f in files),
    )
    if key not in _PARSED:
        for stale in [k for k in _PARSED if k.same_files_as(key)]:
            _PARSED.pop(stale).unpersist()  # the files changed
        _PARSED[key] = _parse_files(spark, folder, source, files).persist(StorageLevel.MEMORY_AND_DISK)
    return _PARSED[key]


class _ParseKey(NamedTuple):
    application: str
    folder: str
    source: str
    files: tuple[TextFile, ...]
    stamps: tuple[tuple[int, int, int], ...]

    def same_files_as(self, other: _ParseKey) -> bool:
        return self[:4] == other[:4]


_PARSED: dict[_ParseKey, DataFrame] = {}


def _stamp(path: Path) -> tuple[int, int, int]:
    """A file's size, modification time and inode; a folder's (Parquet files, a Delta table) the
    count, total size and newest modification of the files under it."""
    if path.is_dir():
        stats = [p.stat() for p in path.rglob("*") if p.is_file()]
        return len(stats), sum(s.st_size for s in stats), max((s.st_mtime_ns for s in stats), default=0)
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns, stat.st_ino


def _parse_files(spark: SparkSession, folder: Path, source: str, files: Sequence[TextFile]) -> DataFrame:
    layouts: dict[TextFile, list[tuple[int, TextFile]]] = {}
    for i, text_file in enumerate(files):
        layouts.setdefault(dataclasses.replace(text_file, name=""), []).append((i, text_file))
    parts = [
        _parse(_numbered_lines(spark, folder, source, group), layout)
        if layout.format == "text"
        else columnar.numbered_rows(spark, folder, source, group, layout)
        for layout, group in layouts.items()
    ]
    rows = reduce(lambda a, b: a.unionByName(b, allowMissingColumns=True), parts)
    return _flag_duplicates(rows)


def _numbered_lines(spark: SparkSession, folder: Path, source: str, files: list[tuple[int, TextFile]]) -> DataFrame:
    """The data lines of `files` ((place, file) of one layout): `value` (the raw bytes), `_file`, `_number`
    (1-based line in the file), `_row` (0-based data line), `_source_file`, `impression_id`, `_scope`
    (the file where its key is the file's own, else the whole source).

    Scan partitions keep a file's lines in order, so the monotonic id numbers them.
    """
    scans = [
        spark.read.text(str(folder / f.name)).select(
            "value",
            F.lit(i).alias("_file"),
            F.lit(f"{folder.name}/{f.name}").alias("_source_file"),
            F.lit(f"{source}-{Path(f.name).stem}-").alias("_prefix"),
            F.lit(f.name if f.key else "").alias("_scope"),
        )
        for i, f in files
    ]
    first_data_line = 1 if files[0][1].header is None else 2
    number = F.row_number().over(Window.partitionBy("_file").orderBy(F.monotonically_increasing_id()))
    lines = reduce(DataFrame.unionByName, scans).select("*", number.cast("bigint").alias("_number"))
    row = F.col("_number") - first_data_line
    return lines.where(F.col("_number") >= first_data_line).select(
        "value",
        "_file",
        "_number",
        row.alias("_row"),
        "_source_file",
        "_scope",
        F.concat("_prefix", row.cast("string")).alias("impression_id"),
    )


def _csv_schema(n_fields: int) -> str:
    """All-string fields `_0.._<n-1>`: `from_csv` splits quote-aware and makes an empty field null, as
    Spark's CSV reader does."""
    return ", ".join(f"_{i} string" for i in range(n_fields))


def _field_count(value: Column, separator: str) -> Column:
    """Separators outside double quotes, plus one (an unterminated quote runs to the end of the line)."""
    return F.size(F.split(F.regexp_replace(value, '"[^"]*("|$)', ""), re.escape(separator)))


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _typed(token: str, kind: str, timestamp_format: str | None) -> str:
    """SQL: the field `token` (a string) as `kind`, null when it does not parse."""
    if kind == "string":
        return token
    if kind == "timestamp" and timestamp_format is not None:
        return f"try_to_timestamp({token}, {_string(timestamp_format)})"
    return f"try_cast({token} AS {kind})"


def _field_sql(layout: TextFile) -> tuple[list[str], list[str]]:
    """SQL for each field's typed column, and for each field's failure (`WHEN ... THEN reason`).

    Built as SQL text rather than Column objects: a layout has up to 267 fields, and composing
    their expressions through the Python API costs thousands of JVM round trips per read.
    """
    columns, failures, start = [], [], 0
    for field in layout.fields:
        name = _quoted(field.name)
        if field.width == 1:
            token = f"_csv._{start}"
            columns.append(f"{_typed(token, field.type, layout.timestamp_format)} AS {name}")
            if field.name in layout.labels:
                allowed = ", ".join(map(_string, layout.label_values))
                failures.append(
                    f"WHEN {token} IS NULL OR {token} NOT IN ({allowed}) THEN {_string(f'invalid_label_{field.name}')}"
                )
            elif field.type != "string":
                failures.append(
                    f"WHEN {token} IS NOT NULL AND {name} IS NULL THEN {_string(f'unparsable_{field.name}')}"
                )
        else:
            tokens = "array(" + ", ".join(f"_csv._{i}" for i in range(start, start + field.width)) + ")"
            columns.append(f"transform({tokens}, t -> {_typed('t', field.type, layout.timestamp_format)}) AS {name}")
            if field.type != "string":
                bad = f"zip_with({tokens}, {name}, (t, v) -> t IS NOT NULL AND v IS NULL)"
                failures.append(f"WHEN exists({bad}, b -> b) THEN {_string(f'unparsable_{field.name}')}")
        start += field.width
    return columns, failures


def _parse(lines: DataFrame, layout: TextFile) -> DataFrame:
    """Lines of one layout, checked in order and typed; `_error` is the first failure.

    Each step is its own projection referring to the one before by name, so `from_csv` and each cast
    run once per line (an expression built from another's parts would repeat them).
    """
    if layout.encoding != "utf-8":  # the text reader keeps the raw bytes, which this decodes
        lines = lines.withColumn("value", F.decode(F.col("value").cast("binary"), layout.encoding))
    n = _field_count(F.col("value"), layout.separator)
    structure = (
        F.when(~F.is_valid_utf8("value"), F.lit("invalid_utf8"))
        .when(n < layout.n_fields, F.lit("too_few_fields"))
        .when(n > layout.n_fields, F.lit("too_many_fields"))
    )
    checked = lines.select("*", structure.alias("_structure"))
    csv_fields = F.when(
        F.col("_structure").isNull(), F.from_csv("value", _csv_schema(layout.n_fields), {"sep": layout.separator})
    )
    checked = checked.select("*", csv_fields.alias("_csv"))
    columns, failures = _field_sql(layout)
    typed = checked.selectExpr(
        *columns,
        "_file",
        "_row",
        "impression_id",
        "_source_file",
        "_number",
        "_scope",
        "_csv",
        "_structure",
        "make_valid_utf8(value) AS _raw",
    )
    field_error = F.expr(f"CASE {' '.join(failures)} END") if failures else F.lit(None).cast("string")
    if layout.key:  # a key column left empty identifies nothing, so it is never a duplicate
        known = reduce(lambda a, b: a & b, [F.col(c).isNotNull() for c in layout.key])
        key = F.struct(F.col("_scope").alias("scope"), F.when(known, F.to_json(F.struct(*layout.key))).alias("value"))
    else:
        key = F.struct(F.col("_scope").alias("scope"), F.col("_raw").alias("value"))
    return typed.select(
        *[c for c in typed.columns if c not in ("_csv", "_structure", "_scope")],
        F.coalesce(F.col("_structure"), field_error).alias("_error"),
        key.alias("_key"),
        F.lit(layout.duplicate_reason).alias("_duplicate_reason"),
    )


def _flag_duplicates(rows: DataFrame) -> DataFrame:
    """Mark later copies of a key among lines that parsed, and fold the checks into `_line`."""
    first = Window.partitionBy("_key", F.col("_error").isNull()).orderBy("_file", "_number")
    repeated = F.col("_error").isNull() & F.col("_key.value").isNotNull() & (F.row_number().over(first) > 1)
    error = F.when(repeated, F.col("_duplicate_reason")).otherwise(F.col("_error"))
    line = F.struct(
        F.col("_source_file").alias("file"),
        F.col("_number").alias("number"),
        F.col("_raw").alias("raw"),
        error.alias("error"),
    )
    internal = {"_source_file", "_number", "_raw", "_error", "_key", "_duplicate_reason"}
    return rows.select(*[c for c in rows.columns if c not in internal], line.alias(LINE_COLUMN))
