"""Scoring the teacher's logits from `gold.user_timelines`: whole timelines per chunk, and point-in-time exact."""

from datetime import date

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import torch

from gem_model.config import TASKS, GemConfig
from gem_model.data.loader import impression_rows
from gem_model.export.batch import ScoringInput
from gem_model.export.checkpoint import LoadedModel
from gem_model.export.scoring import score_timelines
from gem_model.models.gem import GemModel
from gem_model.testing.examples import impression_alone, random_timelines

CFG = GemConfig()
SPEC = CFG.features
DS = date(2026, 11, 1)


def _timelines(n: int, seed: int) -> pa.Table:
    """Random timelines with the keys scoring writes: a user per row, an impression id, ad and surface each."""
    table = random_timelines(SPEC, n, seed=seed, max_events=30)
    counts = pc.list_value_length(table.column("visible")).to_pylist()
    ids = iter(range(sum(counts)))
    keys = {
        "user_id": pa.array(range(1, n + 1), pa.int64()),
        "impression_id": [[f"imp-{next(ids)}" for _ in range(k)] for k in counts],
        "ad_id": [[7] * k for k in counts],
        "surface": [["feed"] * k for k in counts],
    }
    for name, column in keys.items():
        table = table.append_column(name, pa.array(column) if not isinstance(column, pa.Array) else column)
    return table


def _loaded() -> LoadedModel:
    torch.manual_seed(0)
    return LoadedModel(GemModel(SPEC, CFG.model).eval(), CFG, {"model_version": "v1"}, torch.device("cpu"))


def test_each_rank_scores_whole_timelines_in_chunks_of_bounded_impressions_and_every_impression_once(tmp_path):
    table = _timelines(40, seed=1)
    for i, part in enumerate((table.slice(0, 13), table.slice(13, 20), table.slice(33))):
        pq.write_table(part, tmp_path / f"part-{i}.parquet", row_group_size=5)
    dataset = pads.dataset(tmp_path, format="parquet")
    source = ScoringInput(dataset, None, table.schema.names, score_timelines, timelines=True)
    seen, shares = [], []
    for rank in range(2):
        rows = 0
        shard = source.shard(rank, 2)
        for chunk in source.chunks(shard, 8):
            counts = pc.list_value_length(chunk.column("visible")).to_numpy()
            assert counts.sum() <= 8 or chunk.num_rows == 1  # a timeline over the bound comes alone
            seen += pc.list_flatten(chunk.column("impression_id")).to_pylist()
            rows += int(counts.sum())
        assert rows == sum(n for _, n in shard)
        shares.append(rows)
    assert sorted(seen) == sorted(pc.list_flatten(table.column("impression_id")).to_pylist())
    assert abs(shares[0] - shares[1]) <= max(pc.list_value_length(table.column("visible")).to_pylist()) * 5


def test_teacher_logits_score_each_impression_as_alone_with_the_events_before_it():
    """Scoring's path (score_timelines) is point-in-time exact: each impression's logits equal those it gets as a
    timeline of its own holding only the events before it, and moving events it does not see leaves them equal."""
    loaded, table = _loaded(), _timelines(6, seed=3)
    scored = score_timelines(loaded, table, DS)
    rows = impression_rows(table, ["user_id"], ["impression_id", "visible"])
    assert scored.column("impression_id").to_pylist() == rows.column("impression_id").to_pylist()
    assert set(scored.schema.names) >= {"user_id", "ad_id", "surface", "model_version", "ds"}
    logits = np.stack([scored.column(f"{task}_logit").to_numpy() for task in TASKS], axis=1)

    at = 0
    for row, visible in enumerate(table.column("visible").to_pylist()):
        for i in range(len(visible)):
            alone = score_timelines(loaded, impression_alone(table, SPEC, row, i), DS)
            assert alone.column("impression_id").to_pylist() == [scored.column("impression_id")[at].as_py()]
            np.testing.assert_allclose(
                np.stack([alone.column(f"{task}_logit").to_numpy() for task in TASKS], axis=1)[0], logits[at], atol=1e-5
            )
            at += 1
    assert at == scored.num_rows > 6

    # Every event moved to another item: the impressions that see none of them keep their logits exactly.
    moved = table.set_column(
        table.schema.get_field_index(SPEC.sequence_idx_column),
        SPEC.sequence_idx_column,
        pa.array(
            [
                [(v + 1) % SPEC.item_feature.buckets for v in items]
                for items in table.column(SPEC.sequence_idx_column).to_pylist()
            ]
        ),
    )
    again = score_timelines(loaded, moved, DS)
    blind = pc.equal(rows.column("visible"), 0).to_numpy(zero_copy_only=False)
    assert blind.any() and not blind.all()
    for task in TASKS:
        before, after = scored.column(f"{task}_logit").to_numpy(), again.column(f"{task}_logit").to_numpy()
        np.testing.assert_array_equal(after[blind], before[blind])
        assert (after[~blind] != before[~blind]).any()
