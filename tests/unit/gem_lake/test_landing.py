"""Landing safety: the row-drop guard, the landing journal, one landing per partition, and schema evolution."""

from datetime import date, datetime

import pytest
from pyspark.sql import Row

from gem_lake.delta import RowDropError, SchemaChangeError, WritePolicy, read_table, table_version
from gem_lake.features import bronze
from gem_lake.features.bronze import IncompleteLandingError, land, read_journal, require_landed
from gem_lake.locks import PartitionBusyError, partition_lock
from gem_model.config import SURFACES, GemConfig
from gem_model.paths import GemPaths
from tests.conftest import real_data_root

pytestmark = pytest.mark.spark
DS = date(2026, 11, 3)
NEXT = date(2026, 11, 4)
SCHEMA = (
    "impression_id string, ts timestamp, ds date, user_id bigint, ad_id bigint, surface string, "
    "position int, clicked boolean, converted boolean, p_click double, p_convert double"
)
GUARDED = WritePolicy(max_row_drop_fraction=0.5)


def _impressions(spark, n: int, day: date = DS, bad: int = 0, extra: dict | None = None):
    """`n` good impressions of `day` (and `bad` with an unknown surface), with `extra` columns if given."""
    rows = [
        Row(
            impression_id=f"{day}-{i}",
            ts=datetime(day.year, day.month, day.day, 12),
            ds=day,
            user_id=i,
            ad_id=7,
            surface="billboard" if i < bad else "feed",
            position=1,
            clicked=i % 3 == 0,
            converted=False,
            p_click=None,
            p_convert=None,
        )
        for i in range(n + bad)
    ]
    df = spark.createDataFrame(rows, SCHEMA)
    for name, value in (extra or {}).items():
        df = df.selectExpr("*", f"{value} AS {name}")
    return df


@pytest.mark.slow
def test_an_empty_batch_does_not_replace_landed_rows(spark, tmp_path):
    paths = GemPaths(tmp_path)
    land(_impressions(spark, 20, bad=2), "bronze.impressions", paths, SURFACES, DS, policy=GUARDED)
    table = paths.table("bronze.impressions")
    version = table_version(table)
    with pytest.raises(
        RowDropError,
        match=r"bronze.impressions where ds = DATE'2026-11-03': the new rows \(0\) "
        r"would replace 20 rows.*allow_row_drop",
    ):
        land(_impressions(spark, 0), "bronze.impressions", paths, SURFACES, DS, policy=GUARDED)
    assert table_version(table) == version and read_table(spark, table).count() == 20
    assert read_table(spark, paths.table("bronze.rejected_rows")).count() == 2  # its rejections stand too
    assert read_journal(paths, "bronze.impressions", DS.isoformat())["state"] == "committed"
    allowed = land(
        _impressions(spark, 0),
        "bronze.impressions",
        paths,
        SURFACES,
        DS,
        policy=WritePolicy(max_row_drop_fraction=0.5, allow_row_drop=True),
    )
    assert (allowed.accepted, allowed.rejected) == (0, 0) and read_table(spark, table).count() == 0


@pytest.mark.slow
def test_a_drop_beyond_the_fraction_is_refused_and_a_smaller_one_lands(spark, tmp_path):
    paths = GemPaths(tmp_path)
    land(_impressions(spark, 20), "bronze.impressions", paths, SURFACES, DS, policy=GUARDED)
    with pytest.raises(RowDropError, match=r"the new rows \(9\) would replace 20 rows"):
        land(_impressions(spark, 9), "bronze.impressions", paths, SURFACES, DS, policy=GUARDED)
    landing = land(_impressions(spark, 10), "bronze.impressions", paths, SURFACES, DS, policy=GUARDED)
    assert landing.accepted == 10


@pytest.mark.slow
def test_a_landing_reads_back_its_own_day_alone_and_agrees_with_spark(spark, tmp_path):
    paths = GemPaths(tmp_path)
    land(_impressions(spark, 6, bad=2), "bronze.impressions", paths, SURFACES, DS)
    landing = land(_impressions(spark, 4, day=NEXT, bad=1), "bronze.impressions", paths, SURFACES, NEXT)
    assert (landing.rows_in, landing.accepted, landing.rejected) == (5, 4, 1)
    assert landing.reasons == {"unknown_surface": 1}
    # The read-back (delta-rs) counts what Spark reads from the same tables.
    by_day = {
        r["ds"]: r["count"]
        for r in read_table(spark, paths.table("bronze.impressions")).groupBy("ds").count().collect()
    }
    rejected = read_table(spark, paths.table("bronze.rejected_rows")).groupBy("source_partition").count().collect()
    assert by_day == {DS: 6, NEXT: landing.accepted}
    assert {r["source_partition"]: r["count"] for r in rejected} == {DS.isoformat(): 2, NEXT.isoformat(): 1}


