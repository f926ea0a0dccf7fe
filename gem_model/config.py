"""The one typed configuration of the pipeline.

Spark jobs, the training data loader, the model, the exporters and the Dagster definitions all
read the same frozen `GemConfig`: the synthetic world (`WorldConfig`), the sparse feature
specification that maps raw columns to embedding rows (`FeatureSpec`), the model, training and
index settings. Named presets (`tiny` for tests, `small` for the demo) are the only entry
points; overrides go through `GemConfig.from_dict`, where an unknown key is an error. The
resolved config is saved with every model so an artefact always says how it was made.

Every field is type- and range-checked when a section is built, from JSON or in Python: the type
hints drive one validator (`_convert`), with ranges declared beside the fields as `Annotated`
markers (`Days` is `Annotated[int, Between(1, 3660)]`), so `"compile": "false"`, `"surfaces": "feed"`,
`epochs: 0` or `n_days: 100000000` fail at once with a `ConfigError` naming the dotted key, the value
and what is allowed, instead of misbehaving or failing late. Every number has an upper bound too, far
above any run (a cluster's included) but low enough to catch a typo. A GEM_CONFIG file is read
strictly (`gem_model.documents`): UTF-8 JSON of at most 1 MiB and 50 levels, no key given twice.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import typing
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from gem_model.documents import DocumentError, load_json, read_document

SURFACES: tuple[str, ...] = ("feed", "stories", "reels", "messaging", "offsite")
TASKS: tuple[str, ...] = ("ctr", "cvr")


class ConfigError(ValueError):
    """A configuration value, key or file that cannot be used; the message names the dotted key
    (e.g. `train.epochs`) or the file, the value, and what is allowed."""


# Range and shape markers, declared beside a field: `epochs: Annotated[int, Between(1, 10_000)]`.
@dataclass(frozen=True)
class Between:
    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def admits(self, value: Any) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        return f"in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"


@dataclass(frozen=True)
class OneOf:
    """A string that is one of `values` (for names kept in a tuple constant rather than a Literal)."""

    values: tuple[str, ...]

    def admits(self, value: Any) -> bool:
        return value in self.values

    def __str__(self) -> str:
        return f"one of {list(self.values)}"


@dataclass(frozen=True)
class NonEmpty:
    def admits(self, value: Any) -> bool:
        return len(value) > 0

    def __str__(self) -> str:
        return "non-empty"


@dataclass(frozen=True)
class Distinct:
    def admits(self, value: Any) -> bool:
        return len(set(value)) == len(value)

    def __str__(self) -> str:
        return "without duplicates"


# Every number is bounded above: far beyond any run of this pipeline, a cluster's included, yet low enough
# that a typo (an extra zero, a value meant for another key) fails here, not minutes into a run
# (`n_days: 100000000` took two minutes to end in an OverflowError of the calendar).
INT32_MAX = 2**31 - 1  # Spark int columns, tensor sizes and counts: beyond it something overflows
Count = Annotated[int, Between(1, INT32_MAX)]  # world sizes, rows, samples, steps, files, k
NonNegativeInt = Annotated[int, Between(0, INT32_MAX)]
Days = Annotated[int, Between(1, 3660)]  # ten years of daily partitions
NonNegativeDays = Annotated[int, Between(0, 3660)]
Processes = Annotated[int, Between(1, 4096)]  # processes on one node (torchrun --nproc-per-node)
Epochs = Annotated[int, Between(1, 10_000)]
BatchRows = Annotated[int, Between(1, 1 << 24)]  # rows one process holds at once (a batch, a chunk)
Width = Annotated[int, Between(1, 65_536)]  # dims, heads, ranks, experts, layers, CLS tokens
Tokens = Annotated[int, Between(1, 1 << 20)]  # sequence lengths, tokens a layer keeps
NonNegativeTokens = Annotated[int, Between(0, 1 << 20)]
Seed = Annotated[int, Between(0, 2**32 - 1)]  # fits every RNG here (torch, NumPy, a Spark bigint), + rank too
Buckets = Annotated[int, Between(2, INT32_MAX)]  # values land in rows 1..buckets-1; row 0 is the missing value
LearningRate = Annotated[float, Between(0, 10, low_open=True)]
Temperature = Annotated[float, Between(0, 100, low_open=True)]
Weight = Annotated[float, Between(0, 1000)]  # loss weights and penalties (weight decays)
Positive = Annotated[float, Between(0, 1_000_000, low_open=True)]  # rates and scales
Fraction = Annotated[float, Between(0, 1)]
Rate = Annotated[float, Between(0, 1, high_open=True)]  # a share of rows that must leave some rows alone
Name = Annotated[str, NonEmpty()]
Names = Annotated[tuple[Name, ...], NonEmpty(), Distinct()]


# The validator: type hints say what a field is, `Annotated` markers what range it may take.
def _validate(obj: Any, where: str) -> None:
    """Type- and range-check every field of a config dataclass from its type hints; called by each
    `__post_init__`, so direct construction in Python is checked like JSON. Normalises in place what
    JSON cannot say exactly (a list for a tuple, an ISO string for a date, an int for a float)."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        converted = _convert(value, hints[f.name], _join(where, f.name))
        if converted is not value:
            object.__setattr__(obj, f.name, converted)


