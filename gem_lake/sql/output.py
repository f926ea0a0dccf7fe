"""How `gem sql` prints a query's rows: a table, JSON lines or CSV, written as the rows arrive.

Nothing here holds more than one block of rows: the table format aligns its columns on the first
`ROW_CAP` rows, prints them, and prints every later row at those widths (a wider later value widens
its own line only), so `gem sql --all` streams a result of any size at a bounded memory cost.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Sequence
from typing import TextIO

ROW_CAP = 1000  # rows `gem sql` prints unless --limit or --all says otherwise; also the table's block
FORMATS = ("table", "json", "csv")


def write_rows(
    out: TextIO, columns: Sequence[str], rows: Iterable[Sequence[object]], fmt: str, limit: int | None = None
) -> tuple[int, bool]:
    """Write `rows` to `out` in `fmt`, at most `limit` of them (None: all). Returns (rows written, whether
    `rows` had more): give it `limit + 1` rows to learn whether more exist without reading them all.

    The table format ends with a `(N rows)` line that also says when more exist; JSON and CSV hold
    only the rows, so the caller says it elsewhere.
    """
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit={limit} must be 0 or more, or None for every row")
    writer = csv.writer(out) if fmt == "csv" else None
    if writer is not None:
        writer.writerow(columns)
    table = _Table(out, columns) if fmt == "table" else None
    written, more = 0, False
    for row in rows:
        if written == limit:
            more = True
            break
        written += 1
        if table is not None:
            table.add(row)
        elif writer is not None:
            writer.writerow(row)
        else:
            out.write(json.dumps(dict(zip(columns, row)), default=str) + "\n")
    if table is not None:
        table.flush()
        count = f"{written} row{'s' if written != 1 else ''}"
        out.write(f"({count} shown; more exist: --limit N shows N, --all every row)\n" if more else f"({count})\n")
    return written, more


class _Table:
    """Columns padded to the widths of the first `ROW_CAP` rows; NULL for None."""

    def __init__(self, out: TextIO, columns: Sequence[str]) -> None:
        self._out, self._columns = out, [str(c) for c in columns]
        self._block: list[list[str]] = []
        self._widths: list[int] | None = None

    def add(self, row: Sequence[object]) -> None:
        self._block.append(["NULL" if v is None else str(v) for v in row])
        if self._widths is not None or len(self._block) == ROW_CAP:
            self.flush()

    def flush(self) -> None:
        widths = self._widths
        if widths is None:
            widths = self._widths = [
                max([len(c)] + [len(r[i]) for r in self._block]) for i, c in enumerate(self._columns)
            ]
            self._line(self._columns, widths)
            self._line(["-" * w for w in widths], widths)
        for row in self._block:
            self._line(row, widths)
        self._block = []

    def _line(self, cells: Sequence[str], widths: list[int]) -> None:
        self._out.write("  ".join(v.ljust(w) for v, w in zip(cells, widths)).rstrip() + "\n")
