"""Spark transforms: point-in-time sequences, hashing, and idempotent partition writes."""

import dataclasses
import math
import random
from datetime import date, datetime, timedelta

import pytest
from pyspark.sql import Row
from pyspark.sql import functions as F

from gem_lake.delta import SchemaChangeError, read_table, replace_partition
from gem_lake.features import tables
from gem_lake.table_contract import schema_violations
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
        r["impression_id"]: r.asDict()
        for r in tables.training_examples(_impressions(spark), users, ads, spec, DS).collect()
    }
    timelines = tables.user_timelines(_impressions(spark), _events(spark), users, ads, spec, DS)
    for r in tables.impression_sequences(timelines, spec).collect():
        assert (r["user_id"], r["ts"]) == (out[r["impression_id"]]["user_id"], out[r["impression_id"]]["ts"])
        out[r["impression_id"]] |= r.asDict()
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
    out = {r["impression_id"]: r for r in tables.training_examples(_impressions(spark), users, ads, spec, DS).collect()}
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
    examples = tables.training_examples(imps, users, ads, spec, DS)
    out = {r["impression_id"]: r for r in examples.collect()}
    timelines = tables.user_timelines(imps, _events(spark), users, ads, spec, DS)
    own = {r["impression_id"]: r for r in tables.impression_sequences(timelines, spec).collect()}
    a = out["a"]
    assert a["gender_idx"] == users.first()["gender_idx"] != tables.MISSING_ROW
    assert a["genre_idx"] == ads.where("ad_id = 5").first()["genre_idx"] != tables.MISSING_ROW
    assert a["hour"] == 10 and a["hour_idx"] == spark.range(1).select(tables.hashed(F.lit(10), 32)).first()[0]
    assert own["a"]["seq_genre_idx"] == [ads.where("ad_id = 12").first()["genre_idx"], tables.MISSING_ROW]
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
            tables.training_examples(_impressions(spark), users, ads, spec, DS)
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


def _timeline_events(spark):
    def event(user: int, item: int, action: str, ts: datetime) -> Row:
        return Row(user_id=user, item_id=item, action=action, surface="feed", ts=ts, ds=ts.date())

    return spark.createDataFrame(
        [  # user 1: three events before its first impression (10:00), one at it, two tied at 10:30, one after all
            event(1, 31, "view", datetime(2026, 11, 1, 8)),
            event(1, 11, "view", datetime(2026, 11, 2, 8)),
            event(1, 12, "view", datetime(2026, 11, 3, 9)),
            event(1, 13, "click", datetime(2026, 11, 3, 10)),
            event(1, 14, "view", datetime(2026, 11, 3, 10, 30)),
            event(1, 12, "click", datetime(2026, 11, 3, 10, 30)),
            event(1, 15, "view", datetime(2026, 11, 3, 13)),
            event(2, 21, "view", datetime(2026, 10, 1, 11)),  # outside the lookback window
            event(3, 31, "view", datetime(2026, 11, 3, 8)),  # user 3 has no impression on DS
        ]
    )


def _timeline_impressions(spark):
    def impression(id_: str, ts: datetime, user: int, ad: int, surface: str, position: int, labels: str) -> Row:
        clicked, converted = (c == "1" for c in labels)
        return Row(
            impression_id=id_,
            ts=ts,
            ds=ts.date(),
            user_id=user,
            ad_id=ad,
            surface=surface,
            position=position,
            clicked=clicked,
            converted=converted,
            p_click=position / 10,
            p_convert=0.01,
        )

    return spark.createDataFrame(
        [  # out of time order; a and e share a ts
            impression("c", datetime(2026, 11, 3, 12), 1, 99, "feed", 3, "11"),
            impression("e", datetime(2026, 11, 3, 10), 1, 12, "reels", 2, "00"),
            impression("a", datetime(2026, 11, 3, 10), 1, 5, "feed", 1, "10"),
            impression("b", datetime(2026, 11, 3, 12), 2, 5, "feed", 1, "00"),
            impression("x", datetime(2026, 11, 2, 12), 3, 5, "feed", 1, "00"),  # another day
        ]
    )


