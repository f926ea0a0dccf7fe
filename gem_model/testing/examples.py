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
