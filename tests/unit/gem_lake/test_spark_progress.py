"""Long Spark steps report progress: the reporter's lines, and the same lines in a Dagster run's log."""

import time

import dagster as dg
import pytest

from dagster_project.resources.spark import SparkResource
from gem_lake.spark.progress import SparkProgress


def _slow_job(spark) -> int:
    return spark.sparkContext.parallelize(range(16), 8).map(lambda x: time.sleep(0.25) or x).sum()


@pytest.mark.slow
def test_the_reporter_logs_each_active_stage_while_it_runs(spark):
    lines: list[str] = []
    with SparkProgress(spark.sparkContext, lines.append, interval_s=0.1):
        assert _slow_job(spark) == sum(range(16))
    assert lines, "no progress was logged during a one-second Spark job"
    assert all(line.startswith("Spark stage ") and "/8 tasks done" in line for line in lines), lines
    assert len(set(lines)) == len(lines), "an unchanged progress line was logged twice in a row"
    silent: list[str] = []
    with SparkProgress(spark.sparkContext, silent.append, interval_s=0.05):
        time.sleep(0.3)
    assert silent == []  # nothing runs, nothing is logged


@pytest.mark.slow
def test_a_dagster_step_waiting_on_spark_logs_its_progress(spark):
    @dg.asset
    def slow(spark: SparkResource) -> int:
        return _slow_job(spark.session())

    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([slow], instance=instance, resources={"spark": SparkResource(progress_interval_s=0.1)})
    assert result.success and result.output_for_node("slow") == sum(range(16))
    messages = [e.user_message for e in instance.all_logs(result.run_id)]
    assert any(m.startswith("Spark stage ") and "tasks done" in m for m in messages), messages
