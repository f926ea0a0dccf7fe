"""SparkResource: a Delta-enabled Spark session, local by default (see jobs/spark_session.py)."""

import dataclasses

import dagster as dg
from pyspark.sql import SparkSession

from jobs.spark_session import SparkSettings, build_spark_session


class SparkResource(dg.ConfigurableResource):
    """`master` overrides GEM_SPARK_MASTER; jars and extra conf come from the environment."""

    master: str | None = None

    def session(self) -> SparkSession:
        settings = SparkSettings.from_env()
        if self.master:
            settings = dataclasses.replace(settings, master=self.master)
        return build_spark_session(settings)
