"""The config's sections: one frozen dataclass each, every field typed, ranged and described.

A field's range is declared in its type (`Days` is `Annotated[int, Between(1, 3660)]`, see
`gem_model.config.validation`) and its description in the docstring written under it, which
`python -m gem_model.config.reference` turns into docs/CONFIG.md (a field without one fails there and in
tests/unit/gem_model/test_config_reference.py). Checks that span fields (a holdout shorter than the calendar, a factory
string FAISS can build) live in each section's `__post_init__`; those that span sections in
`GemConfig.__post_init__` (`gem_model.config.gem`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Annotated, Literal

from gem_model.config.names import ARCHITECTURES, DATA_SOURCES, STUDENT_VARIANTS, SURFACES
from gem_model.config.validation import (
    BatchRows,
    Between,
    Buckets,
    ConfigError,
    Count,
    Days,
    Distinct,
    Epochs,
    Fraction,
    LearningRate,
    Name,
    Names,
    NonEmpty,
    NonNegativeDays,
    NonNegativeInt,
    NonNegativeTokens,
    OneOf,
    Positive,
    Processes,
    Rate,
    Seed,
    Temperature,
    Tokens,
    Weight,
    Width,
    validate,
)


@dataclass(frozen=True)
class WorldConfig:
    """The calendar and, for the synthetic world, its size, seed and dynamics (`gem_lake.sources.world`).

    The calendar (`start_date`, `n_days`, `holdout_days`) is shared by every data source: the teacher
    trains on the days before the holdout and is measured on the holdout. The synthetic world goes on
    after them when `open_ended` (the default): every later day exists, as the world stood on its
    last configured day, up to the last day that has ended (`GemConfig.calendar_end`), so the daily
    schedule builds each new day and the sensor exports it with the promoted model.
    """

    seed: Seed = 7
    """Seed of every random draw of the synthetic world (users, ads, events, impressions, labels)."""
    start_date: date = date(2026, 11, 1)
    """First day of the calendar; real datasets are laid out on the calendar in their original order."""
    n_days: Days = 6
    """Days of the configured calendar, the holdout included."""
    holdout_days: Days = 2
    """Last days of the calendar the teacher is measured and exported on, never trained on (at least one)."""
    open_ended: bool = True
    """Synthetic world only: every day after the calendar exists too, as the world stood on its last day, so the
    daily schedule can build it; a real dataset's calendar ends with its files."""
    n_users: Count = 400
    """Users of the synthetic world."""
    n_ads: Count = 120
    """Ads of the synthetic world."""
    n_categories: Count = 12
    """Ad categories (and user interests) of the synthetic world; day one must have an ad in each."""
    n_advertisers: Count = 30
    """Advertisers of the synthetic world."""
    campaigns_per_advertiser: Count = 3
    """Campaigns each advertiser runs; its ads are spread over them."""
    new_user_fraction: Rate = 0.15
    """Share of the users who sign up after day one, spread over the calendar (cold start)."""
    new_ad_fraction: Rate = 0.25
    """Share of the ads launched after day one, spread over the calendar (cold start)."""
    impressions_per_day: Count = 3000
    """Impressions the synthetic world logs a day."""
    events_per_user_day: Positive = 4.0
    """Median of a user's daily event count, log-normal across users (heavy-tailed sequences)."""
    # At 10 a user two sigmas up is already e^20 times as active as the median.
    activity_sigma: Annotated[float, Between(0, 10)] = 1.6
    """Spread (sigma) of the log-normal daily event count."""
    max_events_per_user_day: Count = 2000
    """Cap on one user's events in a day."""
    malformed_rate: Rate = 0.002
    """Share of raw rows corrupted on purpose, so that the quarantine is exercised on every run."""
    surfaces: Annotated[tuple[Annotated[str, OneOf(SURFACES)], ...], NonEmpty(), Distinct()] = SURFACES
    """Surfaces that carry traffic: the synthetic world draws impressions on them, and the quarantine rejects
    real rows on any other."""

    def __post_init__(self) -> None:
        validate(self, "world")
        if self.holdout_days >= self.n_days:
            raise ConfigError(
                f"world.holdout_days={self.holdout_days} must be below world.n_days={self.n_days}: "
                "training needs at least one day before the holdout"
            )
        if self.initial_ads < self.n_categories:
            raise ConfigError(
                f"world.n_ads={self.n_ads} with new_ad_fraction={self.new_ad_fraction} leaves {self.initial_ads} "
                f"ads on day one, fewer than world.n_categories={self.n_categories}; raise n_ads"
            )
        if self.start_date > date.max - timedelta(days=self.n_days - 1):
            raise ConfigError(
                f"world.start_date={self.start_date.isoformat()} with world.n_days={self.n_days} "
                f"runs past {date.max.isoformat()}; start the calendar earlier"
            )

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


