"""Student assets: per-surface students distilled from one teacher version, and their metrics table.

`student_models` runs `jobs.train_student` in a separate process through the launcher
(Dagster Pipes; one process on one node, whatever the launcher's `nnodes`) on the days after
the teacher's training window, reading that version's exported logits and embeddings (partitioned
by model version: one partition per teacher version, `dagster_project/defs/partitions.py`); then
`gold.student_metrics` gets the manifest's metrics, replacing exactly the (model_version,
student_version) partition, so a re-run never duplicates rows. The student version is named by
the teacher version, the student config and the calendar: re-materialising unchanged inputs
rewrites the same version; one run trains a student version at a time
(`gem_lake.locks.partition_lock`).
"""

import math
import shutil

import dagster as dg

from dagster_project.defs.lake_tables import contract_check, key, table_metadata
from dagster_project.defs.partitions import MODEL_VERSIONS
from dagster_project.resources.lake import LakeResource
from dagster_project.resources.launchers import JobLauncher
from dagster_project.resources.spark import SparkResource
from gem_lake.locks import partition_lock
from gem_lake.table_contract import CONTRACT
from gem_model.train.manifest import read_manifest

GROUP = "student"
STUDENT_MODELS = dg.AssetKey("student_models")
STUDENT_METRICS = "gold.student_metrics"
FINITE_CHECK = dg.AssetCheckSpec(
    "finite_metrics",
    asset=STUDENT_MODELS,
    blocking=True,
    partitions_def=MODEL_VERSIONS,
    description="Every student variant has a finite overall ctr AUC and NE",
)


def _summary(manifest: dict) -> dict[str, object]:
    """The overall ctr NE of every variant and the gains as numbers, and one Markdown table of the ctr NE per
    surface (every metric of every variant, surface and task is a row of gold.student_metrics)."""
    metrics = manifest["metrics"]
    columns = ("teacher", *manifest["config"]["student"]["variants"], "oracle")

    def ne(variant: str, scope: str) -> float:
        return metrics.get(f"{variant}/{'' if scope == 'all' else scope + '/'}ctr/ne", math.nan)

    lines = ["| scope | " + " | ".join(columns) + " | KD gain | adapter gain |", "|---" * (len(columns) + 3) + "|"]
    for scope, gains in manifest["gains"].items():
        ctr = gains["ctr"]
        cells = [f"{ne(v, scope):.4f}" for v in columns]
        cells += [f"{ctr['kd_ne_gain']:+.4f}", f"{ctr['adapter_ne_gain']:+.4f}"]
        lines.append(f"| {scope} | " + " | ".join(cells) + " |")
    overall = manifest["gains"]["all"]["ctr"]
    return {
        "ctr_ne_by_surface": dg.MetadataValue.md("\n".join(lines)),
        **{f"{v}/ctr/ne": round(ne(v, "all"), 4) for v in columns if math.isfinite(ne(v, "all"))},
        **{f"gain/ctr/{k}": round(v, 4) for k, v in overall.items() if math.isfinite(v)},
    }


def _finite_metrics(manifest: dict) -> dg.AssetCheckResult:
    metrics = manifest["metrics"]
    required = [f"{v}/ctr/{m}" for v in manifest["config"]["student"]["variants"] for m in ("auc", "ne")]
    missing = [m for m in required if not math.isfinite(metrics.get(m, math.nan))]
    return dg.AssetCheckResult(
        asset_key=STUDENT_MODELS,
        check_name=FINITE_CHECK.name,
        passed=not missing,
        description=f"missing or non-finite: {missing}" if missing else "ok",
        metadata={m: metrics[m] for m in required if m not in missing},
    )


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            STUDENT_MODELS,
            group_name=GROUP,
            kinds={"pytorch"},
            deps=[
                key("gold.training_examples"),
                key("gold.teacher_logits"),
                key("gold.user_embeddings"),
                key("gold.ad_embeddings"),
            ],
            description="Per-surface students (labels / KD / Student Adapter) of one teacher version",
        ),
        dg.AssetSpec(
            key(STUDENT_METRICS),
            group_name=GROUP,
            kinds={"delta"},
            deps=[STUDENT_MODELS],
            description="Per-surface NE/AUC of every student variant, the teacher and the oracle",
        ),
    ],
    check_specs=[FINITE_CHECK],
    partitions_def=MODEL_VERSIONS,
)
def student_models(context: dg.AssetExecutionContext, spark: SparkResource, lake: LakeResource, launcher: JobLauncher):
    """Train the students of a teacher version on the days after its window and commit their metrics."""
    from gem_lake.delta import replace_partition
    from gem_model.distill.artefact import metric_rows, read_student_manifest, student_version

    cfg, paths = lake.config, lake.paths
    version = context.partition_key
    read_manifest(paths.model_dir(version))  # a missing version fails here, naming the known ones
    name = student_version(cfg, version)
    directory = paths.student_dir(name)
    staging = paths.run_staging("student", context.run_id)
    with partition_lock(paths, "student", name, holder=f"dagster run {context.run_id}"):
        staging.mkdir(parents=True, exist_ok=True)
        try:
            config_file = staging / "config.json"
            config_file.write_text(cfg.to_json())
            launcher.single_process().launch(
                context,
                "jobs.train_student",
                ["--model-version", version, "--config", str(config_file), "--out", str(directory)],
                nproc=1,
            )
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        manifest = read_student_manifest(directory)
    yield dg.MaterializeResult(
        asset_key=STUDENT_MODELS,
        metadata={
            "student_version": name,
            "path": dg.MetadataValue.path(str(directory)),
            **{f"inference_ms_per_1000/{v}": round(ms, 2) for v, ms in manifest["inference_ms_per_1000"].items()},
            "rows": dg.MetadataValue.json(manifest["rows"]),
            **_summary(manifest),
        },
        data_version=dg.DataVersion(name),
        check_results=[_finite_metrics(manifest)],
    )
    s = spark.session()
    columns = CONTRACT[STUDENT_METRICS].columns
    df = s.createDataFrame(metric_rows(manifest), ", ".join(f"{c} {t}" for c, t in columns.items()))
    rows = replace_partition(df, paths.table(STUDENT_METRICS), {"model_version": version, "student_version": name})
    yield dg.MaterializeResult(
        asset_key=key(STUDENT_METRICS),
        metadata={"student_version": name, **table_metadata(lake, STUDENT_METRICS, rows)},
    )


def build_student_checks() -> list[dg.AssetChecksDefinition]:
    return [contract_check(STUDENT_METRICS, MODEL_VERSIONS)]
