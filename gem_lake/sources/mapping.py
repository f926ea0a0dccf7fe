"""A source mapping: one file (YAML or JSON) that maps a user's own logs (delimited text, Parquet or Delta)
onto the bronze tables.

    name: my_logs                       # [a-z0-9_]+: impression ids <name>-<file stem>-<row>
    impressions:
      folder: logs                      # under the data root: the mapping file's folder (see below)
      files: [train.csv, test.csv]      # read in this order: a later file takes the later days
      holdout_files: [test.csv]         # optional: exactly these files' rows fill the holdout days
      format: text                      # or parquet (files or folders), delta (tables; `version: N` pins one)
      separator: ","
      header: true                      # the first line must name `columns`, in order
      columns: {label: int, user: bigint, item: bigint, hour: int}   # every field, in file order: its type
      key: []                           # columns identifying a line (duplicates); []: the whole line
      order_by: null                    # a column giving the rows' time order; null: file order
      timestamp_format: null            # how `timestamp` columns are written (Spark datetime pattern)
    user_id: user                       # a column, or [a, b]: several hashed together into one id
    ad_id: item
    surface: feed                       # a surface, or {column: slot, values: {"1": feed, "2": reels}}
    clicked: {column: label, positive: ["1"], negative: ["0"]}   # or `all`: every row is a click
    converted: null                     # optional: the same form; null: no conversion label
    features: [hour]                    # impression columns kept as the dataset's own features; or
                                        # {name: column} to rename one that collides with a bronze column
    users: {attributes: {age_bucket: null, country: null, device: null}, features: []}
    ads: {attributes: {advertiser_id: null, category: null, ad_format: null, objective: null}, features: []}
    events: {rows: clicks, action: click}   # or rows: all; or {file: views.csv, user:, item:, order_by:, ...}

Label values and surface codes are matched as written in the file; a value in neither set is an
`invalid_label_<column>` row in the quarantine. The file is read strictly (`gem_model.documents`: UTF-8,
at most 1 MiB and 50 levels, no anchors, aliases or repeated keys; `yes`, `no`, `07` stay text), and a
boolean or a number with a fraction where a label value or code belongs is refused: quote it.

Data paths: `impressions.folder`, and every file under it (`files`, `events.file`, `users.file`,
`ads.file`), are relative to the data root (the mapping file's own folder for a user's mapping, the
datasets folder for a built-in one) and, once resolved (`..` and symlinks followed), must lie inside it
unless the config allows otherwise (`data.allow_outside_data_root`): `data_folder`.

Every problem is a `MappingError` naming the file, the key, what is wrong and the fix.
docs/datasets.md documents every key with a complete example.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gem_lake import table_contract as contract
from gem_lake.sources.files import FORMATS, Field, TextFile
from gem_model.documents import DocumentError, load_json, load_yaml, read_document

TYPES = ("string", "int", "bigint", "double", "boolean", "timestamp")
USER_ATTRIBUTES = tuple(c.name for c in contract.USER_ATTRIBUTES)
AD_ATTRIBUTES = tuple(c.name for c in contract.AD_ATTRIBUTES)
# Keys that describe an input's layout (impressions', or a dimension's own file); the text-only ones
# do not apply to Parquet or Delta.
TEXT_KEYS = ("separator", "header", "timestamp_format", "encoding")
LAYOUT_KEYS = ("format", "version", "columns", "key", *TEXT_KEYS)
ENCODINGS = ("utf-8", "iso-8859-1", "windows-1252")
NAME = re.compile(r"[a-z0-9_]+")
# Bronze and gold columns an impression feature must not shadow (it would collide in the examples' join),
# besides gold's sequence columns (seq_*) and embedding rows (*_idx).
RESERVED = frozenset(
    (*contract.CONTRACT["bronze.impressions"].columns, "source_surface", *USER_ATTRIBUTES, *AD_ATTRIBUTES)
)


class MappingError(ValueError):
    """A source mapping that cannot be read: names the file, the key, the problem and the fix."""


@dataclass(frozen=True)
class Label:
    column: str
    positive: tuple[str, ...]
    negative: tuple[str, ...]


@dataclass(frozen=True)
class Surface:
    """A constant surface, or a column's codes mapped onto surfaces (an unmapped code: surface null)."""

    constant: str | None = None
    column: str | None = None
    values: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Dimension:
    attributes: tuple[tuple[str, str | None], ...]  # contract attribute -> column (None: the data has none)
    features: tuple[str, ...]
    file: TextFile | None = None  # its own file (else the impressions' rows)
    id: str | None = None  # the id column of that file


