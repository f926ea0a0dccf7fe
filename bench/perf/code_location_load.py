"""What loading the Dagster code location costs: seconds, peak memory, and which heavy libraries it imports.

    .venv/bin/python -m bench.perf.code_location_load [--repeats 5]

Each repeat starts a fresh interpreter that imports `dagster_project.definitions` and builds the
Definitions, as `dagster dev`, the daemon and every run worker of the multiprocess executor do;
it reports the wall time of that import and build, the process's peak RSS, and which of torch,
torchrec, fbgemm_gpu, faiss, pyspark, deltalake and duckdb ended up in `sys.modules`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from bench.common import REPO

HEAVY = ("torch", "torchrec", "fbgemm_gpu", "faiss", "pyspark", "deltalake", "duckdb")
CHILD = f"""
import json, resource, sys, time
started = time.perf_counter()
from dagster_project.definitions import build_definitions
from dagster_project.resources.lake import LakeResource
build_definitions(lake=LakeResource(home="/tmp/gem-load-bench"))
seconds = time.perf_counter() - started
print(json.dumps({{"seconds": seconds, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    runs = [
        json.loads(
            subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, capture_output=True, text=True, check=True)
            .stdout.strip()
            .splitlines()[-1]
        )
        for _ in range(args.repeats)
    ]
    seconds = [r["seconds"] for r in runs]
    print(
        json.dumps(
            {
                "repeats": args.repeats,
                "seconds_median": round(statistics.median(seconds), 2),
                "seconds_min": round(min(seconds), 2),
                "seconds_max": round(max(seconds), 2),
                "peak_rss_mb_median": round(statistics.median(r["peak_rss_mb"] for r in runs)),
                "heavy_modules": runs[0]["heavy"],
            }
        )
    )


if __name__ == "__main__":
    main()
