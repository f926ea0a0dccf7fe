"""Promotion of a trained teacher: `models/LATEST` moves only to a version the promotion rule accepts.

LATEST is what every downstream default reads (the export's and the students' model version, the
`teacher_model_sensor`'s trigger, `gem export` / `gem neighbors`), so a model that is untrained,
diverged, no better than chance, or worse than the model it would replace must never become it. One
function decides, records and moves LATEST, `promote`: the teacher asset calls it on the version it
just trained (its blocking `holdout_metrics` check is the verdict), `gem promote VERSION` by hand.

The rule (`judge`, settings in `GemConfig.promotion`), per task: clicks, and conversions where the
holdout has both classes (Criteo has no conversions). Each judgement needs the task's smaller holdout
class to be large enough to tell; below that it is recorded as not judged, with the reason.
1. The model's own check: the click holdout has both classes; every task's AUC and NE are finite.
2. The floor: AUC >= `min_auc` (0.55) where the smaller class has >= `floor_min_class_rows` (300).
3. The incumbent: AUC no more than `max_auc_regression` (0.01) below the promoted model's, where both
   were measured on the same holdout (the same holdout days, click rows and clicks: a re-landed day
   makes another holdout) and the smaller class has >= `compare_min_class_rows` (2,000). Where the
   holdouts differ, or nothing is promoted, the floor alone decides, and the record says so.
The reasoning behind each default is beside it in `PromotionConfig`. AUC is what is judged: it is the
ranking the candidates are cut from; NE and its delta are recorded beside it.

Rolling back is `gem promote OLDER_VERSION`, under the same rule, so it is refused where the older
model is worse than the promoted one on the same holdout: a rollback usually answers a problem the
holdout does not show (serving, a feature), and it should say which. `--force --reason TEXT`
(`force_reason`) waives the incumbent comparison alone, and the waiver and reason are recorded; the
model's own check and the floor are never waived, so a broken model is never served.

Every decision, promoted or refused, is appended to `models/<version>/promotion.json`, beside the
manifest (which stays as training wrote it); the teacher asset also puts it in its metadata.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gem_model.config import TASKS, PromotionConfig
from gem_model.integrity import CorruptArtefactError
from gem_model.paths import GemPaths
from gem_model.train.manifest import read_manifest

RECORD_FILE = "promotion.json"
CLASSES = {"ctr": ("clicks", "non-clicks"), "cvr": ("conversions", "clicks without a conversion")}


@dataclass(frozen=True)
class PromotionDecision:
    """What `judge` found: the verdict, every reason to refuse, and the comparison with the promoted model."""

    model_version: str
    promoted: bool
    problems: tuple[str, ...]  # the model's own check and the floor: each refuses it, never waived
    regressions: tuple[str, ...]  # worse than the incumbent beyond the tolerance: refuse it unless forced
    notes: tuple[str, ...]  # what was not judged, and why
    metrics: dict[str, float]  # the candidate's holdout `<task>/auc` and `<task>/ne`
    incumbent: str | None  # the promoted version it was compared with; None: none comparable
    incumbent_metrics: dict[str, float]  # the incumbent's, on the same holdout
    deltas: dict[str, float]  # candidate minus incumbent, per metric
    rule: dict[str, float]  # the PromotionConfig it was judged by
    force_reason: str = ""  # non-empty: the regressions are waived, for this reason

    @property
    def description(self) -> str:
        if not self.promoted:
            return "; ".join(self.problems + self.regressions)
        found = ", ".join(f"{k} {v:.4f}" for k, v in self.metrics.items())
        against = ""
        if self.incumbent is not None:
            against = f"; vs {self.incumbent}: " + ", ".join(f"{k} {v:+.4f}" for k, v in self.deltas.items())
        waived = f"; waived ({self.force_reason}): " + "; ".join(self.regressions) if self.regressions else ""
        notes = "; " + "; ".join(self.notes) if self.notes else ""
        return f"passes: {found}{against}{waived}{notes}"

    def check_metadata(self) -> dict[str, float | str | bool]:
        """Flat metadata for the Dagster check: the metrics, the incumbent's, the deltas and the thresholds."""
        return {
            "promoted": self.promoted,
            "incumbent": self.incumbent or "none",
            **self.metrics,
            **{f"incumbent {k}": v for k, v in self.incumbent_metrics.items()},
            **{f"delta {k}": v for k, v in self.deltas.items()},
            **self.rule,
        }