@dataclass(frozen=True)
class Events:
    """Behaviour events: the clicked impressions, every impression, or the lines of a file of their own
    (`file`); the action a constant or a column's value."""

    rows: str  # "clicks", "all" or "file"
    action: str | None
    action_column: str | None
    file: TextFile | None = None  # rows "file": its layout, and the columns of its user, item and time
    user: str | None = None
    item: str | None = None
    order_by: str | None = None  # the events' time, in the units of impressions.order_by
    surface: Surface | None = None  # None: the impressions' constant surface


@dataclass(frozen=True)
class SourceMapping:
    name: str
    folder: str
    layout: TextFile  # what every impression file holds (its name empty)
    files: tuple[str, ...]
    holdout_files: tuple[str, ...]  # laid out on exactly the holdout days (the dataset's own test split)
    order_by: str | None
    user_id: tuple[str, ...]  # one column, or several hashed together
    ad_id: tuple[str, ...]
    surface: Surface
    clicked: Label | None  # None: every row is a click (a click log, `converted` its label)
    converted: Label | None
    features: tuple[tuple[str, str], ...]  # (bronze name, column)
    users: Dimension
    ads: Dimension
    events: Events

    @property
    def text_files(self) -> tuple[TextFile, ...]:
        return tuple(dataclasses.replace(self.layout, name=f) for f in self.files)


class _Reader:
    """Typed access to the mapping's keys, each failure naming the key path and the fix."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, problem: str, fix: str) -> MappingError:
        return MappingError(f"{self.path}: {key}: {problem}; {fix}")

    def table(self, node: Any, key: str) -> dict[str, Any]:
        if not isinstance(node, dict):
            raise self.fail(key, f"expected a mapping of keys, found {_show(node)}", "write it as `key: value` lines")
        return node

    def required(self, node: dict[str, Any], key: str, where: str) -> Any:
        if node.get(key) is None:
            raise self.fail(f"{where}{key}", "is missing", f"add `{key}:` (docs/datasets.md lists every key)")
        return node[key]

    def unknown(self, node: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
        for key in node:
            if key not in allowed:
                raise self.fail(
                    f"{where}{key}", "is not a key of a source mapping", f"use one of {list(allowed)} (a typo?)"
                )

    def strings(self, node: Any, key: str) -> tuple[str, ...]:
        if node is None:
            return ()
        if not isinstance(node, list):
            raise self.fail(key, f"expected a list of names or values, found {_show(node)}", "write it as [a, b, c]")
        return tuple(self.text(v, f"{key}[{i}]") for i, v in enumerate(node))

    def text(self, node: Any, key: str) -> str:
        """A name, or a value compared with the data's text (a label value, a code): a string, or an integer,
        whose digits are its text as written (`gem_model.documents` reads `07` as the string '07')."""
        if isinstance(node, str):
            return node
        if isinstance(node, int) and not isinstance(node, bool):
            return str(node)
        raise self.fail(
            key,
            f"{_show(node)} is {_kind(node)}, not text as the file writes it",
            'quote it as the file writes it, e.g. "true" or "1.0"',
        )

    def column(self, node: Any, key: str, columns: dict[str, str], table: str = "impressions") -> str:
        if not isinstance(node, str) or node not in columns:
            raise self.fail(
                key, f"names column {_show(node)}, which `{table}.columns` does not have", f"use one of {list(columns)}"
            )
        return node


def _show(value: Any) -> str:
    """`value` for an error message, cut short: a mapping's value may be long."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(value: Any) -> str:
    for types, name in (
        (bool, "a boolean"),
        (int, "an integer"),
        (float, "a number with a fraction"),
        (str, "a string"),
        (list, "a list"),
        (dict, "a mapping of keys"),
        (type(None), "null"),
    ):
        if isinstance(value, types):
            return name
    return f"a {type(value).__name__}"


