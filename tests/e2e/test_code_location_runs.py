"""`gem demo` and `gem export` launch their jobs as runs of the code location, as the UI does."""

import dagster as dg

from dagster_project.code_location_runs import LOCATION, CodeLocationRuns
from dagster_project.demo import instance_for
from dagster_project.resources.lake import LakeResource


def test_a_run_launched_through_the_code_location_belongs_to_it(gem_home):
    lake = LakeResource.from_env()  # the code server reads the same environment
    instance = instance_for(lake)
    with CodeLocationRuns(instance) as runs:
        run = runs.run("build_reports_job")
    assert run.status == dg.DagsterRunStatus.SUCCESS
    # What the UI's job pages, timeline and re-execution key on: the run's code location and repository.
    assert run.remote_job_origin.location_name == LOCATION
    assert run.job_code_origin.repository_origin.code_pointer.module == "dagster_project.definitions"
    started = [
        e.message
        for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ENGINE_EVENT)
        if (e.message or "").startswith("Started process for run (pid: ")
    ]
    assert started, "the run worker logs its pid, which run monitoring checks"
    materialized = instance.get_latest_materialization_event(dg.AssetKey(["reports", "sql_pack"]))
    assert materialized.run_id == run.run_id