@dataclass(frozen=True)
class DataConfig:
    """Where bronze comes from: the synthetic world, one real public dataset read in place, or the user's own logs.

    Real datasets are never copied; their rows are laid out on the world's calendar (`world.start_date`,
    `world.n_days`) in their original order.
    """

    source: Annotated[str, OneOf(DATA_SOURCES)] = "synthetic"
    """The synthetic world, a real dataset (docs/datasets.md), or `mapping`: the logs a `mapping` file describes."""
    data_dir: str = ""
    """Where the real datasets are; empty: $GEM_DATA_DIR, else `../shared/data` beside the repository."""
    mapping: str = ""
    """Source `mapping` only: the file (YAML or JSON) that maps the user's own logs onto bronze (docs/datasets.md);
    GEM_SOURCE_MAPPING sets it and the source together."""
    allow_outside_data_root: bool = False
    """Let a mapping read paths outside its data root (the mapping file's folder; the datasets folder for a built-in
    one) once resolved, links followed; off because a mapping may come from anyone."""
    click_rate_bounds: tuple[Fraction, Fraction] = (0.001, 0.8)
    """[low, high] bounds of each surface's click rate in a partition, checked by the label-rate asset check."""
    label_check_min_rows: NonNegativeInt = 500
    """Impressions a surface needs in a partition before the label-rate check judges it."""
    max_row_drop_fraction: Fraction = 0.5
    """Re-landing a bronze partition or dimension with an empty batch, or with more than this fraction fewer rows,
    is refused unless asked (`allow_row_drop`)."""

    def __post_init__(self) -> None:
        validate(self, "data")
        if self.mapping and self.source != "mapping":
            raise ConfigError(
                f"data.mapping={self.mapping!r} is set but data.source={self.source!r}; set data.source "
                "to 'mapping' to read it (GEM_SOURCE_MAPPING sets both)"
            )
        low, high = self.click_rate_bounds
        if low > high:
            raise ConfigError(
                f"data.click_rate_bounds={list(self.click_rate_bounds)}: the low bound exceeds the "
                "high one; give [low, high]"
            )


@dataclass(frozen=True)
class SparseFeature:
    """One categorical feature: raw column `name`, mapped to one of `buckets` embedding rows (row 0: missing).

    Spark computes each value's row into column `<name>_idx` (`gem_lake.features.tables.embedding_row`), so the
    loader and the model never re-implement the mapping. With `hash`, n distinct values in b rows put about
    n^2 / 2b pairs together (5,000 users in 16,384 rows: 27% of them share one; 24 hours in 32: 11 do); with
    `modulo`, integer ids within any range of buckets - 1 never share a row.
    """

    name: Name
    """The raw column; its embedding row is column `<name>_idx`."""
    buckets: Buckets
    """Embedding rows of the feature's table; row 0 is the missing value."""
    side: Literal["user", "ad", "context"]
    """Whose attribute it is: the user and ad towers read their side's features."""
    encoding: Literal["hash", "modulo"] = "hash"
    """`hash`: 1 + pmod(xxhash64(str(v)), buckets - 1), any value; `modulo`: 1 + pmod(v, buckets - 1), integer
    ids (DLRM's mapping), a row each for dense ids."""

    def __post_init__(self) -> None:
        validate(self, f"features.features[{self.name!r}]")

    @property
    def idx_column(self) -> str:
        return f"{self.name}_idx"


