"""Trained-model stand-ins: a `models/<version>/manifest.json` with chosen holdout metrics and no checkpoint,
for tests of what reads manifests only (promotion, version arguments), so they need no training run."""

from __future__ import annotations

import json

from gem_model.paths import GemPaths

HOLDOUT_DAYS = ("2026-11-05", "2026-11-06")


def write_model(
    paths: GemPaths,
    version: str,
    ctr_auc: float,
    clicks: int = 450,
    rows: int = 6000,
    conversions: int = 40,
    cvr_auc: float = 0.6,
    holdout_days: tuple[str, ...] = HOLDOUT_DAYS,
) -> None:
    """A finished model `version` whose holdout has `rows` impressions, `clicks` of them clicked (the cvr task's
    rows) and `conversions` of those converted, scored with AUCs `ctr_auc` and `cvr_auc`."""
    model_dir = paths.model_dir(version)
    model_dir.mkdir(parents=True)
    metrics = {
        "ctr/rows": rows,
        "ctr/positives": clicks,
        "ctr/auc": ctr_auc,
        "ctr/ne": 0.95,
        "cvr/rows": clicks,
        "cvr/positives": conversions,
        "cvr/auc": cvr_auc,
        "cvr/ne": 0.97,
    }
    manifest = {"model_version": version, "training_data": {"holdout_days": list(holdout_days)}, "metrics": metrics}
    (model_dir / "manifest.json").write_text(json.dumps(manifest))
