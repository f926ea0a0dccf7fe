"""Cross-process locks that keep concurrent runs from interleaving their writes to the lake.

Two kinds, both `flock(2)` on a file, which the kernel releases when the holding process dies
(SIGKILL included), so a crash never leaves a stale lock behind:

- `table_commit_lock(table_path)`: held around every Delta write of `gem_lake.delta`. Delta's log store
  for local (and most shared POSIX) file systems arbitrates concurrent commits only inside one
  JVM; two Spark drivers committing to one table can both claim the same log version. Writers
  wait for each other (up to `COMMIT_WAIT_S`), so commits to one table are serial.
- `partition_lock(paths, kind, *key)`: one run owns a unit of output for its whole step (an
  export's (model_version, ds), a teacher's resumable working directory, a landing's partition).
  A second run is refused at once with `PartitionBusyError` naming the holder: it would either
  redo the same work or mix two runs' outputs.

The lock files live on the same file system as the data (`$GEM_HOME/locks`, or beside the
table), so every process that can write the lake sees them. On object stores, where flock does
not exist, Delta needs its multi-cluster log store (e.g. S3 + DynamoDB) and partitions need an
external lock service: docs/RELIABILITY.md.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from pathlib import Path

from gem_model.paths import GemPaths

COMMIT_WAIT_S = 600.0  # a table commit waits this long for another writer of the same table


class PartitionBusyError(RuntimeError):
    """Another live process holds the lock."""


def _holder(label: str) -> str:
    return json.dumps(
        {
            "holder": label,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": datetime.now(UTC).isoformat(timespec="seconds"),
        }
    )


@contextmanager
def file_lock(path: Path, label: str, wait_s: float) -> Iterator[None]:
    """Hold an exclusive flock on `path`, waiting up to `wait_s` seconds (0: fail at once).

    The holder's description (`label`, pid, host, since) is written into the file, so a refused
    caller can name who holds it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as err:
                if err.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() >= deadline:
                    held_by = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
                    raise PartitionBusyError(
                        f"{path.stem} is locked by another run ({held_by}); wait for it to finish "
                        "(its output is complete when it does), then re-run if you still need to"
                    ) from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, _holder(label).encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the flock


def table_commit_lock(table_path: Path) -> AbstractContextManager[None]:
    """The lock every writer of the Delta table at `table_path` holds while it writes and commits."""
    lock = table_path.parent / f".{table_path.name}.commit.lock"
    return file_lock(lock, f"commit to {table_path}", COMMIT_WAIT_S)


def partition_lock(paths: GemPaths, kind: str, *key: str, holder: str) -> AbstractContextManager[None]:
    """Exclusive ownership of one unit of output (`kind` and `key`, e.g. export / version / ds) for
    `holder` (a Dagster run id); a second owner is refused at once."""
    name = "__".join((kind, *key))
    return file_lock(paths.home / "locks" / kind / f"{name}.lock", holder, 0.0)