def _convert(value: Any, hint: Any, where: str) -> Any:
    """`value` checked against `hint` (and its markers) and normalised; a ConfigError naming `where` otherwise."""
    kind, marks = _split(hint)
    origin = typing.get_origin(kind)

    def wrong_type() -> ConfigError:
        return ConfigError(f"{where}={_show(value)}: must be {_describe(hint)}, not {_kind(value)}")

    if kind is bool:
        if not isinstance(value, bool):
            raise wrong_type()
        out = value
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong_type()
        out = value
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong_type()
        out = float(value)
        if not math.isfinite(out):
            raise ConfigError(f"{where}={_show(value)}: must be {_describe(hint)} (a finite number)")
    elif kind is str:
        if not isinstance(value, str):
            raise wrong_type()
        out = value
    elif kind is date:
        if isinstance(value, str):
            try:
                out = date.fromisoformat(value)
            except ValueError:
                raise ConfigError(f"{where}={_show(value)}: must be {_describe(hint)}") from None
        elif isinstance(value, date) and not isinstance(value, datetime):
            out = value
        else:
            raise wrong_type()
    elif origin is Literal:
        if not any(type(value) is type(choice) and value == choice for choice in typing.get_args(kind)):
            raise ConfigError(f"{where}={_show(value)}: must be {_describe(hint)}")
        out = value
    elif origin is tuple:
        # A string is a sequence too, but never a tuple field's value: "feed" is not ("feed",).
        if not isinstance(value, (list, tuple)):
            raise wrong_type()
        args = typing.get_args(kind)
        if len(args) == 2 and args[1] is Ellipsis:
            elements = (args[0],) * len(value)
        elif len(value) != len(args):
            raise ConfigError(f"{where}={_show(value)}: must be {_describe(hint)}, not an array of {len(value)}")
        else:
            elements = args
        out = tuple(_convert(v, h, f"{where}[{i}]") for i, (h, v) in enumerate(zip(elements, value)))
        if isinstance(value, tuple) and all(a is b for a, b in zip(out, value)):
            out = value
    elif dataclasses.is_dataclass(kind):
        if isinstance(value, dict):
            out = _build(kind, value, where)
        elif isinstance(value, kind):
            out = value
        else:
            raise wrong_type()
    else:  # a field type this validator does not know: a programming error, not a user's
        raise TypeError(f"{where}: unsupported config field type {kind!r}")
    for mark in marks:
        if not mark.admits(out):
            raise ConfigError(f"{where}={_show(value)}: must be {_describe(hint)}")
    return out


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    """A `cls` from a complete JSON object (an element of a tuple of dataclasses, e.g. a SparseFeature)."""
    hints, fields = _hints(cls), dataclasses.fields(cls)
    names = {f.name for f in fields}
    unknown = sorted(set(data) - names)
    missing = [f.name for f in fields if f.name not in data
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if unknown or missing:
        raise ConfigError(f"{_in(where)}: " + "; ".join(
            ([f"unknown key(s) {unknown}"] if unknown else []) + ([f"missing key(s) {missing}"] if missing else []))
            + f"; valid keys are {sorted(names)}")
    return cls(**{k: _convert(v, hints[k], _join(where, k)) for k, v in data.items()})


def _describe(hint: Any) -> str:
    """What a hint allows, in the words of a JSON file: `an integer in [1, 3660]`, `true or false (a JSON
    boolean)`."""
    kind, marks = _split(hint)
    origin = typing.get_origin(kind)
    bounds = " and ".join(str(m) for m in marks if isinstance(m, Between))
    if kind is bool:
        return "true or false (a JSON boolean)"
    if kind is int:
        return f"an integer {bounds}".rstrip()
    if kind is float:
        return f"a number {bounds}".rstrip()
    if kind is str:
        choices = [m for m in marks if isinstance(m, OneOf)]
        if choices:
            return str(choices[0])
        return "a non-empty string" if any(isinstance(m, NonEmpty) for m in marks) else "a string"
    if kind is date:
        return "an ISO date string (YYYY-MM-DD)"
    if origin is Literal:
        return f"one of {list(typing.get_args(kind))}"
    if origin is tuple:
        args = typing.get_args(kind)
        non_empty = "non-empty " if any(isinstance(m, NonEmpty) for m in marks) else ""
        distinct = " without duplicates" if any(isinstance(m, Distinct) for m in marks) else ""
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a {non_empty}JSON array{distinct}, each element {_describe(args[0])}"
        each = {_describe(a) for a in args}
        if len(args) == 1:
            return f"a JSON array of exactly one element, {each.pop()}"
        if len(each) == 1:
            return f"a JSON array of exactly {len(args)} elements{distinct}, each {each.pop()}"
        return f"a JSON array of exactly {len(args)} elements: " + ", ".join(_describe(a) for a in args)
    if dataclasses.is_dataclass(kind):
        return f"a JSON object of {kind.__name__} settings"
    return repr(kind)


def _kind(value: Any) -> str:
    if dataclasses.is_dataclass(value):
        return f"a {type(value).__name__}"
    for types, name in ((bool, "a boolean"), (int, "an integer"), (float, "a float"), (str, "a string"),
                        ((list, tuple), "an array"), (dict, "an object"), (type(None), "null")):
        if isinstance(value, types):
            return name
    return f"a {type(value).__name__}"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, include_extras=True)


