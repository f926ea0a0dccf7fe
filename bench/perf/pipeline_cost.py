"""One real-dataset pipeline's cost, run again and again in one JVM: seconds, Spark jobs, code generations.

    .venv/bin/python -m bench.perf.pipeline_cost ali_ccp criteo ali_ccp
    GEM_SPARK_CONF="spark.sql.codegen.cache.maxEntries=4000" .venv/bin/python -m bench.perf.pipeline_cost ...

Each named dataset runs the whole asset graph as `tests/e2e/test_datasets.py` does (its sample cut
to `gem_model.testing.samples.MAX_LINES` lines a file, two days, `tiny`) into a fresh lake, in this
process and its one Spark session, so the first run also pays the JVM's warm-up and a dataset named
twice shows a warm JVM's cost. Per run: wall seconds, the Spark jobs the driver ran and the classes
Spark generated and compiled (Janino; none when its code cache already holds the plan's code),
printed as JSON after the runs' own output.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

from dagster_project.definitions import build_definitions  # noqa: E402
from dagster_project.demo import in_process, instance_for, run_pipeline  # noqa: E402
from dagster_project.resources.lake import LakeResource  # noqa: E402
from gem_lake.sources import data_dir, dataset_folder  # noqa: E402
from gem_lake.spark.session import SparkSettings, build_spark_session  # noqa: E402
from gem_model.config import DATA_SOURCES, GemConfig  # noqa: E402
from gem_model.testing.samples import head_copy, sample_overrides  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("datasets", nargs="+", choices=[s for s in DATA_SOURCES if s not in ("synthetic", "mapping")])
    args = parser.parse_args()
    spark = build_spark_session()
    spark.sparkContext.setLogLevel("ERROR")
    jvm = spark.sparkContext._jvm
    status = spark.sparkContext._jsc.sc().statusStore()  # the driver's job list (Spark's UI reads the same)
    compilations = jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    samples = data_dir(GemConfig())
    root = Path(tempfile.mkdtemp(prefix="pipeline-cost-"))
    runs = []
    try:
        for n, source in enumerate(args.datasets):
            home = root / f"{n}-{source}"
            folder = dataset_folder(source)
            head_copy(samples / folder, home / "data" / folder)
            (home / "overrides.json").write_text(json.dumps(sample_overrides(source, home / "data")))
            lake = LakeResource(
                home=str(home / "gem"), preset="tiny", config_path=str(home / "overrides.json"), data_source=source
            )
            os.environ["GEM_HOME"], os.environ["DAGSTER_HOME"] = lake.home, str(home / "gem" / "dagster")  # not yours
            runner = in_process(build_definitions(lake=lake), instance_for(lake))
            jobs, compiled, started = status.jobsList(None).size(), compilations.getCount(), time.monotonic()
            run_pipeline(lake, runner)
            runs.append(
                {
                    "dataset": source,
                    "seconds": round(time.monotonic() - started, 1),
                    "spark_jobs": status.jobsList(None).size() - jobs,
                    "classes_compiled": compilations.getCount() - compiled,
                }
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        json.dumps(
            {
                "machine": platform.processor() or platform.machine(),
                "cores": os.cpu_count(),
                "spark_conf": SparkSettings.from_env().extra_conf,
                "runs": runs,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
