"""The teacher model asset: launches distributed training (torchrun) through Dagster Pipes.

The model version is derived from the config fingerprint and the pinned Delta version of
`gold.training_examples`, so re-materialising on unchanged data and config rewrites the same
version instead of creating a duplicate. One run trains a version at a time (its resumable
working directory is per version: `jobs.locks.partition_lock`). The blocking `holdout_metrics`
check is evaluated on the version just trained, and only a version that passes it is promoted
to `models/LATEST` (`gem_model.train.promotion`), which the `teacher_model_sensor` follows.
Every trained version becomes a partition of the model_versions dimension, so its exports and
students can be materialised from the UI, and the metadata compares its holdout metrics with the
version it would replace (the previous LATEST) and with the oracle where the data has one.
"""

import shutil

import dagster as dg

from dagster_project.defs.lake_tables import key
from dagster_project.defs.partitions import MODEL_VERSIONS
from dagster_project.resources.lake import LakeResource
from dagster_project.resources.launchers import JobLauncher
from gem_model.train.manifest import read_manifest
from gem_model.train.promotion import holdout_check
from jobs.locks import partition_lock

GROUP = "training"
TEACHER_MODEL = dg.AssetKey("teacher_model")
HOLDOUT_CHECK = dg.AssetCheckSpec("holdout_metrics", asset=TEACHER_MODEL, blocking=True,
                                  description="Holdout metrics finite and the click AUC better than chance; "
                                              "the version is promoted to LATEST only if this passes")


@dg.asset(key=TEACHER_MODEL, group_name=GROUP, deps=[key("gold.training_examples")], kinds={"pytorch"},
          check_specs=[HOLDOUT_CHECK])
def teacher_model(context: dg.AssetExecutionContext, lake: LakeResource, launcher: JobLauncher) -> dg.MaterializeResult:
    """GEM teacher trained with TorchRec over torchrun workers; checkpoint + manifest per version."""
    from jobs.lake import table_version

    cfg, paths = lake.config, lake.paths
    data = paths.table("gold.training_examples")
    data_version = table_version(data)
    model_version = f"gem-{cfg.preset}-{cfg.fingerprint}-d{data_version}"
    model_dir = paths.model_dir(model_version)
    staging = paths.run_staging("train", context.run_id)
    try:
        previous = lake.latest_model_version()
    except FileNotFoundError:
        previous = None
    with partition_lock(paths, "train", model_version, holder=f"dagster run {context.run_id}"):
        staging.mkdir(parents=True, exist_ok=True)
        try:
            config_file = staging / "config.json"
            config_file.write_text(cfg.to_json())
            launched = launcher.launch(context, "jobs/train.py",
                                       ["--config", str(config_file), "--data", str(data), "--data-version",
                                        str(data_version), "--model-dir", str(model_dir)], nproc=cfg.train.nproc)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        manifest = read_manifest(model_dir)
        if not context.instance.has_dynamic_partition(MODEL_VERSIONS.name, model_version):
            context.instance.add_dynamic_partitions(MODEL_VERSIONS.name, [model_version])
        check = holdout_check(manifest)
        if check.passed:
            lake.set_latest_model_version(model_version)
        else:
            context.log.error(f"{model_version} failed its holdout check ({check.description}); LATEST stays "
                              "where it was")
    metrics = manifest["metrics"]
    headline = {k: round(metrics[k], 4) for k in sorted(metrics)
                if k.count("/") == 1 and not k.endswith(("rows", "positives"))}
    return dg.MaterializeResult(
        metadata={"model_version": model_version, "architecture": cfg.model.architecture,
                  "training_data_version": data_version, "promoted": check.passed,
                  "train_examples_per_second": round(manifest["train_examples_per_second"]),
                  "path": dg.MetadataValue.path(str(model_dir)), **headline,
                  "sharding_plan": dg.MetadataValue.json(manifest["sharding_plan"]),
                  "baselines": dg.MetadataValue.md(_baselines(lake, manifest, previous)),
                  **launched.metadata},  # where it ran: the Slurm job id and log, the Kubernetes job
        data_version=dg.DataVersion(model_version),
        check_results=[dg.AssetCheckResult(check_name=HOLDOUT_CHECK.name, passed=check.passed,
                                           description=check.description,
                                           metadata={"model_version": model_version, **check.metadata})],
    )


def _baselines(lake: LakeResource, manifest: dict, previous: str | None) -> str:
    """The holdout AUC and NE per task beside the previous LATEST's (same holdout days only) and the oracle's."""
    metrics, before = manifest["metrics"], {}
    if previous and previous != manifest["model_version"]:
        other = read_manifest(lake.paths.model_dir(previous))
        if other["training_data"]["holdout_days"] == manifest["training_data"]["holdout_days"]:
            before = other["metrics"]
    columns = ["this model", *([f"previous LATEST ({previous})"] if before else []), "oracle (true probabilities)"]
    lines = ["| metric | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for task in lake.config.model.tasks:
        for name in ("auc", "ne"):
            cells = [metrics.get(f"{task}/{name}"), *([before.get(f"{task}/{name}")] if before else []),
                     metrics.get(f"{task}/oracle_{name}")]
            lines.append(f"| {task} {name.upper()} | " + " | ".join("–" if c is None else f"{c:.4f}" for c in cells)
                         + " |")
    return "\n".join(lines)
