"""The Delta -> KeyedJaggedTensor loader: sharding across ranks, padding, jagged sequences."""

import json
from datetime import date, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from pyspark.sql import Row

from gem_model.config import FeatureSpec
from gem_model.data.loader import MAPPING_KEY, TimelineStream, features_to_kjt, rank_fragments, scan_rows

pytestmark = pytest.mark.spark
SPEC = FeatureSpec()


def _timeline(i: int) -> dict:
    """User i's timeline on day 1 + i % 2: 1 + i % 5 impressions (ids i0000-0, ...), 2 * (i % 4) events, impression j
    seeing the first min(2j, events) of them."""
    n, events = 1 + i % 5, 2 * (i % 4)
    per_impression = {f.idx_column: [(i + j) % f.buckets for j in range(n)] for f in SPEC.features if f.side != "user"}
    return dict(
        user_id=i,
        ds=date(2026, 11, 1) + timedelta(days=i % 2),
        impression_id=[f"i{i:04d}-{j}" for j in range(n)],
        ad_id=[j % 7 for j in range(n)],
        surface=["feed"] * n,
        ts=[datetime(2026, 11, 1, 1 + j) for j in range(n)],
        clicked=[(i + j) % 3 == 0 for j in range(n)],
        converted=[(i + j) % 9 == 0 for j in range(n)],
        visible=[min(2 * j, events) for j in range(n)],
        target_age_idx=[3] * n,
        seq_item_idx=[100 * i + e for e in range(events)],
        seq_action_idx=[1] * events,
        seq_age_idx=[2] * events,
        seq_category_idx=[3] * events,
        seq_ts=[datetime(2026, 11, 1, 1) + timedelta(minutes=30 * e) for e in range(events)],
        **{f.idx_column: i % f.buckets for f in SPEC.side("user")},
        **per_impression,
    )


def _write_timelines(spark, path, n):
    # Several files per day, so ranks can be given whole files.
    _mapped(spark.createDataFrame([Row(**_timeline(i)) for i in range(n)]).repartition(5).write).partitionBy("ds").save(
        str(path)
    )


def _impressions(n: int) -> list[str]:
    return sorted(f"i{i:04d}-{j}" for i in range(n) for j in range(1 + i % 5))


def _mapped(writer):
    """A Delta writer whose commit records SPEC's feature mapping, as the feature jobs' do."""
    return writer.format("delta").option("userMetadata", json.dumps({MAPPING_KEY: SPEC.mapping}))


def _read_events(batch) -> dict[str, list[int]]:
    """impression id -> the item rows of the events the batch lets it read, oldest first."""
    features = batch.features.to_dict()
    starts, visible = (features[key].values().tolist() for key in SPEC.timeline_keys[:2])
    items = features[SPEC.sequence_feature]
    offsets, values = items.offsets().tolist(), items.values().tolist()
    read, first = {}, 0
    for row, impression in enumerate(batch.table.column("impression_id").to_pylist()[: int(batch.valid.sum())]):
        first = row if starts[row] else first
        read[impression] = values[offsets[first] : offsets[first] + visible[row]]
    return read


