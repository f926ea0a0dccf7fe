"""Train and evaluate the per-surface students: labels only, + KD, + the Student Adapter.

Each variant (`VARIANTS`, chosen by `student.variants`) is one student per surface, trained on
that surface's rows of the student training days and evaluated on its rows of the evaluation
days. A variant says what the distillation term targets and whether the teacher's user/ad
embeddings are inputs:

- `labels`: the ESMM label loss alone;
- `kd`: + `kd_weight` * distillation towards the teacher's logits;
- `adapter`: + distillation towards the Student Adapter's logits (fit on the freshest training
  days), with the GEM embeddings as inputs;
- ablations: `kd_embeddings` (teacher targets, embeddings in), `adapter_no_embeddings`.

Metrics are `gem_model.train.trainer.holdout_metrics` (ctr on impressions, cvr on clicks, overall
and per surface) of every variant and of two references on the same rows: the raw `teacher` and
the `teacher_adapted` (the adapter's output served directly); `oracle/...` are the true
probabilities'. Gains are in NE (lower is better, so gain = NE(labels) - NE(variant)) and AUC.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import torch

from gem_model.config import TASKS, GemConfig
from gem_model.distill.adapter import StudentAdapter, fit_adapter_with_prior_choice
from gem_model.distill.data import LOGIT_COLUMNS, StudentCalendar, StudentData
from gem_model.distill.losses import distillation_loss, label_loss
from gem_model.distill.student import StudentModel, embedding_inputs, inference_ms_per_1000
from gem_model.train.trainer import holdout_metrics


@dataclass(frozen=True)
class Variant:
    target: Literal["none", "teacher", "adapter"]  # what the distillation term pulls towards
    embeddings: bool  # the teacher's user/ad embeddings as dense inputs


VARIANTS: dict[str, Variant] = {
    "labels": Variant("none", False),
    "kd": Variant("teacher", False),
    "adapter": Variant("adapter", True),
    "kd_embeddings": Variant("teacher", True),
    "adapter_no_embeddings": Variant("adapter", False),
}


@dataclass
class Inputs:
    """One slice of rows as arrays: ids [N, F], dense [N, 2R + 1], labels [N], targets [N, 2]."""

    ids: np.ndarray
    dense: np.ndarray
    clicked: np.ndarray
    converted: np.ndarray
    teacher: np.ndarray
    adapted: np.ndarray

    def dense_for(self, variant: Variant) -> np.ndarray:
        return self.dense if variant.embeddings else self.dense[:, :0]

    def take(self, rows: np.ndarray) -> Inputs:
        return Inputs(
            **{
                name: getattr(self, name)[rows]
                for name in ("ids", "dense", "clicked", "converted", "teacher", "adapted")
            }
        )


@dataclass
class StudentRun:
    models: dict[str, dict[str, StudentModel]]  # surface -> variant -> model
    adapters: dict[str, StudentAdapter]  # task -> adapter
    adapter_fit: dict[str, dict[str, Any]]
    metrics: dict[str, float]
    gains: dict[str, dict[str, dict[str, float]]]  # scope ("all" or a surface) -> task -> gain
    rows: dict[str, dict[str, int]]  # surface -> {"train", "eval"}
    fits: dict[str, dict[str, FitResult]] = field(default_factory=dict)  # surface -> variant -> fit
    inference_ms_per_1000: dict[str, float] = field(default_factory=dict)  # variant -> ms


def id_columns(cfg: GemConfig, names: tuple[str, ...]) -> list[str]:
    return [cfg.features.by_name(n).idx_column for n in names]


def _ids(data: StudentData, cfg: GemConfig, names: tuple[str, ...]) -> np.ndarray:
    if not names:
        return np.zeros((len(data), 0), np.int64)
    return np.stack([data.column(c).astype(np.int64) for c in id_columns(cfg, names)], axis=1)


def make_adapter(cfg: GemConfig) -> StudentAdapter:
    buckets = {f: cfg.features.by_name(f).buckets for f in cfg.student.adapter_features}
    return StudentAdapter(tuple(cfg.world.surfaces), buckets)


def fit_adapters(data: StudentData, cfg: GemConfig) -> tuple[dict[str, StudentAdapter], dict[str, dict[str, Any]]]:
    """Click adapter on every impression of `data`, conversion adapter on its clicked ones."""
    adapters, fits = {}, {}
    st = cfg.student
    ids, surface = _ids(data, cfg, st.adapter_features), data.column("surface")
    clicked, converted = data.column("clicked").astype(bool), data.column("converted").astype(bool)
    for k, (task, logit, rows, labels) in enumerate(
        (("ctr", "ctr_logit", np.ones(len(data), bool), clicked), ("cvr", "cvr_logit", clicked, converted))
    ):
        adapters[task], fits[task] = fit_adapter_with_prior_choice(
            lambda: make_adapter(cfg),
            data.column(logit)[rows],
            surface[rows],
            ids[rows],
            labels[rows],
            st.adapter_prior_sds,
            st.validation_fraction,
            seed=st.seed + k,
        )
    return adapters, fits


def make_inputs(data: StudentData, cfg: GemConfig, adapters: dict[str, StudentAdapter]) -> Inputs:
    teacher = np.stack([data.column(c).astype(np.float32) for c in LOGIT_COLUMNS], axis=1)
    context, surface = _ids(data, cfg, cfg.student.adapter_features), data.column("surface")
    adapted = np.stack([adapters[t].adapt(teacher[:, i], surface, context) for i, t in enumerate(TASKS)], axis=1)
    return Inputs(
        ids=_ids(data, cfg, cfg.student.features),
        dense=embedding_inputs(data.user_embedding, data.ad_embedding),
        clicked=data.column("clicked").astype(np.float32),
        converted=data.column("converted").astype(np.float32),
        teacher=teacher,
        adapted=adapted.astype(np.float32),
    )


def build_student(cfg: GemConfig, variant: Variant, repr_dim: int) -> StudentModel:
    features = tuple(cfg.features.by_name(f) for f in cfg.student.features)
    return StudentModel(features, cfg.student, 2 * repr_dim + 1 if variant.embeddings else 0)


@dataclass(frozen=True)
class FitResult:
    validation_losses: list[float]  # label loss of the held-out rows before training and at each check
    best_check: int  # index into validation_losses of the weights kept
    steps_per_check: int
    validation_rows: int


def fit_student(model: StudentModel, variant: Variant, inputs: Inputs, cfg: GemConfig, seed: int) -> FitResult:
    """Adam over shuffled mini-batches, keeping the weights with the lowest held-out label loss.

    A seeded `student.validation_fraction` of the rows is held out, and its ESMM label loss
    (whatever the variant's objective, so every variant is judged by the same yardstick) is
    checked `student.checks_per_epoch` times an epoch for up to `student.epochs` epochs; the best
    weights are restored. With one fresh day per surface a student memorises hashed ids within an
    epoch: a labels-only feed student's click NE on `small` was 0.98 after one epoch and 1.13
    after four, so a fixed epoch count would compare variants at arbitrary points of over-fitting.
    """
    st = cfg.student
    order = np.random.default_rng([st.seed, seed]).permutation(len(inputs.clicked))
    held_out = round(len(order) * st.validation_fraction) if len(order) >= 2 else 0
    fit, validation = inputs.take(order[held_out:]), inputs.take(order[:held_out] if held_out else order)
    n, clicks = len(fit.clicked), float(fit.clicked.sum())
    model.init_base_rates(clicks / max(n, 1), float(fit.converted.sum()) / max(clicks, 1.0))
    optimizer = torch.optim.Adam(model.parameters(), lr=st.lr, weight_decay=st.weight_decay)
    dense, val_dense = fit.dense_for(variant), validation.dense_for(variant)
    target = {"teacher": fit.teacher, "adapter": fit.adapted}.get(variant.target)
    steps_per_check = max(1, math.ceil(n / st.batch_size / st.checks_per_epoch))

    @torch.no_grad()
    def validation_loss() -> float:
        model.eval()
        logits = model(torch.from_numpy(validation.ids), torch.from_numpy(val_dense))
        model.train()
        return float(label_loss(logits, torch.from_numpy(validation.clicked), torch.from_numpy(validation.converted)))

    losses = [validation_loss()]
    best = {k: v.detach().clone() for k, v in model.state_dict().items()}
    step = 0
    for epoch in range(st.epochs):
        batches = np.random.default_rng([st.seed, seed, epoch]).permutation(n)
        for start in range(0, n, st.batch_size):
            rows = batches[start : start + st.batch_size]
            logits = model(torch.from_numpy(fit.ids[rows]), torch.from_numpy(dense[rows]))
            loss = label_loss(logits, torch.from_numpy(fit.clicked[rows]), torch.from_numpy(fit.converted[rows]))
            if target is not None and st.kd_weight > 0:
                loss = loss + st.kd_weight * distillation_loss(logits, torch.from_numpy(target[rows]), st.temperature)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % steps_per_check == 0:
                losses.append(validation_loss())
                if losses[-1] <= min(losses[:-1]):
                    best = {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best)
    return FitResult(losses, int(np.argmin(losses)), steps_per_check, len(validation.clicked))


def _scored(data: StudentData, logits: np.ndarray) -> pa.Table:
    """The rows holdout_metrics reads, with the predictions of `logits` [N, 2]."""
    p_ctr = 1 / (1 + np.exp(-logits[:, 0].astype(np.float64)))
    p_cvr = 1 / (1 + np.exp(-logits[:, 1].astype(np.float64)))
    keep = [c for c in ("surface", "clicked", "converted", "p_click", "p_convert") if c in data.table.column_names]
    return (
        data.table.select(keep)
        .append_column("pred_ctr", pa.array(p_ctr))
        .append_column("pred_ctcvr", pa.array(p_ctr * p_cvr))
    )


def _prefixed(name: str, metrics: dict[str, float]) -> dict[str, float]:
    """`<name>/<metric>` for a predictor's metrics; the oracle's (the same for all) under `oracle/` once."""
    out = {}
    for key, value in metrics.items():
        head, _, metric = key.rpartition("/")
        if metric.startswith("oracle_"):
            if name == "teacher":
                out[f"oracle/{head}/{metric.removeprefix('oracle_')}"] = value
        else:
            out[f"{name}/{key}"] = value
    return out


def gains(metrics: dict[str, float], surfaces: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    """NE and AUC gains of `kd` and `adapter` over `labels`, and adapter gain / KD gain (NE), per scope."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for scope in ("all", *surfaces):
        prefix = "" if scope == "all" else f"{scope}/"
        for task in TASKS:

            def get(variant: str, metric: str, prefix: str = prefix, task: str = task) -> float:
                return metrics.get(f"{variant}/{prefix}{task}/{metric}", math.nan)

            kd, adapter = get("labels", "ne") - get("kd", "ne"), get("labels", "ne") - get("adapter", "ne")
            out.setdefault(scope, {})[task] = {
                "kd_ne_gain": kd,
                "adapter_ne_gain": adapter,
                # Only where KD helps: against a KD loss the ratio's sign says nothing.
                "ne_gain_ratio": adapter / kd if kd > 0 else math.nan,
                "kd_auc_gain": get("kd", "auc") - get("labels", "auc"),
                "adapter_auc_gain": get("adapter", "auc") - get("labels", "auc"),
            }
    return out


def train_students(data: StudentData, calendar: StudentCalendar, cfg: GemConfig, repr_dim: int) -> StudentRun:
    """Fit the adapters, then every variant's student per surface; evaluate all on the evaluation days."""
    train, evaluation = data.on_days(calendar.train), data.on_days(calendar.eval)
    adapters, adapter_fit = fit_adapters(train.on_days(calendar.adapter), cfg)
    variants = {name: VARIANTS[name] for name in cfg.student.variants}
    models: dict[str, dict[str, StudentModel]] = {}
    fits: dict[str, dict[str, FitResult]] = {}
    rows: dict[str, dict[str, int]] = {}
    eval_parts: list[StudentData] = []
    eval_logits: dict[str, list[np.ndarray]] = {name: [] for name in variants}
    for k, surface in enumerate(cfg.world.surfaces):
        surface_train, surface_eval = train.on_surface(surface), evaluation.on_surface(surface)
        rows[surface] = {"train": len(surface_train), "eval": len(surface_eval)}
        if len(surface_train) == 0 or len(surface_eval) == 0:
            continue  # a surface without traffic on the student days has no student (counted in `rows`)
        train_inputs, eval_inputs = make_inputs(surface_train, cfg, adapters), make_inputs(surface_eval, cfg, adapters)
        eval_parts.append(surface_eval)
        for name, variant in variants.items():
            torch.manual_seed(cfg.student.seed + k)
            model = build_student(cfg, variant, repr_dim)
            fits.setdefault(surface, {})[name] = fit_student(model, variant, train_inputs, cfg, seed=k)
            models.setdefault(surface, {})[name] = model
            eval_logits[name].append(model.predict(eval_inputs.ids, eval_inputs.dense_for(variant)))
    if not eval_parts:
        raise ValueError(
            f"no surface has impressions on both the student training days {calendar.to_dict()['train']} "
            f"and evaluation days {calendar.to_dict()['eval']}"
        )
    scored_rows = StudentData(
        pa.concat_tables([p.table for p in eval_parts]),
        np.concatenate([p.user_embedding for p in eval_parts]),
        np.concatenate([p.ad_embedding for p in eval_parts]),
    )
    reference = make_inputs(scored_rows, cfg, adapters)
    predictors = {
        "teacher": reference.teacher,
        "teacher_adapted": reference.adapted,
        **{name: np.concatenate(parts) for name, parts in eval_logits.items()},
    }
    metrics: dict[str, float] = {}
    for name, logits in predictors.items():
        metrics.update(_prefixed(name, holdout_metrics(_scored(scored_rows, logits))))
    surfaces = sorted(models)
    speed = {
        name: inference_ms_per_1000(models[surfaces[0]][name], reference.ids, reference.dense_for(variant))
        for name, variant in variants.items()
    }
    return StudentRun(
        models=models,
        adapters=adapters,
        adapter_fit=adapter_fit,
        metrics=metrics,
        gains=gains(metrics, surfaces),
        rows=rows,
        fits=fits,
        inference_ms_per_1000=speed,
    )
