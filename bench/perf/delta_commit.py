"""The fixed cost of one Delta commit in local Spark: the write, then the first and second query after it.

    .venv/bin/python -m bench.perf.delta_commit
    GEM_SPARK_CONF="spark.sql.shuffle.partitions=1" .venv/bin/python -m bench.perf.delta_commit   # a setting's effect

Replaces one day of a small table (`gem_lake.delta.replace_partition`, as every landing and feature day
does) `--commits` times over six days, and after each commit counts that day's rows twice. For each
step it reports the median wall time and Spark jobs over the commits after the first `--warmup`, and
the commits that also wrote a checkpoint (Delta's every tenth) on their own. The first query after a
commit pays for the new version's snapshot (Delta replays its log with Spark jobs); the second does not.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

from pyspark.sql import functions as F  # noqa: E402

from gem_lake.delta import read_table, replace_partition  # noqa: E402
from gem_lake.spark.session import build_spark_session  # noqa: E402

STEPS = ("write", "first_query", "second_query")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, default=24)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--rows", type=int, default=2_000)
    args = parser.parse_args()
    spark = build_spark_session()
    spark.sparkContext.setLogLevel("ERROR")
    status = spark.sparkContext._jsc.sc().statusStore()  # the driver's job list (Spark's UI reads the same)

    def timed(step, *args) -> tuple[float, int]:
        jobs, started = status.jobsList(None).size(), time.monotonic()
        step(*args)
        return time.monotonic() - started, status.jobsList(None).size() - jobs

    root = Path(tempfile.mkdtemp(prefix="delta-commit-"))
    path = root / "bronze" / "t"

    def count_day(day: date) -> int:
        return read_table(spark, path).where(F.col("ds") == F.lit(day)).count()

    runs = []
    for n in range(args.commits):
        day = date(2026, 11, 1) + timedelta(days=n % 6)
        rows = spark.range(args.rows).select("id", (F.col("id") % 7).alias("x"), F.lit(day).alias("ds"))
        runs.append(
            {
                "write": timed(replace_partition, rows, path, {"ds": day}),
                "first_query": timed(count_day, day),
                "second_query": timed(count_day, day),
                "checkpoint": (path / "_delta_log" / f"{n:020d}.checkpoint.parquet").exists(),
            }
        )
    shutil.rmtree(root)

    def summary(selected: list[dict]) -> dict[str, dict[str, float]] | None:
        if not selected:  # fewer commits than a checkpoint needs
            return None
        return {
            s: {
                "median_s": round(statistics.median(r[s][0] for r in selected), 3),
                "median_jobs": statistics.median(r[s][1] for r in selected),
            }
            for s in STEPS
        }

    measured = runs[args.warmup :]
    print(
        json.dumps(
            {
                "machine": platform.processor() or platform.machine(),
                "cores": spark.sparkContext.defaultParallelism,
                "rows_per_commit": args.rows,
                "commits": len(measured),
                "plain_commits": summary([r for r in measured if not r["checkpoint"]]),
                "checkpoint_commits": summary([r for r in measured if r["checkpoint"]]),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
