"""Run a Spark entry point under the pinned pyspark's `spark-submit`, with the project's Spark settings.

    python -m jobs.spark_submit jobs/build_features.py --preset small --days 1
    GEM_SPARK_MASTER=spark://host:7077 python -m jobs.spark_submit jobs/build_features.py --preset medium

spark-submit starts the driver's JVM before any Python runs, so the master, Delta's jars and the
session settings must be on its command line; this builds that command line from the same
`SparkSettings` a local session uses (GEM_SPARK_MASTER, GEM_SPARK_JARS_DIR or
GEM_SPARK_JARS_PACKAGES, GEM_SPARK_CONF), prints it and replaces this process with it. spark-submit's own
options have `spark.*` equivalents to put in GEM_SPARK_CONF (`spark.submit.deployMode`,
`spark.executor.instances`, `spark.executor.memory`, ...).
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from gem_lake.spark.session import SparkSettings, worker_python


def submit_command(script: str, args: list[str], settings: SparkSettings) -> list[str]:
    import pyspark

    spark_submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    return [str(spark_submit), *settings.submit_args(), script, *args]


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        sys.exit(__doc__)
    command = submit_command(argv[0], argv[1:], SparkSettings.from_env())
    print(shlex.join(command), flush=True)
    # The driver and the executors run this interpreter (and so this environment's packages) unless told otherwise.
    os.environ["PYSPARK_PYTHON"] = worker_python()
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
