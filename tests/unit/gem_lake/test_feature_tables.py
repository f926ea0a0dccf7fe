"""Spark transforms: point-in-time sequences, hashing, and idempotent partition writes."""

import dataclasses
from datetime import date, datetime

import pytest
from pyspark.sql import Row
from pyspark.sql import functions as F

from gem_lake.delta import SchemaChangeError, read_table, replace_partition
from gem_lake.features import tables
from gem_model.config import ConfigError, FeatureSpec, SparseFeature

pytestmark = pytest.mark.spark
DS = date(2026, 11, 3)


def _events(spark):
    rows = [  # user 1: two events before the impression, one at its timestamp, one after
        Row(user_id=1, item_id=11, action="view", surface="feed", ts=datetime(2026, 11, 2, 8), ds=date(2026, 11, 2)),
        Row(user_id=1, item_id=12, action="view", surface="feed", ts=datetime(2026, 11, 3, 9), ds=DS),
        Row(user_id=1, item_id=13, action="click", surface="reels", ts=datetime(2026, 11, 3, 10), ds=DS),
        Row(user_id=1, item_id=14, action="view", surface="feed", ts=datetime(2026, 11, 3, 11), ds=DS),
        Row(user_id=2, item_id=21, action="view", surface="feed", ts=datetime(2026, 10, 1, 11), ds=date(2026, 10, 1)),
    ]
    return spark.createDataFrame(rows)


def _impressions(spark):
    base = dict(ds=DS, surface="feed", position=1, clicked=True, converted=False, p_click=0.2, p_convert=0.01)
    return spark.createDataFrame(
        [
            Row(impression_id="a", ts=datetime(2026, 11, 3, 10), user_id=1, ad_id=5, **base),
            Row(impression_id="b", ts=datetime(2026, 11, 3, 12), user_id=2, ad_id=5, **base),
        ]
    )


@pytest.mark.slow
def test_sequences_hold_only_strictly_earlier_events_most_recent_first(spark):
    spec = FeatureSpec(lookback_days=14)
    users = tables.silver_user_features(
        spark.createDataFrame(
            [
                Row(user_id=1, age_bucket="18-24", country="US", device="ios", true_interest=3),
                Row(user_id=2, age_bucket="65+", country="BR", device="web", true_interest=1),
            ]
        ),
        spec,
    )
    ads = tables.silver_ad_features(
        spark.createDataFrame(
            [
                Row(ad_id=5, advertiser_id=1, category=2, ad_format="video", objective="conversion", true_quality=0.3),
                Row(ad_id=12, advertiser_id=1, category=7, ad_format="video", objective="conversion", true_quality=0.1),
            ]
        ),
        spec,
    )
    out = {
        r["impression_id"]: r
        for r in tables.training_examples(_impressions(spark), _events(spark), users, ads, spec, DS).collect()
    }
    assert out["a"]["seq_item_ids"] == [12, 11]  # 13 is at the impression's ts, 14 after it
    # Each event's item carries its ad's category row, hashed like the target's; 11 is no ad.
    category_of_12 = ads.where("ad_id = 12").first()["category_idx"]
    assert out["a"]["seq_category_idx"] == [category_of_12, tables.MISSING_ROW] and category_of_12 != 0
    assert out["a"]["seq_ts"] == [datetime(2026, 11, 3, 9), datetime(2026, 11, 2, 8)]
    assert out["b"]["seq_item_ids"] == []  # user 2's only event is outside the lookback window
    assert "true_interest" not in out["a"] and "true_quality" not in out["a"]
    assert (out["a"]["hour_of_day"], out["b"]["hour_of_day"]) == (10, 12)  # from ts, for every source
    assert tables.MISSING_ROW not in (out["a"]["hour_of_day_idx"], out["b"]["hour_of_day_idx"])
    assert out["a"]["seq_actions"] == ["view", "view"]
    assert all(1 <= i < spec.by_name("ad_id").buckets for i in out["a"]["seq_item_idx"])
    # 60 and 1,560 minutes before the impression: floor(log2(1 + minutes)) = 5 and 10.
    assert out["a"]["seq_age_idx"] == [5, 10]
    action = out["a"]["seq_action_idx"]
    assert len(action) == 2 and action[0] == action[1] and 1 <= action[0] < spec.action_buckets


@pytest.mark.slow
def test_missing_dimension_rows_map_to_the_reserved_row(spark):
    spec = FeatureSpec()
    users = tables.silver_user_features(
        spark.createDataFrame(
            [Row(user_id=1, age_bucket=None, country="US", device="ios")],
            "user_id bigint, age_bucket string, country string, device string",
        ),
        spec,
    )
    ads = tables.silver_ad_features(
        spark.createDataFrame([Row(ad_id=9, advertiser_id=1, category=2, ad_format="video", objective="conversion")]),
        spec,
    )
    out = {
        r["impression_id"]: r
        for r in tables.training_examples(_impressions(spark), _events(spark), users, ads, spec, DS).collect()
    }
    assert out["a"]["age_bucket_idx"] == tables.MISSING_ROW  # null attribute
    assert out["a"]["country_idx"] != tables.MISSING_ROW
    assert out["b"]["device_idx"] == tables.MISSING_ROW  # user 2 has no silver.user_features row
    assert out["a"]["category_idx"] == tables.MISSING_ROW  # ad 5 has no silver.ad_features row
    assert out["a"]["ad_id_idx"] != tables.MISSING_ROW  # ...but its id still gets a hashed row


