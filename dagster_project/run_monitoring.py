"""Runs whose process died (killed, machine rebooted) are marked failed instead of staying STARTED forever.

Dagster's run monitoring (the daemon that `make ui` / `dagster dev` starts) asks the instance's run
launcher whether each STARTED run's worker is alive; Dagster's `DefaultRunLauncher` cannot answer,
so the instance (`dagster.yaml`, written into DAGSTER_HOME by `ensure_instance_config`) uses
`PidCheckingRunLauncher`: the same launcher, plus a health check that finds the run's worker
process and reports `FAILED` once it is gone. The worker is named by the pid Dagster's run worker
logs at start ("Started process for run (pid: N)": runs launched from the UI, `gem demo` and
`gem export`), or, for runs executed in process (tests, scripts), by the `gem/pid` and `gem/host`
tags (`worker_tags`). Without the daemon, the next `gem demo` / `gem export` marks the dead runs
failed when it opens the instance (`fail_dead_runs`), through Dagster's own monitoring code.

A pid outlives its process: after a reboot, or once the kernel hands it out again, another process
may hold it. The worker is therefore known by its identity (`gem/process`: the boot id and its start
in clock ticks since boot), which no wall clock enters: a clock step (NTP, a resumed or cloned VM)
must not fail a live run. An in-process run carries it from the start; a worker known by its logged
pid gets it at its first check (the daemon's comes within `poll_interval_seconds`), which fails it instead
if the machine booted after the run started or, for a first check later than `FIRST_CHECK_TRUST_S` after
the start (the daemon was down), if the process started after the run by the wall clock.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import time
from pathlib import Path

import dagster as dg
from dagster._core.launcher import CheckRunHealthResult, DefaultRunLauncher, WorkerStatus
from dagster._daemon.monitoring.run_monitoring import monitor_started_run

PID_TAG, HOST_TAG, PROCESS_TAG = "gem/pid", "gem/host", "gem/process"
INSTANCE_CONFIG = Path(__file__).with_name("dagster.yaml")
_STARTED_PROCESS = "Started process for run (pid: "
FIRST_CHECK_TRUST_S = 600.0  # a logged pid first checked this soon after the run started is its worker


def _start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot; None where /proc cannot tell or it is gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _identity(ticks: int | None) -> str | None:
    """`<boot id>/<start ticks>` of the process that started at `ticks`; None where /proc cannot tell."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    return None if ticks is None else f"{boot}/{ticks}"


def _started_after(ticks: int | None, timestamp: float) -> bool:
    """Whether the process that started at `ticks` started after `timestamp` by the wall clock."""
    return ticks is not None and _boot_time() + ticks / os.sysconf("SC_CLK_TCK") > timestamp + 1.0


def _boot_time() -> float:
    """The machine's boot by the wall clock (0.0 where /proc cannot tell)."""
    try:
        return next(
            float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime ")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return 0.0


def _booted_after(timestamp: float) -> bool:
    """Whether the machine booted after `timestamp`; only a clock step larger than the uptime then misleads it."""
    return _boot_time() > timestamp


def worker_tags() -> dict[str, str]:
    """Tags naming this process as the worker of an in-process run."""
    identity = _identity(_start_ticks(os.getpid()))
    return {PID_TAG: str(os.getpid()), HOST_TAG: socket.gethostname(), **({PROCESS_TAG: identity} if identity else {})}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class PidCheckingRunLauncher(DefaultRunLauncher):
    """Dagster's default launcher, with a worker health check for run monitoring (module docstring)."""

    @property
    def supports_check_run_worker_health(self) -> bool:
        return True

    def _worker(self, run: dg.DagsterRun) -> tuple[int | None, str | None]:
        if PID_TAG in run.tags:
            return int(run.tags[PID_TAG]), run.tags.get(HOST_TAG)
        for record in self._instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT):
            message = (record.dagster_event.message or "") if record.dagster_event else ""
            if message.startswith(_STARTED_PROCESS):
                return int(message[len(_STARTED_PROCESS) :].rstrip(").")), socket.gethostname()
        return None, None

    def check_run_worker_health(self, run: dg.DagsterRun) -> CheckRunHealthResult:
        pid, host = self._worker(run)
        if pid is None or host != socket.gethostname():
            return CheckRunHealthResult(WorkerStatus.RUNNING, "worker unknown or on another host: not judged")
        gone = CheckRunHealthResult(
            WorkerStatus.FAILED, f"run worker process {pid} on {host} is gone (killed or crashed)"
        )
        ticks = _start_ticks(pid)
        identity = _identity(ticks)
        if not _alive(pid) or (identity is not None and run.tags.get(PROCESS_TAG, identity) != identity):
            return gone
        if identity is not None and PROCESS_TAG not in run.tags:  # first check of a worker known by its logged pid
            record = self._instance.get_run_record_by_id(run.run_id)
            started = record.start_time if record and record.start_time else 0.0
            late = time.time() - started > FIRST_CHECK_TRUST_S
            if _booted_after(started) or (late and _started_after(ticks, started)):
                return gone
            self._instance.add_run_tags(run.run_id, {PROCESS_TAG: identity})
        return CheckRunHealthResult(WorkerStatus.RUNNING)


def ensure_instance_config(dagster_home: Path) -> None:
    """Write the project's `dagster.yaml` (run monitoring on) into `dagster_home` unless one is there."""
    dagster_home.mkdir(parents=True, exist_ok=True)
    target = dagster_home / "dagster.yaml"
    if not target.exists():
        shutil.copyfile(INSTANCE_CONFIG, target)


def fail_dead_runs(instance: dg.DagsterInstance) -> list[str]:
    """Mark every STARTED run whose worker is gone as failed (Dagster's monitoring step); returns their ids."""
    if not instance.run_launcher.supports_check_run_worker_health:
        return []
    failed = []
    logger = logging.getLogger("gem.run_monitoring")
    for record in instance.get_run_records(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])):
        monitor_started_run(instance, None, record, logger)  # workspace: only used to resume, which is off
        if instance.get_run_by_id(record.dagster_run.run_id).status == dg.DagsterRunStatus.FAILURE:
            failed.append(record.dagster_run.run_id)
    return failed