def _split(hint: Any) -> tuple[Any, tuple[Any, ...]]:
    """(type, markers) of a possibly `Annotated` hint."""
    if typing.get_origin(hint) is Annotated:
        return hint.__origin__, hint.__metadata__
    return hint, ()


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _in(where: str) -> str:
    """How structural errors (unknown or missing keys) name a section: `config.world`, `config`."""
    return f"config.{where}" if where else "config"


@dataclass(frozen=True)
class WorldConfig:
    """The calendar and, for the synthetic world, its size, seed and dynamics (`jobs.features.world`).

    The calendar (`start_date`, `n_days`, `holdout_days`) is shared by every data source: the teacher
    trains on the days before the holdout and is measured on the holdout. The synthetic world goes on
    after them when `open_ended` (the default): every later day exists, as the world stood on its
    last configured day, up to the last day that has ended (`GemConfig.calendar_end`), so the daily
    schedule builds each new day and the sensor exports it with the promoted model. Users and
    ads arrive over the days (`new_user_fraction`, `new_ad_fraction`: cold start); a user's daily
    event count is log-normal around `events_per_user_day` with spread `activity_sigma`, which
    gives heavy-tailed sequences; `malformed_rate` of the raw rows are corrupted on purpose so the
    quarantine is exercised on every run.
    """

    seed: Seed = 7
    start_date: date = date(2026, 11, 1)
    n_days: Days = 6
    # At least one day: the teacher's metrics and the export are computed on the holdout.
    holdout_days: Days = 2
    open_ended: bool = True  # synthetic world only: a real dataset's calendar ends with its files
    n_users: Count = 400
    n_ads: Count = 120
    n_categories: Count = 12
    n_advertisers: Count = 30
    campaigns_per_advertiser: Count = 3
    new_user_fraction: Rate = 0.15
    new_ad_fraction: Rate = 0.25
    impressions_per_day: Count = 3000
    events_per_user_day: Positive = 4.0
    # The log-normal's spread: at 10 a user two sigmas up is already e^20 times as active as the median.
    activity_sigma: Annotated[float, Between(0, 10)] = 1.6
    max_events_per_user_day: Count = 2000
    malformed_rate: Rate = 0.002
    # Any non-empty subset of SURFACES: the synthetic world has a traffic share for each of them
    # (jobs.features.world), the real sources map onto them, and the quarantine rejects the rest.
    surfaces: Annotated[tuple[Annotated[str, OneOf(SURFACES)], ...], NonEmpty(), Distinct()] = SURFACES

    def __post_init__(self) -> None:
        _validate(self, "world")
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
            raise ConfigError(f"world.start_date={self.start_date.isoformat()} with world.n_days={self.n_days} "
                              f"runs past {date.max.isoformat()}; start the calendar earlier")

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


# Model configs (GEM_CONFIG files) for built-in datasets whose own fields are features: <source>.json.
DATASET_CONFIGS = Path(__file__).with_name("configs")
DATA_SOURCES: tuple[str, ...] = ("synthetic", "taobao", "ali_ccp", "aliexpress", "criteo", "open_bandit", "frappe",
                                 "movielens", "mapping")


@dataclass(frozen=True)
class DataConfig:
    """Where bronze comes from: the synthetic world, or one real public dataset read in place.

    Real datasets are read from `data_dir` (empty: $GEM_DATA_DIR, else `../shared/data` beside the
    repository) and never copied into it; their rows are laid out on the world's calendar
    (`world.start_date`, `world.n_days`) in their original order.
    """

    source: str = "synthetic"
    data_dir: str = ""
    # source "mapping": the user's own logs mapped onto bronze by this file (YAML or JSON; docs/datasets.md).
    mapping: str = ""
    # A mapping's paths must lie inside its data root (the mapping file's folder; the datasets folder for a
    # built-in one) once resolved, links followed: a mapping may come from anyone. True lifts that rule.
    allow_outside_data_root: bool = False
    # The label-rate check: per-surface click rate must lie in these bounds, judged only on
    # surfaces with at least `label_check_min_rows` impressions in the partition.
    click_rate_bounds: tuple[Fraction, Fraction] = (0.001, 0.8)
    label_check_min_rows: NonNegativeInt = 500
    # The landing's row-drop guard: re-landing a bronze partition (or dimension) that has rows with an
    # empty batch, or with more than this fraction fewer rows, is refused unless asked (allow_row_drop).
    max_row_drop_fraction: Fraction = 0.5

    def __post_init__(self) -> None:
        _validate(self, "data")
        if self.source not in DATA_SOURCES:
            raise ConfigError(f"data.source={self.source!r} is not one of {list(DATA_SOURCES)}")
        if self.mapping and self.source != "mapping":
            raise ConfigError(f"data.mapping={self.mapping!r} is set but data.source={self.source!r}; set data.source "
                              "to 'mapping' to read it (GEM_SOURCE_MAPPING sets both)")
        low, high = self.click_rate_bounds
        if low > high:
            raise ConfigError(f"data.click_rate_bounds={list(self.click_rate_bounds)}: the low bound exceeds the "
                              "high one; give [low, high]")


