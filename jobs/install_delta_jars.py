"""Resolve Delta Lake's jars from Maven Central into a directory that Spark's `spark.jars` uses.

Run by `make .venv` (it needs `mvn` and network access to Maven Central):

    python -m jobs.install_delta_jars .venv/jars

The versions come from `jobs/delta-jars.pom.xml`. Jars whose artifact Spark already ships in
`pyspark/jars` are dropped, so Spark's own (newer) Jackson, Parquet and Hadoop stay the only
copies on the classpath; this is the same set `spark.jars.packages` would add, minus duplicates.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyspark

POM = Path(__file__).with_name("delta-jars.pom.xml")
_VERSIONED_JAR = re.compile(r"^(?P<artifact>.+?)-\d[\w.\-]*\.jar$")


def artifact_name(jar: str) -> str:
    match = _VERSIONED_JAR.match(jar)
    return match.group("artifact") if match else jar


def install(target: Path) -> list[Path]:
    target = target.resolve()
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    subprocess.run(
        [
            "mvn",
            "-q",
            "-B",
            "-f",
            str(POM),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={staging}",
        ],
        check=True,
    )
    provided = {artifact_name(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    for jar in staging.glob("*.jar"):
        if artifact_name(jar.name) in provided:
            jar.unlink()
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return sorted(target.glob("*.jar"))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m jobs.install_delta_jars TARGET_DIR")
    for jar in install(Path(sys.argv[1])):
        print(jar.name)
