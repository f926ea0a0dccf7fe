"""Jobs, the daily schedule and the new-model sensor.

- `build_dimensions_job`: users and ads (bronze, silver), unpartitioned.
- `build_features_job`: one day of events, impressions, sequences and training examples;
  `build_features_job_schedule` runs it every day for the day that just ended.
- `train_teacher_job`: the teacher model.
- `export_job`: one (model version, day)'s scored tables, indexes and candidates;
  `teacher_model_sensor` requests it for the promoted teacher (`models/LATEST` moves only once a
  version's blocking holdout check passed) on every serving day: the holdout days after its
  training window, and each later day of an open-ended calendar once the schedule has built it.
  Once per (version, day): the run key is `<version>:<day>`, and days whose indexes that version
  already published are skipped.
- `train_students_job`: one teacher version's per-surface students and gold.student_metrics.
- `build_reports_job`: the SQL pack's report queries, results as the asset's metadata.
"""

from __future__ import annotations

from datetime import date

import dagster as dg

from dagster_project.defs.export.assets import INDEXES
from dagster_project.defs.lake_tables import key
from dagster_project.defs.partitions import MODEL_VERSIONS, model_day_key
from dagster_project.defs.training.assets import TEACHER_MODEL
from dagster_project.resources.lake import LakeResource
from gem_model.config import GemConfig

DIMENSIONS = dg.AssetSelection.assets(
    ["bronze", "users"], ["bronze", "ads"], ["silver", "user_features"], ["silver", "ad_features"]
)


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


def serving_days(instance: dg.DagsterInstance, cfg: GemConfig) -> list[date]:
    """The days a promoted teacher is exported on: its holdout days, and each later day of an open-ended
    calendar once its training examples are materialised (the daily schedule builds one per day)."""
    holdout = [d for d in cfg.world.days if d >= cfg.world.holdout_start]
    built = {date.fromisoformat(p) for p in instance.get_materialized_partitions(key("gold.training_examples"))}
    return [*holdout, *sorted(d for d in built if d > cfg.world.days[-1])]


def export_requests(lake: LakeResource, version: str, days: list[date]) -> list[dg.RunRequest]:
    """One export run per day of `days` that `version` has not published both indexes for yet."""
    return [
        dg.RunRequest(run_key=f"{version}:{day.isoformat()}", partition_key=model_day_key(version, day))
        for day in days
        if not all((lake.paths.index_dir(name, version, day) / "CURRENT").is_file() for name in INDEXES)
    ]


def build_sensors(jobs: dict[str, dg.UnresolvedAssetJobDefinition], cfg: GemConfig) -> list[dg.SensorDefinition]:
    @dg.sensor(
        job=jobs["export_job"],
        name="teacher_model_sensor",
        minimum_interval_seconds=30,
        description="Export the promoted teacher (models/LATEST) on every day after its training window: "
        "the holdout days, then each new day the daily schedule builds; once per (version, day)",
    )
    def teacher_model_sensor(context: dg.SensorEvaluationContext, lake: LakeResource):
        try:
            version = lake.latest_model_version()
        except FileNotFoundError as missing:
            return dg.SkipReason(str(missing))
        # `gem promote` can promote a version this instance never trained: it becomes a partition here.
        new = [] if context.instance.has_dynamic_partition(MODEL_VERSIONS.name, version) else [version]
        requests = export_requests(lake, version, serving_days(context.instance, cfg))
        if not requests and not new:
            return dg.SkipReason(f"{version} is exported on every serving day")
        # A request's run key is `<version>:<day>`: Dagster launches each at most once.
        return dg.SensorResult(
            run_requests=requests, dynamic_partitions_requests=[MODEL_VERSIONS.build_add_request(new)] if new else []
        )

    return [teacher_model_sensor]
