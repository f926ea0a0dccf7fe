"""What a dataset's input files hold: the layout of each file (`TextFile`) and its columns (`Field`).

A `TextFile` is read as delimited text by `gem_lake.sources.lines` or, with `format` parquet or
delta, as a columnar input by `gem_lake.sources.columnar`; both import the layout from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

LABEL_VALUES = ("0", "1")
FORMATS = ("text", "parquet", "delta")  # text: gem_lake.sources.lines; the others: gem_lake.sources.columnar


class Field(NamedTuple):
    """`width` consecutive fields of a line as one column of Spark SQL `type` (an array of it when width > 1)."""

    name: str
    type: str
    width: int = 1


@dataclass(frozen=True)
class TextFile:
    """One delimited file of a dataset (`name` under the dataset's folder) and what its lines must hold;
    or, with `format` parquet or delta, a columnar input read by `gem_lake.sources.columnar` (the text-only
    settings unused)."""

    name: str
    fields: tuple[Field, ...]
    header: tuple[str, ...] | None  # the header line's fields exactly; None for a file without one
    labels: tuple[str, ...] = ()  # columns whose field must be one of `label_values`
    label_values: tuple[str, ...] = LABEL_VALUES  # exactly as written in the file
    key: tuple[str, ...] = ()  # columns identifying a line within the file; (): the whole line, within the source
    timestamp_format: str | None = None  # how `timestamp` fields are written
    separator: str = ","  # one character; fields in double quotes may hold it
    encoding: str = "utf-8"  # another (ISO-8859-1, windows-1252) is decoded before the checks
    format: str = "text"  # or parquet (a file or a folder of files), delta (a table): gem_lake.sources.columnar
    version: int | None = None  # delta: the table version read (None: the latest)

    @property
    def n_fields(self) -> int:
        return sum(f.width for f in self.fields)

    @property
    def duplicate_reason(self) -> str:
        return f"duplicate_{'_'.join(self.key) or 'line'}"
