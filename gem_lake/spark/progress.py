"""Progress of the running Spark stages, logged every few seconds while a step waits on Spark.

Spark's own console progress bar is off (`spark.ui.showConsoleProgress`): it rewrites one terminal
line, which a Dagster run log or a CI log cannot show. This reporter reads the driver's status
tracker instead and logs one line per active stage, only while stages run and only when their
progress changed, so a minutes-long feature build is never silent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark import SparkContext

INTERVAL_S = 20.0


def stage_lines(context: SparkContext) -> list[str]:
    """One line per active stage: its id, name, tasks done of total, running and failed tasks."""
    tracker = context.statusTracker()
    lines = []
    for stage_id in sorted(tracker.getActiveStageIds()):
        info = tracker.getStageInfo(stage_id)
        if info is None:  # finished between the two calls
            continue
        failed = f", {info.numFailedTasks} failed" if info.numFailedTasks else ""
        lines.append(
            f"Spark stage {stage_id} ({info.name}): {info.numCompletedTasks}/{info.numTasks} tasks done, "
            f"{info.numActiveTasks} running{failed}"
        )
    return lines


class SparkProgress:
    """A daemon thread calling `log` with the active stages' progress every `interval_s` seconds."""

    def __init__(self, context: SparkContext, log: Callable[[str], None], interval_s: float = INTERVAL_S) -> None:
        self._context, self._log, self._interval_s = context, log, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="spark-progress", daemon=True)

    def __enter__(self) -> SparkProgress:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        last: list[str] = []
        while not self._stop.wait(self._interval_s):
            try:
                lines = stage_lines(self._context)
            except Exception:  # the session stopped under us: nothing left to report
                return
            if lines and lines != last:
                self._log("; ".join(lines))
            last = lines
