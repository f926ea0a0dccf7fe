"""SparkResource: a Delta-enabled Spark session, local by default (see jobs/spark_session.py).

pyspark is imported when a step asks for the session, not when the code location loads.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import dagster as dg

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class SparkResource(dg.ConfigurableResource):
    """`master` overrides GEM_SPARK_MASTER; jars and extra conf come from the environment."""

    master: str | None = None

    def session(self) -> SparkSession:
        from jobs.spark_session import SparkSettings, build_spark_session

        settings = SparkSettings.from_env()
        if self.master:
            settings = dataclasses.replace(settings, master=self.master)
        return build_spark_session(settings)
