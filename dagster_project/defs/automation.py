"""Jobs, the daily schedule and the new-model sensor.

- `build_dimensions_job`: users and ads (bronze, silver), unpartitioned.
- `build_features_job`: one day of events, impressions, sequences and training examples;
  `build_features_job_schedule` runs it every day for the day that just ended.
- `train_teacher_job`: the teacher model.
- `export_job`: one day's scored tables, indexes and candidates; `teacher_model_sensor` requests
  it for every holdout day (the days after the training window) of each newly promoted teacher
  (`models/LATEST` moves only once a version's blocking holdout check passed), once per
  (version, day): the run key is `<version>:<day>`, and days whose indexes that version already
  published are skipped.
- `train_students_job`: the per-surface students of the latest teacher and gold.student_metrics.
- `build_reports_job`: the SQL pack's report queries, results as the asset's metadata.
"""

from __future__ import annotations

import json
from datetime import date

import dagster as dg

from dagster_project.defs.export.assets import EXPORT_OPS, INDEXES
from dagster_project.defs.training.assets import TEACHER_MODEL
from dagster_project.resources.lake import LakeResource
from gem_model.config import GemConfig

DIMENSIONS = dg.AssetSelection.assets(["bronze", "users"], ["bronze", "ads"], ["silver", "user_features"],
                                      ["silver", "ad_features"])


def build_jobs() -> list[dg.UnresolvedAssetJobDefinition]:
    features = dg.AssetSelection.groups("features") - DIMENSIONS
    # Partitioned jobs take their (daily) partitions from their assets.
    return [
        dg.define_asset_job("build_dimensions_job", selection=DIMENSIONS),
        dg.define_asset_job("build_features_job", selection=features),
        dg.define_asset_job("train_teacher_job", selection=dg.AssetSelection.assets(TEACHER_MODEL)),
        dg.define_asset_job("export_job", selection=dg.AssetSelection.groups("export")),
        dg.define_asset_job("train_students_job", selection=dg.AssetSelection.groups("student")),
        dg.define_asset_job("build_reports_job", selection=dg.AssetSelection.groups("reports")),
    ]


def build_schedules(jobs: dict[str, dg.UnresolvedAssetJobDefinition]) -> list:
    return [dg.build_schedule_from_partitioned_job(jobs["build_features_job"], hour_of_day=1)]


def export_requests(lake: LakeResource, version: str, days: list[date]) -> list[dg.RunRequest]:
    """One export run per day of `days` that `version` has not published both indexes for yet."""
    requests = []
    for day in days:
        if all((lake.paths.index_dir(name, version, day) / "CURRENT").is_file() for name in INDEXES):
            continue
        requests.append(dg.RunRequest(
            run_key=f"{version}:{day.isoformat()}", partition_key=day.isoformat(), tags={"gem/model_version": version},
            run_config={"ops": {op: {"config": {"model_version": version}} for op in EXPORT_OPS}}))
    return requests


def build_sensors(jobs: dict[str, dg.UnresolvedAssetJobDefinition], cfg: GemConfig) -> list[dg.SensorDefinition]:
    holdout = [d for d in cfg.world.days if d >= cfg.world.holdout_start]

    @dg.sensor(job=jobs["export_job"], name="teacher_model_sensor", minimum_interval_seconds=30,
               description="Export embeddings, logits, indexes and candidates of the days after the training window "
                           "of each newly promoted teacher (models/LATEST), once per (version, day)")
    def teacher_model_sensor(context: dg.SensorEvaluationContext, lake: LakeResource):
        try:
            version = lake.latest_model_version()
        except FileNotFoundError as missing:
            return dg.SkipReason(str(missing))
        seen = json.loads(context.cursor) if context.cursor else {}
        if seen.get("version") == version:
            return dg.SkipReason(f"exports of {version} were already requested")
        context.update_cursor(json.dumps({"version": version}))
        return export_requests(lake, version, holdout) or dg.SkipReason(f"{version} is exported on every holdout day")

    return [teacher_model_sensor]
