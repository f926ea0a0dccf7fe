"""LATEST moves only to a teacher the promotion rule accepts (its own metrics, the AUC floor, no regression
against the promoted model on the same holdout), every decision is recorded with the model, and one run
trains a version at a time. The rule's tests use model stand-ins (manifests only); the asset's, the
end-to-end pipeline."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import pytest

from dagster_project.definitions import build_definitions
from dagster_project.resources.lake import LakeResource
from dagster_project.resources.launchers import JobLauncher
from gem_lake.delta import table_version
from gem_lake.locks import partition_lock
from gem_model.config import ConfigError, GemConfig, PromotionConfig
from gem_model.paths import GemPaths
from gem_model.testing.models import write_model
from gem_model.train.promotion import RECORD_FILE, PromotionRefusedError, judge, promote, read_decisions
from jobs.cli import main
from tests.conftest import PIPELINE_OVERRIDES

RULE = PromotionConfig()


class UntrainedModelLauncher(JobLauncher):
    """Stands in for a training run that learned nothing: writes a copy of a real model version at the
    requested `--model-dir` whose manifest reports the chance-level holdout AUC such a run measures."""

    source: str

    def launch(self, context, module, args, nproc):
        target = Path(args[args.index("--model-dir") + 1])
        shutil.copytree(self.source, target, ignore=shutil.ignore_patterns(RECORD_FILE))  # a new model: no decisions
        manifest = json.loads((target / "manifest.json").read_text())
        manifest.update(model_version=target.name, metrics={**manifest["metrics"], "ctr/auc": 0.49})
        (target / "manifest.json").write_text(json.dumps(manifest))
        return SimpleNamespace(metadata={})  # what the asset reads of a completed Pipes invocation


def _lake_with_seed(lake: LakeResource, tmp_path: Path, seed: int) -> LakeResource:
    """The pipeline's lake under a config of another fingerprint (so another model version name)."""
    overrides = tmp_path / "overrides.json"
    overrides.write_text(json.dumps({**PIPELINE_OVERRIDES, "train": {"seed": seed}}))
    return LakeResource(home=lake.home, preset=lake.preset, config_path=str(overrides))


def _version(lake: LakeResource, spark) -> str:
    cfg = lake.config
    return f"gem-{cfg.preset}-{cfg.fingerprint}-d{table_version(lake.paths.table('gold.training_examples'))}"


@pytest.mark.slow
@pytest.mark.spark
def test_a_model_failing_its_holdout_check_is_not_promoted_nor_exported(pipeline, spark, tmp_path):
    lake, _, instance = pipeline
    promoted = lake.latest_model_version()
    untrained = _lake_with_seed(lake, tmp_path, seed=1)
    version = _version(untrained, spark)
    defs = build_definitions(
        lake=untrained, launcher=UntrainedModelLauncher(source=str(lake.paths.model_dir(promoted)))
    )
    try:
        result = defs.resolve_job_def("train_teacher_job").execute_in_process(instance=instance, raise_on_error=False)
        assert not result.success  # the blocking check fails the step
        checks = [
            e.event_specific_data
            for e in result.all_events
            if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
        ]
        assert [(c.check_name, c.passed) for c in checks] == [("holdout_metrics", False)]
        assert "ctr/auc 0.4900 is below the floor 0.55 on " in checks[0].description
        assert checks[0].metadata["ctr/auc"].value == 0.49 and checks[0].metadata["promoted"].value is False
        materialization = result.asset_materializations_for_node("teacher_model")[0]
        assert materialization.metadata["model_version"].value == version
        assert materialization.metadata["promoted"].value is False
        recorded = materialization.metadata["promotion"].value
        assert recorded["promoted"] is False and recorded["rule"]["min_auc"] == 0.55
        assert [d["problems"] for d in read_decisions(lake.paths, version)] == [recorded["problems"]]
        assert lake.latest_model_version() == promoted  # LATEST, the sensor's trigger and every default, stays
        sensor = defs.get_repository_def().get_sensor_def("teacher_model_sensor")
        tick = sensor.evaluate_tick(
            dg.build_sensor_context(instance=instance, definitions=defs, resources={"lake": untrained})
        )
        assert tick.run_requests == []  # the promoted version is exported already; the untrained one never is
        with pytest.raises(PromotionRefusedError, match="ctr/auc 0.4900 is below the floor"):
            promote(lake.paths, version, RULE, "test")
        assert lake.latest_model_version() == promoted
    finally:
        shutil.rmtree(lake.paths.model_dir(version), ignore_errors=True)


