"""The one Spark session factory, configured for Delta Lake.

Defaults are embedded and local: `local[*]`, Delta jars from `.venv/jars` (installed by
`make .venv`), UTC session time zone. On a cluster, set:

- `GEM_SPARK_MASTER`: e.g. `spark://host:7077`, `yarn` or `k8s://...` (default `local[*]`);
- `GEM_SPARK_JARS_DIR`: a pre-populated directory of Delta jars (default `<venv>/jars`), or
- `GEM_SPARK_JARS_PACKAGES`: Maven coordinates resolved by Spark itself instead, e.g.
  `io.delta:delta-spark_2.13:4.4.0` (needs Maven access from the driver);
- `GEM_SPARK_CONF`: extra `key=value` pairs separated by `;`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession

DELTA_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
LOCAL_DEFAULTS: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "8",
    "spark.ui.enabled": "false",
    "spark.driver.memory": "3g",
    "spark.sql.catalogImplementation": "in-memory",
    "spark.databricks.delta.snapshotPartitions": "2",
}


@dataclass(frozen=True)
class SparkSettings:
    master: str = "local[*]"
    jars_dir: Path | None = None
    jars_packages: str | None = None
    extra_conf: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def from_env() -> SparkSettings:
        extra = {}
        for pair in filter(None, os.environ.get("GEM_SPARK_CONF", "").split(";")):
            key, sep, value = pair.partition("=")
            if not sep:
                raise ValueError(f"GEM_SPARK_CONF entry {pair!r} must be key=value")
            extra[key.strip()] = value.strip()
        jars_dir = os.environ.get("GEM_SPARK_JARS_DIR")
        return SparkSettings(
            master=os.environ.get("GEM_SPARK_MASTER", "local[*]"),
            jars_dir=Path(jars_dir) if jars_dir else None,
            jars_packages=os.environ.get("GEM_SPARK_JARS_PACKAGES") or None,
            extra_conf=extra,
        )

    def conf(self) -> dict[str, str]:
        conf = {**LOCAL_DEFAULTS, **DELTA_CONF}
        if self.jars_packages:
            conf["spark.jars.packages"] = self.jars_packages
        else:
            jars_dir = self.jars_dir or Path(sys.prefix) / "jars"
            jars = sorted(str(p) for p in jars_dir.glob("*.jar"))
            if not any("delta-spark" in j for j in jars):
                raise FileNotFoundError(
                    f"no delta-spark jar in {jars_dir}; run `make .venv` (installs the jars), or set "
                    "GEM_SPARK_JARS_DIR to a directory holding them, or GEM_SPARK_JARS_PACKAGES"
                )
            conf["spark.jars"] = ",".join(jars)
        conf.update(self.extra_conf)
        return conf


def build_spark_session(settings: SparkSettings | None = None, app_name: str = "gem-pipeline") -> SparkSession:
    """Return the process's Spark session, creating it with Delta enabled on first use."""
    settings = settings or SparkSettings.from_env()
    builder = SparkSession.builder.master(settings.master).appName(app_name)
    for key, value in settings.conf().items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
