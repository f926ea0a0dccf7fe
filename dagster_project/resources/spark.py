"""SparkResource: a Delta-enabled Spark session, local by default (see gem_lake/spark/session.py).

pyspark is imported when a step asks for the session, not when the code location loads. While the
run holds the session, the active Spark stages' progress goes to the run's log every
`progress_interval_s` seconds (gem_lake/spark/progress.py), so a long Spark step is never silent.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import dagster as dg
from pydantic import PrivateAttr

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from gem_lake.spark.progress import SparkProgress


class SparkResource(dg.ConfigurableResource):
    """`master` overrides GEM_SPARK_MASTER; jars and extra conf come from the environment."""

    master: str | None = None
    progress_interval_s: float = 20.0

    _log: dg.DagsterLogManager | None = PrivateAttr(default=None)
    _progress: SparkProgress | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._log = context.log

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._progress is not None:
            self._progress.__exit__()
            self._progress = None

    def session(self) -> SparkSession:
        from gem_lake.spark.progress import SparkProgress
        from gem_lake.spark.session import SparkSettings, build_spark_session

        settings = SparkSettings.from_env()
        if self.master:
            settings = dataclasses.replace(settings, master=self.master)
        spark = build_spark_session(settings)
        if self._log is not None and self._progress is None:
            self._progress = SparkProgress(spark.sparkContext, self._log.info, self.progress_interval_s).__enter__()
        return spark
