"""Killed runs are marked failed on the next start (dagster_project/run_monitoring.py), live ones are left alone."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dagster as dg
import pytest

from dagster_project.run_monitoring import PidCheckingRunLauncher, ensure_instance_config, fail_dead_runs

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


def _started_run(instance: dg.DagsterInstance, timeout: float = 60) -> dg.DagsterRun:
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


def test_a_killed_run_is_marked_failed_and_a_live_one_is_not(instance, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
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
    instance.handle_run_event(run.run_id, dg.DagsterEvent(
        dg.DagsterEventType.RUN_START.value, job_name=run.job_name))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    instance.report_engine_event(f"Started process for run (pid: {dead.pid}).", run)
    assert instance.run_launcher.check_run_worker_health(instance.get_run_by_id(run.run_id)).status.value == "FAILED"
    assert fail_dead_runs(instance) == [run.run_id]
