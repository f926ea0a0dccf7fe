"""Student models on one lake: per-surface NE / AUC of labels-only, KD and Student Adapter students.

    GEM_HOME=lakehouse-small python -m bench.research.student_quality --preset small --seeds 0,1,2 \\
        --out student_small.json
    GEM_HOME=lakehouse-tiny python -m bench.research.student_quality --preset tiny

Builds the feature tables when the lake has none (`jobs.build_features`); trains the GEM teacher
with the real training job when it is missing (`bench/research/model_quality.py`'s `gem` variant, or
pass `--model-version`); exports the days after its training window through the Dagster
`export_job` when gold.teacher_logits lacks them; then trains every variant (`student.variants`
here defaults to all five, ablations included) with `jobs/train_student.py`'s `train`, in this
process on one thread, and times student inference (ms per 1,000 rows, one thread, batch of
1,000), once per student seed (`--seeds`; one teacher and one export for all). Prints markdown
tables of the means over the seeds, with the gains' spread (docs/MODEL.md "Student models"), and
writes the runs' manifests and the tables as JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import torch
from deltalake import DeltaTable

from bench.common import REPO, train_variant, variant_version
from gem_model.config import STUDENT_VARIANTS, TASKS, GemConfig
from gem_model.data.loader import open_delta
from gem_model.distill.data import StudentCalendar
from gem_model.distill.training import train
from gem_model.distill.variants import gains
from gem_model.paths import GemPaths

REFERENCES = ("teacher", "teacher_adapted")


def ensure_features(args: argparse.Namespace, paths: GemPaths) -> None:
    if not (paths.table("gold.user_timelines") / "_delta_log").is_dir():
        build = [sys.executable, "-m", "jobs.build_features", "--preset", args.preset]
        subprocess.run(build + (["--config", args.config] if args.config else []), check=True, cwd=REPO)


def ensure_export(args: argparse.Namespace, paths: GemPaths, cfg: GemConfig, version: str) -> None:
    """Export the student days with `version` through Dagster unless gold.teacher_logits has them all."""
    days = StudentCalendar.from_config(cfg).days
    logits = paths.table("gold.teacher_logits")
    present: set = set()
    if (logits / "_delta_log").is_dir():
        present = set(
            open_delta(logits)
            .to_table(columns=["ds"], filter=pc.field("model_version") == version)
            .column("ds")
            .unique()
            .to_pylist()
        )
    missing = [d for d in days if d not in present]
    if not missing:
        return
    from dagster_project.definitions import build_definitions
    from dagster_project.defs.partitions import MODEL_VERSIONS, model_day_key
    from dagster_project.demo import instance_for
    from dagster_project.resources.lake import LakeResource

    lake = LakeResource(home=str(paths.home), preset=args.preset, config_path=args.config)
    defs, instance = build_definitions(lake=lake), instance_for(lake)
    if not instance.has_dynamic_partition(MODEL_VERSIONS.name, version):
        instance.add_dynamic_partitions(MODEL_VERSIONS.name, [version])
    for day in missing:
        result = defs.resolve_job_def("export_job").execute_in_process(
            instance=instance, partition_key=model_day_key(version, day)
        )
        if not result.success:
            raise RuntimeError(f"export_job failed for {day} with model_version {version}")


def _cell(metrics: dict[str, float], key: str) -> str:
    value = metrics.get(key, math.nan)
    return "–" if math.isnan(value) else f"{value:.4f}"


def mean_metrics(manifests: list[dict[str, Any]]) -> dict[str, float]:
    """Each metric's mean over the runs (one per student seed)."""
    return {
        key: statistics.fmean(m["metrics"].get(key, math.nan) for m in manifests) for key in manifests[0]["metrics"]
    }


def _gain(values: list[float]) -> str:
    """A gain's mean, and its standard deviation over the seeds when there are several."""
    spread = f" ± {statistics.stdev(values):.4f}" if len(values) > 1 else ""
    return f"{statistics.fmean(values):+.4f}{spread}"


def _ratio(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.1f}"