def load_mapping(path: Path) -> SourceMapping:
    """Read and check a mapping file (.yaml, .yml or .json)."""
    reader = _Reader(path)
    try:
        text = read_document(path)
        root = load_json(text) if path.suffix == ".json" else load_yaml(text)
    except OSError as e:
        raise MappingError(
            f"{path}: cannot be read ({e.strerror}); point GEM_SOURCE_MAPPING or "
            "data.mapping at an existing mapping file"
        ) from None
    except DocumentError as e:
        raise MappingError(f"{path}: {e}") from None
    if not isinstance(root, dict):  # its kind only: the path may name a file that is no mapping at all
        raise reader.fail(
            "(top level)",
            f"is {_kind(root)}, not a mapping of keys",
            "write the mapping's keys as `key: value` lines (docs/datasets.md)",
        )
    reader.unknown(
        root,
        (
            "name",
            "impressions",
            "user_id",
            "ad_id",
            "surface",
            "clicked",
            "converted",
            "features",
            "users",
            "ads",
            "events",
        ),
        "",
    )
    name = reader.text(reader.required(root, "name", ""), "name")
    if not NAME.fullmatch(name):
        raise reader.fail("name", f"{name!r} is not made of a-z, 0-9 and _", "rename it, e.g. my_logs")
    imps = reader.table(reader.required(root, "impressions", ""), "impressions")
    reader.unknown(imps, ("folder", "files", "holdout_files", *LAYOUT_KEYS, "order_by"), "impressions.")
    files = reader.strings(reader.required(imps, "files", "impressions."), "impressions.files")
    if not files:
        raise reader.fail("impressions.files", "is empty", "list the impression files, oldest first")
    holdout_files = reader.strings(imps.get("holdout_files"), "impressions.holdout_files")
    if not set(holdout_files) < set(files):
        raise reader.fail(
            "impressions.holdout_files",
            f"{list(holdout_files)} must be some, not all, of impressions.files {list(files)}",
            "name the test split's files (the rest train)",
        )
    columns = _columns(reader, reader.required(imps, "columns", "impressions."), "impressions.columns")
    order_by = imps.get("order_by")
    if order_by is not None:
        reader.column(order_by, "impressions.order_by", columns)
    clicked_node = reader.required(root, "clicked", "")
    clicked = None if clicked_node == "all" else _label(reader, clicked_node, "clicked", columns)
    converted = None if root.get("converted") is None else _label(reader, root["converted"], "converted", columns)
    if clicked is None and converted is None:
        raise reader.fail(
            "clicked",
            "is `all` (every row a click) but `converted` is not given",
            "a click log needs its conversion label: add `converted: {column: ..., positive: [...], negative: [...]}`",
        )
    layout = _layout(reader, imps, "impressions.", columns, [x for x in (clicked, converted) if x is not None])
    features = _features(reader, root.get("features"), columns)
    surface = _surface(reader, reader.required(root, "surface", ""), columns)
    return SourceMapping(
        name=name,
        folder=reader.text(imps.get("folder", ""), "impressions.folder"),
        layout=layout,
        files=files,
        holdout_files=holdout_files,
        order_by=order_by,
        user_id=_id_columns(reader, reader.required(root, "user_id", ""), "user_id", columns),
        ad_id=_id_columns(reader, reader.required(root, "ad_id", ""), "ad_id", columns),
        surface=surface,
        clicked=clicked,
        converted=converted,
        features=features,
        users=_dimension(reader, root.get("users"), "users", USER_ATTRIBUTES, columns),
        ads=_dimension(reader, root.get("ads"), "ads", AD_ATTRIBUTES, columns),
        events=_events(reader, root.get("events"), columns, order_by, holdout_files, surface),
    )