@dataclass(frozen=True)
class FeatureSpec:
    """Sparse features and the behaviour sequence, shared by Spark, the loader and the model."""

    features: Annotated[tuple[SparseFeature, ...], NonEmpty()] = (
        # Integer ids by modulo, labels hashed into enough rows that the synthetic world's never share one
        # (tests/unit/gem_lake/test_feature_tables.py checks it): a feature whose values share rows can't tell
        # them apart.
        SparseFeature("user_id", 4096, "user", "modulo"),
        SparseFeature("age_bucket", 64, "user"),
        SparseFeature("country", 64, "user"),
        SparseFeature("device", 16, "user"),
        SparseFeature("ad_id", 2048, "ad", "modulo"),
        SparseFeature("advertiser_id", 512, "ad", "modulo"),
        SparseFeature("category", 64, "ad", "modulo"),
        SparseFeature("ad_format", 16, "ad"),
        SparseFeature("objective", 16, "ad"),
        SparseFeature("surface", 64, "context"),
        # The logged slot: known when training and when scoring logged impressions (teacher
        # logits); null (row 0) where a source does not log it.
        SparseFeature("position", 8, "context", "modulo"),
        # Derived from the impression's `ts` for every source (gold.training_examples.hour_of_day).
        SparseFeature("hour_of_day", 32, "context", "modulo"),
    )
    """The single-valued categorical features, each with its own embedding table (the item table is shared with
    the sequence)."""
    sequence_feature: Name = "seq_item_ids"
    """Column of the behaviour sequence's item ids."""
    sequence_table: str = "ad_id"
    """The feature whose table the sequence's items are looked up in (the target ad shares it)."""
    max_seq_len: Tokens = 256
    """Most recent events a sequence keeps."""
    lookback_days: NonNegativeDays = 14
    """Days of history before the impression's day a sequence reads; 0: only that day's earlier events."""
    action_buckets: Buckets = 16
    """Embedding rows of each event's action (hashed)."""
    age_buckets: Count = 16
    """Buckets of age, floor(log2(1 + minutes)) (bucket 15 is ~23 days), before the instant a timeline's ages count
    to (the impression for a row of its own, the end of the day for a user's timeline of a day): each event's, and
    each impression's own. The clock the timeline arch reads."""
    sequence_item_attributes: Annotated[tuple[str, ...], Distinct()] = ("category",)
    """Ad attributes looked up for every event's item (row 0 when the item is no ad), so attention can match
    history to the candidate by attribute without learning every item's category from its id."""
    domain_feature: str = "surface"
    """The context feature that names the domain: the heads keep a tower per value, and a student per value."""

    def __post_init__(self) -> None:
        validate(self, "features")
        names = [f.name for f in self.features]
        if len(set(names)) != len(names):
            raise ConfigError(f"features: duplicate feature names in {names}")
        if self.sequence_table not in names:
            raise ConfigError(f"features.sequence_table={self.sequence_table!r} is not one of {names}")
        if self.domain_feature not in [f.name for f in self.side("context")]:
            raise ConfigError(f"features.domain_feature={self.domain_feature!r} must name a context feature")
        ad_attributes = [f.name for f in self.side("ad") if f.name != self.sequence_table]
        for name in self.sequence_item_attributes:
            if name not in ad_attributes:
                raise ConfigError(
                    f"features.sequence_item_attributes: {name!r} is not an ad attribute; choose from {ad_attributes}"
                )

    def by_name(self, name: str) -> SparseFeature:
        for f in self.features:
            if f.name == name:
                return f
        raise KeyError(f"unknown sparse feature {name!r}; known: {[f.name for f in self.features]}")

    def side(self, side: str) -> tuple[SparseFeature, ...]:
        return tuple(f for f in self.features if f.side == side)

    @property
    def mapping(self) -> str:
        """Fingerprint of how values map to embedding rows (each feature's buckets and encoding, the sequence's
        columns): the feature tables record it, and rows mapped two ways never meet in a table or a model."""
        rows = {
            "features": [[f.name, f.buckets, f.encoding] for f in self.features],
            "sequence_table": self.sequence_table,
            "action_buckets": self.action_buckets,
            "age_buckets": self.age_buckets,
            "sequence_item_attributes": list(self.sequence_item_attributes),
        }
        return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:10]

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
        """Key order of the model's input KJT: pooled features | target item, sequence | side columns | timeline keys.

        Contiguous groups, so the sparse arch splits one KJT into the EmbeddingBagCollection's,
        the EmbeddingCollection's and the timeline arch's inputs.
        """
        return (
            *(f.name for f in self.pooled_features),
            self.sequence_table,
            self.sequence_feature,
            *self.sequence_side_columns,
            self.event_minutes_key,
            *self.timeline_keys,
        )

    @property
    def event_ts_column(self) -> str:
        """Per event: its timestamp, aligned with `seq_item_idx` (the loader measures ages from it)."""
        return "seq_ts"

    @property
    def sequence_columns(self) -> tuple[str, ...]:
        """Every per-event column a reader of a feature table needs: the item rows, the side columns, the times."""
        return (self.sequence_idx_column, *self.sequence_side_columns, self.event_ts_column)

    @property
    def event_minutes_key(self) -> str:
        """Per event: whole minutes before the instant its timeline's ages count to (not embedded: the timeline arch
        subtracts an impression's own minutes to get how long before the impression the event happened)."""
        return "seq_minutes"

    @property
    def timeline_keys(self) -> tuple[str, str, str, str]:
        """The per-row keys that place each impression row in its timeline (`gem_model.modules.timeline`): 1 where a
        row starts a timeline (its events ride on that row), how many of the timeline's events the impression may
        read, the impression's own age bucket before the instant its events' ages count to, and its whole minutes
        before that instant."""
        return ("timeline_start", "visible", "target_age_idx", "target_minutes")

    @property
    def domain(self) -> SparseFeature:
        return self.by_name(self.domain_feature)

    @property
    def item_feature(self) -> SparseFeature:
        """The feature whose table the sequence shares (the target ad looks up the same rows)."""
        return self.by_name(self.sequence_table)


