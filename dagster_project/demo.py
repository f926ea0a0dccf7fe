"""Run the whole asset graph once, in order, on the embedded defaults, and summarise it.

Used by `gem demo` (and `make demo`): dimensions, then every day's features, the teacher model,
the export of the holdout days, the students distilled on them, and the SQL reports. Each job is a
run of the code location, launched as the UI launches one (`CodeLocationRuns`), in the Dagster
instance under $GEM_HOME/dagster (or $DAGSTER_HOME), so afterwards the UI (`make ui`) shows every
run on its job's page and timeline and can re-execute it. Tests run the same sequence in process
(`in_process`).
"""

import os
from collections.abc import Callable
from pathlib import Path

import dagster as dg

from dagster_project.code_location_runs import CodeLocationRuns
from dagster_project.defs.partitions import model_day_key
from dagster_project.resources.lake import LakeResource
from dagster_project.run_monitoring import ensure_instance_config, fail_dead_runs, worker_tags
from gem_model.config import TASKS
from gem_model.distill.artefact import read_student_manifest, student_version
from gem_model.distill.data import has_student_days
from gem_model.export.index import read_index
from gem_model.train.manifest import read_manifest


def instance_for(lake: LakeResource) -> dg.DagsterInstance:
    """The Dagster instance under DAGSTER_HOME (its dagster.yaml written if missing), with the runs whose
    process died since the last start marked failed (`dagster_project.run_monitoring`)."""
    home = lake.paths.dagster_home
    ensure_instance_config(home)
    os.environ["DAGSTER_HOME"] = str(home)
    instance = dg.DagsterInstance.get()
    for run_id in fail_dead_runs(instance):
        print(f"marked run {run_id} failed: its process is gone", flush=True)
    return instance


JobRunner = Callable[[str, str | None], object]  # (job, partition) -> run; raises if the run failed


def in_process(defs: dg.Definitions, instance: dg.DagsterInstance) -> JobRunner:
    """Run jobs of `defs` in this process (tests: their own resources, no code server)."""

    def run(job: str, partition: str | None = None) -> dg.ExecuteInProcessResult:
        result = defs.resolve_job_def(job).execute_in_process(
            instance=instance, partition_key=partition, tags=worker_tags()
        )
        if not result.success:
            raise RuntimeError(f"{job} failed for partition {partition}")
        return result

    return run


def run_pipeline(lake: LakeResource, run: JobRunner) -> None:
    """Materialise every asset: dimensions, feature days, the teacher, the holdout export, students, reports."""
    cfg = lake.config

    def step(job: str, partition: str | None = None) -> None:
        run(job, partition)
        print(f"ok  {job}{f' [{partition}]' if partition else ''}", flush=True)

    step("build_dimensions_job")
    for day in cfg.world.days:
        step("build_features_job", day.isoformat())
    step("train_teacher_job")
    version = lake.latest_model_version()
    for day in cfg.world.days:
        if day >= cfg.world.holdout_start:
            step("export_job", model_day_key(version, day))
    if has_student_days(cfg):
        step("train_students_job", version)
    else:
        print(
            f"skip train_students_job: world.holdout_days={cfg.world.holdout_days} leaves no day before the "
            f"student.eval_days={cfg.student.eval_days} evaluation day(s)",
            flush=True,
        )
    step("build_reports_job")


def summary(lake: LakeResource) -> str:
    from gem_lake.delta import existing_tables, table_stats, value_counts

    version = lake.latest_model_version()
    lines = ["", "Tables ($GEM_HOME/lake):"]
    for name, path in existing_tables(lake.paths).items():
        stats = table_stats(path)
        if "model_version" not in stats.schema:
            lines.append(f"  {name:<28} {stats.rows:>10,} rows")
            continue
        # Every model's output stays beside the others' (a re-run of the demo trains a new version on the
        # features' new Delta version): say how much of the table is the promoted model's.
        per_version = value_counts(path, "model_version")
        versions = f", {len(per_version)} model versions" if len(per_version) > 1 else ""
        lines.append(f"  {name:<28} {stats.rows:>10,} rows  ({per_version.get(version, 0):,} of {version}{versions})")
    manifest = read_manifest(lake.paths.model_dir(version))
    m = manifest["metrics"]
    lines += ["", f"Model {version} (holdout {', '.join(manifest['training_data']['holdout_days'])}):"]
    for task in TASKS:
        # Real datasets have no true probabilities, hence no oracle.
        oracle = {
            name: f" (oracle {m[f'{task}/oracle_{name}']:.4f})" if f"{task}/oracle_{name}" in m else ""
            for name in ("auc", "ne")
        }
        lines.append(
            f"  {task}: AUC {m.get(f'{task}/auc', float('nan')):.4f}{oracle['auc']}  "
            f"NE {m.get(f'{task}/ne', float('nan')):.4f}{oracle['ne']}  "
            f"calibration {m.get(f'{task}/calibration', float('nan')):.3f}"
        )
    last_day = lake.config.world.days[-1]
    lines += ["", f"Indexes ($GEM_HOME/indexes, {last_day}):"]
    k = lake.config.index.recall_k
    for name in ("ads", "users"):
        _, im = read_index(lake.paths.index_dir(name, version, last_day))
        lines.append(
            f"  {name:<6} {im['factory']:<14} {im['row_count']:>7,} vectors  "
            f"recall@{k} {im[f'recall_at_{k}']:.3f}  {im['queries_per_second']:,.0f} queries/s"
        )
    lines += student_summary(lake, version)
    lines += [
        "",
        f"Open the Dagster UI:  make ui   (DAGSTER_HOME={lake.paths.dagster_home})",
        "Query the tables:     .venv/bin/gem sql -e 'SELECT surface, avg(ctr_logit) FROM "
        "gold.teacher_logits GROUP BY surface'",
        f"Nearest ads:          .venv/bin/gem neighbors --user-id 1 --k {k}",
    ]
    return "\n".join(lines)


def student_summary(lake: LakeResource, version: str) -> list[str]:
    """Per-surface ctr NE of the students on their evaluation day(s), and the gains over labels-only."""
    if not has_student_days(lake.config):
        return []
    directory = lake.paths.student_dir(student_version(lake.config, version))
    if not (directory / "manifest.json").is_file():
        return []
    manifest = read_student_manifest(directory)
    m, variants = manifest["metrics"], manifest["config"]["student"]["variants"]
    nan = float("nan")
    lines = ["", f"Students {directory.name} (eval {', '.join(manifest['calendar']['eval'])}), ctr NE:"]
    for scope, gains in manifest["gains"].items():
        prefix = "" if scope == "all" else f"{scope}/"
        cells = "  ".join(f"{v} {m.get(f'{v}/{prefix}ctr/ne', nan):.4f}" for v in ("teacher", *variants, "oracle"))
        g = gains["ctr"]
        lines.append(f"  {scope:<10} {cells}  gain KD {g['kd_ne_gain']:+.4f} adapter {g['adapter_ne_gain']:+.4f}")
    return lines


# The runs' console logger at INFO: their progress and results, without Dagster's DEBUG stream of engine events
# (every event still reaches the instance, so the UI shows it).
CONCISE = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}


def main(verbose: bool = False) -> None:
    lake = LakeResource.from_env()
    print(f"GEM demo: preset {lake.preset}, GEM_HOME={Path(lake.home)}", flush=True)
    with CodeLocationRuns(instance_for(lake)) as runs:
        run_pipeline(lake, lambda job, partition=None: runs.run(job, partition, None if verbose else CONCISE))
    print(summary(lake))
