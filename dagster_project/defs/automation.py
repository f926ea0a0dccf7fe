"""Jobs, the daily schedule and the new-model sensor.

- `build_dimensions_job`: users and ads (bronze, silver), unpartitioned.
- `build_features_job`: one day of events, impressions, sequences and training examples;
  `build_features_job_schedule` runs it every day for the day that just ended.
- `train_teacher_job`: the teacher model.
- `export_job`: one day's scored tables, indexes and candidates; `teacher_model_sensor` requests
  it for every holdout day (the days after the training window) whenever a new teacher model
  version is materialised.
- `train_students_job`: the per-surface students of the latest teacher and gold.student_metrics.
- `build_reports_job`: the SQL pack's report queries, results as the asset's metadata.
"""

from __future__ import annotations

import dagster as dg

from dagster_project.defs.export.assets import EXPORT_OPS
from dagster_project.defs.lake_tables import daily_partitions
from dagster_project.defs.training.assets import TEACHER_MODEL
from gem_model.config import GemConfig

DIMENSIONS = dg.AssetSelection.assets(["bronze", "users"], ["bronze", "ads"], ["silver", "users"],
                                      ["silver", "ads"])


def build_jobs(cfg: GemConfig) -> list[dg.UnresolvedAssetJobDefinition]:
    daily = daily_partitions(cfg)
    features = dg.AssetSelection.groups("features") - DIMENSIONS
    return [
        dg.define_asset_job("build_dimensions_job", selection=DIMENSIONS),
        dg.define_asset_job("build_features_job", selection=features, partitions_def=daily),
        dg.define_asset_job("train_teacher_job", selection=dg.AssetSelection.assets(TEACHER_MODEL)),
        dg.define_asset_job("export_job", selection=dg.AssetSelection.groups("export"), partitions_def=daily),
        dg.define_asset_job("train_students_job", selection=dg.AssetSelection.groups("student")),
        dg.define_asset_job("build_reports_job", selection=dg.AssetSelection.groups("reports")),
    ]


def build_schedules(jobs: dict[str, dg.UnresolvedAssetJobDefinition]) -> list:
    return [dg.build_schedule_from_partitioned_job(jobs["build_features_job"], hour_of_day=1)]


def build_sensors(jobs: dict[str, dg.UnresolvedAssetJobDefinition], cfg: GemConfig) -> list[dg.SensorDefinition]:
    holdout = [d.isoformat() for d in cfg.world.days if d >= cfg.world.holdout_start]

    @dg.asset_sensor(asset_key=TEACHER_MODEL, job=jobs["export_job"], name="teacher_model_sensor",
                     description="Export embeddings, logits, indexes and candidates of the days after the "
                                 "new teacher's training window when it lands")
    def teacher_model_sensor(context: dg.SensorEvaluationContext, asset_event: dg.EventLogEntry):
        materialization = asset_event.asset_materialization
        version = materialization.metadata["model_version"].value if materialization else None
        for day in holdout:
            yield dg.RunRequest(run_key=f"{version}:{day}", partition_key=day,
                                run_config={"ops": {op: {"config": {"model_version": version}} for op in EXPORT_OPS}})

    return [teacher_model_sensor]
