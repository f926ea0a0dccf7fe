"""Promotion of a trained teacher: `models/LATEST` moves only to a version whose holdout check passes.

LATEST is what every downstream default reads (the export's and the students' model version, the
`teacher_model_sensor`'s trigger, `gem export` / `gem neighbors`), so a model that failed its
check (untrained, diverged, worse than chance) must never become it. The teacher asset promotes
after its blocking check passes; `gem promote VERSION` runs the same check to roll LATEST back or
forward by hand.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from gem_model.paths import GemPaths
from gem_model.train.manifest import read_manifest

# Below this many holdout clicks an AUC is too noisy to hold against chance: its standard error is
# ~0.02-0.03 at a few hundred clicks, and the real samples' holdouts have 9-190 clicks (a model
# that memorises near-unique ids sits at chance there). The tiny synthetic holdout has ~450.
MIN_POSITIVES_FOR_AUC_FLOOR = 300


class PromotionRefusedError(ValueError):
    pass


@dataclass(frozen=True)
class HoldoutCheck:
    passed: bool
    description: str
    metadata: dict[str, float] = field(default_factory=dict)


def holdout_check(manifest: dict[str, Any]) -> HoldoutCheck:
    """Holdout metrics finite, and the click AUC better than chance where the holdout can tell."""
    metrics = manifest["metrics"]

    def has_both_classes(task: str) -> bool:
        return 0 < metrics.get(f"{task}/positives", 0) < metrics.get(f"{task}/rows", 0)

    # A task's AUC/NE exist only where its holdout labels have both classes (e.g. Criteo has no conversions).
    required = [f"{t}/{m}" for t in ("ctr", "cvr") if has_both_classes(t) for m in ("auc", "ne")]
    problems = [f"{m} missing or non-finite" for m in required if not math.isfinite(metrics.get(m, math.nan))]
    if not has_both_classes("ctr"):
        problems.append("ctr: the holdout needs clicks and non-clicks")
    if metrics.get("ctr/positives", 0) >= MIN_POSITIVES_FOR_AUC_FLOOR and not metrics.get("ctr/auc", 0) > 0.5:
        problems.append(f"ctr/auc {metrics.get('ctr/auc')} is not better than chance (0.5) on "
                        f"{metrics['ctr/positives']:.0f} holdout clicks")
    found = {m: metrics[m] for m in required if m in metrics}
    return HoldoutCheck(not problems, "; ".join(problems) or json.dumps(found), found)


def promote(paths: GemPaths, version: str) -> HoldoutCheck:
    """Point `models/LATEST` at `version` if its holdout check passes; raise `PromotionRefusedError` if not."""
    check = holdout_check(read_manifest(paths.model_dir(version)))
    if not check.passed:
        raise PromotionRefusedError(f"model version {version} fails its holdout check ({check.description}); "
                                    "LATEST is unchanged")
    paths.set_latest_model_version(version)
    return check