@pytest.mark.slow
def test_a_landing_killed_between_its_two_commits_is_refused_downstream_until_relanded(spark, tmp_path, monkeypatch):
    paths = GemPaths(tmp_path)
    land(_impressions(spark, 10, bad=1), "bronze.impressions", paths, SURFACES, DS)
    real = bronze.replace_partition

    def killed_at_the_rejected_commit(df, path, *args, **kwargs):
        if path == paths.table("bronze.rejected_rows"):
            raise SystemExit("killed")  # the process dies after the accepted rows were committed
        return real(df, path, *args, **kwargs)

    monkeypatch.setattr(bronze, "replace_partition", killed_at_the_rejected_commit)
    with pytest.raises(SystemExit):
        land(_impressions(spark, 12, bad=3), "bronze.impressions", paths, SURFACES, DS)
    monkeypatch.undo()
    entry = read_journal(paths, "bronze.impressions", DS.isoformat())
    assert entry["state"] == "started" and entry["rows_in"] == 15
    # Accepted rows are the new landing's, rejected ones still the old one's: nothing may read this partition.
    assert read_table(spark, paths.table("bronze.impressions")).count() == 12
    assert read_table(spark, paths.table("bronze.rejected_rows")).count() == 1
    with pytest.raises(IncompleteLandingError, match="never finished.*land it again"):
        require_landed(paths, "bronze.impressions", [DS.isoformat()])
    landing = land(_impressions(spark, 12, bad=3), "bronze.impressions", paths, SURFACES, DS)
    assert (landing.accepted, landing.rejected, landing.conserved) == (12, 3, True)
    require_landed(paths, "bronze.impressions", [DS.isoformat()])


@pytest.mark.slow
def test_a_refused_landing_leaves_the_previous_journal_entry(spark, tmp_path):
    paths = GemPaths(tmp_path)
    land(_impressions(spark, 5, extra={"promo": "'x'"}), "bronze.impressions", paths, SURFACES, DS)
    before = read_journal(paths, "bronze.impressions", DS.isoformat())
    with pytest.raises(SchemaChangeError):
        land(_impressions(spark, 5), "bronze.impressions", paths, SURFACES, DS)
    assert read_journal(paths, "bronze.impressions", DS.isoformat()) == before


def test_one_landing_of_a_partition_at_a_time(spark, tmp_path):
    paths = GemPaths(tmp_path)
    with partition_lock(paths, "landing", "bronze.impressions", DS.isoformat(), holder="dagster run other"):
        with pytest.raises(PartitionBusyError, match="locked by another run.*dagster run other"):
            land(_impressions(spark, 3), "bronze.impressions", paths, SURFACES, DS)
    assert not paths.table("bronze.impressions").exists()


@pytest.mark.slow
def test_a_column_added_once_blocks_later_batches_until_kept_or_dropped(spark, gem_home):
    from jobs.cli import main

    paths = GemPaths(gem_home)
    land(_impressions(spark, 4, extra={"promo": "'spring'"}), "bronze.impressions", paths, SURFACES, DS)
    with pytest.raises(
        SchemaChangeError,
        match=r"lack: \['promo'\].*allow_missing_columns.*"
        r"gem lake drop-columns bronze.impressions promo",
    ):
        land(_impressions(spark, 4, NEXT), "bronze.impressions", paths, SURFACES, NEXT)
    # Fix 1: keep the column, nulls for the new day.
    kept = land(
        _impressions(spark, 4, NEXT),
        "bronze.impressions",
        paths,
        SURFACES,
        NEXT,
        policy=WritePolicy(allow_missing_columns=True),
    )
    assert kept.accepted == 4
    promo = {(r["ds"], r["promo"]) for r in read_table(spark, paths.table("bronze.impressions")).collect()}
    assert promo == {(DS, "spring"), (NEXT, None)}
    # Fix 2: drop the column from the table with the CLI; the next batch lands as it is, every row kept.
    main(["lake", "drop-columns", "bronze.impressions", "promo"])
    table = read_table(spark, paths.table("bronze.impressions"))
    assert "promo" not in table.columns and table.count() == 8
    assert land(_impressions(spark, 5, NEXT), "bronze.impressions", paths, SURFACES, NEXT).accepted == 5