@pytest.mark.slow
@pytest.mark.spark
def test_the_pipelines_teacher_passes_the_rule_it_was_promoted_by(pipeline):
    lake, _, _ = pipeline
    version = lake.latest_model_version()
    decision = read_decisions(lake.paths, version)[0]  # the teacher asset's
    assert decision["promoted"] and decision["decided_by"].startswith("dagster run ")
    assert decision["metrics"]["ctr/auc"] > RULE.min_auc
    assert promote(lake.paths, version, RULE, "test").promoted and lake.latest_model_version() == version


@pytest.mark.slow
@pytest.mark.spark
def test_a_second_training_of_a_version_in_training_is_refused(pipeline, spark, tmp_path):
    lake, _, instance = pipeline
    other = _lake_with_seed(lake, tmp_path, seed=2)
    version = _version(other, spark)
    defs = build_definitions(lake=other, launcher=UntrainedModelLauncher(source="never used"))
    with partition_lock(lake.paths, "train", version, holder="dagster run first-run"):
        result = defs.resolve_job_def("train_teacher_job").execute_in_process(instance=instance, raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure).step_failure_data.error
    assert "is locked by another run" in str(failure.cause or failure) and "first-run" in str(failure.cause or failure)
    assert not lake.paths.model_dir(version).exists() and not lake.paths.model_dir(version + ".partial").exists()


# The rule, on model stand-ins (manifests only) in a temporary GEM_HOME.
@pytest.fixture
def paths(gem_home) -> GemPaths:
    return GemPaths(gem_home)


def _latest_bytes(paths: GemPaths) -> bytes:
    return (paths.models / "LATEST").read_bytes()


def test_a_chance_level_model_is_refused_and_the_refusal_recorded(paths):
    write_model(paths, "gem-good", ctr_auc=0.62)
    promote(paths, "gem-good", RULE, "test")
    before = _latest_bytes(paths)
    write_model(paths, "gem-chance", ctr_auc=0.5001)
    with pytest.raises(PromotionRefusedError, match=r"ctr/auc 0.5001 is below the floor 0.55 on 450 holdout clicks"):
        promote(paths, "gem-chance", RULE, "test")
    assert _latest_bytes(paths) == before
    [record] = read_decisions(paths, "gem-chance")
    assert record["promoted"] is False and record["decided_by"] == "test"
    assert record["problems"] == ["ctr/auc 0.5001 is below the floor 0.55 on 450 holdout clicks"]


def test_the_floor_is_judged_only_where_the_holdout_can_tell(paths):
    """Below 300 clicks a chance-level AUC is too noisy to hold against the floor (the real samples' holdouts)."""
    write_model(paths, "gem-small-holdout", ctr_auc=0.5001, clicks=120, rows=600)
    decision = promote(paths, "gem-small-holdout", RULE, "test")
    assert decision.promoted and paths.latest_model_version() == "gem-small-holdout"
    assert "ctr: floor not judged on 120 holdout clicks (needs 300)" in decision.notes


def test_the_conversion_task_is_held_to_the_floor_where_it_has_enough_conversions(paths):
    write_model(paths, "gem-no-cvr-signal", ctr_auc=0.70, clicks=3000, rows=30000, conversions=400, cvr_auc=0.52)
    with pytest.raises(PromotionRefusedError, match="cvr/auc 0.5200 is below the floor 0.55 on 400 holdout conv"):
        promote(paths, "gem-no-cvr-signal", RULE, "test")
    assert not (paths.models / "LATEST").exists()


