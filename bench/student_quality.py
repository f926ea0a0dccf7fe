"""Student models on one lake: per-surface NE / AUC of labels-only, KD and Student Adapter students.

    GEM_HOME=/tmp/gem-small python bench/student_quality.py --preset small --out /tmp/student_small.json
    GEM_HOME=/tmp/gem-tiny python bench/student_quality.py --preset tiny

Builds the feature tables when the lake has none (`jobs.build_features`); trains the GEM teacher
with the real training job when it is missing (`bench/model_quality.py`'s `gem` variant, or
pass `--model-version`); exports the days after its training window through the Dagster
`export_job` when gold.teacher_logits lacks them; then trains every variant (`student.variants`
here defaults to all five, ablations included) with `jobs/train_student.py`'s `train`, in this
process on one thread, and times student inference (ms per 1,000 rows, one thread, batch of
1,000). Prints markdown tables (docs/MODEL.md "Student models") and writes JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import torch
from deltalake import DeltaTable
from model_quality import train_variant, variant_version  # bench/ is on sys.path when run as a script

from gem_model.config import STUDENT_VARIANTS, GemConfig
from gem_model.data.loader import open_delta
from gem_model.distill.data import StudentCalendar
from gem_model.paths import GemPaths
from jobs.train_student import train

REPO = Path(__file__).resolve().parents[1]
REFERENCES = ("teacher", "teacher_adapted")
TASKS = ("ctr", "cvr")


def ensure_features(args: argparse.Namespace, paths: GemPaths) -> None:
    if not (paths.table("gold.training_examples") / "_delta_log").is_dir():
        build = [sys.executable, "-m", "jobs.build_features", "--preset", args.preset]
        subprocess.run(build + (["--config", args.config] if args.config else []), check=True, cwd=REPO)


def ensure_export(args: argparse.Namespace, paths: GemPaths, cfg: GemConfig, version: str) -> None:
    """Export the student days with `version` through Dagster unless gold.teacher_logits has them all."""
    days = StudentCalendar.from_config(cfg).days
    logits = paths.table("gold.teacher_logits")
    present: set = set()
    if (logits / "_delta_log").is_dir():
        present = set(open_delta(logits).to_table(columns=["ds"], filter=pc.field("model_version") == version)
                      .column("ds").unique().to_pylist())
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
        result = defs.resolve_job_def("export_job").execute_in_process(instance=instance,
                                                                      partition_key=model_day_key(version, day))
        if not result.success:
            raise RuntimeError(f"export_job failed for {day} with model_version {version}")


def _cell(metrics: dict[str, float], key: str) -> str:
    value = metrics.get(key, math.nan)
    return "–" if math.isnan(value) else f"{value:.4f}"


def tables(manifest: dict[str, Any]) -> str:
    metrics, variants = manifest["metrics"], manifest["config"]["student"]["variants"]
    surfaces = [s for s, n in manifest["rows"].items() if n["train"] and n["eval"]]
    columns = [*REFERENCES, *variants, "oracle"]
    lines = []
    for metric in ("ne", "auc"):
        header = ["surface", "task", *columns]
        lines += [f"{metric.upper()} on {', '.join(manifest['calendar']['eval'])}", "",
                  "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for scope in ("all", *surfaces):
            prefix = "" if scope == "all" else f"{scope}/"
            for task in TASKS:
                cells = [_cell(metrics, f"{c}/{prefix}{task}/{metric}") for c in columns]
                lines.append("| " + " | ".join([scope, task, *cells]) + " |")
        lines.append("")
    header = ["surface", "task", "KD NE gain", "adapter NE gain", "adapter / KD", "KD AUC gain", "adapter AUC gain"]
    lines += ["Gains over labels-only (NE: lower is better, gain = NE(labels) - NE(variant))", "",
              "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for scope, per_task in manifest["gains"].items():
        for task, g in per_task.items():
            ratio = "–" if math.isnan(g["ne_gain_ratio"]) else f"{g['ne_gain_ratio']:.2f}"
            lines.append(f"| {scope} | {task} | {g['kd_ne_gain']:+.4f} | {g['adapter_ne_gain']:+.4f} | {ratio} | "
                         f"{g['kd_auc_gain']:+.4f} | {g['adapter_auc_gain']:+.4f} |")
    rows = {s: n for s, n in manifest["rows"].items()}
    lines += ["", f"rows (train / eval) per surface: {rows}",
              f"adapter fit: {json.dumps(manifest['adapter_fit'])}",
              "inference, ms per 1,000 rows (1 thread): "
              + ", ".join(f"{v} {ms:.3f}" for v, ms in manifest["inference_ms_per_1000"].items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--config", help="JSON file of overrides (teacher and students)")
    parser.add_argument("--model-version", help="an existing teacher version; default: train bench's `gem`")
    parser.add_argument("--variants", default=",".join(STUDENT_VARIANTS))
    parser.add_argument("--out", type=Path, help="write the manifest and tables as JSON here")
    args = parser.parse_args(argv)
    cfg = GemConfig.load(args.preset, args.config)
    paths = GemPaths.from_env()
    ensure_features(args, paths)
    version = args.model_version
    if version is None:
        train_variant(cfg, paths, "gem", DeltaTable(str(paths.table("gold.training_examples"))).version())
        version = variant_version(cfg, "gem")
    ensure_export(args, paths, cfg, version)
    torch.set_num_threads(1)  # as jobs/train_student.py: the students' ops are too small for threads
    students = GemConfig.from_dict({"student": {"variants": args.variants.split(",")}}, base=cfg)
    _, manifest = train(paths, students, version)  # its own version: the variants are part of the name
    report = tables(manifest)
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"manifest": manifest, "tables": report}, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
