"""`GEM_SOURCE_MAPPING=mapping.yaml gem demo` lands the mapped log and trains on it (docs/datasets.md).

The demo runs in its own process, as a user starts it, and launches its jobs as runs of the code
location, which reads the environment itself: the variable must reach the code location's lake
resource, not only the CLI. The log is written by the test (ids the synthetic world never draws,
numbered from 1), on the shortest calendar (one training day, one holdout day: no students) with
one training and one scoring process.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml
from deltalake import DeltaTable

from gem_model.paths import GemPaths

pytestmark = [pytest.mark.slow, pytest.mark.spark]

REPO = Path(__file__).resolve().parents[2]
USERS = [9_000_001 + i for i in range(8)]
ADS = [8_000_001 + i for i in range(5)]
HEADER = "at,user,ad,clicked,bought"


def _lines(first_at: int, n: int) -> list[tuple[int, int, int, bool, bool]]:
    """(at, user, ad, clicked, bought) rows: every third a click, every other click bought."""
    return [(first_at + i, USERS[i % len(USERS)], ADS[(3 * i) % len(ADS)], i % 3 == 0, i % 6 == 0) for i in range(n)]


def _csv(rows: list[tuple[int, int, int, bool, bool]]) -> str:
    yes = {True: "yes", False: "no"}
    return "\n".join([HEADER, *(f"{at},{u},{a},{yes[c]},{yes[b]}" for at, u, a, c, b in rows)]) + "\n"


MAPPING = {
    "name": "my_logs",
    "impressions": {
        "folder": "logs",
        "files": ["train.csv", "test.csv"],
        "holdout_files": ["test.csv"],
        "columns": {"at": "bigint", "user": "bigint", "ad": "bigint", "clicked": "string", "bought": "string"},
        "order_by": "at",
    },
    "user_id": "user",
    "ad_id": "ad",
    "surface": "feed",
    "clicked": {"column": "clicked", "positive": ["yes"], "negative": ["no"]},
    "converted": {"column": "bought", "positive": ["yes"], "negative": ["no"]},
}


def _rows(paths: GemPaths, table: str, columns: list[str]) -> list[dict]:
    return DeltaTable(str(paths.table(table))).to_pyarrow_table(columns=columns).to_pylist()


def test_gem_demo_lands_and_trains_on_the_mapping_the_environment_names(tmp_path):
    train, test = _lines(1000, 30), _lines(2000, 20)
    (tmp_path / "mine" / "logs").mkdir(parents=True)
    (tmp_path / "mine" / "logs" / "train.csv").write_text(_csv(train) + "1100,9000001,8000001,maybe,no\n")
    (tmp_path / "mine" / "logs" / "test.csv").write_text(_csv(test))
    mapping = tmp_path / "mine" / "mapping.yaml"
    mapping.write_text(yaml.safe_dump(MAPPING, sort_keys=False))
    overrides = tmp_path / "overrides.json"
    overrides.write_text(
        json.dumps(
            {
                "world": {"n_days": 2, "holdout_days": 1},
                "train": {"nproc": 1, "epochs": 1},
                "export": {"nproc": 1, "user_input_files": 1},
            }
        )
    )
    home = tmp_path / "gem"
    env = {name: value for name, value in os.environ.items() if name not in ("GEM_PRESET", "GEM_DATA_SOURCE")}
    env.update(
        GEM_HOME=str(home),
        DAGSTER_HOME=str(home / "dagster"),
        GEM_CONFIG=str(overrides),
        GEM_SOURCE_MAPPING=str(mapping),
        PYTHONPATH=str(REPO),
    )
    demo = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "demo"], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800
    )
    assert demo.returncode == 0, (demo.stdout[-3000:], demo.stderr[-3000:])
    assert "skip train_students_job" in demo.stdout and "ok  build_reports_job" in demo.stdout

    paths = GemPaths(home)
    impressions = _rows(
        paths, "bronze.impressions", ["impression_id", "user_id", "ad_id", "clicked", "converted", "ds"]
    )
    rejected = _rows(paths, "bronze.rejected_rows", ["source_table", "source_file", "reason"])
    assert len(impressions) + len(rejected) == len(train) + 1 + len(test)  # every line in the log, one bad
    assert rejected == [
        {"source_table": "bronze.impressions", "source_file": "logs/train.csv", "reason": "invalid_label_clicked"}
    ]
    assert sorted((r["user_id"], r["ad_id"], r["clicked"], r["converted"]) for r in impressions) == sorted(
        (u, a, c, b) for _, u, a, c, b in train + test
    )
    assert {r["impression_id"].rpartition("-")[0] for r in impressions} == {"my_logs-train", "my_logs-test"}
    assert {r["user_id"] for r in _rows(paths, "bronze.users", ["user_id"])} == set(USERS)
    assert {r["ad_id"] for r in _rows(paths, "bronze.ads", ["ad_id"])} == set(ADS)
    clicks = sum(c for *_, c, _ in train + test)
    assert len(_rows(paths, "bronze.events", ["user_id"])) == clicks  # each click a behaviour event
    assert len(_rows(paths, "gold.training_examples", ["user_id"])) == len(impressions)

    # The promoted teacher trained on the training file's rows and was measured on the test file's.
    version = paths.latest_model_version()
    manifest = json.loads((paths.model_dir(version) / "manifest.json").read_text())
    assert (manifest["config"]["data"]["source"], manifest["config"]["data"]["mapping"]) == ("mapping", str(mapping))
    assert len(manifest["epoch_losses"]) == 1 and manifest["world_size"] == 1
    metrics = manifest["metrics"]
    assert (metrics["ctr/rows"], metrics["ctr/positives"]) == (len(test), sum(c for *_, c, _ in test))
    instance = dg.DagsterInstance.from_config(str(home / "dagster"))
    [training] = instance.get_run_records(dg.RunsFilter(job_name="train_teacher_job"))
    messages = [e.user_message for e in instance.all_logs(training.dagster_run.run_id)]
    assert any(f"; {len(train)} training impressions from " in m for m in messages), messages
    assert len(_rows(paths, "gold.teacher_logits", ["user_id"])) == len(test)
