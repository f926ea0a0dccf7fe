"""The one Spark session factory, configured for Delta Lake.

Defaults are embedded and local: `local[*]`, Delta jars from `.venv/jars` (installed by
`make .venv`), UTC session time zone. On a cluster, set:

- `GEM_SPARK_MASTER`: e.g. `spark://host:7077`, `yarn` or `k8s://...` (default `local[*]`);
- `GEM_SPARK_JARS_DIR`: a pre-populated directory of Delta jars (default `<venv>/jars`), or
- `GEM_SPARK_JARS_PACKAGES`: Maven coordinates resolved by Spark itself instead, e.g.
  `io.delta:delta-spark_2.13:4.4.0` (needs Maven access from the driver);
- `GEM_SPARK_CONF`: extra `key=value` pairs separated by `;`;
- `PYSPARK_PYTHON`: the interpreter Spark's Python workers run (default: the driver's own,
  `sys.executable`). On a cluster, set it to a path that holds this environment on every
  executor (the same venv on a shared file system, or a packed one shipped with
  `spark.archives`).

Under `spark-submit` the driver's JVM is running before any Python does, so its command line, not
this module, sets the master and must carry Delta's jars: `python -m jobs.spark_submit` builds that
command line from the same settings. A session started by spark-submit keeps its master and every
setting given there, and is refused with the fix when Delta's jars are missing.
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
    "spark.ui.showConsoleProgress": "false",  # gem_lake.spark.progress logs progress as lines instead
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
        return {**LOCAL_DEFAULTS, **DELTA_CONF, **self.jars_conf(), **self.extra_conf}

    @property
    def jars_directory(self) -> Path:
        """`jars_dir`, else the environment's `<venv>/jars`."""
        return self.jars_dir or Path(sys.prefix) / "jars"

    def jars_conf(self) -> dict[str, str]:
        """`spark.jars.packages`, or `spark.jars` listing the Delta jars of `jars_directory`."""
        if self.jars_packages:
            return {"spark.jars.packages": self.jars_packages}
        jars_dir = self.jars_directory
        jars = sorted(str(p) for p in jars_dir.glob("*.jar"))
        if not any("delta-spark" in j for j in jars):
            raise FileNotFoundError(
                f"no delta-spark jar in {jars_dir}; run `make .venv` (installs the jars), or set "
                "GEM_SPARK_JARS_DIR to a directory holding them, or GEM_SPARK_JARS_PACKAGES"
            )
        return {"spark.jars": ",".join(jars)}

    def submit_args(self) -> list[str]:
        """spark-submit's options for these settings: the master, the jars and every setting as `--conf`."""
        args = ["--master", self.master]
        for key, value in self.conf().items():
            args += ["--conf", f"{key}={value}"]
        return args


def worker_python() -> str:
    """The interpreter of Spark's Python workers: `PYSPARK_PYTHON` if set, else the driver's own. pyspark would
    otherwise start the `python3` on PATH, which may be another minor version (Debian 13's 3.13) and fails
    the first Python UDF or local-data step with PYTHON_VERSION_MISMATCH."""
    return os.environ.get("PYSPARK_PYTHON") or sys.executable


def submitted() -> bool:
    """Whether spark-submit started this process (its JVM, already running, handed us its gateway)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_spark_session(settings: SparkSettings | None = None, app_name: str = "gem-pipeline") -> SparkSession:
    """Return the process's Spark session, creating it with Delta enabled on first use."""
    settings = settings or SparkSettings.from_env()
    os.environ["PYSPARK_PYTHON"] = worker_python()  # pyspark reads it when the SparkContext starts
    if submitted():
        return _submitted_session(settings, app_name)
    builder = SparkSession.builder.master(settings.master).appName(app_name)
    for key, value in settings.conf().items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _submitted_session(settings: SparkSettings, app_name: str) -> SparkSession:
    """The session of a process spark-submit started: its master and settings stay as given on its command
    line (defaults fill only what it left unset), and Delta's jars must be among them: added now they would
    reach the executors but not the driver's classpath."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connect to spark-submit's JVM
    given = SparkConf()  # the settings spark-submit passed to it
    jars = f"{given.get('spark.jars', '')},{given.get('spark.jars.packages', '')}"
    if "delta-spark" not in jars:
        raise RuntimeError(
            "spark-submit was started without Delta's jars, which the driver needs on its classpath from the "
            "start; submit through `python -m jobs.spark_submit <script> [args]` (it adds them, the master "
            "from GEM_SPARK_MASTER and the session settings), or pass `--jars` with the jars of "
            f"{settings.jars_directory} or `--packages io.delta:delta-spark_2.13:<version>`"
        )
    builder = SparkSession.builder.appName(app_name)
    # spark-submit's own log level is INFO: thousands of lines per table.
    for key, value in {**LOCAL_DEFAULTS, "spark.log.level": "WARN", **DELTA_CONF, **settings.extra_conf}.items():
        if not given.contains(key):
            builder = builder.config(key, value)
    return builder.getOrCreate()
