"""The one typed configuration of the pipeline.

Spark jobs, the training data loader, the model, the exporters and the Dagster definitions all
read the same frozen `GemConfig`: the synthetic world (`WorldConfig`), the sparse feature
specification that maps raw columns to embedding rows (`FeatureSpec`), the model, training and
index settings. Named presets (`tiny` for tests, `small` for the demo) are the only entry
points; overrides go through `GemConfig.from_dict`, where an unknown key is an error. The
resolved config is saved with every model so an artefact always says how it was made.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any, Literal

SURFACES: tuple[str, ...] = ("feed", "stories", "reels", "messaging", "offsite")
TASKS: tuple[str, ...] = ("ctr", "cvr")


@dataclass(frozen=True)
class WorldConfig:
    """The calendar and, for the synthetic world, its size, seed and dynamics (`jobs.features.world`).

    The calendar (`start_date`, `n_days`, `holdout_days`) is shared by every data source. Users and
    ads arrive over the days (`new_user_fraction`, `new_ad_fraction`: cold start); a user's daily
    event count is log-normal around `events_per_user_day` with spread `activity_sigma`, which
    gives heavy-tailed sequences; `malformed_rate` of the raw rows are corrupted on purpose so the
    quarantine is exercised on every run.
    """

    seed: int = 7
    start_date: date = date(2026, 11, 1)
    n_days: int = 6
    holdout_days: int = 2
    n_users: int = 400
    n_ads: int = 120
    n_categories: int = 12
    n_advertisers: int = 30
    campaigns_per_advertiser: int = 3
    new_user_fraction: float = 0.15
    new_ad_fraction: float = 0.25
    impressions_per_day: int = 3000
    events_per_user_day: float = 4.0
    activity_sigma: float = 1.6
    max_events_per_user_day: int = 2000
    malformed_rate: float = 0.002
    surfaces: tuple[str, ...] = SURFACES

    def __post_init__(self) -> None:
        if self.holdout_days >= self.n_days:
            raise ValueError(
                f"world.holdout_days={self.holdout_days} must be below world.n_days={self.n_days}: "
                "training needs at least one day before the holdout"
            )
        if self.initial_ads < self.n_categories:
            raise ValueError(
                f"world.n_ads={self.n_ads} with new_ad_fraction={self.new_ad_fraction} leaves {self.initial_ads} "
                f"ads on day one, fewer than world.n_categories={self.n_categories}; raise n_ads"
            )
        for name in ("new_user_fraction", "new_ad_fraction", "malformed_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"world.{name}={getattr(self, name)} must be in [0, 1)")

    @property
    def days(self) -> list[date]:
        return [self.start_date + timedelta(days=i) for i in range(self.n_days)]

    @property
    def holdout_start(self) -> date:
        """First day of the time-based holdout; training uses only days before it."""
        return self.start_date + timedelta(days=self.n_days - self.holdout_days)

    @property
    def initial_ads(self) -> int:
        return self.n_ads - round(self.n_ads * self.new_ad_fraction)


DATA_SOURCES: tuple[str, ...] = ("synthetic", "taobao", "ali_ccp", "aliexpress", "criteo", "open_bandit")


@dataclass(frozen=True)
class DataConfig:
    """Where bronze comes from: the synthetic world, or one real public dataset read in place.

    Real datasets are read from `data_dir` (empty: $GEM_DATA_DIR, else `../shared/data` beside the
    repository) and never copied into it; their rows are laid out on the world's calendar
    (`world.start_date`, `world.n_days`) in their original order.
    """

    source: str = "synthetic"
    data_dir: str = ""
    # The label-rate check: per-surface click rate must lie in these bounds, judged only on
    # surfaces with at least `label_check_min_rows` impressions in the partition.
    click_rate_bounds: tuple[float, float] = (0.001, 0.8)
    label_check_min_rows: int = 500

    def __post_init__(self) -> None:
        if self.source not in DATA_SOURCES:
            raise ValueError(f"data.source={self.source!r} is not one of {list(DATA_SOURCES)}")


@dataclass(frozen=True)
class SparseFeature:
    """One categorical feature: raw column `source`, hashed into `buckets` embedding rows.

    The row of value v is pmod(xxhash64(v), buckets), computed by Spark into column `<name>_idx`
    (`gem_model.data.feature_columns`), so the loader and the model never re-implement hashing.
    """

    name: str
    buckets: int
    side: Literal["user", "ad", "context"]

    @property
    def idx_column(self) -> str:
        return f"{self.name}_idx"


@dataclass(frozen=True)
class FeatureSpec:
    """Sparse features and the behaviour sequence, shared by Spark, the loader and the model."""

    features: tuple[SparseFeature, ...] = (
        SparseFeature("user_id", 4096, "user"),
        SparseFeature("age_bucket", 16, "user"),
        SparseFeature("country", 64, "user"),
        SparseFeature("device", 16, "user"),
        SparseFeature("ad_id", 2048, "ad"),
        SparseFeature("advertiser_id", 512, "ad"),
        SparseFeature("category", 64, "ad"),
        SparseFeature("ad_format", 16, "ad"),
        SparseFeature("objective", 16, "ad"),
        SparseFeature("surface", 16, "context"),
        # The logged slot: known when training and when scoring logged impressions (teacher
        # logits); null (row 0) where a source does not log it.
        SparseFeature("position", 8, "context"),
    )
    # The behaviour sequence holds item (ad) ids, looked up in the `ad_id` table.
    sequence_feature: str = "seq_item_ids"
    sequence_table: str = "ad_id"
    max_seq_len: int = 256
    lookback_days: int = 14
    # Per event, beside the item: its action (hashed) and its age before the impression, in
    # buckets of log2(1 + minutes) (bucket 15 is ~23 days), the clock the sequence arch reads.
    action_buckets: int = 16
    age_buckets: int = 16
    # Ad attributes looked up for every event's item (silver.ads, row 0 when the item is no ad
    # there), hashed like the target's own: attention can then match history to the candidate by
    # category without first learning every item's category from its id.
    sequence_item_attributes: tuple[str, ...] = ("category",)
    # The context feature that names the domain: the heads keep a tower per value.
    domain_feature: str = "surface"

    def __post_init__(self) -> None:
        names = [f.name for f in self.features]
        if len(set(names)) != len(names):
            raise ValueError(f"features: duplicate feature names in {names}")
        if self.sequence_table not in names:
            raise ValueError(f"features.sequence_table={self.sequence_table!r} is not one of {names}")
        if self.domain_feature not in [f.name for f in self.side("context")]:
            raise ValueError(f"features.domain_feature={self.domain_feature!r} must name a context feature")
        ad_attributes = [f.name for f in self.side("ad") if f.name != self.sequence_table]
        for name in self.sequence_item_attributes:
            if name not in ad_attributes:
                raise ValueError(f"features.sequence_item_attributes: {name!r} is not an ad attribute; "
                                 f"choose from {ad_attributes}")

    def by_name(self, name: str) -> SparseFeature:
        for f in self.features:
            if f.name == name:
                return f
        raise KeyError(f"unknown sparse feature {name!r}; known: {[f.name for f in self.features]}")

    def side(self, side: str) -> tuple[SparseFeature, ...]:
        return tuple(f for f in self.features if f.side == side)

    @property
    def sequence_idx_column(self) -> str:
        return "seq_item_idx"

    @property
    def sequence_side_columns(self) -> dict[str, int]:
        """Per-event side columns of the sequence (aligned with `seq_item_idx`) -> their bucket counts."""
        attributes = {column: self.by_name(name).buckets for name, column in self.sequence_attribute_columns.items()}
        return {self.action_idx_column: self.action_buckets, self.age_idx_column: self.age_buckets, **attributes}

    @property
    def sequence_attribute_columns(self) -> dict[str, str]:
        """Ad attribute -> the side column of its embedding rows per event (`seq_<attribute>_idx`)."""
        return {name: f"seq_{name}_idx" for name in self.sequence_item_attributes}

    @property
    def action_idx_column(self) -> str:
        return "seq_action_idx"

    @property
    def age_idx_column(self) -> str:
        return "seq_age_idx"

    @property
    def pooled_features(self) -> tuple[SparseFeature, ...]:
        """Single-valued features with their own tables (everything but the item table)."""
        return tuple(f for f in self.features if f.name != self.sequence_table)

    @property
    def kjt_keys(self) -> tuple[str, ...]:
        """Key order of the model's input KJT: pooled features | target item, sequence | side columns.

        Contiguous groups, so the sparse arch splits one KJT into the EmbeddingBagCollection's,
        the EmbeddingCollection's and the sequence arch's inputs.
        """
        return (*(f.name for f in self.pooled_features), self.sequence_table, self.sequence_feature,
                *self.sequence_side_columns)

    @property
    def domain(self) -> SparseFeature:
        return self.by_name(self.domain_feature)

    @property
    def item_feature(self) -> SparseFeature:
        """The feature whose table the sequence shares (the target ad looks up the same rows)."""
        return self.by_name(self.sequence_table)


ARCHITECTURES: tuple[str, ...] = ("gem", "dlrm", "dcnv2")


@dataclass(frozen=True)
class WukongConfig:
    """Wukong interaction layers (arXiv 2403.02545), see `gem_model.modules.wukong`.

    Each layer maps n embeddings to `n_fm` (factorization-machine block) + `n_lc` (linear
    compress block) embeddings; `rank` is k, the columns of the low-rank FM projection, made
    input-attentive when `attentive`.
    """

    n_fm: int = 8
    n_lc: int = 8
    rank: int = 8
    mlp_dims: tuple[int, ...] = (128,)
    attentive: bool = True


@dataclass(frozen=True)
class SequenceConfig:
    """The pyramid of jagged attention layers over the behaviour sequence (`gem_model.modules.sequence`).

    `pyramid[i]` is how many of the most recent tokens layer i keeps (the rest are pooled into
    one summary token), so the layer count is `len(pyramid)`; `activation` is the generalized
    dot-product attention's (softmax, or HSTU's pointwise silu). `n_cls` CLS tokens carry the
    non-sequential summary in; `n_recent` most recent tokens go into the sequence summary.
    """

    dim: int = 32
    heads: int = 2
    pyramid: tuple[int, ...] = (64, 16)
    activation: Literal["softmax", "silu"] = "softmax"
    causal: bool = False
    n_cls: int = 2
    n_recent: int = 2
    pffn_rank: int = 8

    def __post_init__(self) -> None:
        if self.activation not in ("softmax", "silu"):
            raise ValueError(f"model.sequence.activation={self.activation!r} must be 'softmax' or 'silu'")
        if self.dim % self.heads:
            raise ValueError(f"model.sequence.dim={self.dim} must be divisible by heads={self.heads}")
        if not self.pyramid or any(k < 1 for k in self.pyramid):
            raise ValueError(f"model.sequence.pyramid={self.pyramid} needs at least one layer, each keeping >= 1 token")


@dataclass(frozen=True)
class ModelConfig:
    """The teacher (`architecture="gem"`) or a baseline (`dlrm`, `dcnv2`) in the same framework.

    All share the sparse arch, the representation heads (user/ad towers -> `repr_dim` unit
    vectors) and the multi-surface multi-task heads (`shared_dims`, then per-surface
    `surface_dims`); they differ in the interaction arch. `use_wukong`, `use_sequence` and
    `interleave` switch GEM's parts off for ablations (see gem_model.models.gem).
    """

    architecture: str = "gem"
    embedding_dim: int = 16
    tower_dims: tuple[int, ...] = (64,)
    repr_dim: int = 32
    shared_dims: tuple[int, ...] = (128, 64)
    surface_dims: tuple[int, ...] = (32,)
    tasks: tuple[str, ...] = TASKS
    wukong: WukongConfig = field(default_factory=WukongConfig)
    sequence: SequenceConfig = field(default_factory=SequenceConfig)
    use_wukong: bool = True
    use_sequence: bool = True
    interleave: bool = True
    dcn_layers: int = 3
    dcn_rank: int = 16

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"model.architecture={self.architecture!r} is not one of {list(ARCHITECTURES)}")
        if self.tasks != TASKS:
            raise ValueError(f"model.tasks={self.tasks} must be {TASKS}: the heads model the funnel (ESMM)")


@dataclass(frozen=True)
class TrainConfig:
    """Distributed training (`gem_model.train.trainer`, launched by `jobs/train.py` under torchrun).

    `checkpoint_every_steps`: how often every rank writes a resumable checkpoint (model, both
    optimizers, progress) with torch.distributed.checkpoint; a re-launched run continues from the
    last complete one. `bf16` autocasts the dense forward on CUDA (ignored on CPU); `compile`
    wraps the dense interaction arch in torch.compile. `dense_lr_schedule`: `cosine` decays the
    dense learning rate from `dense_lr` to `dense_lr * min_lr_fraction` over the run (the last
    steps then average out batch noise instead of chasing it); `constant` keeps it.
    """

    nproc: int = 2
    batch_size: int = 256
    epochs: int = 3
    dense_lr: float = 3e-3
    dense_lr_schedule: Literal["constant", "cosine"] = "cosine"
    min_lr_fraction: float = 0.1
    sparse_lr: float = 0.05
    retrieval_weight: float = 0.2
    temperature: float = 0.1
    grad_clip: float = 1.0
    checkpoint_every_steps: int = 100
    log_every_steps: int = 20
    bf16: bool = True
    compile: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.dense_lr_schedule not in ("constant", "cosine"):
            raise ValueError(f"train.dense_lr_schedule={self.dense_lr_schedule!r} must be 'constant' or 'cosine'")
        if not 0.0 <= self.min_lr_fraction <= 1.0:
            raise ValueError(f"train.min_lr_fraction={self.min_lr_fraction} must be in [0, 1]")


@dataclass(frozen=True)
class IndexConfig:
    """FAISS settings; `factory` is a FAISS index_factory string over inner-product vectors.

    Supported families (`factory_family`): `Flat` (exact), IVF-Flat `IVF<nlist>,Flat`, IVF-PQ
    `IVF<nlist>,PQ<m>` (m one-byte codes a vector; m must divide the vector dimension) and
    `HNSW<M>,Flat`. IVF lists and PQ codebooks are k-means trained on at most `train_sample` rows,
    drawn with a fixed seed; a search scans `nprobe` of the nlist lists (IVF) or keeps
    `hnsw_ef_search` candidates (HNSW). `nlist` ~ 4 * sqrt(rows) is the usual starting point.
    """

    factory: str = "HNSW32,Flat"
    recall_k: int = 10
    recall_queries: int = 200
    hnsw_ef_search: int = 64
    nprobe: int = 32
    # k-means wants >= 39 points a centroid (FAISS warns below, and subsamples above 256): 200k rows
    # cover nlist = 4 * sqrt(N) up to N = 1.6M.
    train_sample: int = 200_000
    # Below this many vectors the index is exact (Flat): a graph index buys nothing at that size,
    # and HNSW over inner product loses near-duplicate clusters (users with equal features:
    # recall@10 0.0 on the Open Bandit sample's 337 users).
    exact_below: int = 10_000
    min_recall: float = 0.9

    def __post_init__(self) -> None:
        for name in ("recall_k", "recall_queries", "hnsw_ef_search", "nprobe"):
            if getattr(self, name) < 1:
                raise ValueError(f"index.{name}={getattr(self, name)} must be >= 1")
        needed = self.min_train_rows(self.factory)
        if self.train_sample < needed:
            raise ValueError(
                f"index.train_sample={self.train_sample} is below the {needed} k-means centroids "
                f"index.factory={self.factory!r} trains; raise it to >= {39 * needed} (39 points a centroid) "
                "or use fewer IVF lists"
            )

    @staticmethod
    def factory_family(factory: str) -> str:
        """`flat`, `ivf_flat`, `ivf_pq` or `hnsw`; a ValueError naming `index.factory` for anything else."""
        head, _, tail = factory.partition(",")
        if factory == "Flat":
            return "flat"
        if IndexConfig._count(head, "HNSW") and tail == "Flat":
            return "hnsw"
        if IndexConfig._count(head, "IVF") and tail == "Flat":
            return "ivf_flat"
        if IndexConfig._count(head, "IVF") and IndexConfig._count(tail, "PQ"):
            return "ivf_pq"
        raise ValueError(
            f"index.factory={factory!r} is not a supported FAISS factory string; use one of: 'Flat' (exact), "
            "'IVF<nlist>,Flat' (IVF-Flat, e.g. 'IVF1024,Flat'), 'IVF<nlist>,PQ<m>' (IVF-PQ, e.g. 'IVF1024,PQ16', "
            "m dividing the vector dimension), 'HNSW<M>,Flat' (HNSW, e.g. 'HNSW32,Flat')"
        )

    @staticmethod
    def min_train_rows(factory: str) -> int:
        """Rows `factory` must be trained on: one per k-means centroid (nlist; 256 a PQ codebook), else 0."""
        nlist = IndexConfig._count(factory.partition(",")[0], "IVF")
        return {"flat": 0, "hnsw": 0, "ivf_flat": nlist, "ivf_pq": max(nlist, 256)}[IndexConfig.factory_family(factory)]

    @staticmethod
    def _count(part: str, prefix: str) -> int:
        """n where `part` is `<prefix><n>` for a positive integer n, else 0."""
        digits = part.removeprefix(prefix)
        return int(digits) if part.startswith(prefix) and digits.isascii() and digits.isdigit() else 0


@dataclass(frozen=True)
class ExportConfig:
    """Batch scoring and candidate generation (`jobs/score.py`, the export assets).

    Scoring runs `nproc` processes under torchrun, each streaming its share of the inputs' row
    groups in chunks of `chunk_rows`; the users' scoring input is written by Spark as
    `user_input_files` files so that every rank gets a share. `candidates_k` ads per user go to
    gold.user_ad_candidates.
    """

    nproc: int = 2
    chunk_rows: int = 4096
    user_input_files: int = 8
    candidates_k: int = 50
    progress_every_chunks: int = 20

    def __post_init__(self) -> None:
        for name in ("nproc", "chunk_rows", "user_input_files", "candidates_k", "progress_every_chunks"):
            if getattr(self, name) < 1:
                raise ValueError(f"export.{name}={getattr(self, name)} must be at least 1")


STUDENT_VARIANTS: tuple[str, ...] = ("labels", "kd", "adapter", "kd_embeddings", "adapter_no_embeddings")


@dataclass(frozen=True)
class StudentConfig:
    """Per-surface student models distilled from the teacher (`gem_model.distill`, `jobs/train_student.py`).

    Calendar: students train on the days after the teacher's training window (the world's holdout
    days) except the last `eval_days`, on which they are evaluated; the Student Adapter is fit on
    the freshest `adapter_days` of that training window, never on an evaluation day. A student is
    an EmbeddingBagCollection over `features` (`embedding_dim` each) and an MLP (`dense_dims`) with
    a click and a conversion logit, trained with Adam for up to `epochs` on all but a held-out
    `validation_fraction` of its rows, whose label loss is checked `checks_per_epoch` times an
    epoch to keep the best weights. `variants` name what is trained (`gem_model.distill.variants`):
    `labels` (labels only), `kd` (+ distillation from the teacher's logits), `adapter` (+ the
    Student Adapter's targets and the teacher's user/ad embeddings as inputs), and two ablations.
    GEM embeddings of an impression on day d are read from the export of day d -
    `embedding_lag_days`. The adapter's per-id logit offsets have a Gaussian prior (the L2 penalty
    that shrinks ids seen a few times toward zero) whose standard deviation is chosen per task
    from `adapter_prior_sds` by held-out log loss on a `validation_fraction` of its window.
    """

    features: tuple[str, ...] = ("user_id", "age_bucket", "country", "device", "ad_id", "advertiser_id",
                                 "category", "ad_format", "objective", "position")
    embedding_dim: int = 8
    dense_dims: tuple[int, ...] = (64, 32)
    variants: tuple[str, ...] = ("labels", "kd", "adapter")
    eval_days: int = 1
    adapter_days: int = 1
    embedding_lag_days: int = 0
    batch_size: int = 128
    epochs: int = 3
    checks_per_epoch: int = 4
    validation_fraction: float = 0.1
    lr: float = 3e-3
    weight_decay: float = 1e-5
    kd_weight: float = 1.0
    temperature: float = 1.0
    adapter_features: tuple[str, ...] = ("ad_id", "advertiser_id")
    adapter_prior_sds: tuple[float, ...] = (0.05, 0.1, 0.2, 0.5, 1.0)
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = [v for v in self.variants if v not in STUDENT_VARIANTS]
        if unknown or not self.variants:
            raise ValueError(f"student.variants={self.variants} must be a non-empty subset of {STUDENT_VARIANTS}")
        for name in ("embedding_dim", "eval_days", "adapter_days", "batch_size", "epochs", "checks_per_epoch"):
            if getattr(self, name) < 1:
                raise ValueError(f"student.{name}={getattr(self, name)} must be >= 1")
        if self.embedding_lag_days < 0:
            raise ValueError(f"student.embedding_lag_days={self.embedding_lag_days} must be >= 0")
        if not 0 < self.validation_fraction < 1:
            raise ValueError(f"student.validation_fraction={self.validation_fraction} must be in (0, 1)")
        for name in ("lr", "temperature"):
            if not getattr(self, name) > 0:
                raise ValueError(f"student.{name}={getattr(self, name)} must be > 0")
        if not self.adapter_prior_sds or min(self.adapter_prior_sds) <= 0:
            raise ValueError(f"student.adapter_prior_sds={self.adapter_prior_sds} must be non-empty and all > 0")
        if self.kd_weight < 0 or self.weight_decay < 0:
            raise ValueError(f"student.kd_weight={self.kd_weight} and student.weight_decay={self.weight_decay} "
                             "must be >= 0")


# GemConfig sections read only after the teacher is trained.
DOWNSTREAM_SECTIONS: frozenset[str] = frozenset({"index", "export", "student"})


@dataclass(frozen=True)
class GemConfig:
    preset: str = "tiny"
    world: WorldConfig = field(default_factory=WorldConfig)
    data: DataConfig = field(default_factory=DataConfig)
    features: FeatureSpec = field(default_factory=FeatureSpec)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    student: StudentConfig = field(default_factory=StudentConfig)

    def __post_init__(self) -> None:
        # The student calendar (world.holdout_days > student.eval_days) is checked where students are
        # trained (`gem_model.distill.data.StudentCalendar`): a teacher-only world with one holdout day is valid.
        st, names = self.student, [f.name for f in self.features.features]
        for group in ("features", "adapter_features"):
            bad = [f for f in getattr(st, group) if f not in names or f == self.features.domain_feature]
            if bad or not getattr(st, group):
                raise ValueError(
                    f"student.{group}={getattr(st, group)}: {bad or 'empty'}; each must name a features.features "
                    f"entry other than the domain feature {self.features.domain_feature!r} (one student per "
                    f"value of it); choose from {[n for n in names if n != self.features.domain_feature]}"
                )

    @staticmethod
    def from_preset(name: str) -> GemConfig:
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return PRESETS[name]

    @staticmethod
    def load(preset: str, overrides_path: str | None = None, data_source: str | None = None) -> GemConfig:
        """A preset, optionally overridden by a JSON file of (partial) nested settings, then by `data_source`."""
        cfg = GemConfig.from_preset(preset)
        if overrides_path:
            with open(overrides_path) as fh:
                cfg = GemConfig.from_dict(json.load(fh), base=cfg)
        if data_source:
            cfg = GemConfig.from_dict({"data": {"source": data_source}}, base=cfg)
        return cfg

    @staticmethod
    def from_env() -> GemConfig:
        """GEM_PRESET (default `tiny`), overridden by GEM_CONFIG (a JSON file) and GEM_DATA_SOURCE."""
        return GemConfig.load(os.environ.get("GEM_PRESET", "tiny"), os.environ.get("GEM_CONFIG") or None,
                              os.environ.get("GEM_DATA_SOURCE") or None)

    def to_dict(self) -> dict[str, Any]:
        return _to_jsonable(dataclasses.asdict(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @staticmethod
    def from_dict(data: dict[str, Any], base: GemConfig | None = None) -> GemConfig:
        """Build a config from (possibly partial) nested dicts over `base`; unknown keys raise."""
        return _merge(base or GemConfig(), data, "config")

    @property
    def fingerprint(self) -> str:
        """Hash of what the teacher is trained from; the export, index and student settings do not
        rename (or invalidate the resumable checkpoints of) a teacher model version."""
        teacher = {k: v for k, v in self.to_dict().items() if k not in DOWNSTREAM_SECTIONS}
        return hashlib.sha256(json.dumps(teacher, sort_keys=True).encode()).hexdigest()[:10]


def _to_jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_jsonable(v) for v in value]
    if isinstance(value, date):
        return value.isoformat()
    return value


def _merge(obj: Any, data: Any, where: str) -> Any:
    if not dataclasses.is_dataclass(obj):
        return _coerce(obj, data, where)
    if not isinstance(data, dict):
        raise TypeError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(obj)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; valid keys are {sorted(fields)}")
    changes = {k: _merge(getattr(obj, k), v, f"{where}.{k}") for k, v in data.items()}
    return dataclasses.replace(obj, **changes)


def _coerce(current: Any, value: Any, where: str) -> Any:
    if isinstance(current, date):
        return date.fromisoformat(value) if isinstance(value, str) else value
    if isinstance(current, tuple):
        if current and dataclasses.is_dataclass(current[0]):
            kind = type(current[0])
            return tuple(v if isinstance(v, kind) else kind(**v) for v in value)
        return tuple(value)
    if isinstance(current, bool) or not isinstance(current, (int, float)):
        return value
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise TypeError(f"{where}: expected a number, got {value!r}")
    return type(current)(value)


def _buckets(*sizes: int) -> tuple[SparseFeature, ...]:
    return tuple(dataclasses.replace(f, buckets=b) for f, b in zip(FeatureSpec().features, sizes, strict=True))


PRESETS: dict[str, GemConfig] = {
    "tiny": GemConfig(),
    # ~1M impressions: the demo-at-scale and benchmark preset.
    "small": GemConfig(
        preset="small",
        world=WorldConfig(n_days=8, n_users=5000, n_ads=1000, n_categories=24, n_advertisers=200,
                          impressions_per_day=125_000),
        features=FeatureSpec(features=_buckets(16384, 16, 64, 16, 4096, 512, 64, 16, 16, 16, 8), max_seq_len=1024),
        train=TrainConfig(epochs=2, batch_size=512),
    ),
    # ~10M impressions, sequences up to 8,192 events.
    "medium": GemConfig(
        preset="medium",
        world=WorldConfig(n_days=10, n_users=50_000, n_ads=10_000, n_categories=48, n_advertisers=1000,
                          impressions_per_day=1_000_000),
        features=FeatureSpec(features=_buckets(131072, 16, 64, 16, 32768, 2048, 128, 16, 16, 16, 8), max_seq_len=8192),
        train=TrainConfig(epochs=1, batch_size=2048),
    ),
}