@dataclass(frozen=True)
class WukongConfig:
    """Wukong interaction layers (arXiv 2403.02545), see `gem_model.modules.wukong`.

    Each layer maps n embeddings to `n_fm` (factorization-machine block) + `n_lc` (linear compress block)
    embeddings. Wukong earns its place as GEM grows: at the scaling ladder's size `l`, MLP layers of the same
    shapes in its place (`model.use_wukong=false`) lose the conversion task on both seeds (docs/MODEL.md, "The
    default's parts").
    """

    n_layers: Count = 2
    """Wukong layers stacked over the feature embeddings."""
    n_fm: Width = 8
    """Embeddings the factorization-machine block makes a layer."""
    n_lc: Width = 8
    """Embeddings the linear compress block makes a layer."""
    rank: Width = 8
    """k, the columns of the low-rank, input-attentive FM projection X (Xᵀ Y)."""
    mlp_dims: tuple[Width, ...] = (128,)
    """Hidden layers of the MLP that maps the FM block's result to its `n_fm` embeddings."""

    def __post_init__(self) -> None:
        validate(self, "model.wukong")


@dataclass(frozen=True)
class SequenceConfig:
    """The timeline arch over the behaviour sequence (`gem_model.modules.timeline`): a user's events encoded once,
    causally, by `layers` jagged attention blocks, then read by each of the user's impressions.

    Each impression's `queries`, made from its candidate ad and context, attend over the encoded events strictly
    before it; with the mean and the `n_recent` newest of those events and a token of match counts they form the
    summary that joins the non-sequential side at the top.
    """

    dim: Width = 32
    """Width of the sequence's tokens; a multiple of `heads`."""
    heads: Width = 2
    """Attention heads."""
    layers: Count = 2
    """Causal attention blocks that encode a user's events (once per timeline, not per impression)."""
    window: NonNegativeTokens = 0
    """Each event attends to itself and at most this many events before it (sliding-window attention, for long
    histories: encoding then costs O(events x window)); 0: every event before it."""
    queries: Width = 2
    """Queries per impression, made from its candidate and context, that attend over its visible events."""
    read_window: NonNegativeTokens = 256
    """The newest visible events an impression's queries attend over, so an impression's cost stays flat however
    long its history (the mean and the match tokens still count every visible event); 0: all of them."""
    n_recent: NonNegativeTokens = 2
    """Newest visible events that join the summary beside their mean."""
    match_candidate: bool = True
    """Embed each item attribute into the impression's queries and the events' keys (one table), so an event that
    shares the candidate's attributes scores high, and add the match tokens: per kind of match (any visible event,
    one sharing the candidate's item or an attribute, and each of those per action), the count and share of
    matching visible events and the newest one's age and decayed recency."""

    def __post_init__(self) -> None:
        validate(self, "model.sequence")
        if self.dim % self.heads:
            raise ConfigError(f"model.sequence.dim={self.dim} must be divisible by heads={self.heads}")


