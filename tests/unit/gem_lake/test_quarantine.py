"""Bronze landing: malformed rows are quarantined with a reason, rows are conserved, re-runs are idempotent."""

from datetime import date, datetime

import pytest
from pyspark.sql import Row

from gem_lake.delta import read_table
from gem_lake.features.bronze import land
from gem_lake.quarantine import split
from gem_model.config import SURFACES
from gem_model.paths import GemPaths

pytestmark = pytest.mark.spark
DS = date(2026, 11, 3)
SCHEMA = (
    "impression_id string, ts timestamp, ds date, user_id bigint, ad_id bigint, surface string, "
    "position int, clicked boolean, converted boolean, p_click double, p_convert double"
)


def _impressions(spark):
    ok = dict(
        ts=datetime(2026, 11, 3, 12),
        ds=DS,
        user_id=1,
        ad_id=2,
        surface="feed",
        position=1,
        clicked=True,
        converted=False,
        p_click=None,
        p_convert=None,
    )
    rows = [
        ("good-1", {}),
        ("good-2", {"converted": True}),
        ("null-user", {"user_id": None}),
        ("bad-surface", {"surface": "billboard"}),
        ("late", {"ts": datetime(2026, 11, 5, 1)}),
        ("negative-ad", {"ad_id": -4}),
        ("funnel", {"clicked": False, "converted": True}),
        ("good-1", {"position": 2}),  # a second row with an existing impression_id
    ]
    return spark.createDataFrame([Row(impression_id=i, **{**ok, **bad}) for i, bad in rows], SCHEMA)


@pytest.mark.slow
def test_malformed_rows_are_quarantined_with_reasons_and_conserved(spark, tmp_path):
    paths = GemPaths(tmp_path)
    landing = land(_impressions(spark), "bronze.impressions", paths, SURFACES, DS)
    assert landing.rows_in == 8 and landing.accepted == 2 and landing.rejected == 6 and landing.conserved
    assert landing.reasons == {
        "conversion_without_click": 1,
        "duplicate_impression_id": 1,
        "negative_ad_id": 1,
        "null_user_id": 1,
        "ts_outside_partition": 1,
        "unknown_surface": 1,
    }
    accepted = read_table(spark, paths.table("bronze.impressions"))
    assert sorted(r["impression_id"] for r in accepted.collect()) == ["good-1", "good-2"]
    rejected = read_table(spark, paths.table("bronze.rejected_rows")).collect()
    by_reason = {r["reason"]: r for r in rejected}
    assert '"surface":"billboard"' in by_reason["unknown_surface"]["record"]  # the full row is kept
    assert {r["source_table"] for r in rejected} == {"bronze.impressions"}
    assert {r["source_partition"] for r in rejected} == {DS.isoformat()}
    # rows that were not read from a text file have no source line
    assert {(r["raw_line"], r["source_file"], r["source_line"]) for r in rejected} == {(None, None, None)}


@pytest.mark.slow
def test_relanding_a_day_replaces_it_and_its_rejections(spark, tmp_path):
    paths = GemPaths(tmp_path)
    for _ in range(2):
        landing = land(_impressions(spark), "bronze.impressions", paths, SURFACES, DS)
    assert landing.accepted == 2 and landing.rejected == 6
    assert read_table(spark, paths.table("bronze.impressions")).count() == 2
    assert read_table(spark, paths.table("bronze.rejected_rows")).count() == 6
    fixed = _impressions(spark).where("impression_id LIKE 'good%'").dropDuplicates(["impression_id"])
    landing = land(fixed, "bronze.impressions", paths, SURFACES, DS)
    assert (landing.accepted, landing.rejected) == (2, 0)
    assert read_table(spark, paths.table("bronze.rejected_rows")).count() == 0


def test_dimension_duplicates_and_bad_keys(spark, tmp_path):
    paths = GemPaths(tmp_path)
    users = spark.createDataFrame(
        [
            Row(user_id=1, age_bucket="18-24", country="US", device="ios"),
            Row(user_id=1, age_bucket="18-24", country="US", device="ios"),
            Row(user_id=None, age_bucket="65+", country="BR", device="web"),
            Row(user_id=-3, age_bucket="65+", country="BR", device="web"),
        ],
        "user_id bigint, age_bucket string, country string, device string",
    )
    landing = land(users, "bronze.users", paths, SURFACES)
    assert (landing.accepted, landing.rejected, landing.conserved) == (1, 3, True)
    assert landing.reasons == {"duplicate_user_id": 1, "negative_user_id": 1, "null_user_id": 1}


