"""The one Dagster code location of GEM Pipeline (loaded by workspace.yaml).

Definitions are built by `build_definitions`, called when Dagster loads the location, never at
import time: the lake root and preset come from the environment (GEM_HOME, GEM_PRESET,
GEM_CONFIG), the launcher from GEM_LAUNCHER and GEM_LAUNCHER_CONFIG, or all from the caller
(tests pass their own resources).

Runs execute in process by default (`GEM_DAGSTER_EXECUTOR=in_process`): a run's steps share one
process and so one Spark session, where the multiprocess executor would start a Python process,
its imports and a Spark JVM per step, for no parallelism on one machine (Spark and torchrun
already use every core). `GEM_DAGSTER_EXECUTOR=multiprocess` restores Dagster's default;
docs/ENVIRONMENT.md says how a cluster deployment runs steps elsewhere.
"""

import os

import dagster as dg

from dagster_project.defs.automation import build_jobs, build_schedules, build_sensors
from dagster_project.defs.export.assets import build_export_assets, build_export_checks
from dagster_project.defs.features.assets import build_feature_assets
from dagster_project.defs.features.checks import build_feature_checks
from dagster_project.defs.provenance import with_provenance
from dagster_project.defs.reports.assets import sql_pack
from dagster_project.defs.student.assets import build_student_checks, student_models
from dagster_project.defs.training.assets import teacher_model
from dagster_project.resources.lake import LakeResource
from dagster_project.resources.launchers import JobLauncher, launcher_from_env
from dagster_project.resources.spark import SparkResource

EXECUTORS = {"in_process": dg.in_process_executor, "multiprocess": dg.multiprocess_executor}


def executor_from_env() -> dg.ExecutorDefinition:
    name = os.environ.get("GEM_DAGSTER_EXECUTOR", "in_process")
    if name not in EXECUTORS:
        raise ValueError(f"GEM_DAGSTER_EXECUTOR={name!r} is not one of {sorted(EXECUTORS)}; unset it for in_process")
    return EXECUTORS[name]


def build_definitions(
    lake: LakeResource | None = None, spark: SparkResource | None = None, launcher: JobLauncher | None = None
) -> dg.Definitions:
    lake = lake or LakeResource.from_env()
    cfg = lake.config
    jobs = build_jobs()
    by_name = {j.name: j for j in jobs}
    return dg.Definitions(
        assets=with_provenance(
            [*build_feature_assets(cfg), teacher_model, *build_export_assets(cfg), sql_pack, student_models], cfg
        ),
        asset_checks=[*build_feature_checks(cfg), *build_export_checks(cfg), *build_student_checks()],
        jobs=jobs,
        schedules=build_schedules(by_name),
        sensors=build_sensors(by_name, cfg),
        executor=executor_from_env(),
        resources={
            "lake": lake,
            "spark": spark or SparkResource(),
            "launcher": launcher or launcher_from_env(lake.home),
        },
    )


@dg.definitions
def defs() -> dg.Definitions:
    return build_definitions()
