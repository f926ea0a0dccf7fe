"""Random feature rows in the `gold.training_examples` and `gold.user_timelines` layouts, for model tests and
benchmarks."""

from __future__ import annotations

from datetime import date, datetime, timedelta

import numpy as np
import pyarrow as pa

from gem_model.config import FeatureSpec
from gem_model.data.loader import VISIBLE_COLUMN, timeline_columns


def random_examples(spec: FeatureSpec, n: int, seed: int = 0, max_len: int = 40) -> pa.Table:
    """n rows of every `<feature>_idx` column, the impression's `ts` and the jagged sequence columns with their
    timestamps (newest first, minutes to days before it); row 0's sequence is empty."""
    rng = np.random.default_rng(seed)
    cols: dict[str, object] = {f.idx_column: rng.integers(0, f.buckets, n) for f in spec.features}
    lengths = rng.integers(0, max_len, n)
    lengths[0] = 0
    for column, buckets in {spec.sequence_idx_column: spec.item_feature.buckets, **spec.sequence_side_columns}.items():
        cols[column] = [list(rng.integers(0, buckets, k)) for k in lengths]
    cols["ts"] = [START + timedelta(hours=12) for _ in range(n)]
    cols["seq_ts"] = [[START + timedelta(hours=12) - d for d in _gaps(rng, k)] for k in lengths]
    return pa.table(cols)


START = datetime(2026, 11, 1)


def _gaps(rng: np.random.Generator, k: int) -> list[timedelta]:
    """k increasing gaps of 1 minute to days."""
    return [timedelta(minutes=int(m)) for m in np.cumsum(rng.integers(1, 600, k))]


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
    # Events through the day before ds = 2026-11-01's end, each impression a minute after the last event it sees.
    cols["seq_ts"] = [sorted(START + timedelta(hours=23) - d for d in _gaps(rng, e)) for e in events]
    cols["ts"] = [
        [(seq[v - 1] if v else START) + timedelta(minutes=1) for v in visible]
        for seq, visible in zip(cols["seq_ts"], cols["visible"])
    ]
    cols["ds"] = [date(2026, 11, 1)] * n
    cols["target_age_idx"] = [list(rng.integers(0, spec.age_buckets, k)) for k in impressions]
    return pa.table(cols)


def impression_alone(timelines: pa.Table, spec: FeatureSpec, row: int, impression: int) -> pa.Table:
    """Impression `impression` of timeline row `row` of `timelines` as a timeline of its own, holding only the
    events it sees."""
    one = timelines.slice(row, 1).to_pylist()[0]
    seen = one[VISIBLE_COLUMN][impression]
    _, per_impression, per_event = timeline_columns(spec, labels=True)
    for column in per_event:
        one[column] = one[column][:seen]
    for column in per_impression:
        if column in one:
            one[column] = [one[column][impression]]
    return pa.Table.from_pylist([one], schema=timelines.schema)