def _id_columns(reader: _Reader, node: Any, key: str, columns: dict[str, str]) -> tuple[str, ...]:
    names = reader.strings(node, key) if isinstance(node, list) else (node,)
    if not names:
        raise reader.fail(key, "is empty", "name the id's column, or the columns that together identify it")
    return tuple(reader.column(n, key if len(names) == 1 else f"{key}[{i}]", columns) for i, n in enumerate(names))


def _layout(
    reader: _Reader, node: dict[str, Any], where: str, columns: dict[str, str], labels: list[Label]
) -> TextFile:
    """What every file of a table holds (its name left empty), from the keys of LAYOUT_KEYS."""
    file_format = str(node.get("format", "text"))
    if file_format not in FORMATS:
        raise reader.fail(
            f"{where}format",
            f"{file_format!r} is not one of {list(FORMATS)}",
            "text: delimited files; parquet: Parquet files or folders; delta: Delta tables",
        )
    version = node.get("version")
    if version is not None and (file_format != "delta" or not isinstance(version, int) or version < 0):
        raise reader.fail(
            f"{where}version",
            f"{version!r} pins no Delta table version",
            "give a version number >= 0 of a `format: delta` input, or drop it for the latest",
        )
    if file_format != "text":
        for k in TEXT_KEYS:
            if k in node:
                raise reader.fail(
                    f"{where}{k}",
                    f"applies to text files only, not {file_format}",
                    f"drop it: a {file_format} input's columns carry their own types",
                )
    separator = str(node.get("separator", ","))
    if len(separator) != 1 or separator == '"':
        raise reader.fail(
            f"{where}separator",
            f"{separator!r} is not one character other than a quote",
            'use e.g. "," or "\\t" or "|"',
        )
    header = node.get("header", True)
    if isinstance(header, list):  # the file's own names, mapped in order onto `columns`
        header = [reader.text(h, f"{where}header[{i}]") for i, h in enumerate(header)]
        if len(header) != len(columns):
            raise reader.fail(
                f"{where}header",
                f"{_show(header)} does not name each of the {len(columns)} columns once",
                "list the header line's names in file order, one per entry of `columns`",
            )
    elif not isinstance(header, bool):
        raise reader.fail(
            f"{where}header",
            f"expected true, false or a list of names, found {header!r}",
            "true when the first line names the columns; a list when it names them otherwise",
        )
    key = reader.strings(node.get("key"), f"{where}key")
    for i, k in enumerate(key):
        reader.column(k, f"{where}key[{i}]", columns)
    encoding = str(node.get("encoding", "utf-8")).lower()
    if encoding not in ENCODINGS:
        raise reader.fail(
            f"{where}encoding",
            f"{encoding!r} is not one of {list(ENCODINGS)}",
            "name the files' character set (ISO-8859-1 for Latin-1)",
        )
    return TextFile(
        name="",
        fields=tuple(Field(c, t) for c, t in columns.items()),
        header=tuple(header) if isinstance(header, list) else tuple(columns) if header else None,
        labels=tuple(label.column for label in labels),
        label_values=tuple(dict.fromkeys(v for label in labels for v in (*label.positive, *label.negative))),
        key=key,
        timestamp_format=node.get("timestamp_format"),
        separator=separator,
        encoding=encoding,
        format=file_format,
        version=version,
    )


def _features(reader: _Reader, node: Any, columns: dict[str, str]) -> tuple[tuple[str, str], ...]:
    named = node if isinstance(node, dict) else {c: c for c in reader.strings(node, "features")}
    for name, column in named.items():
        reader.column(column, f"features.{name}", columns)
        if name in RESERVED or not NAME.fullmatch(str(name)) or name.startswith("seq_") or name.endswith("_idx"):
            raise reader.fail(
                f"features.{name}",
                "collides with a bronze column (or is not a name of a-z, 0-9 and _)",
                f"rename it: features: {{{column}_feature: {column}}}",
            )
    return tuple((str(n), str(c)) for n, c in named.items())


