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
from gem_model.data.loader import MAPPING_KEY, ExampleStream, features_to_kjt, scan_rank

pytestmark = pytest.mark.spark
SPEC = FeatureSpec()


def _write_examples(spark, path, n):
    rows = []
    for i in range(n):
        row = {f.idx_column: i % f.buckets for f in SPEC.features}
        rows.append(
            Row(
                impression_id=f"i{i:04d}",
                user_id=i,
                ad_id=i % 7,
                surface="feed",
                ds=date(2026, 11, 1) + timedelta(days=i % 2),
                ts=datetime(2026, 11, 1),
                clicked=i % 3 == 0,
                converted=i % 9 == 0,
                seq_item_idx=list(range(i % 4)),
                seq_action_idx=[1] * (i % 4),
                seq_age_idx=[2] * (i % 4),
                seq_category_idx=[3] * (i % 4),
                **row,
            )
        )
    # Several files per day, so ranks can be given whole files.
    _mapped(spark.createDataFrame(rows).repartition(5).write).partitionBy("ds").save(str(path))


def _mapped(writer):
    """A Delta writer whose commit records SPEC's feature mapping, as the feature jobs' do."""
    return writer.format("delta").option("userMetadata", json.dumps({MAPPING_KEY: SPEC.mapping}))


def test_ranks_read_disjoint_files_and_step_in_lockstep(spark, tmp_path):
    path = tmp_path / "examples"
    _write_examples(spark, path, 101)
    streams = [ExampleStream(path, SPEC, batch_size=16, rank=r, world_size=2) for r in range(2)]
    files = [{f.path for f, _ in s.fragments[s.rank]} for s in streams]
    assert files[0] and files[1] and not files[0] & files[1]
    assert sum(s.rank_rows for s in streams) == 101
    assert abs(streams[0].rank_rows - streams[1].rank_rows) <= 101 // 5 + 1  # balanced to within a file
    steps = -(-max(s.rank_rows for s in streams) // 16)
    seen = []
    for stream in streams:
        batches = list(stream)
        assert len(batches) == len(stream) == steps
        for b in batches:
            assert b.features.stride() == 16
            seen += b.table.column("impression_id").to_pylist()[: int(b.valid.sum())]
    assert sorted(seen) == [f"i{i:04d}" for i in range(101)]  # every row once, across both ranks


def test_shuffled_epochs_cover_the_shard_in_a_new_order(spark, tmp_path):
    path = tmp_path / "examples"
    _write_examples(spark, path, 64)
    stream = ExampleStream(path, SPEC, batch_size=8, shuffle_buffer=16, seed=3)
    orders = []
    for epoch in range(2):
        stream.set_epoch(epoch)
        ids = [i for b in stream for i in b.table.column("impression_id").to_pylist()[: int(b.valid.sum())]]
        assert sorted(ids) == [f"i{i:04d}" for i in range(64)]
        orders.append(ids)
    assert orders[0] != orders[1]


def test_ds_filter_selects_days(spark, tmp_path):
    path = tmp_path / "examples"
    _write_examples(spark, path, 10)
    stream = ExampleStream(path, SPEC, batch_size=4, start=date(2026, 11, 2))
    assert stream.total_rows == 5
    with pytest.raises(ValueError, match="no rows"):
        ExampleStream(path, SPEC, batch_size=4, start=date(2027, 1, 1))


def test_kjt_is_jagged_for_sequences_and_empty_for_absent_features():
    table = pa.table({"ad_id_idx": [3, 4], "seq_item_idx": [[1, 2, 3], []], "seq_action_idx": [[5, 6, 7], []]})
    kjt = features_to_kjt(table, SPEC)
    assert kjt.keys() == list(SPEC.kjt_keys)
    jts = kjt.to_dict()
    assert jts["ad_id"].lengths().tolist() == [1, 1] and jts["ad_id"].values().tolist() == [3, 4]
    assert jts["seq_item_ids"].lengths().tolist() == [3, 0]
    assert jts["seq_action_idx"].values().tolist() == [5, 6, 7]
    assert jts["seq_age_idx"].lengths().tolist() == [0, 0]
    assert jts["user_id"].lengths().tolist() == [0, 0]


def test_misaligned_sequence_side_column_is_an_error():
    table = pa.table({"seq_item_idx": [[1, 2, 3], []], "seq_action_idx": [[5], [6]]})
    with pytest.raises(ValueError, match="seq_action_idx is not aligned"):
        features_to_kjt(table, SPEC)


def test_missing_feature_column_names_the_fix(spark, tmp_path):
    path = tmp_path / "bad"
    _mapped(spark.createDataFrame([Row(ds=date(2026, 11, 1), x=1)]).write).save(str(path))
    with pytest.raises(ValueError, match="lacks columns .*user_id_idx.*FeatureSpec"):
        ExampleStream(path, SPEC, batch_size=4)


def test_ranks_split_row_groups_into_disjoint_shards_that_cover_every_row(tmp_path):
    for f in range(3):  # 3 files of 4 row groups each, 10 rows a group
        ids = pa.table({"user_id": np.arange(f * 40, (f + 1) * 40, dtype=np.int64)})
        pq.write_table(ids, tmp_path / f"part-{f}.parquet", row_group_size=10)
    dataset = pads.dataset(tmp_path, format="parquet")
    shards = [
        np.concatenate(
            [t.column("user_id").to_numpy() for t in scan_rank(dataset, None, rank, 5, ["user_id"], batch_rows=4)]
        )
        for rank in range(5)
    ]
    assert sorted(len(s) for s in shards) == [20, 20, 20, 30, 30]  # 12 groups over 5 ranks
    assert np.array_equal(np.sort(np.concatenate(shards)), np.arange(120))
    again = np.concatenate([t.column("user_id").to_numpy() for t in scan_rank(dataset, None, 3, 5, ["user_id"], 4)])
    assert np.array_equal(again, shards[3])
