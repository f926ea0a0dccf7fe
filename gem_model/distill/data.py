"""The students' data: `gold.training_examples` of the student days joined to one teacher version.

The calendar (`StudentCalendar`) comes from the config: the days after the teacher's training
window (`world.holdout_start` on) are split into student training days and the last
`student.eval_days` evaluation days; the adapter is fit on the freshest `student.adapter_days`
training days. Every impression is joined on `impression_id` to its `gold.teacher_logits` row of
the teacher version, and its user and ad to `gold.user_embeddings` / `gold.ad_embeddings` of that
version on the day `student.embedding_lag_days` before the impression's. An impression without a
teacher logit is an error, never dropped: students trained on a silently thinned sample would be
compared with a teacher evaluated on all of it. A user or ad without an embedding (no dimension
row) gets zeros, counted in `missing_embeddings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gem_model.config import GemConfig
from gem_model.data.loader import KEY_COLUMNS, LABEL_COLUMNS, TRUTH_COLUMNS, open_delta
from gem_model.export.scoring import read_embeddings
from gem_model.paths import GemPaths

LOGIT_COLUMNS = ("ctr_logit", "cvr_logit")


def has_student_days(cfg: GemConfig) -> bool:
    """Whether the days after the teacher's window leave students a day to train on before evaluating."""
    return cfg.world.holdout_days > cfg.student.eval_days


@dataclass(frozen=True)
class StudentCalendar:
    """The students' days: `train` (the adapter's `adapter` are its freshest) and `eval`."""

    train: tuple[date, ...]
    adapter: tuple[date, ...]
    eval: tuple[date, ...]

    @staticmethod
    def from_config(cfg: GemConfig) -> StudentCalendar:
        world, st = cfg.world, cfg.student
        after_teacher = tuple(d for d in world.days if d >= world.holdout_start)
        if not has_student_days(cfg):
            raise ValueError(
                f"world.holdout_days={world.holdout_days} must exceed student.eval_days={st.eval_days}: students "
                "train on the days after the teacher's window before their evaluation days; raise world.holdout_days"
            )
        train = after_teacher[: -st.eval_days]
        if st.adapter_days > len(train):
            raise ValueError(
                f"student.adapter_days={st.adapter_days} exceeds the {len(train)} student training day(s) "
                "(world.holdout_days - student.eval_days); lower student.adapter_days"
            )
        return StudentCalendar(train, train[-st.adapter_days :], after_teacher[-st.eval_days :])

    @property
    def days(self) -> tuple[date, ...]:
        return self.train + self.eval

    def check_teacher(self, manifest: dict[str, Any]) -> None:
        """Refuse a teacher that trained on a student day: its logits there would be fitted, not predicted."""
        taught = sorted(set(manifest["training_data"]["train_days"]) & {d.isoformat() for d in self.days})
        if taught:
            raise ValueError(
                f"teacher {manifest['model_version']!r} was trained on student day(s) {taught}; students need "
                "days after the teacher's training window: use a teacher trained with this world.holdout_days"
            )

    def to_dict(self) -> dict[str, list[str]]:
        return {name: [d.isoformat() for d in getattr(self, name)] for name in ("train", "adapter", "eval")}


@dataclass
class StudentData:
    """Impressions of the student days, one row each, sorted by (ds, impression_id).

    `table` holds the keys, labels, truth (when known), the `<feature>_idx` columns and the
    teacher's `ctr_logit` / `cvr_logit`; `user_embedding` / `ad_embedding` are aligned [N, R].
    """

    table: pa.Table
    user_embedding: np.ndarray
    ad_embedding: np.ndarray
    missing_embeddings: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.table.num_rows

    def column(self, name: str) -> np.ndarray:
        return self.table.column(name).to_numpy(zero_copy_only=False)

    def where(self, mask: np.ndarray) -> StudentData:
        return StudentData(
            self.table.filter(pa.array(mask)),
            self.user_embedding[mask],
            self.ad_embedding[mask],
            self.missing_embeddings,
        )

    def on_days(self, days: tuple[date, ...]) -> StudentData:
        return self.where(np.isin(self.column("ds"), np.array(days, dtype="datetime64[D]")))

    def on_surface(self, surface: str) -> StudentData:
        return self.where(self.column("surface") == surface)


def _day_filter(days: tuple[date, ...]) -> pc.Expression:
    return pc.field("ds").isin(pa.array(days, pa.date32()))


def _rows_per_day(table: pa.Table) -> dict[date, int]:
    counts = table.group_by("ds").aggregate([("ds", "count")])
    return dict(zip(counts.column("ds").to_pylist(), counts.column("ds_count").to_pylist(), strict=True))


def _require_days(table: pa.Table, days: tuple[date, ...], what: str, fix: str) -> None:
    present = _rows_per_day(table)
    missing = [d.isoformat() for d in days if not present.get(d)]
    if missing:
        raise ValueError(f"{what} has no rows for ds={missing}; {fix}")