def test_ranks_read_disjoint_files_and_step_in_lockstep(spark, tmp_path):
    path = tmp_path / "timelines"
    _write_timelines(spark, path, 41)
    streams = [TimelineStream(path, SPEC, batch_size=16, rank=r, world_size=2) for r in range(2)]
    files = [{f.path for f, _ in s.fragments[s.rank]} for s in streams]
    assert files[0] and files[1] and not files[0] & files[1]
    total = len(_impressions(41))
    assert sum(s.rank_rows for s in streams) == total == streams[0].total_rows
    steps = -(-max(s.rank_rows for s in streams) // 16)
    seen: dict[str, list[int]] = {}
    for stream in streams:
        batches = list(stream)
        assert len(batches) == len(stream) == steps
        for b in batches:
            assert b.features.stride() == b.table.num_rows == 16
            read = _read_events(b)
            assert not read.keys() & seen.keys()
            seen |= read
    assert sorted(seen) == _impressions(41)  # every impression once, across both ranks
    for impression, events in seen.items():  # each reads its own first events, a timeline split or not
        i, j = (int(x) for x in impression[1:].split("-"))
        assert events == [100 * i + e for e in range(min(2 * j, 2 * (i % 4)))], impression


def test_a_timeline_across_a_batchs_end_is_split_with_the_events_each_part_reads(spark, tmp_path):
    path = tmp_path / "timelines"
    _write_timelines(spark, path, 5)  # users 0..4: 1..5 impressions, 0, 2, 4, 6, 0 events
    batches = list(TimelineStream(path, SPEC, batch_size=4))
    assert [int(b.valid.sum()) for b in batches] == [4, 4, 4, 3]
    for b in batches:
        features = b.features.to_dict()
        starts = features[SPEC.timeline_keys[0]].values().tolist()
        carried = features[SPEC.sequence_feature].lengths().tolist()
        ids = b.table.column("impression_id").to_pylist()[: int(b.valid.sum())]
        assert starts[0] == 1 and all(n == 0 for n, start in zip(carried, starts) if not start)
        pieces = [r for r, start in enumerate(starts[: len(ids)]) if start] + [len(ids)]
        for first, end in zip(pieces, pieces[1:]):
            i, last = (int(x) for x in ids[end - 1][1:].split("-"))
            # The part with the user's last impression carries every event; an earlier part those it reads.
            expected = 2 * (i % 4) if last == i % 5 else min(2 * last, 2 * (i % 4))
            assert carried[first] == expected, ids[first:end]


def test_shuffled_epochs_cover_the_shard_in_a_new_order(spark, tmp_path):
    path = tmp_path / "timelines"
    _write_timelines(spark, path, 30)
    stream = TimelineStream(path, SPEC, batch_size=8, shuffle_buffer=16, seed=3)
    orders = []
    for epoch in range(2):
        stream.set_epoch(epoch)
        ids = [i for b in stream for i in b.table.column("impression_id").to_pylist()[: int(b.valid.sum())]]
        assert sorted(ids) == _impressions(30)
        orders.append(ids)
    assert orders[0] != orders[1]


def test_ds_filter_selects_days(spark, tmp_path):
    path = tmp_path / "timelines"
    _write_timelines(spark, path, 10)
    stream = TimelineStream(path, SPEC, batch_size=4, start=date(2026, 11, 2))
    assert stream.total_rows == sum(1 + i % 5 for i in range(1, 10, 2))
    with pytest.raises(ValueError, match="no impressions"):
        TimelineStream(path, SPEC, batch_size=4, start=date(2027, 1, 1))


def test_kjt_is_jagged_for_sequences_and_empty_for_absent_features():
    noon = datetime(2026, 11, 1, 12)
    table = pa.table(
        {
            "ad_id_idx": [3, 4],
            "seq_item_idx": [[1, 2, 3], []],
            "seq_action_idx": [[5, 6, 7], []],
            "ts": [noon, noon],
            "seq_ts": [[noon - timedelta(minutes=m) for m in (1, 30, 90)], []],
        }
    )
    kjt = features_to_kjt(table, SPEC)
    assert kjt.keys() == list(SPEC.kjt_keys)
    jts = kjt.to_dict()
    assert jts["ad_id"].lengths().tolist() == [1, 1] and jts["ad_id"].values().tolist() == [3, 4]
    assert jts["seq_item_ids"].lengths().tolist() == [3, 0]
    assert jts["seq_item_ids"].values().tolist() == [3, 2, 1]  # a timeline of its own: oldest first
    assert jts["seq_action_idx"].values().tolist() == [7, 6, 5]
    assert jts["seq_age_idx"].lengths().tolist() == [0, 0]
    assert jts["user_id"].lengths().tolist() == [0, 0]
    # Each row starts its timeline, sees all its events, and is the instant its events' ages count to.
    assert [jts[key].values().tolist() for key in SPEC.timeline_keys] == [[1, 1], [3, 0], [0, 0], [0, 0]]
    assert jts["seq_minutes"].values().tolist() == [90, 30, 1]  # minutes before the impression, oldest first


def test_misaligned_sequence_side_column_is_an_error():
    table = pa.table({"seq_item_idx": [[1, 2, 3], []], "seq_action_idx": [[5], [6]]})
    with pytest.raises(ValueError, match="seq_action_idx is not aligned"):
        features_to_kjt(table, SPEC)


def test_missing_feature_column_names_the_fix(spark, tmp_path):
    path = tmp_path / "bad"
    _mapped(spark.createDataFrame([Row(ds=date(2026, 11, 1), x=1)]).write).save(str(path))
    with pytest.raises(ValueError, match="lacks columns .*user_id_idx.*FeatureSpec"):
        TimelineStream(path, SPEC, batch_size=4)


def test_ranks_split_row_groups_into_disjoint_shards_that_cover_every_row(tmp_path):
    for f in range(3):  # 3 files of 4 row groups each, 10 rows a group
        ids = pa.table({"user_id": np.arange(f * 40, (f + 1) * 40, dtype=np.int64)})
        pq.write_table(ids, tmp_path / f"part-{f}.parquet", row_group_size=10)
    dataset = pads.dataset(tmp_path, format="parquet")
    shards = [
        np.concatenate(
            [
                t.column("user_id").to_numpy()
                for t in scan_rows(dataset, rank_fragments(dataset, None, rank, 5), None, ["user_id"], batch_rows=4)
            ]
        )
        for rank in range(5)
    ]
    assert sorted(len(s) for s in shards) == [20, 20, 20, 30, 30]  # 12 groups over 5 ranks
    assert np.array_equal(np.sort(np.concatenate(shards)), np.arange(120))
    again = np.concatenate(
        [
            t.column("user_id").to_numpy()
            for t in scan_rows(dataset, rank_fragments(dataset, None, 3, 5), None, ["user_id"], 4)
        ]
    )
    assert np.array_equal(again, shards[3])