def test_an_event_repeated_in_its_key_is_rejected_and_two_actions_in_one_second_are_two_events(spark, tmp_path):
    paths = GemPaths(tmp_path)
    at = datetime(2026, 11, 3, 9, 30, 5)
    view = Row(user_id=1, item_id=7, action="view", surface="feed", ts=at, ds=DS)
    events = spark.createDataFrame(
        [
            view,
            Row(**{**view.asDict(), "action": "ad_click"}),
            Row(**{**view.asDict(), "surface": "reels"}),
            Row(**{**view.asDict(), "item_id": 8}),
        ],
        "user_id bigint, item_id bigint, action string, surface string, ts timestamp, ds date",
    )
    landing = land(events, "bronze.events", paths, SURFACES, DS)
    assert (landing.accepted, landing.rejected, landing.conserved) == (3, 1, True)
    assert landing.reasons == {"duplicate_user_id_item_id_action_ts": 1}
    kept = read_table(spark, paths.table("bronze.events")).collect()
    assert sorted((r["item_id"], r["action"], r["surface"]) for r in kept) == [
        (7, "ad_click", "feed"),
        (7, "view", "feed"),
        (8, "view", "feed"),
    ]  # the first copy in JSON order


def test_a_lake_holds_one_data_source(tmp_path):
    paths = GemPaths(tmp_path)
    paths.claim_source("synthetic")
    paths.claim_source("synthetic")
    with pytest.raises(ValueError, match="holds data.source='synthetic', not 'criteo'.*GEM_HOME"):
        paths.claim_source("criteo")


LINE_SCHEMA = SCHEMA + ", _line struct<file: string, number: bigint, raw: string, error: string>"


def _from_lines(spark, rows):
    """Impressions read from lines of `f.csv`: (impression_id, line number, raw line, line error, changes)."""
    ok = dict(
        ts=datetime(2026, 11, 3, 12),
        ds=DS,
        user_id=1,
        ad_id=2,
        surface="feed",
        position=1,
        clicked=False,
        converted=False,
        p_click=None,
        p_convert=None,
    )
    return spark.createDataFrame(
        [
            Row(impression_id=i, **{**ok, **bad}, _line=Row(file="d/f.csv", number=n, raw=raw, error=error))
            for i, n, raw, error, bad in rows
        ],
        LINE_SCHEMA,
    )


@pytest.mark.slow
def test_a_line_error_comes_first_and_its_raw_line_is_kept(spark, tmp_path):
    paths = GemPaths(tmp_path)
    raw = _from_lines(
        spark,
        [
            ("i-0", 2, "1,a,b", None, {}),
            ("i-1", 3, "1,a,b,EXTRA", "too_many_fields", {}),
            ("i-2", 4, "1,a", "too_few_fields", {"user_id": None}),  # the line's reason, not null_user_id
            ("i-3", 5, "1,a,b", None, {"surface": "billboard"}),
        ],
    )
    landing = land(raw, "bronze.impressions", paths, SURFACES, DS)
    assert (landing.rows_in, landing.accepted, landing.rejected, landing.conserved) == (4, 1, 3, True)
    accepted = read_table(spark, paths.table("bronze.impressions"))
    assert "_line" not in accepted.columns and [r["impression_id"] for r in accepted.collect()] == ["i-0"]
    rejected = {r["reason"]: r for r in read_table(spark, paths.table("bronze.rejected_rows")).collect()}
    assert {k: (r["raw_line"], r["source_file"], r["source_line"]) for k, r in rejected.items()} == {
        "too_many_fields": ("1,a,b,EXTRA", "d/f.csv", 3),
        "too_few_fields": ("1,a", "d/f.csv", 4),
        "unknown_surface": ("1,a,b", "d/f.csv", 5),
    }
    assert '"impression_id":"i-1"' in rejected["too_many_fields"]["record"]
    assert "_line" not in rejected["too_many_fields"]["record"]


def test_the_first_good_copy_of_a_key_is_kept(spark):
    # The copy on the earliest line wins; a malformed copy never displaces a good one.
    raw = _from_lines(
        spark,
        [
            ("dup", 9, "late copy", None, {"position": 1}),
            ("dup", 4, "early copy", None, {"position": 2}),
            ("dup", 2, "malformed copy", None, {"surface": None}),
        ],
    )
    accepted, rejected = split(raw, "bronze.impressions", SURFACES, DS)
    assert [r["position"] for r in accepted.collect()] == [2]
    assert sorted((r["reason"], r["source_line"]) for r in rejected.collect()) == [
        ("duplicate_impression_id", 9),
        ("null_surface", 2),
    ]
