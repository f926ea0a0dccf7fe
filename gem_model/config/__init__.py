"""The one typed configuration of the pipeline.

Spark jobs, the training data loader, the model, the exporters and the Dagster definitions all read the
same frozen `GemConfig`: the synthetic world (`WorldConfig`), the sparse feature specification that maps
raw columns to embedding rows (`FeatureSpec`), the model, training, promotion, index, export and student
settings. Named presets (`tiny` for tests, `small` for the demo) are the entry points; overrides go through
`GemConfig.from_dict`, where an unknown key is an error, and every value is type- and range-checked as a
section is built. The research options that were measured and not adopted sit in one section,
`model.experimental`.

    sections.py    the section dataclasses, each field with its range and its description
    gem.py         GemConfig: the root, loading, the fingerprint that names a teacher
    presets.py     the named presets
    sources.py     the environment (GEM_PRESET, GEM_CONFIG, ...) and the overrides file
    validation.py  ConfigError, the range markers and the validator
    names.py       the fixed vocabularies: surfaces, tasks, data sources, architectures, student variants
    reference.py   docs/CONFIG.md, generated from the sections (`python -m gem_model.config.reference`)
"""

from gem_model.config.gem import DOWNSTREAM_SECTIONS, LANDING_GUARDS, GemConfig
from gem_model.config.names import ARCHITECTURES, DATA_SOURCES, STUDENT_VARIANTS, SURFACES, TASKS
from gem_model.config.presets import DATASET_CONFIGS, DEFAULT_PRESET, PRESETS
from gem_model.config.sections import (
    DataConfig,
    ExperimentalConfig,
    ExportConfig,
    FeatureSpec,
    IndexConfig,
    ModelConfig,
    PromotionConfig,
    SequenceConfig,
    SparseFeature,
    StudentConfig,
    TrainConfig,
    WorldConfig,
    WukongConfig,
)
from gem_model.config.sources import ConfigSources
from gem_model.config.validation import ConfigError

__all__ = [
    "ARCHITECTURES",
    "DATASET_CONFIGS",
    "DATA_SOURCES",
    "DEFAULT_PRESET",
    "DOWNSTREAM_SECTIONS",
    "LANDING_GUARDS",
    "PRESETS",
    "STUDENT_VARIANTS",
    "SURFACES",
    "TASKS",
    "ConfigError",
    "ConfigSources",
    "DataConfig",
    "ExperimentalConfig",
    "ExportConfig",
    "FeatureSpec",
    "GemConfig",
    "IndexConfig",
    "ModelConfig",
    "PromotionConfig",
    "SequenceConfig",
    "SparseFeature",
    "StudentConfig",
    "TrainConfig",
    "WorldConfig",
    "WukongConfig",
]
