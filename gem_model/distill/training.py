"""Train and write one student version of a teacher: the data, the Student Adapter, every variant per surface.

`train` is what `jobs/train_student.py` runs: it reads the teacher's manifest and the gold
tables it needs (`INPUT_TABLES`), trains the students (`gem_model.distill.variants`) and writes
the student version atomically with a manifest of its inputs' Delta versions, config and metrics.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import torch
from deltalake import DeltaTable

from gem_model.config import GemConfig
from gem_model.distill.artefact import student_version, write_student
from gem_model.distill.data import StudentCalendar, load_student_data
from gem_model.distill.variants import train_students
from gem_model.paths import GemPaths
from gem_model.train.manifest import read_manifest
from gem_model.train.trainer import finite

INPUT_TABLES = ("gold.training_examples", "gold.teacher_logits", "gold.user_embeddings", "gold.ad_embeddings")


def train(
    paths: GemPaths, cfg: GemConfig, model_version: str, out: Path | None = None, log: Callable[[str], None] = print
) -> tuple[Path, dict[str, Any]]:
    """Train and write one student version; returns its directory and manifest."""
    started = time.monotonic()
    teacher = read_manifest(paths.model_dir(model_version))
    calendar = StudentCalendar.from_config(cfg)
    out = out or paths.student_dir(student_version(cfg, model_version))
    inputs = {
        name: DeltaTable(str(paths.table(name))).version()
        for name in INPUT_TABLES
        if (paths.table(name) / "_delta_log").is_dir()
    }
    data = load_student_data(paths, cfg, teacher, calendar)
    log(
        f"{len(data):,} impressions on {calendar.to_dict()} with teacher {model_version}; "
        f"missing embeddings {data.missing_embeddings}"
    )
    repr_dim = int(teacher["config"]["model"]["repr_dim"])
    run = train_students(data, calendar, cfg, repr_dim)
    lag = timedelta(days=cfg.student.embedding_lag_days)
    manifest = {
        "student_version": out.name,
        "created_at": datetime.now(UTC).isoformat(),
        "teacher": {
            "model_version": model_version,
            "repr_dim": repr_dim,
            "train_days": teacher["training_data"]["train_days"],
        },
        "calendar": {
            **calendar.to_dict(),
            "embedding_days": {d.isoformat(): (d - lag).isoformat() for d in calendar.days},
        },
        "inputs": {"delta_versions": inputs, "missing_embeddings": data.missing_embeddings},
        "config": cfg.to_dict(),
        "rows": run.rows,
        "adapter_fit": run.adapter_fit,
        "fits": {s: {v: dataclasses.asdict(fit) for v, fit in fits.items()} for s, fits in run.fits.items()},
        "metrics": finite(run.metrics),
        "gains": run.gains,
        "inference_ms_per_1000": run.inference_ms_per_1000,
        "torch_threads": torch.get_num_threads(),
        "train_seconds": time.monotonic() - started,
    }
    write_student(run, out, manifest)
    overall = run.gains["all"]["ctr"]
    log(
        f"wrote {out}: ctr NE labels {run.metrics.get('labels/ctr/ne', float('nan')):.4f}, "
        f"KD gain {overall['kd_ne_gain']:+.4f}, adapter gain {overall['adapter_ne_gain']:+.4f}"
    )
    return out, manifest