def _own_features_spec() -> FeatureSpec:
    """A dataset's own fields as features: a user's `gender`, an ad's `genre`, the impression's `hour`."""
    return FeatureSpec(
        features=(
            SparseFeature("user_id", 64, "user"),
            SparseFeature("gender", 8, "user"),
            SparseFeature("ad_id", 64, "ad"),
            SparseFeature("genre", 16, "ad"),
            SparseFeature("surface", 8, "context"),
            SparseFeature("hour", 32, "context"),
        ),
        sequence_item_attributes=("genre",),
    )


@pytest.mark.slow
def test_a_datasets_own_fields_become_features_on_every_side(spark):
    spec = _own_features_spec()
    users = tables.silver_user_features(
        spark.createDataFrame(
            [Row(user_id=1, gender="f", age_bucket=None)], "user_id bigint, gender string, age_bucket string"
        ),
        spec,
    )
    ads = tables.silver_ad_features(
        spark.createDataFrame([Row(ad_id=5, genre="drama"), Row(ad_id=12, genre="war")]), spec
    )
    imps = _impressions(spark).withColumn("hour", F.hour("ts"))
    examples = tables.training_examples(imps, _events(spark), users, ads, spec, DS)
    out = {r["impression_id"]: r for r in examples.collect()}
    a = out["a"]
    assert a["gender_idx"] == users.first()["gender_idx"] != tables.MISSING_ROW
    assert a["genre_idx"] == ads.where("ad_id = 5").first()["genre_idx"] != tables.MISSING_ROW
    assert a["hour"] == 10 and a["hour_idx"] == spark.range(1).select(tables.hashed(F.lit(10), 32)).first()[0]
    assert a["seq_genre_idx"] == [ads.where("ad_id = 12").first()["genre_idx"], tables.MISSING_ROW]
    assert out["b"]["gender_idx"] == tables.MISSING_ROW  # user 2 has no row


@pytest.mark.parametrize(
    ("side", "message"),
    [
        (
            "user",
            "user feature(s) ['gender'] have no column in bronze.users (data source's columns not yet used as "
            "features: ['age_bucket']); name one of those",
        ),
        ("context", "context feature(s) ['hour'] have no column in bronze.impressions"),
    ],
)
def test_a_feature_the_data_lacks_is_named_with_the_fix(spark, side, message):
    spec = _own_features_spec()
    users = spark.createDataFrame([Row(user_id=1, age_bucket="18-24")])
    ads = tables.silver_ad_features(spark.createDataFrame([Row(ad_id=5, genre="drama")]), spec)
    with pytest.raises(ConfigError) as error:
        if side == "user":
            tables.silver_user_features(users, spec)
        else:
            tables.training_examples(_impressions(spark), _events(spark), users, ads, spec, DS)
    assert str(error.value).startswith("features.features: ") and message in str(error.value)


def test_sequence_truncated_to_max_len(spark):
    spec = FeatureSpec(max_seq_len=2)
    ads = tables.silver_ad_features(
        spark.createDataFrame([Row(ad_id=14, advertiser_id=1, category=2, ad_format="video", objective="conversion")]),
        spec,
    )
    seqs = {r["user_id"]: r for r in tables.user_sequences(_events(spark), ads, spec, DS).collect()}
    assert seqs[1]["seq_item_ids"] == [14, 13]
    assert seqs[1]["seq_category_idx"][1] == tables.MISSING_ROW and seqs[1]["seq_category_idx"][0] != 0


def test_hashing_is_stable_in_range_and_reserves_row_zero_for_missing(spark):
    df = spark.createDataFrame([Row(v="US"), Row(v="US"), Row(v="BR"), Row(v=None)], "v string")
    idx = [r[0] for r in df.select(tables.hashed(df.v, 64)).collect()]
    assert idx[0] == idx[1] and all(1 <= i < 64 for i in idx[:3]) and idx[3] == 0


@pytest.mark.slow
def test_schema_policy_adds_columns_and_refuses_breaking_changes(spark, tmp_path):
    path = tmp_path / "t"
    day = date(2026, 11, 2)
    base = spark.createDataFrame([Row(ds=day, x=1)])
    replace_partition(base, path, {"ds": day})
    replace_partition(spark.createDataFrame([Row(ds=DS, x=2, extra="new")]), path, {"ds": DS})
    rows = {r["x"]: r["extra"] for r in read_table(spark, path).collect()}
    assert rows == {1: None, 2: "new"}  # additive: older partitions read the new column as null
    with pytest.raises(SchemaChangeError, match=r"change column types \(\['x: bigint -> string'\]\).*rebuild"):
        replace_partition(spark.createDataFrame([Row(ds=DS, x="2", extra="new")]), path, {"ds": DS})
    with pytest.raises(SchemaChangeError, match=r"columns that the new rows lack: \['extra'\].*drop-columns"):
        replace_partition(spark.createDataFrame([Row(ds=DS, x=3)]), path, {"ds": DS})