@dataclass(frozen=True)
class ExperimentalConfig:
    """Research options: parts built and measured over the default, none adopted (docs/MODEL.md), each off.

    Kunlun's Mixture of Wukong Experts (arXiv 2602.10016; reading notes in
    docs/experiments/2026-12-04-kunlun-reading-notes.md). Kept so it can be measured again as the model, the data
    or the hardware change.
    """

    wukong_experts: Width = 1
    """Mixture of Wukong Experts: each layer's embeddings split into this many groups, each mixed by its own Wukong
    layer into an equal share of the outputs; 2 are level on two seeds."""

    def __post_init__(self) -> None:
        validate(self, "model.experimental")


@dataclass(frozen=True)
class ModelConfig:
    """The teacher (`architecture="gem"`) or a baseline (`dlrm`, `dcnv2`, `lr`) in the same framework.

    All share the sparse arch and the representation heads (user/ad towers -> `repr_dim` unit vectors);
    gem, dlrm and dcnv2 also the multi-surface multi-task heads (`shared_dims`, then per-surface
    `surface_dims`) and differ in the interaction arch; `lr` (logistic regression) is one linear map of the
    feature embeddings to the logits.
    """

    architecture: Annotated[str, OneOf(ARCHITECTURES)] = "gem"
    """GEM (Wukong and the timeline arch), or a baseline: DLRM, DCN-V2, logistic regression."""
    embedding_dim: Width = 16
    """Width of every embedding row."""
    tower_dims: tuple[Width, ...] = (64,)
    """Hidden layers of the user and ad representation towers."""
    repr_dim: Width = 32
    """Width of the exported, indexed user and ad embeddings (unit vectors)."""
    shared_dims: Annotated[tuple[Width, ...], NonEmpty()] = (128, 64)
    """Layers of the heads' shared tower; the last is the input of every surface tower."""
    surface_dims: tuple[Width] = (32,)
    """The hidden layer of each surface's tower (`gem_model.modules.heads.MultiSurfaceHeads`)."""
    wukong: WukongConfig = field(default_factory=WukongConfig)
    """GEM's interaction layers."""
    sequence: SequenceConfig = field(default_factory=SequenceConfig)
    """GEM's timeline arch over the behaviour sequence."""
    use_wukong: bool = True
    """Ablation: false swaps each Wukong layer for an MLP layer of the same shapes, which loses the conversion task
    at the scaling ladder's size `l` (docs/MODEL.md, "The default's parts")."""
    use_sequence: bool = True
    """Ablation: false drops the timeline arch for the mean of the visible events' items, as the baselines see
    it."""
    experimental: ExperimentalConfig = field(default_factory=ExperimentalConfig)
    """Research options, measured and not adopted, each off."""
    dcn_layers: Width = 3
    """`dcnv2` only: cross layers."""
    dcn_rank: Width = 16
    """`dcnv2` only: rank of each low-rank cross layer."""

    def __post_init__(self) -> None:
        validate(self, "model")
        experimental = self.experimental
        for name in ("n_fm", "n_lc"):
            if getattr(self.wukong, name) % experimental.wukong_experts:
                raise ConfigError(
                    f"model.wukong.{name}={getattr(self.wukong, name)} must be divisible by "
                    f"model.experimental.wukong_experts={experimental.wukong_experts}: each expert "
                    "makes an equal share"
                )


