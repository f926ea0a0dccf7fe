"""Killed runs are marked failed on the next start (dagster_project/run_monitoring.py), live ones are left alone."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest

from dagster_project.run_monitoring import (
    PROCESS_TAG,
    PidCheckingRunLauncher,
    ensure_instance_config,
    fail_dead_runs,
    worker_tags,
)

# A real run, executed in-process by a child process the way `gem export` and the demo run theirs.
CHILD = textwrap.dedent("""
    import time
    import dagster as dg
    from dagster_project.run_monitoring import worker_tags

    @dg.op
    def wait_forever():
        time.sleep(600)

    @dg.job
    def slow_job():
        wait_forever()

    slow_job.execute_in_process(instance=dg.DagsterInstance.get(), tags=worker_tags())
""")


@pytest.fixture
def instance(tmp_path, monkeypatch):
    home = tmp_path / "dagster"
    ensure_instance_config(home)
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    with dg.DagsterInstance.from_config(str(home)) as inst:
        yield inst


def _started_run(instance: dg.DagsterInstance, timeout: float = 300) -> dg.DagsterRun:
    """The child's run once STARTED; the bound catches a child that never starts it (its op sleeps 600 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
        if runs:
            return runs[0]
        time.sleep(0.2)
    raise AssertionError("the child's run never started")


def test_the_instance_config_turns_on_monitoring_with_a_health_checking_launcher(instance):
    assert isinstance(instance.run_launcher, PidCheckingRunLauncher)
    assert instance.run_monitoring_enabled and instance.run_launcher.supports_check_run_worker_health


@pytest.mark.slow
def test_a_killed_run_is_marked_failed_and_a_live_one_is_not(instance, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])}
    child = subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path, start_new_session=True)
    try:
        run = _started_run(instance)
        assert fail_dead_runs(instance) == []  # alive: left STARTED
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED
        os.killpg(child.pid, signal.SIGKILL)  # the worker and its compute-log tailers, as a lost machine would
        child.wait()
        assert fail_dead_runs(instance) == [run.run_id]
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    failed = instance.get_run_by_id(run.run_id)
    assert failed.status == dg.DagsterRunStatus.FAILURE
    messages = [e.message for e in instance.all_logs(run.run_id) if e.message]
    assert any(f"run worker process {child.pid}" in m and "is gone" in m for m in messages)
    assert fail_dead_runs(instance) == []  # nothing left to mark


def test_a_run_worker_found_by_its_logged_pid(instance):
    """Runs launched from the UI carry no tags; Dagster's run worker logs its pid, as here."""
    run = instance.create_run_for_job(dg.GraphDefinition("g").to_job(), run_id=None)
    instance.handle_run_event(run.run_id, dg.DagsterEvent(dg.DagsterEventType.RUN_START.value, job_name=run.job_name))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    instance.report_engine_event(f"Started process for run (pid: {dead.pid}).", run)
    assert instance.run_launcher.check_run_worker_health(instance.get_run_by_id(run.run_id)).status.value == "FAILED"
    assert fail_dead_runs(instance) == [run.run_id]


def _run(
    instance: dg.DagsterInstance, started: datetime, tags: dict[str, str] | None = None, logged_pid: int | None = None
) -> str:
    """A STARTED run whose start the wall clock put at `started`; its worker named by `tags` or a logged pid."""
    run = instance.create_run_for_job(dg.GraphDefinition("g").to_job(), run_id=None, tags=tags)
    instance.handle_run_event(
        run.run_id,
        dg.DagsterEvent(dg.DagsterEventType.RUN_START.value, job_name=run.job_name),
        update_timestamp=started,
    )
    if logged_pid is not None:
        instance.report_engine_event(f"Started process for run (pid: {logged_pid}).", run)
    return run.run_id


def _health(instance: dg.DagsterInstance, run_id: str) -> str:
    return instance.run_launcher.check_run_worker_health(instance.get_run_by_id(run_id)).status.value


def test_a_wall_clock_step_does_not_fail_a_live_worker_and_a_reused_pid_does(instance):
    """The clock stepped forward a day (a resumed or cloned VM) after the run started: its worker, this process,
    now seems to have started after its run, yet it is the same process (same boot, same start ticks)."""
    a_day_ago = datetime.now(UTC) - timedelta(days=1)
    assert _health(instance, _run(instance, a_day_ago, worker_tags())) == "RUNNING"
    reused = {**worker_tags(), PROCESS_TAG: worker_tags()[PROCESS_TAG].split("/")[0] + "/1"}  # another start
    assert _health(instance, _run(instance, a_day_ago, reused)) == "FAILED"


def test_a_logged_worker_is_identified_at_its_first_check_unless_that_comes_late(instance):
    run_id = _run(instance, datetime.now(UTC), logged_pid=os.getpid())
    assert _health(instance, run_id) == "RUNNING"
    assert instance.get_run_by_id(run_id).tags[PROCESS_TAG] == worker_tags()[PROCESS_TAG]
    # First checked a day after its start (no daemon meanwhile): a process that began since holds another's pid.
    late = _run(instance, datetime.now(UTC) - timedelta(days=1), logged_pid=os.getpid())
    assert _health(instance, late) == "FAILED"
    assert PROCESS_TAG not in instance.get_run_by_id(late).tags
