"""The Spark session factory: its Python workers run the driver's interpreter, whatever `python3` PATH holds."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

# The steps that start Python workers: local rows turned into a DataFrame (export's `gold.index_builds` row, the
# students' metrics), and a Python function over rows.
PROBE = """
from gem_lake.spark.session import build_spark_session
spark = build_spark_session()
spark.sparkContext.setLogLevel("ERROR")
print("rows", spark.createDataFrame([(1, 'a')], 'x int, y string').count())
print("doubled", spark.sparkContext.parallelize([1, 2, 3], 2).map(lambda x: 2 * x).sum())
print("worker", spark.sparkContext.parallelize([0], 1).map(lambda _: __import__('sys').executable).first())
spark.stop()
"""


@pytest.mark.slow
@pytest.mark.spark
def test_python_workers_run_the_drivers_interpreter_not_the_python3_on_path(tmp_path: Path) -> None:
    # Another `python3` first on PATH, as on a machine whose system Python is another minor version: it fails
    # loudly and leaves a mark if anything starts it.
    fake = tmp_path / "bin"
    fake.mkdir()
    mark = tmp_path / "started"
    (fake / "python3").write_text(f"#!/bin/sh\ntouch {mark}\necho 'the python3 on PATH' >&2\nexit 3\n")
    (fake / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    env["PATH"] = f"{fake}{os.pathsep}{env['PATH']}"
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "rows 1" in lines and "doubled 12" in lines
    assert f"worker {sys.executable}" in lines
    assert not mark.exists()