@dataclass(frozen=True)
class TrainConfig:
    """Distributed training (`gem_model.train.trainer`, launched by `jobs.train` under torchrun).

    Embedding rows learn by fbgemm's fused row-wise Adagrad (`sparse_lr`), the dense arches by Adam (`dense_lr`);
    every rank writes a resumable torch.distributed.checkpoint every `checkpoint_every_steps`, and a
    re-launched run continues from the last complete one.
    """

    nproc: Processes = 2
    """Training processes on the node (torchrun --nproc-per-node)."""
    batch_size: BatchRows = 256
    """Examples a process trains on a step."""
    epochs: Epochs = 3
    """Passes over the training days."""
    dense_lr: LearningRate = 3e-3
    """Adam's learning rate for the dense arches (the schedule's start)."""
    dense_lr_schedule: Literal["constant", "cosine"] = "cosine"
    """`cosine` decays the dense learning rate to `dense_lr * min_lr_fraction` over the run (the last steps then
    average out batch noise instead of chasing it); `constant` keeps it."""
    min_lr_fraction: Fraction = 0.1
    """The cosine schedule's floor, as a fraction of `dense_lr`."""
    window_days: NonNegativeDays = 0
    """Train on the last this many days before the holdout (a sliding window; the data axis of
    `python -m bench.research.scaling --window-days`); 0: every day before it."""
    sparse_lr: LearningRate = 0.05
    """Row-wise Adagrad's learning rate for the embedding rows."""
    retrieval_weight: Weight = 0.2
    """Weight of the in-batch retrieval loss that trains the user and ad towers; 0 switches it off."""
    temperature: Temperature = 0.1
    """Temperature of the retrieval loss's in-batch softmax."""
    grad_clip: Positive = 1.0
    """Largest norm of the dense gradients (clipped above it)."""
    checkpoint_every_steps: Count = 100
    """Steps between resumable checkpoints."""
    log_every_steps: Count = 20
    """Steps between rank 0's progress lines (examples/s, ETA, the epoch's mean loss)."""
    bf16: bool = True
    """Autocast the dense forward to bfloat16 on CUDA (ignored on CPU)."""
    compile: bool = False
    """Wrap the dense interaction arch in torch.compile (same logits to 1e-7 on CPU, after ~3 minutes of
    compiling)."""
    seed: Seed = 0
    """Seed of the dense initialisation (the same on every rank) and, plus the rank, of each rank's draws."""

    def __post_init__(self) -> None:
        validate(self, "train")


