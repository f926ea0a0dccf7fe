"""The teacher model asset: launches distributed training (torchrun) through Dagster Pipes.

The model version is derived from the config fingerprint and the pinned Delta version of
`gold.user_timelines` (the teacher trains on users' timelines), so re-materialising on unchanged data
and config rewrites the same version instead of creating a duplicate. One run trains a version at a time (its resumable
working directory is per version: `gem_lake.locks.partition_lock`). The blocking `holdout_metrics`
check is the promotion rule's verdict on the version just trained (`gem_model.train.promotion.promote`:
its own metrics, the AUC floor, no regression beyond the tolerance against the promoted model on the
same holdout), and only a version that passes it is promoted to `models/LATEST`, which the
`teacher_model_sensor` follows. Every trained version becomes a partition of the model_versions
dimension, so its exports and students can be materialised from the UI, and the metadata records the
promotion decision and compares its holdout metrics with the version it would replace (the previous
LATEST, same holdout only) and with the oracle where the data has one.
"""

import dataclasses
import shutil

import dagster as dg

from dagster_project.defs.lake_tables import key
from dagster_project.defs.partitions import MODEL_VERSIONS
from dagster_project.resources.lake import LakeResource
from dagster_project.resources.launchers import JobLauncher
from gem_lake.locks import partition_lock
from gem_model.config import TASKS
from gem_model.train.manifest import read_manifest
from gem_model.train.promotion import PromotionDecision, PromotionRefusedError, promote

GROUP = "training"
TEACHER_MODEL = dg.AssetKey("teacher_model")
HOLDOUT_CHECK = dg.AssetCheckSpec(
    "holdout_metrics",
    asset=TEACHER_MODEL,
    blocking=True,
    description="The promotion rule: holdout metrics finite, AUC above the floor and "
    "not worse than the promoted model's on the same holdout beyond "
    "the tolerance; the version is promoted to LATEST only if this "
    "passes",
)


@dg.asset(
    key=TEACHER_MODEL,
    group_name=GROUP,
    deps=[key("gold.user_timelines")],
    kinds={"pytorch"},
    check_specs=[HOLDOUT_CHECK],
)
def teacher_model(context: dg.AssetExecutionContext, lake: LakeResource, launcher: JobLauncher) -> dg.MaterializeResult:
    """GEM teacher trained with TorchRec over torchrun workers; checkpoint + manifest per version."""
    from gem_lake.delta import table_version

    cfg, paths = lake.config, lake.paths
    data = paths.table("gold.user_timelines")
    data_version = table_version(data)
    model_version = f"gem-{cfg.preset}-{cfg.fingerprint}-d{data_version}"
    model_dir = paths.model_dir(model_version)
    staging = paths.run_staging("train", context.run_id)
    with partition_lock(paths, "train", model_version, holder=f"dagster run {context.run_id}"):
        staging.mkdir(parents=True, exist_ok=True)
        try:
            config_file = staging / "config.json"
            config_file.write_text(cfg.to_json())
            launched = launcher.launch(
                context,
                "jobs.train",
                [
                    "--config",
                    str(config_file),
                    "--data",
                    str(data),
                    "--data-version",
                    str(data_version),
                    "--model-dir",
                    str(model_dir),
                ],
                nproc=cfg.train.nproc,
            )
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        manifest = read_manifest(model_dir)
        if not context.instance.has_dynamic_partition(MODEL_VERSIONS.name, model_version):
            context.instance.add_dynamic_partitions(MODEL_VERSIONS.name, [model_version])
        try:
            decision = promote(paths, model_version, cfg.promotion, decided_by=f"dagster run {context.run_id}")
        except PromotionRefusedError as refused:
            decision = refused.decision
            context.log.error(str(refused))
    metrics = manifest["metrics"]
    headline = {
        k: round(metrics[k], 4) for k in sorted(metrics) if k.count("/") == 1 and not k.endswith(("rows", "positives"))
    }
    return dg.MaterializeResult(
        metadata={
            "model_version": model_version,
            "architecture": cfg.model.architecture,
            "training_data_version": data_version,
            "promoted": decision.promoted,
            "promotion": dg.MetadataValue.json(dataclasses.asdict(decision)),
            "train_examples_per_second": round(manifest["train_examples_per_second"]),
            "path": dg.MetadataValue.path(str(model_dir)),
            **headline,
            "sharding_plan": dg.MetadataValue.json(manifest["sharding_plan"]),
            "baselines": dg.MetadataValue.md(_baselines(lake, manifest, decision)),
            **launched.metadata,
        },  # where it ran: the Slurm job id and log, the Kubernetes job
        data_version=dg.DataVersion(model_version),
        check_results=[
            dg.AssetCheckResult(
                check_name=HOLDOUT_CHECK.name,
                passed=decision.promoted,
                description=decision.description,
                metadata={"model_version": model_version, **decision.check_metadata()},
            )
        ],
    )


def _baselines(lake: LakeResource, manifest: dict, decision: PromotionDecision) -> str:
    """The holdout AUC and NE per task beside the previous LATEST's (the promotion's incumbent: same holdout
    only) and the oracle's."""
    metrics, before = manifest["metrics"], decision.incumbent_metrics
    columns = [
        "this model",
        *([f"previous LATEST ({decision.incumbent})"] if before else []),
        "oracle (true probabilities)",
    ]
    lines = ["| metric | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for task in TASKS:
        for name in ("auc", "ne"):
            cells = [
                metrics.get(f"{task}/{name}"),
                *([before.get(f"{task}/{name}")] if before else []),
                metrics.get(f"{task}/oracle_{name}"),
            ]
            lines.append(
                f"| {task} {name.upper()} | " + " | ".join("–" if c is None else f"{c:.4f}" for c in cells) + " |"
            )
    return "\n".join(lines)
