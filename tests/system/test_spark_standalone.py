"""The feature build submitted with spark-submit to a Spark standalone cluster writes the same tables as local mode.

The cluster is the pinned pyspark's own master and worker (`spark-class`), bound to 127.0.0.1 and
stopped after the module. One day of the session's e2e world is built through
`python -m jobs.spark_submit jobs/build_features.py` into a lake of its own and compared, row for
row, with that day in the e2e pipeline's lake (built by local mode through Dagster).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable

from gem_model.paths import GemPaths

pytestmark = [pytest.mark.slow, pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = {"SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOCAL_HOSTNAME": "localhost"}  # no other interface


def _spark_class(*args: str, log: Path, env: dict[str, str]) -> subprocess.Popen:
    import pyspark

    spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
    return subprocess.Popen(
        [str(spark_class), *args], stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


def _state(ui_port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def standalone(tmp_path_factory, free_port) -> Iterator[tuple[str, int]]:
    """(master URL, master web UI port) of a one-worker standalone cluster on 127.0.0.1."""
    root = tmp_path_factory.mktemp("standalone")
    env = {**os.environ, **LOOPBACK, "SPARK_WORKER_DIR": str(root / "work"), "SPARK_LOG_DIR": str(root)}
    port, ui_port = free_port(), free_port()
    url = f"spark://127.0.0.1:{port}"
    processes = [
        _spark_class(
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--webui-port",
            str(ui_port),
            log=root / "master.log",
            env=env,
        )
    ]
    try:
        deadline = time.monotonic() + 600  # a master or worker that never comes up, not a slow JVM start
        while True:
            try:
                _state(ui_port)
                break
            except OSError:
                if time.monotonic() > deadline or processes[0].poll() is not None:
                    pytest.fail(f"the Spark master did not start:\n{(root / 'master.log').read_text()[-3000:]}")
                time.sleep(1)
        processes.append(
            _spark_class(
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--cores",
                "2",
                "--memory",
                "3g",
                "--webui-port",
                str(free_port()),
                url,
                log=root / "worker.log",
                env=env,
            )
        )
        while not any(w["state"] == "ALIVE" for w in _state(ui_port)["workers"]):
            if time.monotonic() > deadline or processes[1].poll() is not None:
                pytest.fail(f"no Spark worker registered:\n{(root / 'worker.log').read_text()[-3000:]}")
            time.sleep(1)
        yield url, ui_port
    finally:
        for process in reversed(processes):
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)


def _rows(path: Path, other_days: set[str]) -> list[str]:
    """The table's rows, but those of `other_days`, as sorted JSON lines."""
    records = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    day = "source_partition" if "bronze/rejected_rows" in path.as_posix() else "ds"
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in records if str(r.get(day)) not in other_days)


def test_spark_submit_to_a_standalone_cluster_builds_the_same_tables_as_local_mode(standalone, pipeline, tmp_path):
    url, ui_port = standalone
    lake, _, _ = pipeline
    home = tmp_path / "gem"
    env = {
        **os.environ,
        **LOOPBACK,
        "GEM_HOME": str(home),
        "GEM_SPARK_MASTER": url,
        "GEM_SPARK_CONF": "spark.executor.memory=2g;spark.cores.max=2",
    }
    command = [
        sys.executable,
        "-m",
        "jobs.spark_submit",
        "jobs/build_features.py",
        "--preset",
        "tiny",
        "--config",
        lake.config_path,
        "--days",
        "1",
    ]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"{shlex.join(command)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    submitted = done.stdout.splitlines()[0]
    assert f"--master {url}" in submitted and "delta-spark" in submitted

    apps = _state(ui_port)["completedapps"]
    assert [a["name"] for a in apps] == ["gem-pipeline"] and apps[0]["state"] == "FINISHED"

    other_days = {d.isoformat() for d in lake.config.world.days[1:]}
    tables = [
        "bronze.users",
        "bronze.ads",
        "silver.user_features",
        "silver.ad_features",
        "bronze.impressions",
        "bronze.events",
        "bronze.rejected_rows",
        "gold.user_sequences",
        "gold.training_examples",
    ]
    for table in tables:
        cluster = _rows(GemPaths(home).table(table), other_days)
        local = _rows(lake.paths.table(table), other_days)
        assert len(cluster) == len(local), table
        assert cluster == local, f"{table}: the standalone build differs from local mode"