@dataclass(frozen=True)
class PromotionConfig:
    """The rule that moves `models/LATEST` to a trained teacher (`gem_model.train.promotion.judge`), applied
    alike by the teacher asset and `gem promote`.

    Per task (clicks; conversions where the holdout has both classes), judged only where the task's smaller
    holdout class is large enough to tell. The settings do not rename a teacher: they decide which trained
    version is served, not what it learns.
    """

    # At 300 rows in the smaller class a chance-level model's AUC has a standard error of at most
    # 1 / sqrt(12 * 300) = 0.017, so 0.55 is three of them above chance: a model that learned nothing clears
    # it about once in 700. Fewer rows cannot tell: the real samples' holdouts have 9-190 clicks, where a model
    # that memorises near-unique ids sits at chance.
    min_auc: Annotated[float, Between(0.5, 1)] = 0.55
    """Holdout AUC a task must reach (the floor)."""
    floor_min_class_rows: Count = 300
    """Rows the task's smaller holdout class needs before the floor is applied."""
    # One AUC's standard error is ~0.007 at 2,000 clicks (Hanley & McNeil; 0.015 at the tiny holdout's ~450),
    # and two similar models' AUCs on the same rows differ by about 0.7 of it: a 0.01 drop there is ~2 of
    # those, while at ~450 clicks it would refuse a model as good as the promoted one about one time in six.
    max_auc_regression: Fraction = 0.01
    """Most a task's holdout AUC may fall below the promoted model's on the same holdout."""
    compare_min_class_rows: Count = 2000
    """Rows the task's smaller holdout class needs before the comparison with the promoted model is applied."""

    def __post_init__(self) -> None:
        validate(self, "promotion")


