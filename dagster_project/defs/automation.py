"""Jobs, the daily schedule and the new-model sensor.

- `build_dimensions_job`: users and ads (bronze, silver), unpartitioned.
- `build_features_job`: one day of events, impressions, sequences and training examples;
  `build_features_job_schedule` runs it every day for the day that just ended.
- `train_teacher_job`: the teacher model.
- `export_job`: one day's scored tables and indexes; `teacher_model_sensor` requests it for the
  newest day whenever a new teacher model version is materialised.
"""

from __future__ import annotations

import dagster as dg

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
    ]


def build_schedules(jobs: dict[str, dg.UnresolvedAssetJobDefinition]) -> list:
    return [dg.build_schedule_from_partitioned_job(jobs["build_features_job"], hour_of_day=1)]


def build_sensors(jobs: dict[str, dg.UnresolvedAssetJobDefinition], cfg: GemConfig) -> list[dg.SensorDefinition]:
    newest_day = cfg.world.days[-1].isoformat()

    @dg.asset_sensor(asset_key=TEACHER_MODEL, job=jobs["export_job"], name="teacher_model_sensor",
                     description="Export embeddings, logits and indexes when a new teacher model lands")
    def teacher_model_sensor(context: dg.SensorEvaluationContext, asset_event: dg.EventLogEntry):
        materialization = asset_event.asset_materialization
        version = materialization.metadata["model_version"].value if materialization else None
        yield dg.RunRequest(run_key=f"{version}:{newest_day}", partition_key=newest_day,
                            run_config={"ops": {op: {"config": {"model_version": version}}
                                                for op in ("scored_tables", "indexes__ads", "indexes__users")}})

    return [teacher_model_sensor]