def test_a_model_worse_than_the_promoted_one_beyond_the_tolerance_is_refused(paths):
    write_model(paths, "gem-old", ctr_auc=0.75, clicks=20000, rows=200000)
    promote(paths, "gem-old", RULE, "test")
    before = _latest_bytes(paths)
    write_model(paths, "gem-worse", ctr_auc=0.735, clicks=20000, rows=200000)
    with pytest.raises(
        PromotionRefusedError,
        match=r"ctr/auc 0.7350 is 0.0150 below the promoted gem-old's 0.7500 "
        r"on the same holdout \(tolerance 0.01\)",
    ):
        promote(paths, "gem-worse", RULE, "test")
    assert _latest_bytes(paths) == before
    write_model(paths, "gem-level", ctr_auc=0.745, clicks=20000, rows=200000)  # within the tolerance
    assert promote(paths, "gem-level", RULE, "test").promoted and paths.latest_model_version() == "gem-level"


def test_a_better_model_is_promoted_and_the_comparison_recorded_with_it(paths):
    write_model(paths, "gem-old", ctr_auc=0.75, clicks=20000, rows=200000)
    promote(paths, "gem-old", RULE, "test")
    write_model(paths, "gem-new", ctr_auc=0.76, clicks=20000, rows=200000)
    promote(paths, "gem-new", RULE, "dagster run r1")
    assert paths.latest_model_version() == "gem-new"
    [record] = json.loads((paths.model_dir("gem-new") / "promotion.json").read_text())["decisions"]
    assert record["promoted"] is True and record["decided_by"] == "dagster run r1"
    assert record["incumbent"] == "gem-old"
    assert record["incumbent_metrics"] == {"ctr/auc": 0.75, "ctr/ne": 0.95, "cvr/auc": 0.6, "cvr/ne": 0.97}
    assert record["deltas"]["ctr/auc"] == pytest.approx(0.01) and record["deltas"]["ctr/ne"] == 0.0
    assert record["rule"] == {
        "min_auc": 0.55,
        "floor_min_class_rows": 300,
        "max_auc_regression": 0.01,
        "compare_min_class_rows": 2000,
    }
    assert "cvr: comparison not judged on 40 holdout conversions (needs 2000)" in record["notes"]


def test_another_holdout_is_not_compared_and_the_floor_decides(paths):
    write_model(paths, "gem-old", ctr_auc=0.75, clicks=20000, rows=200000)
    promote(paths, "gem-old", RULE, "test")
    write_model(paths, "gem-later", ctr_auc=0.70, clicks=20000, rows=200000, holdout_days=("2026-11-07",))
    decision = promote(paths, "gem-later", RULE, "test")
    assert decision.promoted and decision.incumbent is None and decision.deltas == {}
    assert any(n.startswith("not compared with the promoted gem-old: another holdout") for n in decision.notes)


