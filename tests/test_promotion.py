"""LATEST moves only to a teacher that passes its blocking holdout check; one run trains a version at a time."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import pytest

from dagster_project.definitions import build_definitions
from dagster_project.resources.lake import LakeResource
from dagster_project.resources.launchers import JobLauncher
from gem_model.train.promotion import PromotionRefusedError, holdout_check, promote
from jobs.lake import table_version
from jobs.locks import partition_lock
from tests.conftest import PIPELINE_OVERRIDES

pytestmark = [pytest.mark.slow, pytest.mark.spark]


class UntrainedModelLauncher(JobLauncher):
    """Stands in for a training run that learned nothing: writes a copy of a real model version at the
    requested `--model-dir` whose manifest reports the chance-level holdout AUC such a run measures."""

    source: str

    def launch(self, context, script, args, nproc):
        target = Path(args[args.index("--model-dir") + 1])
        shutil.copytree(self.source, target)
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


def test_a_model_failing_its_holdout_check_is_not_promoted_nor_exported(pipeline, spark, tmp_path):
    lake, _, instance = pipeline
    promoted = lake.latest_model_version()
    untrained = _lake_with_seed(lake, tmp_path, seed=1)
    version = _version(untrained, spark)
    defs = build_definitions(lake=untrained,
                             launcher=UntrainedModelLauncher(source=str(lake.paths.model_dir(promoted))))
    try:
        result = defs.resolve_job_def("train_teacher_job").execute_in_process(instance=instance, raise_on_error=False)
        assert not result.success  # the blocking check fails the step
        checks = [e.event_specific_data for e in result.all_events
                  if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION]
        assert [(c.check_name, c.passed) for c in checks] == [("holdout_metrics", False)]
        assert "ctr/auc 0.49 is not better than chance" in checks[0].description
        materialization = result.asset_materializations_for_node("teacher_model")[0]
        assert materialization.metadata["model_version"].value == version
        assert materialization.metadata["promoted"].value is False
        assert lake.latest_model_version() == promoted  # LATEST, the sensor's trigger and every default, stays
        sensor = defs.get_repository_def().get_sensor_def("teacher_model_sensor")
        tick = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs,
                                                            resources={"lake": untrained}))
        assert tick.run_requests == []  # the promoted version is exported already; the untrained one never is
        with pytest.raises(PromotionRefusedError, match="fails its holdout check"):
            promote(lake.paths, version)
        assert lake.latest_model_version() == promoted
    finally:
        shutil.rmtree(lake.paths.model_dir(version), ignore_errors=True)


def test_promote_moves_latest_to_a_version_that_passes(pipeline):
    lake, _, _ = pipeline
    version = lake.latest_model_version()
    check = promote(lake.paths, version)
    assert check.passed and lake.latest_model_version() == version
    assert holdout_check({"metrics": {"ctr/rows": 10.0, "ctr/positives": 0.0}}).passed is False


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