@dataclass(frozen=True)
class SparseFeature:
    """One categorical feature: raw column `name`, mapped to one of `buckets` embedding rows (row 0: missing).

    Spark computes each value's row into column `<name>_idx` (`jobs.features.tables.embedding_row`), so the
    loader and the model never re-implement the mapping. `encoding`:
    - `hash`: 1 + pmod(xxhash64(str(v)), buckets - 1). Any value, no vocabulary, but distinct values can
      share a row: n values in b rows put about n^2 / 2b pairs together (5,000 users in 16,384 rows: 27% of
      them share one; 24 hours in 32: 11 do).
    - `modulo`: 1 + pmod(v, buckets - 1), for integer ids (DLRM's mapping): ids within any range of
      buckets - 1 never share a row, so dense ids (the synthetic world's, from 1) get one each.
    """

    name: Name
    buckets: Buckets
    side: Literal["user", "ad", "context"]
    encoding: Literal["hash", "modulo"] = "hash"

    def __post_init__(self) -> None:
        _validate(self, f"features.features[{self.name!r}]")

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
    # The behaviour sequence holds item (ad) ids, looked up in the `ad_id` table.
    sequence_feature: Name = "seq_item_ids"
    sequence_table: str = "ad_id"
    max_seq_len: Tokens = 256
    # 0: only the impression day's earlier events.
    lookback_days: NonNegativeDays = 14
    # Per event, beside the item: its action (hashed) and its age before the impression, in
    # buckets of log2(1 + minutes) (bucket 15 is ~23 days), the clock the sequence arch reads.
    action_buckets: Buckets = 16
    age_buckets: Count = 16
    # Ad attributes looked up for every event's item (silver.ad_features, row 0 when the item is no ad
    # there), hashed like the target's own: attention can then match history to the candidate by
    # category without first learning every item's category from its id.
    sequence_item_attributes: Annotated[tuple[str, ...], Distinct()] = ("category",)
    # The context feature that names the domain: the heads keep a tower per value.
    domain_feature: str = "surface"

    def __post_init__(self) -> None:
        _validate(self, "features")
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
                raise ConfigError(f"features.sequence_item_attributes: {name!r} is not an ad attribute; "
                                 f"choose from {ad_attributes}")

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
        rows = {"features": [[f.name, f.buckets, f.encoding] for f in self.features],
                "sequence_table": self.sequence_table, "action_buckets": self.action_buckets,
                "age_buckets": self.age_buckets, "sequence_item_attributes": list(self.sequence_item_attributes)}
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


ARCHITECTURES: tuple[str, ...] = ("gem", "dlrm", "dcnv2", "lr")


@dataclass(frozen=True)
class WukongConfig:
    """Wukong interaction layers (arXiv 2403.02545), see `gem_model.modules.wukong`.

    Each layer maps n embeddings to `n_fm` (factorization-machine block) + `n_lc` (linear
    compress block) embeddings; `rank` is k, the columns of the low-rank FM projection, made
    input-attentive when `attentive`.
    """

    n_fm: Width = 8
    n_lc: Width = 8
    rank: Width = 8
    mlp_dims: tuple[Width, ...] = (128,)
    attentive: bool = True
    # Kunlun's Mixture of Wukong Experts: each layer's embeddings split into n_experts contiguous groups,
    # each mixed by its own Wukong layer into an equal share of the n_fm + n_lc outputs.
    n_experts: Width = 1

    def __post_init__(self) -> None:
        _validate(self, "model.wukong")
        for name in ("n_fm", "n_lc"):
            if getattr(self, name) % self.n_experts:
                raise ConfigError(f"model.wukong.{name}={getattr(self, name)} must be divisible by "
                                  f"n_experts={self.n_experts}: each expert makes an equal share")


@dataclass(frozen=True)
class SequenceConfig:
    """The pyramid of jagged attention layers over the behaviour sequence (`gem_model.modules.sequence`).

    `pyramid[i]` is how many of the most recent tokens layer i keeps (the rest are pooled into
    one summary token), so the layer count is `len(pyramid)`; `activation` is the generalized
    dot-product attention's (softmax, or a pointwise one: HSTU's silu, Kunlun's gelu, relu2, identity).
    `window` > 0 makes attention sliding-window (a token sees the tokens at most `window` positions
    away, the CLS tokens see and are seen by all) in each layer whose rows can be longer than
    2 * window + 1: the pyramid's lower layers. `n_cls` CLS tokens carry the non-sequential summary in;
    `n_recent` most recent tokens go into the sequence summary. `candidate_token` appends the target ad to
    every row as one more global token, embedded by the events' own tokenizer (item projection and attribute
    tables), whose output joins the summary: the target-aware attention of HSTU and DIN, where "an event of
    the candidate's category" is a match of equal embedding rows instead of a map learnt from the CLS tokens.
    `match_candidate` adds to each event's token a learned row for whether each of its item attributes
    (`features.sequence_item_attributes`) equals the target ad's: the match is then read off the token, so the
    summary's mean token carries the share of the history that matches and attention can find the matches
    (on by default since it closed 73% of DLRM's click-AUC gap to the learnable ceiling against 53% without;
    docs/MODEL.md). `summary_mean` is what that mean token averages: the layer's `kept` tokens (its newest
    `pyramid[i]` and one mean of the rest, so the newest weigh most) or its whole `level` (every token it
    attended over: at the first layer the whole history, so the share of it that matches is exact).

    Kunlun's parts (arXiv 2602.10016; docs/KUNLUN_NOTES.md): `pffn="gdpa"` replaces the low-rank
    personalised FFN by generalized dot-product attention of every token to `pffn_kv` keys and values
    made from the non-sequential side (`pffn_activation`); `summary="hsp"` replaces the summary's mean
    and recent tokens by Hierarchical Seed Pooling (`hsp_seeds` learned queries over the row, compressed
    to `hsp_tokens` by a SumKronLinear of rank `hsp_rank`); `comp_skip` skips the self-attention of every
    other layer (the first, third, ...), which then only personalises and summarises its tokens.
    `keep_by="importance"` allocates the upper layers' compute by event: each layer keeps the tokens a
    learned score ranks highest instead of the newest (our reading of event-level personalization,
    which Kunlun describes as compute per event type).
    """

    dim: Width = 32
    heads: Width = 2
    # At least one layer, each keeping >= 1 token.
    pyramid: Annotated[tuple[Tokens, ...], NonEmpty()] = (64, 16)
    activation: Literal["softmax", "silu", "gelu", "relu2", "identity"] = "softmax"
    causal: bool = False
    window: NonNegativeTokens = 0  # 0: every layer attends to the whole row
    n_cls: Width = 2
    n_recent: NonNegativeTokens = 2
    pffn: Literal["lowrank", "gdpa"] = "lowrank"
    pffn_rank: Width = 8
    pffn_kv: Width = 16
    pffn_activation: Literal["silu", "gelu", "relu2", "identity"] = "gelu"
    summary: Literal["mean_recent", "hsp"] = "mean_recent"
    summary_mean: Literal["kept", "level"] = "kept"
    hsp_seeds: Width = 32
    hsp_tokens: Width = 4
    hsp_rank: Width = 4
    comp_skip: bool = False
    keep_by: Literal["recency", "importance"] = "recency"
    # Dropout on each attention block's residual branches (attention and FFN outputs) while training.
    dropout: Fraction = 0.0
    candidate_token: bool = False
    match_candidate: bool = True

    def __post_init__(self) -> None:
        _validate(self, "model.sequence")
        if self.dim % self.heads:
            raise ConfigError(f"model.sequence.dim={self.dim} must be divisible by heads={self.heads}")
        if self.comp_skip and (len(self.pyramid) < 2 or self.summary != "hsp"):
            raise ConfigError(f"model.sequence.comp_skip needs at least 2 pyramid layers (got {len(self.pyramid)}) "
                              f"and summary='hsp' (got {self.summary!r}): a layer without self-attention "
                              "summarises its tokens by seed pooling")


