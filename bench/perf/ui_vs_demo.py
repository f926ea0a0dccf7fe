"""One feature partition launched from the Dagster UI against the same partition launched as `gem demo` does.

    .venv/bin/python -m bench.perf.ui_vs_demo [--preset tiny] [--day 2026-11-01] [--root DIR]

Both paths run `build_features_job` (events, impressions, sequences and training examples of one
day) for the same day, each on a fresh lake (GEM_HOME) and Dagster instance (DAGSTER_HOME) under
--root, after an untimed `build_dimensions_job` launched the same way on that lake:

- demo: `CodeLocationRuns.run` (dagster_project/code_location_runs.py) with the demo's run config,
  what `gem demo` calls: the code location in its own gRPC server, the run created from the job's
  snapshot and handed straight to the instance's run launcher.
- UI: `dagster dev -w workspace.yaml` (as `make ui`) on 127.0.0.1, and the GraphQL mutation the
  launchpad's Launch button sends (`launchPipelineExecution`: the job, a `dagster/partition` tag),
  so the run goes through the instance's queued run coordinator and the daemon, as a click does.

The demo path runs first, with no UI running; the runs' logs go to demo.log and dagster-dev.log
under --root, and the one JSON line to stdout. Per path it reports the run's wall time from the
instance (its start to its end: the run worker's Spark session and the steps), the time from
creating the run to its start (the queue, the run worker's process start and its load of the code
location), and the time from the launch request to the end of the run as the caller sees it; then
the ratios UI / demo.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench.common import REPO
from dagster_project.code_location_runs import CodeLocationRuns
from dagster_project.demo import CONCISE, instance_for
from dagster_project.resources.lake import LakeResource
from dagster_project.run_monitoring import ensure_instance_config

DIMENSIONS, FEATURES = "build_dimensions_job", "build_features_job"
LAUNCH = """mutation($params: ExecutionParams!) { launchPipelineExecution(executionParams: $params) { __typename
  ... on LaunchRunSuccess { run { id } } ... on PythonError { message } ... on RunConfigValidationInvalid {
  errors { message } } ... on InvalidSubsetError { message } ... on PipelineNotFoundError { message } } }"""
RUN = """query($runId: ID!) { runOrError(runId: $runId) { ... on Run { status creationTime startTime endTime } } }"""
LOCATIONS = """{ workspaceOrError { ... on Workspace { locationEntries { name loadStatus
  locationOrLoadError { __typename ... on PythonError { message } } } } } }"""
DONE = ("SUCCESS", "FAILURE", "CANCELED")


def _fresh(root: Path, preset: str) -> LakeResource:
    """A fresh lake and instance under `root`, made the process's (and so its code servers') environment."""
    shutil.rmtree(root, ignore_errors=True)
    os.environ.update(GEM_HOME=str(root / "gem"), DAGSTER_HOME=str(root / "gem" / "dagster"), GEM_PRESET=preset)
    for name in ("GEM_CONFIG", "GEM_DATA_SOURCE", "GEM_SOURCE_MAPPING"):
        os.environ.pop(name, None)
    return LakeResource.from_env()


def _timing(created: float, started: float, ended: float, launched: float, observed: float) -> dict[str, float]:
    return {
        "run_s": round(ended - started, 2),
        "created_to_start_s": round(started - created, 2),
        "launch_to_end_s": round(observed - launched, 2),
    }


@contextlib.contextmanager
def _output_to(log: Path):
    """This process's stdout and stderr, which its code server and run workers inherit, into `log`."""
    sys.stdout.flush(), sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with log.open("w") as out:
        os.dup2(out.fileno(), 1), os.dup2(out.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush(), sys.stderr.flush()
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            os.close(saved[0]), os.close(saved[1])


def demo_path(root: Path, preset: str, day: str) -> dict[str, float]:
    """The partition launched by `gem demo`'s own launcher (after the dimensions, untimed)."""
    lake = _fresh(root, preset)
    root.mkdir(parents=True)
    with _output_to(root / "demo.log"), CodeLocationRuns(instance_for(lake)) as runs:
        runs.run(DIMENSIONS, None, CONCISE)
        launched = time.time()
        run = runs.run(FEATURES, day, CONCISE)
        observed = time.time()
        record = runs.instance.get_run_record_by_id(run.run_id)
    return _timing(record.create_timestamp.timestamp(), record.start_time, record.end_time, launched, observed)


class DagsterDev:
    """`dagster dev -w workspace.yaml` on 127.0.0.1 and a free port, in its own process group."""

    def __init__(self, dagster_home: Path, log: Path) -> None:
        ensure_instance_config(dagster_home)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.url = f"http://127.0.0.1:{s.getsockname()[1]}"
        self.log = log
        with log.open("w") as out:
            self.process = subprocess.Popen(
                [
                    str(Path(sys.executable).with_name("dagster")),
                    "dev",
                    "-w",
                    str(REPO / "workspace.yaml"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    self.url.rsplit(":", 1)[1],
                ],
                cwd=REPO,
                env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                # Ctrl-C's default action: a run started in the background (`... &`) ignores SIGINT, which every
                # process it starts would inherit, and `stop` would wait its 30 s for nothing.
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )

    def graphql(self, query: str, **variables: object) -> dict:
        request = urllib.request.Request(
            f"{self.url}/graphql",
            method="POST",
            data=json.dumps({"query": query, "variables": variables}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            body = json.load(response)
        if body.get("errors"):
            raise RuntimeError(f"GraphQL errors: {body['errors']}")
        return body["data"]

    def wait_served(self, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"dagster dev exited with {self.process.returncode}; see {self.log}")
            with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
                for entry in self.graphql(LOCATIONS)["workspaceOrError"]["locationEntries"]:
                    if entry["name"] == "gem_pipeline" and entry["loadStatus"] == "LOADED":
                        if entry["locationOrLoadError"]["__typename"] != "RepositoryLocation":
                            raise RuntimeError(f"the code location failed to load: {entry['locationOrLoadError']}")
                        return
            time.sleep(1)
        raise RuntimeError(f"dagster dev did not serve the code location within {timeout_s} s; see {self.log}")

    def launch(self, job: str, partition: str | None) -> str:
        """What the launchpad's Launch button sends for `job` (and one partition of it)."""
        tags = [{"key": "dagster/from_ui", "value": "true"}]
        if partition:
            tags.insert(0, {"key": "dagster/partition", "value": partition})
        params = {
            "mode": "default",
            "runConfigData": "{}",
            "executionMetadata": {"tags": tags},
            "selector": {
                "repositoryLocationName": "gem_pipeline",
                "repositoryName": "__repository__",
                "pipelineName": job,
            },
        }
        result = self.graphql(LAUNCH, params=params)["launchPipelineExecution"]
        if result["__typename"] != "LaunchRunSuccess":
            raise RuntimeError(f"launching {job} failed: {result}")
        return result["run"]["id"]

    def wait(self, run_id: str, poll_s: float = 0.5) -> dict:
        while (run := self.graphql(RUN, runId=run_id)["runOrError"])["status"] not in DONE:
            time.sleep(poll_s)
        if run["status"] != "SUCCESS":
            raise RuntimeError(f"run {run_id} ended {run['status']}; see {self.log} and the run in the UI")
        return run

    def stop(self) -> None:
        """Ctrl-C (dagster dev stops its webserver, daemon and code servers), then whatever of its group is left."""
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def ui_path(root: Path, preset: str, day: str) -> dict[str, float]:
    """The partition launched through the UI's webserver (after the dimensions, untimed)."""
    lake = _fresh(root, preset)
    root.mkdir(parents=True)
    ui = DagsterDev(lake.paths.dagster_home, root / "dagster-dev.log")
    try:
        ui.wait_served()
        ui.wait(ui.launch(DIMENSIONS, None))
        launched = time.time()
        run = ui.wait(ui.launch(FEATURES, day))
        observed = time.time()
    finally:
        ui.stop()
    return _timing(run["creationTime"], run["startTime"], run["endTime"], launched, observed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--day", help="the partition (default: the preset's first day)")
    parser.add_argument("--root", type=Path, default=Path("/tmp/ui-vs-demo"), help="where the two fresh lakes go")
    args = parser.parse_args()
    from gem_model.config import GemConfig

    day = args.day or GemConfig.from_preset(args.preset).world.start_date.isoformat()
    demo = demo_path(args.root / "demo", args.preset, day)
    ui = ui_path(args.root / "ui", args.preset, day)
    print(
        json.dumps(
            {
                "preset": args.preset,
                "job": FEATURES,
                "partition": day,
                "cpus": os.cpu_count(),
                "machine": platform.machine(),
                "demo": demo,
                "ui": ui,
                "ratio_run": round(ui["run_s"] / demo["run_s"], 2),
                "ratio_launch_to_end": round(ui["launch_to_end_s"] / demo["launch_to_end_s"], 2),
            }
        )
    )


if __name__ == "__main__":
    main()
