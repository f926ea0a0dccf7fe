"""GemConfig: the root of the config, its sections, how it is loaded and the fingerprint that names a teacher.

A preset (`gem_model.config.presets`) is the entry point; overrides go through `GemConfig.from_dict`
(nested, partial JSON; an unknown key is an error) or `GemConfig.load` (a GEM_CONFIG file, a data source,
a source mapping). The resolved config is saved with every model, so an artefact always says how it was
made, and its teacher sections hash into the model version's name (`fingerprint`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from datetime import date, timedelta
from pathlib import Path
from typing import Any

from gem_model.config.presets import DEFAULT_PRESET, PRESETS
from gem_model.config.sections import (
    DataConfig,
    ExportConfig,
    FeatureSpec,
    IndexConfig,
    ModelConfig,
    PromotionConfig,
    StudentConfig,
    TrainConfig,
    WorldConfig,
)
from gem_model.config.sources import ConfigSources, read_overrides
from gem_model.config.validation import ConfigError, Name, merge, validate

# GemConfig sections read only after the teacher is trained: they do not rename it.
DOWNSTREAM_SECTIONS: frozenset[str] = frozenset({"promotion", "index", "export", "student"})
# Settings that never change what a teacher learns from (how data lands; whether the calendar goes on after
# the configured days): they do not rename it.
LANDING_GUARDS: dict[str, tuple[str, ...]] = {
    "data": ("max_row_drop_fraction", "allow_outside_data_root"),
    "world": ("open_ended",),
}


@dataclass(frozen=True)
class GemConfig:
    """The one config of the pipeline: Spark jobs, the loader, the model, the exporters, the students and the
    Dagster definitions all read it."""

    preset: Name = DEFAULT_PRESET
    """The preset the config started from (GEM_PRESET); the sections below hold its values."""
    world: WorldConfig = field(default_factory=WorldConfig)
    """The calendar and the synthetic world."""
    data: DataConfig = field(default_factory=DataConfig)
    """Where bronze comes from, and the landing's guards."""
    features: FeatureSpec = field(default_factory=FeatureSpec)
    """The sparse features and the behaviour sequence, and how raw values map to embedding rows."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The teacher or a baseline."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The teacher's distributed training."""
    promotion: PromotionConfig = field(default_factory=PromotionConfig)
    """Which trained teacher is served."""
    index: IndexConfig = field(default_factory=IndexConfig)
    """The FAISS indexes of the exported embeddings."""
    export: ExportConfig = field(default_factory=ExportConfig)
    """Batch scoring and candidate generation."""
    student: StudentConfig = field(default_factory=StudentConfig)
    """The per-surface students distilled from the teacher."""

    def __post_init__(self) -> None:
        validate(self, "")
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
        return GemConfig(preset=name, **PRESETS[name])

    @staticmethod
    def load(
        preset: str, overrides_path: str | None = None, data_source: str | None = None, mapping: str | None = None
    ) -> GemConfig:
        """A preset, optionally overridden by a JSON file of (partial) nested settings, then by `data_source`,
        then by a source `mapping` file (which makes the source "mapping").

        Any problem with the file (missing, empty, not JSON, not an object, a bad key or value) is a
        `ConfigError` whose message starts with the file's path.
        """
        cfg = GemConfig.from_preset(preset)
        if overrides_path:
            overrides = read_overrides(Path(overrides_path))
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
    def from_sources(sources: ConfigSources) -> GemConfig:
        return GemConfig.load(sources.preset, sources.config_path, sources.data_source, sources.source_mapping)

    @staticmethod
    def from_env() -> GemConfig:
        """The config the environment names (`ConfigSources.from_env`)."""
        return GemConfig.from_sources(ConfigSources.from_env())

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(dataclasses.asdict(self))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @staticmethod
    def from_dict(data: dict[str, Any], base: GemConfig | None = None) -> GemConfig:
        """Build a config from (possibly partial) nested dicts over `base`; unknown keys and values of
        the wrong type or out of range raise a `ConfigError` naming the dotted key."""
        return merge(base or GemConfig(), data, "")

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
        return hashlib.sha256(json.dumps(teacher, sort_keys=True).encode()).hexdigest()[:10]


def to_jsonable(value: Any) -> Any:
    """`value` (nested dicts, tuples, dates) as JSON can hold it: lists for tuples, ISO strings for dates."""
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, date):
        return value.isoformat()
    return value
