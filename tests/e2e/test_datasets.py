"""End to end on every real dataset: features, training and export run, with rows conserved.

Each dataset gets its own lake (one source per lake) and the whole asset graph at tiny scale, on
a copy of its folder whose files longer than `gem_model.testing.samples.MAX_LINES` keep their first
lines (Open Bandit's six 10,000-line logs; the other samples are whole), with the dataset's own model
config where it has one: the shapes are the dataset's own and the run takes minutes, not ten
(tests/unit/gem_lake/test_sources.py lands every sample whole). Skipped when the datasets folder is absent (set
GEM_DATA_DIR to run it elsewhere).
"""

import json
from collections import Counter

import dagster as dg
import pytest
from pyspark.sql import functions as F

from dagster_project.definitions import build_definitions
from dagster_project.demo import in_process, instance_for, run_pipeline
from dagster_project.resources.lake import LakeResource
from gem_lake.delta import read_table
from gem_lake.sources import build_source, dataset_folder
from gem_model.config import DATA_SOURCES, FeatureSpec
from gem_model.testing.samples import head_copy, sample_overrides
from tests.conftest import real_data_root

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.dist]
# "mapping" (the user's own logs) has no dataset here: tests/unit/gem_lake/test_source_mapping.py lands one.
REAL = [s for s in DATA_SOURCES if s not in ("synthetic", "mapping")]

ROOT = real_data_root()


def _count(spark, lake, table, where=None):
    df = read_table(spark, lake.paths.table(table))
    return (df.where(where) if where is not None else df).count()


@pytest.mark.parametrize("source", REAL)
def test_pipeline_runs_on_real_dataset(source, spark, tmp_path, monkeypatch):
    folder = dataset_folder(source)
    head_copy(ROOT / folder, tmp_path / "data" / folder)
    (tmp_path / "overrides.json").write_text(json.dumps(sample_overrides(source, tmp_path / "data")))
    lake = LakeResource(
        home=str(tmp_path / "gem"), preset="tiny", config_path=str(tmp_path / "overrides.json"), data_source=source
    )
    monkeypatch.setenv("GEM_HOME", lake.home)
    # Its own instance, not one an earlier test left in DAGSTER_HOME (the session's pipeline lake sets it).
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "gem" / "dagster"))  # restored after the test
    instance = instance_for(lake)
    run_pipeline(lake, in_process(build_definitions(lake=lake), instance))
    cfg = lake.config

    raw = build_source(spark, cfg)
    raw_impressions = sum(raw.impressions(d).count() for d in cfg.world.days)
    rejected = F.col("source_table") == "bronze.impressions"
    accepted = _count(spark, lake, "bronze.impressions")
    assert accepted + _count(spark, lake, "bronze.rejected_rows", rejected) == raw_impressions
    assert accepted > 0.9 * raw_impressions
    assert _count(spark, lake, "gold.training_examples") == accepted
    # Every feature has its embedding row, and each of the dataset's own fields holds values.
    examples = read_table(spark, lake.paths.table("gold.training_examples"))
    own_fields = [f for f in cfg.features.features if f.name not in {d.name for d in FeatureSpec().features}]
    assert (source in ("frappe", "movielens")) == bool(own_fields)
    if own_fields:
        filled = examples.agg(*[F.count_if(F.col(f.idx_column) != 0).alias(f.name) for f in own_fields]).first()
        assert min(filled) > 0, filled.asDict()

    holdout = cfg.world.holdout_start
    holdout_rows = _count(spark, lake, "bronze.impressions", F.col("ds") >= F.lit(holdout))
    assert _count(spark, lake, "gold.teacher_logits") == holdout_rows
    assert _count(spark, lake, "gold.ad_embeddings") == _count(spark, lake, "silver.ad_features")
    manifest = json.loads((lake.paths.model_dir(lake.latest_model_version()) / "manifest.json").read_text())
    assert manifest["config"]["data"]["source"] == source
    assert manifest["metrics"]["ctr/rows"] == holdout_rows
    assert "ctr/oracle_auc" not in manifest["metrics"]  # real data has no true probabilities

    evaluations = instance.get_event_records(
        dg.EventRecordsFilter(event_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
    )
    results = [e.event_log_entry.dagster_event.event_specific_data for e in evaluations]
    must_pass = {"row_conservation", "point_in_time", "contract"}
    failed = [
        (r.asset_key.to_user_string(), r.check_name) for r in results if r.check_name in must_pass and not r.passed
    ]
    assert failed == []
    # Every table that carries history checks it on every day.
    checked = Counter(r.asset_key.to_user_string() for r in results if r.check_name == "point_in_time")
    assert checked == {table: cfg.world.n_days for table in ("gold/user_sequences", "gold/user_timelines")}