@dataclass(frozen=True)
class ModelConfig:
    """The teacher (`architecture="gem"`) or a baseline (`dlrm`, `dcnv2`, `lr`) in the same framework.

    All share the sparse arch and the representation heads (user/ad towers -> `repr_dim` unit
    vectors); gem, dlrm and dcnv2 also the multi-surface multi-task heads (`shared_dims`, then
    per-surface `surface_dims`) and differ in the interaction arch; `lr` (logistic regression) is one
    linear map of the feature embeddings to the logits. `use_wukong` and `use_sequence` switch GEM's parts
    off for ablations (see gem_model.models.gem); `interleave` exchanges summaries between Wukong and the
    pyramid at every layer (InterFormer), off by default since the match rows made it level on clicks and a
    loss on conversions (docs/MODEL.md, "The default's parts").
    """

    architecture: str = "gem"
    embedding_dim: Width = 16
    tower_dims: tuple[Width, ...] = (64,)
    repr_dim: Width = 32
    # The last shared layer is the input of every surface tower.
    shared_dims: Annotated[tuple[Width, ...], NonEmpty()] = (128, 64)
    # One hidden layer a surface tower (gem_model.modules.heads.MultiSurfaceHeads).
    surface_dims: tuple[Width] = (32,)
    tasks: tuple[str, ...] = TASKS
    wukong: WukongConfig = field(default_factory=WukongConfig)
    sequence: SequenceConfig = field(default_factory=SequenceConfig)
    use_wukong: bool = True
    use_sequence: bool = True
    interleave: bool = False
    dcn_layers: Width = 3
    dcn_rank: Width = 16

    def __post_init__(self) -> None:
        _validate(self, "model")
        if self.architecture not in ARCHITECTURES:
            raise ConfigError(f"model.architecture={self.architecture!r} is not one of {list(ARCHITECTURES)}")
        if self.tasks != TASKS:
            raise ConfigError(f"model.tasks={self.tasks} must be {TASKS}: the heads model the funnel (ESMM)")
        if self.sequence.pffn == "gdpa" and not self.interleave:
            raise ConfigError("model.sequence.pffn='gdpa' personalises the events from the non-sequential side, "
                              "which reaches only an interleaved pyramid: set model.interleave=true as well")


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

    nproc: Processes = 2
    batch_size: BatchRows = 256
    epochs: Epochs = 3
    dense_lr: LearningRate = 3e-3
    dense_lr_schedule: Literal["constant", "cosine"] = "cosine"
    min_lr_fraction: Fraction = 0.1
    # Train on the last `window_days` days before the holdout (0: every day before it): a sliding training window,
    # and the data axis of the scaling study (`bench/scaling.py --window-days`).
    window_days: NonNegativeDays = 0
    # AdamW's decoupled weight decay on the dense arches (0: plain Adam).
    dense_weight_decay: Weight = 0.0
    sparse_lr: LearningRate = 0.05
    # L2 on the embedding rows, added to each looked-up row's gradient by fbgemm's fused row-wise Adagrad (once a
    # batch, so a row's penalty grows with how often it is seen, as a per-example L2 does). 0: none.
    sparse_weight_decay: Weight = 0.0
    # 0 switches the in-batch retrieval loss off.
    retrieval_weight: Weight = 0.2
    temperature: Temperature = 0.1
    grad_clip: Positive = 1.0
    checkpoint_every_steps: Count = 100
    log_every_steps: Count = 20
    bf16: bool = True
    compile: bool = False
    seed: Seed = 0

    def __post_init__(self) -> None:
        _validate(self, "train")