def _columns(reader: _Reader, node: Any, where: str) -> dict[str, str]:
    columns = reader.table(node, where)
    for column, kind in columns.items():
        if not NAME.fullmatch(str(column)):
            raise reader.fail(
                f"{where}.{column}",
                "is not a name of a-z, 0-9 and _",
                "name the field in lower case (the header must then match it)",
            )
        if kind not in TYPES:
            raise reader.fail(
                f"{where}.{column}",
                f"type {kind!r} is not one of {list(TYPES)}",
                "ids are bigint, labels and codes int or string",
            )
    return {str(c): str(t) for c, t in columns.items()}


def _label(reader: _Reader, node: Any, key: str, columns: dict[str, str]) -> Label:
    if isinstance(node, str):
        fix = "write `all` for a log whose every row is a click, or " if key == "clicked" else "write "
        raise reader.fail(key, f"{node!r} is not a label", fix + "`{column: c, positive: [...], negative: [...]}`")
    table = reader.table(node, key)
    reader.unknown(table, ("column", "positive", "negative"), f"{key}.")
    column = reader.column(reader.required(table, "column", f"{key}."), f"{key}.column", columns)
    positive = reader.strings(reader.required(table, "positive", f"{key}."), f"{key}.positive")
    negative = reader.strings(reader.required(table, "negative", f"{key}."), f"{key}.negative")
    if not positive or not negative or set(positive) & set(negative):
        raise reader.fail(
            key,
            f"positive {list(positive)} and negative {list(negative)} must be non-empty and disjoint",
            "list each value as written in the file in exactly one of them",
        )
    return Label(column, positive, negative)


def _surface(
    reader: _Reader, node: Any, columns: dict[str, str], key: str = "surface", table_name: str = "impressions"
) -> Surface:
    if isinstance(node, str):
        return Surface(constant=node)
    table = reader.table(node, key)
    reader.unknown(table, ("column", "values"), f"{key}.")
    column = reader.column(reader.required(table, "column", f"{key}."), f"{key}.column", columns, table_name)
    values = reader.table(reader.required(table, "values", f"{key}."), f"{key}.values")
    return Surface(
        column=column,
        values=tuple(
            (reader.text(code, f"{key}.values"), reader.text(surface, f"{key}.values.{code}"))
            for code, surface in values.items()
        ),
    )


def _dimension(reader: _Reader, node: Any, key: str, attributes: tuple[str, ...], columns: dict[str, str]) -> Dimension:
    table = reader.table(node if node is not None else {}, key)
    reader.unknown(table, ("file", "id", *LAYOUT_KEYS, "attributes", "features"), f"{key}.")
    file = table.get("file")
    source = key if file is not None else "impressions"  # whose columns the keys below name
    if file is not None:  # its own file: every column named from that file's columns
        columns = _columns(reader, reader.required(table, "columns", f"{key}."), f"{key}.columns")
        layout = dataclasses.replace(
            _layout(reader, table, f"{key}.", columns, []), name=reader.text(file, f"{key}.file")
        )
        id_column = reader.column(reader.required(table, "id", f"{key}."), f"{key}.id", columns, source)
    else:
        for k in ("id", *LAYOUT_KEYS):
            if k in table:
                raise reader.fail(f"{key}.{k}", "applies only to a file of its own", f"add `{key}.file:` or drop it")
        layout, id_column = None, None
    given = reader.table(table.get("attributes") or {}, f"{key}.attributes")
    reader.unknown(given, attributes, f"{key}.attributes.")
    mapped = tuple(
        (a, None if given.get(a) is None else reader.column(given[a], f"{key}.attributes.{a}", columns, source))
        for a in attributes
    )
    features = reader.strings(table.get("features"), f"{key}.features")
    for i, f in enumerate(features):
        reader.column(f, f"{key}.features[{i}]", columns, source)
    return Dimension(mapped, features, layout, id_column)


def _events(
    reader: _Reader,
    node: Any,
    columns: dict[str, str],
    order_by: str | None,
    holdout_files: tuple[str, ...],
    surface: Surface,
) -> Events:
    table = reader.table(node if node is not None else {}, "events")
    if "file" in table:
        return _event_file(reader, table, columns, order_by, holdout_files, surface)
    reader.unknown(table, ("rows", "action"), "events.")
    rows = table.get("rows", "clicks")
    if rows not in ("clicks", "all"):
        raise reader.fail(
            "events.rows",
            f"{rows!r} is not 'clicks' or 'all'",
            "clicks: the clicked impressions are the events; all: every impression is one",
        )
    return Events(rows, *_action(reader, table, columns, "impressions"))


