"""A student version on disk, `$GEM_HOME/students/<student_version>/`, and its rows in gold.student_metrics.

The directory holds `manifest.json` (teacher version, calendar, input Delta versions, the full
resolved config, rows, adapter fits, metrics, gains, inference speed), `adapters/<task>.pt` and
`students/<surface>/<variant>.pt` (state dicts), whose sizes and sha256 the manifest records
(`files`) and the loaders verify. It is written to `<dir>.partial` and renamed,
so a version appears complete or not at all, and a re-run replaces it. The version name is a
function of the teacher version, the student and feature config and the calendar, so the same
inputs always land in the same directory instead of a duplicate.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from datetime import date, datetime
from pathlib import Path
from typing import Any

import torch

from gem_model.config import TASKS, GemConfig
from gem_model.distill.adapter import StudentAdapter
from gem_model.distill.data import StudentCalendar
from gem_model.distill.student import StudentModel
from gem_model.distill.variants import VARIANTS, StudentRun, build_student, make_adapter
from gem_model.integrity import file_digests, read_manifest_file, verify_files

# Columns of a gold.student_metrics row beside its keys, in the manifest's metric names.
METRIC_COLUMNS = ("auc", "ne", "calibration", "log_loss", "rows", "positives")


def student_version(cfg: GemConfig, teacher_version: str) -> str:
    settings = cfg.to_dict()
    payload = {
        "teacher": teacher_version,
        "student": settings["student"],
        "features": settings["features"],
        "calendar": StudentCalendar.from_config(cfg).to_dict(),
    }
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:10]
    return f"student-{teacher_version}-{digest}"


def write_student(run: StudentRun, directory: Path, manifest: dict[str, Any]) -> Path:
    """Stage the models and manifest beside `directory`, then replace it in one rename."""
    staging = directory.with_name(directory.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    for task, adapter in run.adapters.items():
        (staging / "adapters").mkdir(parents=True, exist_ok=True)
        torch.save(adapter.state_dict(), staging / "adapters" / f"{task}.pt")
    for surface, models in run.models.items():
        (staging / "students" / surface).mkdir(parents=True, exist_ok=True)
        for variant, model in models.items():
            torch.save(model.state_dict(), staging / "students" / surface / f"{variant}.pt")
    manifest = {**manifest, "files": file_digests(staging)}
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    shutil.rmtree(directory, ignore_errors=True)
    staging.rename(directory)
    return directory


_RETRAIN = "re-train it: materialise student_models (or run jobs/train_student.py)"


def read_student_manifest(directory: Path) -> dict[str, Any]:
    path = directory / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(f"no student version at {directory} (no manifest.json); {_RETRAIN}")
    return read_manifest_file(path, _RETRAIN)


def _verified(directory: Path, manifest: dict[str, Any], name: str) -> Path:
    verify_files(directory, {name: manifest["files"][name]}, _RETRAIN)
    return directory / name


def load_student(directory: Path, surface: str, variant: str) -> StudentModel:
    manifest = read_student_manifest(directory)
    path = directory / "students" / surface / f"{variant}.pt"
    if not path.is_file():
        trained = sorted(str(p.relative_to(directory / "students")) for p in directory.glob("students/*/*.pt"))
        raise FileNotFoundError(
            f"student {directory.name} has no {variant!r} model for surface {surface!r}; trained: {trained}"
        )
    model = build_student(GemConfig.from_dict(manifest["config"]), VARIANTS[variant], manifest["teacher"]["repr_dim"])
    model.load_state_dict(
        torch.load(_verified(directory, manifest, f"students/{surface}/{variant}.pt"), weights_only=True)
    )
    return model.eval()


def load_adapter(directory: Path, task: str) -> StudentAdapter:
    if task not in TASKS:
        raise ValueError(f"task={task!r} is not one of {TASKS}")
    manifest = read_student_manifest(directory)
    adapter = make_adapter(GemConfig.from_dict(manifest["config"]))
    adapter.load_state_dict(torch.load(_verified(directory, manifest, f"adapters/{task}.pt"), weights_only=True))
    return adapter


def metric_rows(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    """gold.student_metrics rows of a manifest: one per (variant, surface or 'all', task)."""
    grouped: dict[tuple[str, str, str], dict[str, float]] = {}
    for key, value in manifest["metrics"].items():
        variant, *scope, task, metric = key.split("/")
        if metric in METRIC_COLUMNS:
            grouped.setdefault((variant, scope[0] if scope else "all", task), {})[metric] = value
    evaluation = manifest["calendar"]["eval"]
    stamp = {
        "student_version": manifest["student_version"],
        "model_version": manifest["teacher"]["model_version"],
        "eval_start": date.fromisoformat(evaluation[0]),
        "eval_end": date.fromisoformat(evaluation[-1]),
        "created_at": datetime.fromisoformat(manifest["created_at"]),
    }
    rows = []
    for (variant, surface, task), values in sorted(grouped.items()):
        row: dict[str, Any] = {**stamp, "variant": variant, "surface": surface, "task": task}
        for metric in METRIC_COLUMNS:
            value = values.get(metric)
            row[metric] = None if value is None else int(value) if metric in ("rows", "positives") else float(value)
        rows.append(row)
    return rows