@dataclass(frozen=True)
class PromotionConfig:
    """The rule that moves `models/LATEST` to a trained teacher (`gem_model.train.promotion.judge`), applied
    alike by the teacher asset and `gem promote`.

    Per task (clicks; conversions where the holdout has both classes), judged only where the task's smaller
    holdout class is large enough to tell: the holdout AUC must reach `min_auc` (where that class has at least
    `floor_min_class_rows` rows), and must not fall more than `max_auc_regression` below the promoted model's
    on the same holdout (where it has at least `compare_min_class_rows`). The settings do not rename a
    teacher: they decide which trained version is served, not what it learns.
    """

    # At 300 rows in the smaller class a chance-level model's AUC has a standard error of at most
    # 1 / sqrt(12 * 300) = 0.017, so 0.55 is three of them above chance: a model that learned nothing clears
    # it about once in 700. Fewer rows cannot tell: the real samples' holdouts have 9-190 clicks, where a model
    # that memorises near-unique ids sits at chance.
    min_auc: Annotated[float, Between(0.5, 1)] = 0.55
    floor_min_class_rows: Count = 300
    # One AUC's standard error is ~0.007 at 2,000 clicks (Hanley & McNeil; 0.015 at the tiny holdout's ~450),
    # and two similar models' AUCs on the same rows differ by about 0.7 of it: a 0.01 drop there is ~2 of
    # those, while at ~450 clicks it would refuse a model as good as the promoted one about one time in six.
    max_auc_regression: Fraction = 0.01
    compare_min_class_rows: Count = 2000

    def __post_init__(self) -> None:
        _validate(self, "promotion")


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
    recall_k: Count = 10
    recall_queries: Count = 200
    hnsw_ef_search: Count = 64
    nprobe: Count = 32
    # k-means wants >= 39 points a centroid (FAISS warns below, and subsamples above 256): 200k rows
    # cover nlist = 4 * sqrt(N) up to N = 1.6M.
    train_sample: Count = 200_000
    # Below this many vectors the index is exact (Flat): a graph index buys nothing at that size,
    # and HNSW over inner product loses near-duplicate clusters (users with equal features:
    # recall@10 0.0 on the Open Bandit sample's 337 users).
    exact_below: NonNegativeInt = 10_000
    min_recall: Fraction = 0.9

    def __post_init__(self) -> None:
        _validate(self, "index")
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
    """Batch scoring and candidate generation (`jobs/score.py`, the export assets).

    Scoring runs `nproc` processes under torchrun, each streaming its share of the inputs' row
    groups in chunks of `chunk_rows`; the users' scoring input is written by Spark as
    `user_input_files` files so that every rank gets a share. `candidates_k` ads per user go to
    gold.user_ad_candidates. `bf16` autocasts the scoring forward to bfloat16 where the device
    multiplies it in hardware (a CUDA GPU, or a CPU with AVX512-BF16 or AMX), float32 elsewhere:
    logits move by 0.004 on average and the holdout AUC not at all (docs/BENCHMARKS.md).
    """

    nproc: Processes = 2
    # 2,048 rows score 20% faster than 4,096 at `small` (the chunk's activations stay in cache).
    chunk_rows: BatchRows = 2048
    bf16: bool = True
    user_input_files: Count = 8
    candidates_k: Count = 50
    progress_every_chunks: Count = 20

    def __post_init__(self) -> None:
        _validate(self, "export")


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

    features: Names = ("user_id", "age_bucket", "country", "device", "ad_id", "advertiser_id",
                       "category", "ad_format", "objective", "position")
    embedding_dim: Width = 8
    dense_dims: tuple[Width, ...] = (64, 32)
    variants: Annotated[tuple[str, ...], Distinct()] = ("labels", "kd", "adapter")
    eval_days: Days = 1
    adapter_days: Days = 1
    embedding_lag_days: NonNegativeDays = 0
    batch_size: BatchRows = 128
    epochs: Epochs = 3
    checks_per_epoch: Count = 4
    # Both the students' and the adapter's held-out share: some rows must remain on each side.
    validation_fraction: Annotated[float, Between(0, 1, low_open=True, high_open=True)] = 0.1
    lr: LearningRate = 3e-3
    weight_decay: Weight = 1e-5
    kd_weight: Weight = 1.0
    temperature: Temperature = 1.0
    adapter_features: Names = ("ad_id", "advertiser_id")
    adapter_prior_sds: Annotated[tuple[Positive, ...], NonEmpty()] = (0.05, 0.1, 0.2, 0.5, 1.0)
    seed: Seed = 0

    def __post_init__(self) -> None:
        _validate(self, "student")
        unknown = [v for v in self.variants if v not in STUDENT_VARIANTS]
        if unknown or not self.variants:
            raise ConfigError(f"student.variants={self.variants} must be a non-empty subset of {STUDENT_VARIANTS}")


# GemConfig sections read only after the teacher is trained.
DOWNSTREAM_SECTIONS: frozenset[str] = frozenset({"promotion", "index", "export", "student"})
# Settings that never change what a teacher learns from (how data lands; whether the calendar goes on after
# the configured days): they do not rename it.
LANDING_GUARDS: dict[str, tuple[str, ...]] = {"data": ("max_row_drop_fraction", "allow_outside_data_root"),
                                              "world": ("open_ended",)}