def _timeline_dimensions(spark, spec: FeatureSpec):
    users = tables.silver_user_features(
        spark.createDataFrame([Row(user_id=1, age_bucket="18-24", country="US", device="ios")]), spec
    )
    ads = tables.silver_ad_features(
        spark.createDataFrame(
            [
                Row(ad_id=5, advertiser_id=1, category=2, ad_format="video", objective="conversion"),
                Row(ad_id=12, advertiser_id=1, category=7, ad_format="image", objective="conversion"),
            ]
        ),
        spec,
    )
    return users, ads


def _timelines(spark, spec: FeatureSpec):
    users, ads = _timeline_dimensions(spark, spec)
    return tables.user_timelines(_timeline_impressions(spark), _timeline_events(spark), users, ads, spec, DS)


@pytest.mark.slow
def test_a_timeline_holds_each_event_once_oldest_first_and_what_each_impression_sees(spark):
    spec = FeatureSpec(max_seq_len=2)
    users, ads = _timeline_dimensions(spark, spec)
    out = {r["user_id"]: r.asDict() for r in _timelines(spark, spec).collect()}
    assert set(out) == {1, 2}  # user 3's only impression is on another day
    one = out[1]
    # Of the three events before the first impression the newest two; the tie at 10:30 by item; 15 after every
    # impression is gone.
    assert one["seq_item_ids"] == [11, 12, 13, 12, 14]
    assert (
        one["seq_ts"]
        == [datetime(2026, 11, 2, 8), datetime(2026, 11, 3, 9), datetime(2026, 11, 3, 10)]
        + [datetime(2026, 11, 3, 10, 30)] * 2
    )
    assert one["seq_actions"] == ["view", "view", "click", "click", "view"]
    assert one["seq_item_idx"] == [12, 13, 14, 13, 15]  # 1 + id mod 2047
    assert one["seq_category_idx"] == [0, 8, 0, 8, 0]  # item 12 is ad 12 (category 7: row 8); the others no ad
    view, click = one["seq_action_idx"][0], one["seq_action_idx"][2]
    assert one["seq_action_idx"] == [view, view, click, click, view] and view != click
    # Minutes to the end of DS: 2,400, 900, 840, 810, 810 -> floor(log2(1 + minutes)).
    assert one["seq_age_idx"] == [11, 9, 9, 9, 9]
    # Impressions by time, ties by id; the event at 10:00 is not visible to the impressions at 10:00.
    assert one["impression_id"] == ["a", "e", "c"] and one["impression_count"] == 3
    assert one["visible"] == [2, 2, 5]
    assert one["target_age_idx"] == [9, 9, 9]  # 840, 840 and 720 minutes before the end of DS
    assert one["ts"] == [datetime(2026, 11, 3, 10)] * 2 + [datetime(2026, 11, 3, 12)]
    assert one["ad_id"] == [5, 12, 99] and one["surface"] == ["feed", "reels", "feed"]
    assert (one["clicked"], one["converted"]) == ([True, False, True], [False, False, True])
    assert (one["p_click"], one["p_convert"]) == ([0.1, 0.2, 0.3], [0.01] * 3)
    assert one["hour_of_day"] == [10, 10, 12] and one["hour_of_day_idx"] == [11, 11, 13]  # 1 + hour mod 31
    assert one["ad_id_idx"] == [6, 13, 100] and one["position_idx"] == [2, 3, 4]
    assert one["advertiser_id_idx"] == [2, 2, 0] and one["category_idx"] == [3, 8, 0]  # ad 99 has no row
    formats = {r["ad_id"]: r["ad_format_idx"] for r in ads.collect()}
    assert one["ad_format_idx"] == [formats[5], formats[12], tables.MISSING_ROW] and formats[5] != formats[12]
    feed, reels = one["surface_idx"][0], one["surface_idx"][1]
    assert one["surface_idx"] == [feed, reels, feed] and tables.MISSING_ROW not in (feed, reels) and feed != reels
    user = users.first()
    assert one["user_id_idx"] == 2 and (one["country"], one["country_idx"]) == ("US", user["country_idx"])
    two = out[2]  # no event in the window, no silver.user_features row
    assert (two["impression_id"], two["visible"], two["seq_item_ids"], two["seq_ts"]) == (["b"], [0], [], [])
    assert (two["device"], two["device_idx"], two["user_id_idx"]) == (None, tables.MISSING_ROW, 3)