def read_examples(paths: GemPaths, cfg: GemConfig, days: tuple[date, ...]) -> pa.Table:
    """The student days of gold.training_examples: keys, labels, truth and the students' id columns."""
    dataset = open_delta(paths.table("gold.training_examples"))
    spec, st = cfg.features, cfg.student
    idx = [spec.by_name(f).idx_column for f in dict.fromkeys((*st.features, *st.adapter_features))]
    names = set(dataset.schema.names)
    missing = [c for c in (*KEY_COLUMNS, *LABEL_COLUMNS, *idx) if c not in names]
    if missing:
        raise ValueError(f"gold.training_examples lacks columns {missing}; rebuild it with the current FeatureSpec")
    columns = [*KEY_COLUMNS, *LABEL_COLUMNS, *(c for c in TRUTH_COLUMNS if c in names), *idx]
    table = dataset.to_table(columns=columns, filter=_day_filter(days))
    _require_days(
        table,
        days,
        "gold.training_examples",
        "materialise build_features_job for those partitions (or python -m jobs.build_features)",
    )
    for column in idx:
        if table.column(column).null_count:
            raise ValueError(
                f"gold.training_examples.{column} has {table.column(column).null_count} nulls on the "
                "student days; rebuild those partitions"
            )
    return table


def read_teacher_logits(paths: GemPaths, model_version: str, days: tuple[date, ...]) -> pa.Table:
    """One row per impression of gold.teacher_logits for `model_version` on `days`."""
    table = open_delta(paths.table("gold.teacher_logits")).to_table(
        columns=["impression_id", "ds", *LOGIT_COLUMNS],
        filter=(pc.field("model_version") == model_version) & _day_filter(days),
    )
    _require_days(
        table,
        days,
        f"gold.teacher_logits for model_version={model_version!r}",
        f"materialise export_job for those partitions with model_version={model_version!r}",
    )
    if pc.count_distinct(table.column("impression_id")).as_py() != table.num_rows:
        raise ValueError(
            f"gold.teacher_logits has duplicate impression_id rows for model_version={model_version!r} "
            f"on ds={[d.isoformat() for d in days]}; re-materialise export_job for those partitions"
        )
    return table


def join_teacher(examples: pa.Table, logits: pa.Table, model_version: str) -> pa.Table:
    """examples with their teacher logits; an impression without one is an error naming the days."""
    joined = examples.join(logits.drop_columns(["ds"]), keys="impression_id", join_type="left outer")
    lacking = joined.filter(pc.is_null(joined.column("ctr_logit")))
    if lacking.num_rows:
        per_day = {d.isoformat(): n for d, n in sorted(_rows_per_day(lacking).items())}
        raise ValueError(
            f"{lacking.num_rows} impressions of gold.training_examples have no gold.teacher_logits row for "
            f"model_version={model_version!r} (per day: {per_day}; e.g. {lacking.column('impression_id')[0]}); "
            "the examples changed after scoring: re-materialise export_job for those partitions"
        )
    return joined.sort_by([("ds", "ascending"), ("impression_id", "ascending")])


def _aligned(ids: np.ndarray, vectors: np.ndarray, wanted: np.ndarray) -> tuple[np.ndarray, int]:
    """vectors of `wanted` ids in order ([N, R]); zeros and a count for ids without one."""
    position = pc.index_in(pa.array(wanted), value_set=pa.array(ids)).to_numpy(zero_copy_only=False)
    found = ~np.isnan(position.astype(np.float64))
    out = np.zeros((len(wanted), vectors.shape[1]), np.float32)
    out[found] = vectors[position[found].astype(np.int64)]
    return out, int((~found).sum())


def load_student_data(
    paths: GemPaths, cfg: GemConfig, manifest: dict[str, Any], calendar: StudentCalendar
) -> StudentData:
    """Examples, teacher logits and embeddings of the teacher `manifest`'s version on the student days."""
    version = manifest["model_version"]
    calendar.check_teacher(manifest)
    repr_dim = int(manifest["config"]["model"]["repr_dim"])
    table = join_teacher(
        read_examples(paths, cfg, calendar.days), read_teacher_logits(paths, version, calendar.days), version
    )
    days = table.column("ds").to_numpy(zero_copy_only=False)
    users, ads = np.zeros((len(days), repr_dim), np.float32), np.zeros((len(days), repr_dim), np.float32)
    missing = {"user_id": 0, "ad_id": 0}
    for day in calendar.days:
        rows = days == np.datetime64(day, "D")
        source_day = day - timedelta(days=cfg.student.embedding_lag_days)
        for out, name, id_column in ((users, "gold.user_embeddings", "user_id"), (ads, "gold.ad_embeddings", "ad_id")):
            ids, vectors = read_embeddings(paths, name, id_column, version, source_day, dimension=repr_dim)
            out[rows], lacking = _aligned(ids, vectors, table.column(id_column).to_numpy()[rows])
            missing[id_column] += lacking
    return StudentData(table, users, ads, missing)