# Settings added after teachers were named (nested like the config), each with the value that reproduces the
# teachers trained before it: hashed only when set away from that value, so that every existing name stays, and
# filled in where a saved config lacks them (`with_later_settings`), so that those teachers load as they were
# trained even after a setting's default has moved on.
LATER_SETTINGS: dict[str, Any] = {
    "data": {"mapping": ""},
    "train": {"dense_weight_decay": 0.0, "sparse_weight_decay": 0.0, "window_days": 0},
    "model": {
        "sequence": {"window": 0, "pffn": "lowrank", "pffn_kv": 16, "pffn_activation": "gelu",
                     "summary": "mean_recent", "summary_mean": "kept", "hsp_seeds": 32, "hsp_tokens": 4, "hsp_rank": 4,
                     "comp_skip": False,
                     "keep_by": "recency", "dropout": 0.0, "candidate_token": False,
                     "match_candidate": False},
        "wukong": {"n_experts": 1},
    },
}


def _without_defaults(values: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """`values` less each key of `defaults` (recursively) that still holds its default."""
    kept = {}
    for key, value in values.items():
        if key in defaults and isinstance(defaults[key], dict):
            kept[key] = _without_defaults(value, defaults[key])
        elif key not in defaults or value != defaults[key]:
            kept[key] = value
    return kept


def with_later_settings(values: dict[str, Any], later: dict[str, Any] = LATER_SETTINGS) -> dict[str, Any]:
    """A saved config `values` with each setting of `later` it lacks (recursively) set to its `later` value."""
    filled = dict(values)
    for key, value in later.items():
        if isinstance(value, dict):
            filled[key] = with_later_settings(values.get(key, {}), value)
        elif key not in values:
            filled[key] = value
    return filled


@dataclass(frozen=True)
class GemConfig:
    preset: str = "tiny"
    world: WorldConfig = field(default_factory=WorldConfig)
    data: DataConfig = field(default_factory=DataConfig)
    features: FeatureSpec = field(default_factory=FeatureSpec)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    promotion: PromotionConfig = field(default_factory=PromotionConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    student: StudentConfig = field(default_factory=StudentConfig)

    def __post_init__(self) -> None:
        _validate(self, "")
        # The student calendar (world.holdout_days > student.eval_days) is checked where students are
        # trained (`gem_model.distill.data.StudentCalendar`): a teacher-only world with one holdout day is valid.
        train_days = self.world.n_days - self.world.holdout_days
        if self.train.window_days > train_days:
            raise ConfigError(
                f"train.window_days={self.train.window_days} is more than the {train_days} days before the holdout "
                f"(world.n_days - world.holdout_days); set it to at most {train_days}, or 0 for every day"
            )
        st, names = self.student, [f.name for f in self.features.features]
        for group in ("features", "adapter_features"):
            bad = [f for f in getattr(st, group) if f not in names or f == self.features.domain_feature]
            if bad or not getattr(st, group):
                raise ConfigError(
                    f"student.{group}={getattr(st, group)}: {bad or 'empty'}; each must name a features.features "
                    f"entry other than the domain feature {self.features.domain_feature!r} (one student per "
                    f"value of it); choose from {[n for n in names if n != self.features.domain_feature]}"
                )

    @staticmethod
    def from_preset(name: str) -> GemConfig:
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return PRESETS[name]

    @staticmethod
    def load(preset: str, overrides_path: str | None = None, data_source: str | None = None,
             mapping: str | None = None) -> GemConfig:
        """A preset, optionally overridden by a JSON file of (partial) nested settings, then by `data_source`,
        then by a source `mapping` file (which makes the source "mapping").

        Any problem with the file (missing, empty, not JSON, not an object, a bad key or value) is a
        `ConfigError` whose message starts with the file's path.
        """
        cfg = GemConfig.from_preset(preset)
        if overrides_path:
            overrides = _read_overrides(Path(overrides_path))
            try:
                cfg = GemConfig.from_dict(overrides, base=cfg)
            except ConfigError as e:
                raise ConfigError(f"config file {overrides_path}: {e}") from None
        if data_source:
            try:
                cfg = GemConfig.from_dict({"data": {"source": data_source}}, base=cfg)
            except ConfigError as e:
                raise ConfigError(f"data source {data_source!r} (GEM_DATA_SOURCE or --data-source): {e}") from None
        if mapping:
            cfg = GemConfig.from_dict({"data": {"source": "mapping", "mapping": mapping}}, base=cfg)
        return cfg

    @staticmethod
    def from_env() -> GemConfig:
        """The config the environment names (`ConfigSources.from_env`)."""
        return ConfigSources.from_env().load()

    def to_dict(self) -> dict[str, Any]:
        return _to_jsonable(dataclasses.asdict(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @staticmethod
    def from_dict(data: dict[str, Any], base: GemConfig | None = None) -> GemConfig:
        """Build a config from (possibly partial) nested dicts over `base`; unknown keys and values of
        the wrong type or out of range raise a `ConfigError` naming the dotted key."""
        return _merge(base or GemConfig(), data, "")

    @property
    def calendar_end(self) -> date | None:
        """The last day of the calendar: None (open: up to the last day that has ended) for the synthetic
        world when `world.open_ended`, else the last configured day."""
        return None if self.world.open_ended and self.data.source == "synthetic" else self.world.days[-1]

    @property
    def train_start(self) -> date | None:
        """The first day the teacher trains on (`train.window_days` before the holdout), or None: every day
        before the holdout."""
        if self.train.window_days == 0:
            return None
        return self.world.holdout_start - timedelta(days=self.train.window_days)

    @property
    def fingerprint(self) -> str:
        """Hash of what the teacher is trained from; the export, index and student settings do not
        rename (or invalidate the resumable checkpoints of) a teacher model version."""
        teacher = {k: v for k, v in self.to_dict().items() if k not in DOWNSTREAM_SECTIONS}
        for section, names in LANDING_GUARDS.items():
            teacher[section] = {k: v for k, v in teacher[section].items() if k not in names}
        teacher = _without_defaults(teacher, LATER_SETTINGS)
        return hashlib.sha256(json.dumps(teacher, sort_keys=True).encode()).hexdigest()[:10]


def _to_jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_jsonable(v) for v in value]
    if isinstance(value, date):
        return value.isoformat()
    return value


_OVERRIDES_EXAMPLE = '{"train": {"epochs": 1}, "world": {"n_days": 10}}'


def _read_overrides(path: Path) -> dict[str, Any]:
    """The JSON object in the overrides file `path`; a ConfigError naming the file and the fix otherwise."""
    where = f"config file {path} (GEM_CONFIG or --config)"
    fix = f"write a JSON object of overrides, e.g. {_OVERRIDES_EXAMPLE}"
    try:
        text = read_document(path)
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist; point GEM_CONFIG at an existing file, or unset it to use "
                          "the preset alone") from None
    except OSError as e:
        raise ConfigError(f"{where} cannot be read ({e}); point GEM_CONFIG at a readable UTF-8 JSON file") from None
    except DocumentError as e:
        raise ConfigError(f"{where} {e}") from None
    if not text.strip():
        raise ConfigError(f"{where} is empty; {fix}, or unset GEM_CONFIG to use the preset alone")
    try:
        data = load_json(text)
    except DocumentError as e:
        raise ConfigError(f"{where} {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: the top level is {_kind(data)}, not a JSON object; {fix}")
    return data


def _merge(obj: Any, data: Any, where: str) -> Any:
    """`obj` (a config dataclass) with the JSON `data` applied: nested sections merge, other values replace."""
    cls = type(obj)
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}={_show(data)}: must be {_describe(cls)}, not {_kind(data)}")
    hints, fields = _hints(cls), {f.name for f in dataclasses.fields(obj)}
    unknown = sorted(set(data) - fields)
    if unknown:
        raise ConfigError(f"{_in(where)}: unknown key(s) {unknown}; valid keys are {sorted(fields)}")
    changes = {}
    for key, value in data.items():
        path, current = _join(where, key), getattr(obj, key)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            changes[key] = _merge(current, value, path)
        else:
            changes[key] = _convert(value, hints[key], path)
    return dataclasses.replace(obj, **changes)


def _buckets(*sizes: int) -> tuple[SparseFeature, ...]:
    return tuple(dataclasses.replace(f, buckets=b) for f, b in zip(FeatureSpec().features, sizes, strict=True))


PRESETS: dict[str, GemConfig] = {
    "tiny": GemConfig(),
    # ~1M impressions: the demo-at-scale and benchmark preset.
    "small": GemConfig(
        preset="small",
        world=WorldConfig(n_days=8, n_users=5000, n_ads=1000, n_categories=24, n_advertisers=200,
                          impressions_per_day=125_000),
        features=FeatureSpec(features=_buckets(16384, 64, 64, 16, 4096, 512, 64, 16, 16, 64, 8, 32), max_seq_len=1024),
        train=TrainConfig(epochs=2, batch_size=512),
    ),
    # ~10M impressions, sequences up to 8,192 events.
    "medium": GemConfig(
        preset="medium",
        world=WorldConfig(n_days=10, n_users=50_000, n_ads=10_000, n_categories=48, n_advertisers=1000,
                          impressions_per_day=1_000_000),
        features=FeatureSpec(features=_buckets(131072, 64, 64, 16, 32768, 2048, 128, 16, 16, 64, 8, 32),
                             max_seq_len=8192),
        train=TrainConfig(epochs=1, batch_size=2048),
    ),
}


@dataclass(frozen=True)
class ConfigSources:
    """What a config is loaded from (`GemConfig.load`'s arguments), read from the environment in this one place
    by everything that loads one (the CLI, the entry points, the Dagster code location's `LakeResource`):
    GEM_PRESET (default `tiny`), overridden by GEM_CONFIG (a JSON file), GEM_DATA_SOURCE and GEM_SOURCE_MAPPING
    (a source mapping file; the source becomes "mapping"). An empty variable is unset."""

    preset: str = "tiny"
    config_path: str | None = None
    data_source: str | None = None
    source_mapping: str | None = None

    @staticmethod
    def from_env() -> ConfigSources:
        return ConfigSources(os.environ.get("GEM_PRESET") or "tiny", os.environ.get("GEM_CONFIG") or None,
                             os.environ.get("GEM_DATA_SOURCE") or None, os.environ.get("GEM_SOURCE_MAPPING") or None)

    def load(self) -> GemConfig:
        return GemConfig.load(self.preset, self.config_path, self.data_source, self.source_mapping)