def tables(manifests: list[dict[str, Any]]) -> str:
    """Markdown: every metric's mean over the runs, then the gains over labels-only with their spread."""
    first = manifests[0]
    variants, metrics = first["config"]["student"]["variants"], mean_metrics(manifests)
    surfaces = [s for s, n in first["rows"].items() if n["train"] and n["eval"]]
    seeds = ", ".join(str(m["config"]["student"]["seed"]) for m in manifests)
    columns = [*REFERENCES, *variants, "oracle"]
    lines = []
    for metric in ("ne", "auc"):
        header = ["surface", "task", *columns]
        lines += [
            f"{metric.upper()} on {', '.join(first['calendar']['eval'])}, means over student seeds {seeds}",
            "",
            "| " + " | ".join(header) + " |",
            "|" + "---|" * len(header),
        ]
        for scope in ("all", *surfaces):
            prefix = "" if scope == "all" else f"{scope}/"
            for task in TASKS:
                cells = [_cell(metrics, f"{c}/{prefix}{task}/{metric}") for c in columns]
                lines.append("| " + " | ".join([scope, task, *cells]) + " |")
        lines.append("")
    # The ratio of the mean gains, each seed's ratio, and the adapter's targets without the embeddings
    # against KD's: how much of the adapter student's gain is the targets rather than the embeddings.
    header = [
        "surface",
        "task",
        "KD NE gain",
        "adapter NE gain",
        "adapter / KD",
        "per seed",
        "adapter targets without embeddings / KD",
        "KD AUC gain",
        "adapter AUC gain",
    ]
    lines += [
        "Gains over labels-only (NE: lower is better, gain = NE(labels) - NE(variant))",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    of_means = gains(metrics, surfaces)  # the gains are differences, so those of the means are the means of each
    for scope in ("all", *surfaces):
        prefix = "" if scope == "all" else f"{scope}/"
        for task in TASKS:
            per_seed, mean = [m["gains"][scope][task] for m in manifests], of_means[scope][task]
            targets_only = metrics[f"labels/{prefix}{task}/ne"] - metrics.get(
                f"adapter_no_embeddings/{prefix}{task}/ne", math.nan
            )
            cells = [
                _gain([g["kd_ne_gain"] for g in per_seed]),
                _gain([g["adapter_ne_gain"] for g in per_seed]),
                _ratio(mean["ne_gain_ratio"]),
                ", ".join(_ratio(g["ne_gain_ratio"]) for g in per_seed),
                _ratio(targets_only / mean["kd_ne_gain"] if mean["kd_ne_gain"] > 0 else math.nan),
                f"{mean['kd_auc_gain']:+.4f}",
                f"{mean['adapter_auc_gain']:+.4f}",
            ]
            lines.append("| " + " | ".join([scope, task, *cells]) + " |")
    inference = {
        v: statistics.fmean(m["inference_ms_per_1000"][v] for m in manifests) for v in first["inference_ms_per_1000"]
    }
    lines += [
        "",
        f"rows (train / eval) per surface: {first['rows']}",
        *(f"adapter fit, seed {m['config']['student']['seed']}: {json.dumps(m['adapter_fit'])}" for m in manifests),
        "student training, s (1 thread): " + ", ".join(f"{m['train_seconds']:.0f}" for m in manifests),
        "inference, ms per 1,000 rows (1 thread, mean over the runs): "
        + ", ".join(f"{v} {ms:.3f}" for v, ms in inference.items()),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--config", help="JSON file of overrides (teacher and students)")
    parser.add_argument("--model-version", help="an existing teacher version; default: train bench's `gem`")
    parser.add_argument("--variants", default=",".join(STUDENT_VARIANTS))
    parser.add_argument("--seeds", help="student seeds, e.g. 0,1,2: one run each, one teacher; default: student.seed")
    parser.add_argument("--out", type=Path, help="write the manifest and tables as JSON here")
    args = parser.parse_args(argv)
    cfg = GemConfig.load(args.preset, args.config)
    paths = GemPaths.from_env()
    ensure_features(args, paths)
    version = args.model_version
    if version is None:
        train_variant(cfg, paths, "gem", DeltaTable(str(paths.table("gold.user_timelines"))).version())
        version = variant_version(cfg, "gem")
    ensure_export(args, paths, cfg, version)
    torch.set_num_threads(1)  # as jobs/train_student.py: the students' ops are too small for threads
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [cfg.student.seed]
    manifests = []
    for seed in seeds:  # each its own student version: the variants and the seed are part of the name
        students = GemConfig.from_dict({"student": {"variants": args.variants.split(","), "seed": seed}}, base=cfg)
        manifests.append(train(paths, students, version)[1])
    report = tables(manifests)
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"manifests": manifests, "tables": report}, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