def test_a_rollback_past_a_better_model_needs_force_and_a_reason_both_recorded(paths, capsys):
    write_model(paths, "gem-old", ctr_auc=0.74, clicks=20000, rows=200000)
    write_model(paths, "gem-new", ctr_auc=0.76, clicks=20000, rows=200000)
    promote(paths, "gem-old", RULE, "test")
    promote(paths, "gem-new", RULE, "test")
    before = _latest_bytes(paths)
    with pytest.raises(SystemExit) as refused:
        main(["promote", "gem-old"])
    assert str(refused.value).startswith(
        "gem promote: model version gem-old is not promoted: ctr/auc 0.7400 is "
        "0.0200 below the promoted gem-new's 0.7600 on the same holdout"
    )
    assert str(refused.value).endswith("gem promote VERSION --force --reason TEXT")
    assert _latest_bytes(paths) == before
    with pytest.raises(SystemExit) as no_reason:
        main(["promote", "gem-old", "--force"])
    assert no_reason.value.code == 2 and capsys.readouterr().err.startswith(
        "gem promote: error: argument --reason: --force and a non-empty --reason go together"
    )
    assert _latest_bytes(paths) == before
    main(["promote", "gem-old", "--force", "--reason", "serving regression in gem-new"])
    assert paths.latest_model_version() == "gem-old"
    record = read_decisions(paths, "gem-old")[-1]
    assert record["promoted"] and record["force_reason"] == "serving regression in gem-new"
    assert record["regressions"] == [
        "ctr/auc 0.7400 is 0.0200 below the promoted gem-new's 0.7600 on the same holdout (tolerance 0.01)"
    ]


def test_force_never_waives_the_models_own_check_or_the_floor(paths):
    write_model(paths, "gem-good", ctr_auc=0.62)
    promote(paths, "gem-good", RULE, "test")
    write_model(paths, "gem-chance", ctr_auc=0.5001)
    with pytest.raises(PromotionRefusedError, match="below the floor"):
        promote(paths, "gem-chance", RULE, "test", force_reason="roll back")
    assert paths.latest_model_version() == "gem-good"


@pytest.mark.parametrize(
    "version", ["../models/gem-good", "gem-good/", "/tmp/gem-good", "..", "gem-good\\x", "gem-good\n", "gem-unknown"]
)
def test_a_version_that_is_not_a_known_plain_name_is_refused_and_latest_is_unchanged(paths, capsys, version):
    write_model(paths, "gem-good", ctr_auc=0.62)
    write_model(paths, "gem-other", ctr_auc=0.63)
    promote(paths, "gem-good", RULE, "test")
    before = _latest_bytes(paths)
    with pytest.raises(SystemExit) as refused:
        main(["promote", version])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and err.count("\n") == 1
    assert err.startswith(f"gem promote: error: argument VERSION: {version!r} is not ")
    assert err.endswith("; known versions: gem-good, gem-other\n")
    with pytest.raises(ValueError, match="known versions: gem-good, gem-other"):
        promote(paths, version, RULE, "test")
    assert _latest_bytes(paths) == before


def test_latest_refuses_a_name_that_is_not_plain(paths):
    write_model(paths, "gem-good", ctr_auc=0.62)
    paths.set_latest_model_version("gem-good")
    before = _latest_bytes(paths)
    for name in ("../gem-good", "a/b", "", "gem-good\n"):
        with pytest.raises(ValueError, match="is not a plain model version name"):
            paths.set_latest_model_version(name)
    assert _latest_bytes(paths) == before
    (paths.models / "LATEST").write_text("../models/gem-good\n")  # as `gem promote ../models/V` once wrote it
    with pytest.raises(FileNotFoundError, match="LATEST names model version '../models/gem-good'"):
        paths.latest_model_version()


def test_the_rule_is_configured_in_the_typed_config_without_renaming_teachers():
    strict = GemConfig.from_dict({"promotion": {"min_auc": 0.7}})
    assert strict.fingerprint == GemConfig().fingerprint  # which version is served, not what it learns
    manifest = {
        "model_version": "m",
        "metrics": {"ctr/rows": 6000, "ctr/positives": 450, "ctr/auc": 0.65, "ctr/ne": 0.9},
    }
    assert judge(manifest, RULE).promoted and not judge(manifest, strict.promotion).promoted
    with pytest.raises(ConfigError, match=r"promotion.min_auc=0.4: must be a number in \[0.5, 1\]"):
        GemConfig.from_dict({"promotion": {"min_auc": 0.4}})
    assert judge({"model_version": "m", "metrics": {"ctr/rows": 10, "ctr/positives": 0}}, RULE).problems == (
        "ctr: the holdout needs clicks and non-clicks",
    )