def _random_world(spark, seed: int = 7):
    """Events and impressions of 6 users over 4 days on a 20-minute grid, so events share their ts with each other
    and with impressions; ads 1-20 exist, items 21-30 are no ads."""
    rng = random.Random(seed)
    days = [DS - timedelta(days=n) for n in range(4)]

    def instant(day: date) -> datetime:
        return datetime(day.year, day.month, day.day) + timedelta(minutes=20 * rng.randrange(72))

    active = [1] * 6 + [2] * 3 + [3, 4]  # users 5 and 6 have no events
    keys = {
        (rng.choice(active), rng.randint(1, 30), rng.choice(["view", "click"]), instant(rng.choice(days)))
        for _ in range(60)
    }
    events = [Row(user_id=u, item_id=i, action=a, surface="feed", ts=ts, ds=ts.date()) for u, i, a, ts in keys]
    impressions = [
        Row(
            impression_id=f"i{n}",
            ts=(ts := instant(DS if n < 40 else DS - timedelta(days=1))),
            ds=ts.date(),
            user_id=rng.randint(1, 6),
            ad_id=rng.randint(1, 24),
            surface=rng.choice(["feed", "reels"]),
            position=rng.randint(1, 5),
            clicked=(clicked := rng.random() < 0.3),
            converted=clicked and rng.random() < 0.5,
        )
        for n in range(50)
    ]
    return spark.createDataFrame(events), spark.createDataFrame(impressions)


def _age_at(ts: datetime, as_of: datetime) -> int:
    """The age bucket of `ts` at `as_of`, worked out apart from Spark."""
    minutes = (as_of - ts).total_seconds() / 60
    return min(math.floor(math.log2(1 + minutes)), FeatureSpec().age_buckets - 1)


def _age(ts: datetime) -> int:
    return _age_at(ts, datetime(2026, 11, 4))  # the end of DS


@pytest.mark.slow
def test_timelines_conserve_impressions_and_give_each_its_point_in_time_sequence(spark):
    spec = FeatureSpec(max_seq_len=4, lookback_days=2)
    events, impressions = _random_world(spark)
    users = tables.silver_user_features(
        spark.createDataFrame([Row(user_id=u, age_bucket="25-34", country="BR", device="web") for u in (1, 2, 3, 5)]),
        spec,
    )
    ads = tables.silver_ad_features(
        spark.createDataFrame(
            [
                Row(ad_id=a, advertiser_id=a % 3, category=a % 5, ad_format="video", objective="sales")
                for a in range(1, 21)
            ]
        ),
        spec,
    )
    examples = {r["impression_id"]: r for r in tables.training_examples(impressions, users, ads, spec, DS).collect()}
    timelines_df = tables.user_timelines(impressions, events, users, ads, spec, DS)
    timelines = timelines_df.collect()
    own = {r["impression_id"]: r for r in tables.impression_sequences(timelines_df, spec).collect()}
    assert sum(r["impression_count"] for r in timelines) == len(examples) == len(own) == 40
    assert sorted(i for r in timelines for i in r["impression_id"]) == sorted(examples) == sorted(own)
    # Each impression's sequence worked out apart from Spark: its user's events in the lookback window strictly
    # before its ts, newest first (ties by item, then action), the newest max_seq_len.
    category = {r["ad_id"]: r["category_idx"] for r in ads.collect()}
    window = [e for e in events.collect() if e["ds"] >= DS - timedelta(days=spec.lookback_days)]
    lengths, tied = [], []  # each impression's sequence length; whether an event shares its ts
    for impression_id, example in examples.items():
        before = sorted(
            ((e["ts"], e["item_id"], e["action"]) for e in window if e["user_id"] == example["user_id"]),
            reverse=True,
        )
        expected = [e for e in before if e[0] < example["ts"]][: spec.max_seq_len]
        sequence = own[impression_id]
        assert (sequence["user_id"], sequence["ds"], sequence["ts"]) == (example["user_id"], DS, example["ts"])
        assert list(zip(sequence["seq_ts"], sequence["seq_item_ids"], sequence["seq_actions"])) == expected
        assert sequence["seq_category_idx"] == [category.get(item, tables.MISSING_ROW) for _, item, _ in expected]
        assert sequence["seq_age_idx"] == [_age_at(t, example["ts"]) for t, _, _ in expected]
        lengths.append(len(expected))
        tied.append(any(e[0] == example["ts"] for e in before))
    for row in timelines:
        assert row["seq_age_idx"] == [_age(t) for t in row["seq_ts"]]
        for i, impression_id in enumerate(row["impression_id"]):
            example = examples[impression_id]
            assert row["target_age_idx"][i] == _age(row["ts"][i]), impression_id
            for column in (
                "ts",
                "ad_id",
                "surface",
                "clicked",
                "converted",
                "hour_of_day",
                *(f.idx_column for f in spec.features if f.side != "user"),
            ):
                assert row[column][i] == example[column], (impression_id, column)
            for f in spec.side("user"):
                assert row[f.idx_column] == example[f.idx_column], (impression_id, f.name)
    assert spec.max_seq_len in lengths and min(lengths) < spec.max_seq_len and any(tied)  # every case was checked