@pytest.mark.slow
def test_replacing_a_partition_twice_never_duplicates(spark, tmp_path):
    path = tmp_path / "gold" / "events"
    events = _events(spark)
    for _ in range(2):
        for day in (date(2026, 11, 2), DS):
            replace_partition(events.where(events.ds == day), path, {"ds": day})
    assert read_table(spark, path).count() == 4
    with pytest.raises(Exception, match="(?i)replaceWhere|does not conform|DELTA_REPLACE_WHERE"):
        replace_partition(events, path, {"ds": DS})  # rows of other days are refused


def test_modulo_gives_dense_ids_a_row_each_and_refuses_a_column_without_integers(spark):
    feature = SparseFeature("user_id", 8, "user", "modulo")
    df = spark.createDataFrame([Row(v=1), Row(v=7), Row(v=8), Row(v=None)], "v bigint")
    assert [r[0] for r in df.select(tables.embedding_row(df.v, feature)).collect()] == [2, 1, 2, 0]
    dense = spark.range(1, 5001).select(
        tables.embedding_row(F.col("id"), SparseFeature("user_id", 16384, "user", "modulo")).alias("row")
    )
    assert dense.distinct().count() == 5000  # hashed into the same rows, 27% of these users would share one
    users = spark.createDataFrame([Row(user_id="u1", age_bucket="18-24", country="US", device="ios")])
    with pytest.raises(ConfigError, match=r"\{'user_id': 'string'\} use encoding 'modulo'.*'hash'"):
        tables.silver_user_features(users, FeatureSpec())


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny", "small", "medium"])
def test_no_two_of_the_synthetic_worlds_values_share_a_row(spark, preset):
    from gem_lake.sources.world import AD_FORMATS, AGE_BUCKETS, COUNTRIES, DEVICES, OBJECTIVES
    from gem_model.config import SURFACES, GemConfig

    cfg = GemConfig.load(preset)
    w = cfg.world
    values = {
        "age_bucket": AGE_BUCKETS,
        "country": COUNTRIES,
        "device": DEVICES,
        "ad_format": AD_FORMATS,
        "objective": OBJECTIVES,
        "surface": SURFACES,
        "position": range(1, 6),
        "hour_of_day": range(24),
        "user_id": range(1, w.n_users + 1),
        "ad_id": range(1, w.n_ads + 1),
        "advertiser_id": range(1, w.n_advertisers + 1),
        "category": range(w.n_categories),
    }
    assert set(values) == {f.name for f in cfg.features.features}
    for name, domain in values.items():
        df = (
            spark.createDataFrame([(v,) for v in domain], "v string")
            if isinstance(domain, tuple)
            else spark.range(domain.start, domain.stop).withColumnRenamed("id", "v")
        )
        rows = df.select(tables.embedding_row(df.v, cfg.features.by_name(name)).alias("row"))
        assert rows.distinct().count() == df.count(), f"{preset}: values of {name} share a row"


@pytest.mark.slow
def test_a_feature_table_takes_and_serves_rows_of_one_mapping_only(spark, tmp_path):
    from gem_model.data.loader import MAPPING_KEY, FeatureMappingError, open_delta, require_mapping

    path = tmp_path / "lake" / "gold" / "training_examples"
    day = spark.createDataFrame([Row(ds=DS, x=1)])
    old, new = (
        FeatureSpec(),
        FeatureSpec(features=tuple(dataclasses.replace(f, encoding="hash") for f in FeatureSpec().features)),
    )
    assert old.mapping != new.mapping
    replace_partition(day, path, {"ds": DS})  # a table written before mappings were recorded
    with pytest.raises(
        FeatureMappingError,
        match=r"gold.training_examples was built before feature mappings were "
        r"recorded.*remove .*silver/user_features.*bronze stays",
    ):
        require_mapping(path, old.mapping)
    replace_partition(day, path, {"ds": DS}, commit_info={MAPPING_KEY: old.mapping})
    require_mapping(path, old.mapping)  # the same mapping: the next day may be written
    assert open_delta(path, spec=old).count_rows() == 1
    with pytest.raises(FeatureMappingError, match=f"built with feature mapping {old.mapping}.*as {new.mapping}"):
        require_mapping(path, new.mapping)
    with pytest.raises(FeatureMappingError, match="Use the config that built it"):
        open_delta(path, spec=new)
    with pytest.raises(FeatureMappingError, match="before feature mappings were recorded"):
        open_delta(path, version=0, spec=old)  # pinned to the commit before the mapping was recorded
