"""What one statement of SQL over the lake may use: the limits `gem_lake.sql.query.LakeSQL` runs under.

Kept apart from `gem_lake.sql.query` so that `gem`'s argument parser reads the defaults from here without
loading DuckDB; docs/SQL.md says why each default is what it is.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_SIZE = re.compile(r"^[0-9]+(\.[0-9]+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)$", re.IGNORECASE)


@dataclass(frozen=True)
class SQLLimits:
    """What each statement of a `LakeSQL` session may use; every default is bounded (docs/SQL.md).

    `timeout_s`: wall-clock seconds per statement, from its start to its last row read (a declaration
    is a statement, each read of a query's rows is one). `memory_limit`: DuckDB's buffer memory (joins,
    sorts, aggregates, results being produced); beyond it DuckDB spills to disk, up to
    `max_temp_directory_size`. `threads`: DuckDB's worker threads (None: one per core).
    """

    # Five minutes: long enough for a full scan of a large table, short enough that a query that never
    # ends (a recursive CTE without a stop) gives the terminal or the Dagster run back.
    timeout_s: float = 300.0
    # DuckDB's own default is 80% of the RAM, which this machine shares with Spark, training and other
    # users; past 4GB, joins, sorts and aggregates spill to disk and still finish.
    memory_limit: str = "4GB"
    # DuckDB's own default is 90% of the free disk, the disk the lake may be on: a runaway sort would fill it.
    max_temp_directory_size: str = "16GB"
    threads: int | None = None

    def __post_init__(self) -> None:
        if (
            isinstance(self.timeout_s, bool)
            or not isinstance(self.timeout_s, int | float)
            or not (math.isfinite(self.timeout_s) and self.timeout_s > 0)
        ):
            raise ValueError(f"timeout_s={self.timeout_s!r} must be a positive number of seconds, e.g. 300")
        for name in ("memory_limit", "max_temp_directory_size"):
            value = getattr(self, name)
            if not isinstance(value, str) or not _SIZE.match(value.strip()):
                raise ValueError(f"{name}={value!r} must be a size with a unit, e.g. '4GB' or '512MB'")
        if self.threads is not None and (
            isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1
        ):
            raise ValueError(f"threads={self.threads!r} must be a positive integer, or None for one per core")
