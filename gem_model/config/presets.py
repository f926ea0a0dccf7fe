"""Named presets: each a set of sections over the defaults, chosen by GEM_PRESET (`GemConfig.from_preset`).

`tiny` (the defaults) for tests and the demo, `small` (~1M impressions) for the demo at scale and the
benchmarks, `medium` (~10M impressions, sequences up to 8,192 events) for scale. docs/CONFIG.md lists the
values each preset sets. Frappe and MovieLens have GEM_CONFIG files of their own (`DATASET_CONFIGS`) that
make their fields features and set their calendar.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gem_model.config.sections import FeatureSpec, SparseFeature, TrainConfig, WorldConfig

DEFAULT_PRESET = "tiny"
# GEM_CONFIG files for the built-in datasets whose own fields are features: <source>.json.
DATASET_CONFIGS = Path(__file__).parents[1] / "configs"


def _buckets(*sizes: int) -> tuple[SparseFeature, ...]:
    """The default features with these embedding rows, in their order."""
    return tuple(dataclasses.replace(f, buckets=b) for f, b in zip(FeatureSpec().features, sizes, strict=True))


# Preset name -> the sections (GemConfig fields) it replaces.
PRESETS: dict[str, dict[str, object]] = {
    DEFAULT_PRESET: {},
    "small": {
        "world": WorldConfig(
            n_days=8, n_users=5000, n_ads=1000, n_categories=24, n_advertisers=200, impressions_per_day=125_000
        ),
        "features": FeatureSpec(
            features=_buckets(16384, 64, 64, 16, 4096, 512, 64, 16, 16, 64, 8, 32), max_seq_len=1024
        ),
        "train": TrainConfig(epochs=2, batch_size=512),
    },
    "medium": {
        "world": WorldConfig(
            n_days=10, n_users=50_000, n_ads=10_000, n_categories=48, n_advertisers=1000, impressions_per_day=1_000_000
        ),
        "features": FeatureSpec(
            features=_buckets(131072, 64, 64, 16, 32768, 2048, 128, 16, 16, 64, 8, 32), max_seq_len=8192
        ),
        "train": TrainConfig(epochs=1, batch_size=2048),
    },
}