class PromotionRefusedError(ValueError):
    """The rule refused a version (its `decision` says why, and is recorded); LATEST did not move."""

    def __init__(self, decision: PromotionDecision) -> None:
        super().__init__(
            f"model version {decision.model_version} is not promoted: {decision.description}; LATEST is unchanged"
        )
        self.decision = decision


@dataclass
class _Findings:
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    regressions: list[str] = field(default_factory=list)
    incumbent_metrics: dict[str, float] = field(default_factory=dict)
    deltas: dict[str, float] = field(default_factory=dict)


def judge(
    manifest: dict[str, Any], rule: PromotionConfig, incumbent: dict[str, Any] | None = None, force_reason: str = ""
) -> PromotionDecision:
    """The promotion rule (module docstring) on a candidate's manifest and the promoted model's (None: none).

    `force_reason` waives the incumbent comparison alone, and is recorded with the decision.
    """
    metrics, found = manifest["metrics"], _Findings()
    judged = [t for t in TASKS if _has_both_classes(metrics, t)]
    if "ctr" not in judged:
        found.problems.append("ctr: the holdout needs clicks and non-clicks")
    for task in judged:
        bad = [m for m in (f"{task}/auc", f"{task}/ne") if not math.isfinite(metrics.get(m, math.nan))]
        found.problems += [f"{m} missing or non-finite" for m in bad]
        if not bad:
            _floor(task, metrics, rule, found)
    own = {m: metrics[m] for t in judged for m in (f"{t}/auc", f"{t}/ne") if math.isfinite(metrics.get(m, math.nan))}
    comparable = _comparable(manifest, incumbent, found)
    if comparable is not None:
        for task in judged:
            _compare(task, metrics, comparable, rule, found)
    promoted = not found.problems and (not found.regressions or bool(force_reason))
    return PromotionDecision(
        manifest["model_version"],
        promoted,
        tuple(found.problems),
        tuple(found.regressions),
        tuple(found.notes),
        own,
        comparable["model_version"] if comparable else None,
        found.incumbent_metrics,
        found.deltas,
        dataclasses.asdict(rule),
        force_reason,
    )


def _has_both_classes(metrics: dict[str, float], task: str) -> bool:
    return 0 < metrics.get(f"{task}/positives", 0) < metrics.get(f"{task}/rows", 0)


def _smaller_class(metrics: dict[str, float], task: str) -> tuple[int, str]:
    """The row count and name of the task's smaller holdout class, which bounds how well its AUC is known."""
    positives, rows = metrics[f"{task}/positives"], metrics[f"{task}/rows"]
    positive, negative = CLASSES[task]
    return (int(positives), positive) if positives <= rows - positives else (int(rows - positives), negative)


def _floor(task: str, metrics: dict[str, float], rule: PromotionConfig, found: _Findings) -> None:
    n, name = _smaller_class(metrics, task)
    auc = metrics[f"{task}/auc"]
    if n < rule.floor_min_class_rows:
        found.notes.append(f"{task}: floor not judged on {n} holdout {name} (needs {rule.floor_min_class_rows})")
    elif auc < rule.min_auc:
        found.problems.append(f"{task}/auc {auc:.4f} is below the floor {rule.min_auc} on {n} holdout {name}")


