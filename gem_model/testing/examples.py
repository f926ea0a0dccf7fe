"""Random feature rows in the `gold.training_examples` layout, for model tests and benchmarks."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from gem_model.config import FeatureSpec


def random_examples(spec: FeatureSpec, n: int, seed: int = 0, max_len: int = 40) -> pa.Table:
    """n rows of every `<feature>_idx` column and the jagged sequence columns; row 0's sequence is empty."""
    rng = np.random.default_rng(seed)
    cols: dict[str, object] = {f.idx_column: rng.integers(0, f.buckets, n) for f in spec.features}
    lengths = rng.integers(0, max_len, n)
    lengths[0] = 0
    for column, buckets in {spec.sequence_idx_column: spec.item_feature.buckets, **spec.sequence_side_columns}.items():
        cols[column] = [list(rng.integers(0, buckets, k)) for k in lengths]
    return pa.table(cols)


def random_timelines(
    spec: FeatureSpec, n: int, seed: int = 0, max_events: int = 40, max_impressions: int = 6
) -> pa.Table:
    """n timeline rows in the `gold.user_timelines` layout: user features once, the events oldest first, and 1 to
    `max_impressions` impressions, each seeing a non-decreasing prefix of the events; row 0 has no events."""
    rng = np.random.default_rng(seed)
    events = rng.integers(0, max_events, n)
    events[0] = 0
    impressions = rng.integers(1, max_impressions + 1, n)
    cols: dict[str, object] = {}
    for f in spec.features:
        if f.side == "user":
            cols[f.idx_column] = rng.integers(0, f.buckets, n)
        else:
            cols[f.idx_column] = [list(rng.integers(0, f.buckets, k)) for k in impressions]
    for column, buckets in {spec.sequence_idx_column: spec.item_feature.buckets, **spec.sequence_side_columns}.items():
        cols[column] = [list(rng.integers(0, buckets, k)) for k in events]
    cols["visible"] = [sorted(rng.integers(0, e + 1, k).tolist()) for e, k in zip(events, impressions)]
    cols["target_age_idx"] = [list(rng.integers(0, spec.age_buckets, k)) for k in impressions]
    return pa.table(cols)