@pytest.mark.slow
def test_header_only_source_files_do_not_wipe_the_landed_dimensions(spark, tmp_path):
    """The observed case: a real source's files truncated to their headers, landed again over good data."""
    from gem_lake.features.build import land_bronze
    from gem_lake.sources.criteo import FILES, FOLDER

    cfg = GemConfig.from_dict(
        {"world": {"n_days": 2, "holdout_days": 1}, "data": {"source": "criteo", "data_dir": str(tmp_path / "data")}}
    )
    real = real_data_root() / FOLDER
    if not real.is_dir():
        pytest.skip(f"{real} is absent")
    copy = tmp_path / "data" / FOLDER
    copy.mkdir(parents=True)
    names = [f.name for f in FILES]
    for name in names:  # the header and 30 lines of each file
        copy.joinpath(name).write_bytes(b"".join(real.joinpath(name).open("rb").readlines()[:31]))
    paths = GemPaths(tmp_path / "gem")
    first = {t: land_bronze(spark, cfg, paths, t) for t in ("bronze.users", "bronze.ads")}
    assert all(landing.accepted > 0 for landing in first.values())
    versions = {t: table_version(paths.table(t)) for t in first}
    for name in names:  # the next delivery: header-only files
        copy.joinpath(name).write_bytes(real.joinpath(name).open("rb").readline())
    for table, landing in first.items():
        with pytest.raises(RowDropError, match=rf"{table}: the new rows \(0\) would replace {landing.accepted} rows"):
            land_bronze(spark, cfg, paths, table)
        assert table_version(paths.table(table)) == versions[table]
        assert read_table(spark, paths.table(table)).count() == landing.accepted


def _events(spark, day: date, users: int):
    rows = [
        Row(user_id=u, item_id=7, action="view", surface="feed", ts=datetime(day.year, day.month, day.day, 9), ds=day)
        for u in range(users)
    ]
    return spark.createDataFrame(
        rows, "user_id bigint, item_id bigint, action string, surface string, ts timestamp, ds date"
    )


@pytest.mark.slow
def test_a_day_missing_from_the_lookback_fails_the_build_before_anything_is_written(spark, tmp_path):
    from gem_lake.features.build import MissingInputError, build_silver, build_user_sequences

    cfg = GemConfig.from_dict({"features": {"lookback_days": 2}})
    first, gap, day = cfg.world.days[:3]
    paths = GemPaths(tmp_path)
    with pytest.raises(
        MissingInputError,
        match=r"cannot build silver.ad_features: bronze.ads partition all was "
        r"never landed .*materialise bronze/ads \(build_dimensions_job",
    ):
        build_silver(spark, cfg, paths, "silver.ad_features")
    ads = spark.createDataFrame(
        [Row(ad_id=7, advertiser_id=1, category=3, ad_format="video", objective="sales")],
        "ad_id bigint, advertiser_id bigint, category bigint, ad_format string, objective string",
    )
    land(ads, "bronze.ads", paths, SURFACES)
    build_silver(spark, cfg, paths, "silver.ad_features")
    land(_events(spark, first, 3), "bronze.events", paths, SURFACES, first)
    land(_events(spark, day, 2), "bronze.events", paths, SURFACES, day)
    assert build_user_sequences(spark, cfg, paths, first) == 3  # its lookback before the calendar needs no days
    sequences = paths.table("gold.user_sequences")
    version = table_version(sequences)
    with pytest.raises(
        MissingInputError,
        match=(
            rf"cannot build gold.user_sequences for {day}: bronze.events partition {gap} was never landed \(no "
            rf"landing journal in .*\) \(its sequences look back 2 days\). Land it first: materialise bronze/events "
            rf"for {gap} \(build_features_job, or python -m jobs.build_features\), then build gold.user_sequences "
            rf"for {day} again; nothing was written"
        ),
    ):
        build_user_sequences(spark, cfg, paths, day)
    assert table_version(sequences) == version
    assert [r["ds"] for r in read_table(spark, sequences).select("ds").distinct().collect()] == [first]

    # A day landed with no rows is a day without events, not a missing one: the build goes on.
    assert land(_events(spark, gap, 0), "bronze.events", paths, SURFACES, gap).accepted == 0
    assert build_user_sequences(spark, cfg, paths, day) == 3  # the first day's users are still in the window


def test_a_gold_partition_whose_events_are_missing_fails_in_dagster_before_spark_starts(tmp_path):
    import dagster as dg

    from dagster_project.defs.features.assets import build_feature_assets
    from dagster_project.resources.lake import LakeResource
    from dagster_project.resources.spark import SparkResource

    class NoSpark(SparkResource):
        def session(self):
            raise AssertionError("the step started Spark")

    lake = LakeResource(home=str(tmp_path / "gem"))
    day = lake.config.world.days[2].isoformat()
    assets = build_feature_assets(lake.config)
    sequences = next(a for a in assets if a.key == dg.AssetKey(["gold", "user_sequences"]))
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize(
        [sequences],
        partition_key=day,
        resources={"lake": lake, "spark": NoSpark()},
        instance=instance,
        raise_on_error=False,
    )
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    message = (
        failure.step_failure_data.error.cause.message
        if failure.step_failure_data.error.cause
        else failure.step_failure_data.error.message
    )
    assert "MissingInputError: cannot build gold.user_sequences for " + day in message
    assert "bronze.events partitions 2026-11-01, 2026-11-02, 2026-11-03 were never landed" in message
    assert instance.get_latest_materialization_event(sequences.key) is None
    assert not lake.paths.table("gold.user_sequences").exists()