def _comparable(manifest: dict[str, Any], incumbent: dict[str, Any] | None, found: _Findings) -> dict[str, Any] | None:
    """The incumbent's manifest where it is another model measured on the same holdout, else None (noted)."""
    if incumbent is None:
        found.notes.append("no promoted model to compare with")
        return None
    if incumbent["model_version"] == manifest["model_version"]:
        found.notes.append("it is the promoted version already")
        return None
    ours, theirs = _holdout(manifest), _holdout(incumbent)
    if ours != theirs:
        found.notes.append(
            f"not compared with the promoted {incumbent['model_version']}: another holdout "
            f"(days, click rows, clicks: {theirs} there, {ours} here)"
        )
        return None
    return incumbent


def _holdout(manifest: dict[str, Any]) -> tuple[list[str] | None, float | None, float | None]:
    metrics = manifest["metrics"]
    return (
        manifest.get("training_data", {}).get("holdout_days"),
        metrics.get("ctr/rows"),
        metrics.get("ctr/positives"),
    )


def _compare(
    task: str, metrics: dict[str, float], incumbent: dict[str, Any], rule: PromotionConfig, found: _Findings
) -> None:
    """The task's metrics beside the incumbent's; a regression beyond the tolerance is a (waivable) problem."""
    old = incumbent["metrics"]
    for m in (f"{task}/auc", f"{task}/ne"):
        if math.isfinite(old.get(m, math.nan)) and math.isfinite(metrics.get(m, math.nan)):
            found.incumbent_metrics[m], found.deltas[m] = old[m], metrics[m] - old[m]
    key, (n, name), deltas = f"{task}/auc", _smaller_class(metrics, task), found.deltas
    if key not in deltas:
        found.notes.append(f"{task}: no finite {key} on both sides to compare with {incumbent['model_version']}")
    elif n < rule.compare_min_class_rows:
        found.notes.append(f"{task}: comparison not judged on {n} holdout {name} (needs {rule.compare_min_class_rows})")
    elif deltas[key] < -rule.max_auc_regression:
        found.regressions.append(
            f"{key} {metrics[key]:.4f} is {-deltas[key]:.4f} below the promoted "
            f"{incumbent['model_version']}'s {old[key]:.4f} on the same holdout "
            f"(tolerance {rule.max_auc_regression})"
        )


def promote(
    paths: GemPaths, version: str, rule: PromotionConfig, decided_by: str, force_reason: str = ""
) -> PromotionDecision:
    """Judge `version` against the promoted model, record the decision with it, and point `models/LATEST` at
    it if it passes; raise `PromotionRefusedError` (LATEST unchanged) if not. `decided_by` names who asked
    (a Dagster run, `gem promote`); `force_reason` waives the incumbent comparison (module docstring)."""
    paths.require_model_version(version)
    decision = judge(read_manifest(paths.model_dir(version)), rule, _incumbent(paths), force_reason)
    _record(paths, decision, decided_by)
    if not decision.promoted:
        raise PromotionRefusedError(decision)
    paths.set_latest_model_version(version)
    return decision


def _incumbent(paths: GemPaths) -> dict[str, Any] | None:
    """The promoted model's manifest; None where nothing is promoted or LATEST names no readable model
    (a broken pointer must not block the promotion that repairs it)."""
    try:
        return read_manifest(paths.model_dir(paths.latest_model_version()))
    except (FileNotFoundError, CorruptArtefactError):
        return None


def _record(paths: GemPaths, decision: PromotionDecision, decided_by: str) -> None:
    """Append the decision to `models/<version>/promotion.json` (replaced atomically: readers see a whole file)."""
    path = paths.model_dir(decision.model_version) / RECORD_FILE
    history = read_decisions(paths, decision.model_version)
    entry = {"decided_at": datetime.now(UTC).isoformat(), "decided_by": decided_by, **dataclasses.asdict(decision)}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"decisions": [*history, entry]}, indent=2, sort_keys=True))
    tmp.replace(path)


def read_decisions(paths: GemPaths, version: str) -> list[dict[str, Any]]:
    """Every promotion decision recorded for `version`, oldest first."""
    path = paths.model_dir(version) / RECORD_FILE
    return json.loads(path.read_text())["decisions"] if path.is_file() else []