def _action(
    reader: _Reader, table: dict[str, Any], columns: dict[str, str], source: str
) -> tuple[str | None, str | None]:
    """(a constant action, or None; the column holding each event's action, or None)."""
    action = table.get("action", "click")
    if not isinstance(action, dict):
        return reader.text(action, "events.action"), None
    reader.unknown(action, ("column",), "events.action.")
    return None, reader.column(
        reader.required(action, "column", "events.action."), "events.action.column", columns, source
    )


def _event_file(
    reader: _Reader,
    table: dict[str, Any],
    imp_columns: dict[str, str],
    imp_order_by: str | None,
    holdout_files: tuple[str, ...],
    imp_surface: Surface,
) -> Events:
    """Events from a file of their own, laid out on the calendar together with the impressions by time."""
    reader.unknown(table, ("file", *LAYOUT_KEYS, "user", "item", "order_by", "action", "surface"), "events.")
    if imp_order_by is None or holdout_files:
        raise reader.fail(
            "events.file",
            "needs the impressions in time order, without holdout_files",
            "give impressions.order_by (a time column) and drop impressions.holdout_files: events "
            "and impressions share one calendar laid out by time",
        )
    columns = _columns(reader, reader.required(table, "columns", "events."), "events.columns")
    layout = dataclasses.replace(
        _layout(reader, table, "events.", columns, []), name=reader.text(table["file"], "events.file")
    )
    user, item, order_by = (
        reader.column(reader.required(table, k, "events."), f"events.{k}", columns, "events")
        for k in ("user", "item", "order_by")
    )
    if columns[order_by] != imp_columns[imp_order_by]:
        raise reader.fail(
            "events.order_by",
            f"{order_by!r} is {columns[order_by]}, impressions.order_by "
            f"{imp_order_by!r} is {imp_columns[imp_order_by]}",
            "both must be one clock in one unit (e.g. Unix seconds as bigint)",
        )
    if table.get("surface") is None and imp_surface.constant is None:
        raise reader.fail(
            "events.surface",
            "is missing, and the impressions' surface comes from a column",
            "give the events' surface: a constant, or {column: ..., values: {...}}",
        )
    surface = (
        None
        if table.get("surface") is None
        else _surface(reader, table["surface"], columns, "events.surface", "events")
    )
    return Events("file", *_action(reader, table, columns, "events"), layout, user, item, order_by, surface)


def data_folder(mapping: SourceMapping, source: Path, root: Path, allow_outside: bool = False) -> Path:
    """The folder of `mapping`'s files: `impressions.folder` under the data `root`.

    It and every file the mapping names must lie inside `root` once resolved (`..` and symlinks
    followed), or a `MappingError` (naming `source`, the mapping's file, and the key) says so, unless
    `allow_outside` (`data.allow_outside_data_root`): a mapping may come from anyone, and must not make
    the pipeline read `/etc/passwd` into the quarantine's raw lines.
    """
    root = root.resolve()
    folder = root / mapping.folder
    if allow_outside:
        return folder
    named = [("impressions.folder", Path(mapping.folder))]
    named += [(f"impressions.files[{i}]", Path(mapping.folder, f)) for i, f in enumerate(mapping.files)]
    for key, own in (
        ("users.file", mapping.users.file),
        ("ads.file", mapping.ads.file),
        ("events.file", mapping.events.file),
    ):
        if own is not None:
            named.append((key, Path(mapping.folder, own.name)))
    for key, written in named:  # relative to the root, or absolute
        resolved = (root / written).resolve()
        if not resolved.is_relative_to(root):
            raise _Reader(source).fail(
                key,
                f"{_show(str(written))} is {resolved}, outside the data root {root}",
                "keep the data (and what its links point to) under the data root, or set "
                "data.allow_outside_data_root: true in the config to read it where it is",
            )
    return folder