@pytest.mark.slow
def test_timeline_stats_pass_a_good_partition_and_flag_an_impression_shown_a_later_event(spark):
    from gem_lake.features.quality import timeline_stats

    good = _timelines(spark, FeatureSpec(max_seq_len=2))
    stats = timeline_stats(good, max_seq_len=2)
    assert stats.point_in_time
    assert (stats.rows, stats.impressions, stats.events, stats.events_max, stats.impressions_max) == (2, 4, 5, 5, 3)
    # Impression a (10:00) made to see the event at 10:00 too.
    peeks = F.transform("visible", lambda v, i: F.when(i == 0, v + 1).otherwise(v))
    bad = timeline_stats(good.withColumn("visible", F.when(F.col("user_id") == 1, peeks).otherwise(F.col("visible"))))
    assert (bad.future_events, bad.unordered, bad.misaligned, bad.point_in_time) == (1, 0, 0, False)
    shuffled = good.withColumn("seq_ts", F.reverse("seq_ts"))
    assert timeline_stats(shuffled).unordered == 1
    short = good.withColumn("clicked", F.slice("clicked", 1, 1))
    assert timeline_stats(short).misaligned == 1
    assert timeline_stats(good, max_seq_len=1).over_max_len == 1  # user 1 keeps two events before its first


@pytest.mark.slow
def test_building_a_day_of_timelines_twice_replaces_it_and_records_the_mapping(spark, tmp_path):
    from gem_lake.features.bronze import land
    from gem_lake.features.build import build_silver, build_user_timelines
    from gem_model.config import SURFACES, GemConfig
    from gem_model.data.loader import recorded_mapping
    from gem_model.paths import GemPaths

    cfg = GemConfig.from_dict({"features": {"max_seq_len": 2, "lookback_days": 0}})  # DS's events only
    paths = GemPaths(tmp_path)
    spec = cfg.features
    users, ads = _timeline_dimensions(spark, spec)
    land(users.select("user_id", "age_bucket", "country", "device"), "bronze.users", paths, SURFACES)
    land(ads.select(*[c for c in ads.columns if not c.endswith("_idx")]), "bronze.ads", paths, SURFACES)
    for table in ("silver.user_features", "silver.ad_features"):
        build_silver(spark, cfg, paths, table)
    events, impressions = _timeline_events(spark), _timeline_impressions(spark)
    land(events.where(F.col("ds") == DS), "bronze.events", paths, SURFACES, DS)
    land(impressions.where(F.col("ds") == DS), "bronze.impressions", paths, SURFACES, DS)
    assert build_user_timelines(spark, cfg, paths, DS) == build_user_timelines(spark, cfg, paths, DS) == 2
    table = paths.table("gold.user_timelines")
    written = read_table(spark, table)
    assert written.count() == 2 and recorded_mapping(table) == spec.mapping
    assert schema_violations("gold.user_timelines", {f.name: f.dataType.simpleString() for f in written.schema}) == []
    assert {r["user_id"]: r["visible"] for r in written.collect()} == {1: [1, 1, 4], 2: [0]}
