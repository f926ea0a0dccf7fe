"""Runs submitted to the code location exactly as the Dagster UI submits them: first-class runs.

A run made with `execute_in_process` belongs to no code location: the UI's job pages, the Overview
timeline and re-execution do not know it. `CodeLocationRuns` loads `workspace.yaml` the way
`dagster dev` does (the code location in its own gRPC server process), creates each run from the
location's job snapshot with its origin, and hands it to the instance's run launcher, which starts a
run worker for it through the code server (straight to the launcher: the instance's queued run
coordinator is served by the daemon, which only `dagster dev` runs); then it waits for the run to end. `gem demo` and
`gem export` run their jobs this way, so after them the UI shows every run where it shows its own.
The code location reads its settings from the environment (GEM_HOME, GEM_PRESET, GEM_CONFIG, ...),
like the UI.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import TracebackType
from typing import Any

import dagster as dg
from dagster._core.definitions.partitions.utils.multi import get_tags_from_multi_partition_key
from dagster._core.remote_representation.external import RemoteRepository
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import WorkspaceFileTarget

WORKSPACE = Path(__file__).resolve().parents[1] / "workspace.yaml"
LOCATION = "gem_pipeline"
_DONE = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)


def _partition_tags(partition: str | None) -> dict[str, str]:
    """The tags the UI gives a run of `partition`: a (model_version, ds) key also tags each dimension."""
    if partition is None:
        return {}
    dimensions = get_tags_from_multi_partition_key(partition) if isinstance(partition, dg.MultiPartitionKey) else {}
    return {"dagster/partition": str(partition), **dimensions}


class RunFailedError(RuntimeError):
    pass


class CodeLocationRuns:
    """Submit runs of the `gem_pipeline` code location to `instance` and wait for them (a context manager)."""

    def __init__(self, instance: dg.DagsterInstance, workspace: Path = WORKSPACE, poll_s: float = 0.5) -> None:
        self.instance, self.poll_s = instance, poll_s
        self._context = WorkspaceProcessContext(instance, WorkspaceFileTarget(paths=[str(workspace)]))

    def __enter__(self) -> CodeLocationRuns:
        self._context.__enter__()
        errors = self._context.create_request_context().get_code_location_error(LOCATION)
        if errors is not None:
            self._context.__exit__(None, None, None)
            raise RuntimeError(f"the code location {LOCATION} failed to load: {errors.to_string()}")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._context.__exit__(kind, error, traceback)

    def _repository(self) -> tuple[Any, RemoteRepository]:
        location = self._context.create_request_context().get_code_location(LOCATION)
        return location, next(iter(location.get_repositories().values()))

    def submit(
        self, job: str, partition: str | None = None, run_config: dict | None = None, tags: dict[str, str] | None = None
    ) -> dg.DagsterRun:
        """Create and launch a run of `job` (one `partition` of a partitioned job), as the UI's launchpad does."""
        location, repository = self._repository()
        remote = repository.get_full_job(job)
        run_config = run_config or {}
        plan = location.get_execution_plan(
            remote, run_config, step_keys_to_execute=None, known_state=None, instance=self.instance
        )
        run_tags = {**remote.tags, **(tags or {}), **_partition_tags(partition)}
        run = self.instance.create_run(
            job_name=job,
            run_id=None,
            run_config=run_config,
            resolved_op_selection=None,
            step_keys_to_execute=plan.execution_plan_snapshot.step_keys_to_execute,
            op_selection=None,
            status=None,
            root_run_id=None,
            parent_run_id=None,
            tags=run_tags,
            job_snapshot=remote.job_snapshot,
            execution_plan_snapshot=plan.execution_plan_snapshot,
            parent_job_snapshot=remote.parent_job_snapshot,
            remote_job_origin=remote.get_remote_origin(),
            job_code_origin=remote.get_python_origin(),
            asset_selection=None,
            asset_check_selection=None,
            asset_graph=repository.asset_graph,
        )
        return self.instance.launch_run(run.run_id, self._context.create_request_context())

    def wait(self, run_id: str) -> dg.DagsterRun:
        while (run := self.instance.get_run_by_id(run_id)).status not in _DONE:
            time.sleep(self.poll_s)
        return run

    def run(self, job: str, partition: str | None = None, run_config: dict | None = None) -> dg.DagsterRun:
        """Submit a run, wait for it, and raise `RunFailedError` naming its failed steps unless it succeeded."""
        run = self.wait(self.submit(job, partition, run_config).run_id)
        if run.status != dg.DagsterRunStatus.SUCCESS:
            failures = [
                e.dagster_event.step_failure_data.error
                for e in self.instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
            ]
            causes = [((f.cause or f).message.strip() or "?").splitlines()[0] for f in failures if f is not None]
            raise RunFailedError(
                f"{job}{f' [{partition}]' if partition else ''} ended {run.status.value} (run "
                f"{run.run_id}): {'; '.join(causes) or 'see the run in the Dagster UI'}"
            )
        return run
