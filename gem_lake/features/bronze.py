"""Land one raw batch (a dimension table, or a day of events/impressions) in bronze.

The batch is split by `gem_lake.quarantine`; the accepted rows replace the bronze table
(or its day) and the rejected rows replace that batch's slice of `bronze.rejected_rows`, so a
re-run never duplicates either. The landing then reads both back (delta-rs: the accepted rows from
the Delta log's per-file statistics, the rejections' reasons from the Parquet files it lists) and
reports row conservation (rows in = accepted + rejected) and the rejection reasons.

Delta has no transaction across two tables, so a landing is made atomic the way a two-phase
commit is: a journal entry per (table, partition) (`$GEM_HOME/landings/<table>/<partition>.json`)
says `started` before the first of the two commits and `committed` after both. A landing killed
between them leaves `started`, and every job that reads that bronze partition refuses it
(`require_landed`) until it is landed again; nothing reads a half-landed batch unnoticed, nor a
partition that was never landed as if it had no rows. One
landing of a partition runs at a time (`gem_lake.locks.partition_lock`), and the row-drop guard
(`gem_lake.delta.WritePolicy`) refuses, before anything is written, to replace landed rows with an
empty or much smaller batch unless asked.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame

from gem_lake.delta import (
    UNGUARDED,
    WritePolicy,
    check_row_drop,
    overwrite_table,
    replace_partition,
    table_stats,
    table_version,
    value_counts,
)
from gem_lake.locks import partition_lock
from gem_lake.quarantine import REJECTED_TABLE, WHOLE_TABLE, split
from gem_model.paths import GemPaths


@dataclass(frozen=True)
class Landing:
    table: str
    rows_in: int
    accepted: int  # rows of the batch now in the bronze table (read back)
    rejected: int  # rows of the batch now in bronze.rejected_rows (read back)
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def conserved(self) -> bool:
        return self.rows_in == self.accepted + self.rejected


class IncompleteLandingError(RuntimeError):
    pass


class MissingLandingError(FileNotFoundError):
    """Bronze partitions that were never landed: they have no landing journal."""

    def __init__(self, table: str, partitions: list[str], journals: Path) -> None:
        listed = ", ".join(partitions)
        super().__init__(
            f"{table} partition{'s' if len(partitions) > 1 else ''} {listed} "
            f"{'were' if len(partitions) > 1 else 'was'} never landed (no landing journal in {journals})"
        )
        self.table, self.partitions = table, partitions


def _journal_path(paths: GemPaths, table: str, partition: str) -> Path:
    return paths.home / "landings" / table / f"{partition}.json"


def _write_journal(path: Path, entry: dict[str, Any] | None) -> None:
    """Atomically replace the journal entry (None: remove it)."""
    if entry is None:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entry, indent=2, sort_keys=True))
    tmp.replace(path)


def read_journal(paths: GemPaths, table: str, partition: str) -> dict[str, Any] | None:
    """The last landing of (`table`, `partition`: an ISO day or `all`), or None if none was journaled."""
    path = _journal_path(paths, table, partition)
    return json.loads(path.read_text()) if path.is_file() else None


def require_landed(paths: GemPaths, table: str, partitions: Iterable[str]) -> dict[str, int]:
    """The accepted rows of each partition of `table`; refuse one never landed (`MissingLandingError`: a day
    that is missing is not a day without rows) or whose last landing started and never finished."""
    entries = {partition: read_journal(paths, table, partition) for partition in partitions}
    missing = [partition for partition, entry in entries.items() if entry is None]
    if missing:
        raise MissingLandingError(table, missing, _journal_path(paths, table, missing[0]).parent)
    accepted = {}
    for partition, entry in entries.items():
        if entry["state"] != "committed":
            raise IncompleteLandingError(
                f"{table} partition {partition}: its landing {entry['landing_id']} (by {entry['holder']}) started at "
                f"{entry['started_at']} and never finished, so its accepted and rejected rows may disagree; land it "
                f"again (materialise {table} for {partition}) before building anything from it"
            )
        accepted[partition] = entry["accepted"]
    return accepted


def land(
    raw: DataFrame,
    table: str,
    paths: GemPaths,
    surfaces: tuple[str, ...],
    ds: date | None = None,
    *,
    policy: WritePolicy = UNGUARDED,
    holder: str = "",
) -> Landing:
    """Split `raw` and land it as `table` (day `ds`, or the whole dimension), journaled (module docstring)."""
    partition = ds.isoformat() if ds else WHOLE_TABLE
    holder = holder or f"pid {os.getpid()}"
    target = paths.table(table)
    with partition_lock(paths, "landing", table, partition, holder=holder):
        raw = raw.cache()
        rows_in = raw.count()
        accepted, rejected = split(raw, table, surfaces, ds)
        accepted = accepted.cache()
        check_row_drop(target, {"ds": ds} if ds else None, accepted.count(), policy)
        journal = _journal_path(paths, table, partition)
        previous = read_journal(paths, table, partition)
        entry = {
            "landing_id": uuid.uuid4().hex,
            "holder": holder,
            "state": "started",
            "rows_in": rows_in,
            "started_at": datetime.now(UTC).isoformat(),
        }
        _write_journal(journal, entry)
        lineage = {"landing_id": entry["landing_id"], "holder": holder}
        unguarded = dataclasses.replace(policy, max_row_drop_fraction=None)  # checked above, before the journal
        slice_ = {"source_table": table, "source_partition": partition}
        committed = False
        try:
            if ds is None:
                overwrite_table(accepted, target, policy=unguarded, commit_info=lineage)
            else:
                replace_partition(accepted, target, {"ds": ds}, unguarded, lineage)
            committed = True
            replace_partition(rejected, paths.table(REJECTED_TABLE), slice_, commit_info=lineage)
        except BaseException:
            if not committed:  # nothing reached the lake: the previous landing still stands
                _write_journal(journal, previous)
            raise
        finally:
            accepted.unpersist()
            raw.unpersist()

        # What the two tables now hold, read by delta-rs: no Spark job.
        held = table_stats(target, {"ds": ds} if ds else None)  # its rows and the version they were counted at
        reasons = value_counts(paths.table(REJECTED_TABLE), "reason", slice_)
        landing = Landing(table, rows_in, held.rows, sum(reasons.values()), dict(sorted(reasons.items())))
        _write_journal(
            journal,
            {
                **entry,
                "state": "committed",
                "finished_at": datetime.now(UTC).isoformat(),
                "accepted": landing.accepted,
                "rejected": landing.rejected,
                "delta_version": held.version,
                "rejected_delta_version": table_version(paths.table(REJECTED_TABLE)),
            },
        )
    return landing