@dataclass(frozen=True)
class IndexConfig:
    """FAISS settings; `factory` is a FAISS index_factory string over inner-product vectors.

    Supported families (`factory_family`): `Flat` (exact), IVF-Flat `IVF<nlist>,Flat`, IVF-PQ
    `IVF<nlist>,PQ<m>` (m one-byte codes a vector; m must divide the vector dimension) and
    `HNSW<M>,Flat`. `nlist` ~ 4 * sqrt(rows) is the usual starting point.
    """

    factory: str = "HNSW32,Flat"
    """FAISS index_factory string: `Flat`, `IVF<nlist>,Flat`, `IVF<nlist>,PQ<m>` or `HNSW<M>,Flat`."""
    recall_k: Count = 10
    """k of the recall@k measured against exact search on every build."""
    recall_queries: Count = 200
    """Queries the recall is measured with."""
    hnsw_ef_search: Count = 64
    """HNSW: candidates a search keeps."""
    nprobe: Count = 32
    """IVF: lists a search scans."""
    # k-means wants >= 39 points a centroid (FAISS warns below, and subsamples above 256): 200k rows
    # cover nlist = 4 * sqrt(N) up to N = 1.6M.
    train_sample: Count = 200_000
    """Most rows the IVF lists and PQ codebooks are k-means trained on, drawn with a fixed seed."""
    exact_below: NonNegativeInt = 10_000
    """Below this many vectors the index is exact (Flat): a graph index buys nothing at that size, and HNSW over
    inner product loses near-duplicate clusters (recall@10 0.0 on the Open Bandit sample's 337 users)."""
    min_recall: Fraction = 0.9
    """The recall@k floor of the index's `recall_floor` asset check."""

    def __post_init__(self) -> None:
        validate(self, "index")
        needed = self.min_train_rows(self.factory)
        if self.train_sample < needed:
            raise ConfigError(
                f"index.train_sample={self.train_sample} is below the {needed} k-means centroids "
                f"index.factory={self.factory!r} trains; raise it to >= {39 * needed} (39 points a centroid) "
                "or use fewer IVF lists"
            )

    @staticmethod
    def factory_family(factory: str) -> str:
        """`flat`, `ivf_flat`, `ivf_pq` or `hnsw`; a ConfigError naming `index.factory` for anything else."""
        head, _, tail = factory.partition(",")
        if factory == "Flat":
            return "flat"
        if IndexConfig._count(head, "HNSW") and tail == "Flat":
            return "hnsw"
        if IndexConfig._count(head, "IVF") and tail == "Flat":
            return "ivf_flat"
        if IndexConfig._count(head, "IVF") and IndexConfig._count(tail, "PQ"):
            return "ivf_pq"
        raise ConfigError(
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
    """Batch scoring and candidate generation (`jobs.score`, the export assets).

    Scoring runs `nproc` processes under torchrun, each streaming its share of the inputs' row groups in
    chunks of `chunk_rows`.
    """

    nproc: Processes = 2
    """Scoring processes on the node (torchrun --nproc-per-node)."""
    chunk_rows: BatchRows = 2048
    """Rows a process scores at once; 2,048 score 20% faster than 4,096 at `small` (the chunk's activations stay
    in cache)."""
    bf16: bool = True
    """Score in bfloat16 where the device multiplies it in hardware (a CUDA GPU, a CPU with AVX512-BF16 or AMX),
    float32 elsewhere: logits move by 0.004 on average, the holdout AUC not at all (docs/BENCHMARKS.md)."""
    user_input_files: Count = 8
    """Files Spark writes the users' scoring input as, so that every rank gets a share."""
    candidates_k: Count = 50
    """Ads per user written to gold.user_ad_candidates."""
    progress_every_chunks: Count = 20
    """Chunks between rank 0's progress lines."""

    def __post_init__(self) -> None:
        validate(self, "export")


@dataclass(frozen=True)
class StudentConfig:
    """Per-surface student models distilled from the teacher (`gem_model.distill`, `jobs.train_student`).

    Students train on the days after the teacher's training window (the world's holdout days) except the last
    `eval_days`, on which they are evaluated; the Student Adapter is fit on the freshest `adapter_days` of that
    training window, never on an evaluation day. A student is an EmbeddingBagCollection over `features` and an
    MLP (`dense_dims`) with a click and a conversion logit, trained with Adam, keeping the weights of the best
    held-out label loss.
    """

    features: Names = (
        "user_id",
        "age_bucket",
        "country",
        "device",
        "ad_id",
        "advertiser_id",
        "category",
        "ad_format",
        "objective",
        "position",
    )
    """The teacher's features a student embeds (not the domain feature: one student per value of it)."""
    embedding_dim: Width = 8
    """Width of a student's embedding rows."""
    dense_dims: tuple[Width, ...] = (64, 32)
    """Hidden layers of a student's MLP."""
    variants: Annotated[tuple[Annotated[str, OneOf(STUDENT_VARIANTS)], ...], NonEmpty(), Distinct()] = (
        "labels",
        "kd",
        "adapter",
    )
    """What is trained (`gem_model.distill.variants`): `labels` only, `kd` (+ distillation from the teacher's
    logits), `adapter` (+ the Student Adapter's targets and the teacher's embeddings), and two ablations."""
    eval_days: Days = 1
    """Last days of the students' window they are evaluated on."""
    adapter_days: Days = 1
    """Freshest training days the Student Adapter is fit on."""
    embedding_lag_days: NonNegativeDays = 0
    """GEM embeddings of an impression on day d are read from the export of day d minus this."""
    batch_size: BatchRows = 128
    """Examples a student trains on a step."""
    epochs: Epochs = 3
    """Passes over the students' training rows (the weights of the best check are kept)."""
    checks_per_epoch: Count = 4
    """Times an epoch the held-out label loss is checked to keep the best weights."""
    validation_fraction: Annotated[float, Between(0, 1, low_open=True, high_open=True)] = 0.1
    """Held-out share of both the students' and the adapter's rows (some rows remain on each side)."""
    lr: LearningRate = 3e-3
    """Adam's learning rate."""
    weight_decay: Weight = 1e-5
    """Adam's L2 penalty on a student's weights."""
    kd_weight: Weight = 1.0
    """Weight of the distillation loss beside the label loss."""
    temperature: Temperature = 1.0
    """Distillation temperature: the teacher's and the student's logits are divided by it."""
    adapter_features: Names = ("ad_id", "advertiser_id")
    """Features whose ids get the adapter's per-id logit offsets."""
    adapter_prior_sds: Annotated[tuple[Positive, ...], NonEmpty()] = (0.05, 0.1, 0.2, 0.5, 1.0)
    """Standard deviations of the Gaussian prior on the adapter's offsets, one chosen per task by held-out log
    loss (the L2 that shrinks ids seen a few times toward zero)."""
    seed: Seed = 0
    """Seed of the students' initialisation and row order."""

    def __post_init__(self) -> None:
        validate(self, "student")
