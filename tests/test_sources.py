"""The real-dataset adapters against their raw files: schema, row and label conservation, calendar, ids, events.

Every expectation is counted from the raw files with Python's csv module and checked against the
numbers in each folder's SOURCE.md, never through the adapter. The data is read in place; the
module is skipped where it is absent.
"""

from __future__ import annotations

import csv
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date
from functools import reduce
from pathlib import Path

import pytest
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from gem_model.config import GemConfig
from jobs.sources import MODULES, Source, data_dir

try:
    ROOT = data_dir(GemConfig())
except FileNotFoundError as missing:
    pytest.skip(f"real datasets are not on this machine: {missing}", allow_module_level=True)

pytestmark = pytest.mark.spark

IMPRESSION_COLUMNS = [
    ("impression_id", "string"), ("ts", "timestamp"), ("ds", "date"), ("user_id", "bigint"), ("ad_id", "bigint"),
    ("surface", "string"), ("position", "int"), ("clicked", "boolean"), ("converted", "boolean"),
    ("p_click", "double"), ("p_convert", "double"),
]
EVENT_COLUMNS = [("user_id", "bigint"), ("item_id", "bigint"), ("action", "string"), ("surface", "string"),
                 ("ts", "timestamp"), ("ds", "date")]
USER_COLUMNS = [("user_id", "bigint"), ("age_bucket", "string"), ("country", "string"), ("device", "string")]
AD_COLUMNS = [("ad_id", "bigint"), ("advertiser_id", "bigint"), ("category", "bigint"), ("ad_format", "string"),
              ("objective", "string")]


@dataclass(frozen=True)
class Raw:
    """What a dataset's raw files hold, counted with the csv module."""

    rows: int
    clicks: int
    conversions: int
    users: int  # distinct user keys
    ads: int  # rows the adapter's ads() must have
    largest_file: int  # bytes of the largest impression file the adapter reads
    rows_without_ad: int = 0
    history_steps: dict[str, int] | None = None  # Taobao: real sequence steps per btag code
    holdout_file: str | None = None  # the test split, which must fill the last day


def _csv(path: Path, header: bool = True) -> Iterator[list[str]]:
    with path.open(newline="") as fh:
        rows = csv.reader(fh)
        if header:
            next(rows)
        yield from rows


def _largest(paths: list[Path]) -> int:
    return max(p.stat().st_size for p in paths)


def _dicts(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def raw_taobao(folder: Path) -> Raw:
    paths = [folder / "dmr_alimama_sampled_train.txt", folder / "dmr_alimama_sampled_test.txt"]
    rows = [r for path in paths for r in _csv(path, header=False)]
    steps: dict[str, int] = {}
    for r in rows:
        for j in range(50):
            if r[150 + j] == "1":
                steps[r[j]] = steps.get(r[j], 0) + 1
    return Raw(len(rows), sum(r[266] == "1" for r in rows), 0, len({r[250] for r in rows}),
               len({r[259] for r in rows}), _largest(paths), history_steps=steps,
               holdout_file="dmr_alimama_sampled_test")


def raw_ali_ccp(folder: Path) -> Raw:
    paths = [folder / f"ali_ccp_{split}_sample.csv" for split in ("train", "val", "test")]
    rows = [r for path in paths for r in _dicts(path)]
    return Raw(len(rows), sum(r["click"] == "1" for r in rows), sum(r["purchase"] == "1" for r in rows),
               len({r["101"] for r in rows}), len({r["205"] for r in rows}), _largest(paths),
               holdout_file="ali_ccp_test_sample")


def raw_aliexpress(folder: Path) -> Raw:
    paths = sorted(folder.glob("*.csv"))
    rows = [r for path in paths for r in _dicts(path)]
    users = {tuple(r[f"categorical_{i}"] for i in range(1, 10)) for r in rows}
    ads = {tuple(r[f"categorical_{i}"] for i in range(10, 17)) for r in rows}
    return Raw(len(rows), sum(r["click"] == "1" for r in rows), sum(r["conversion"] == "1" for r in rows),
               len(users), len(ads), _largest(paths), holdout_file="_test")


def raw_criteo(folder: Path) -> Raw:
    paths = [folder / "deepctr_criteo_sample.csv", folder / "funrec_kaggle_train.csv"]
    rows = [r for path in paths for r in _dicts(path)]
    clicks = sum(r.get("label", r.get("Label")) == "1" for r in rows)
    return Raw(len(rows), clicks, 0, len({r["C15"] for r in rows}), len({r["C3"] for r in rows if r["C3"]}),
               _largest(paths), rows_without_ad=sum(not r["C3"] for r in rows))


def raw_open_bandit(folder: Path) -> Raw:
    paths = [folder / policy / c / f"{c}.csv" for policy in ("random", "bts") for c in ("all", "men", "women")]
    rows = [r for path in paths for r in _dicts(path)]
    users = {tuple(r[f"user_feature_{i}"] for i in range(4)) for r in rows}
    items = sum(1 for c in ("all", "men", "women") for _ in _csv(folder / "random" / c / "item_context.csv"))
    return Raw(len(rows), sum(r["click"] == "1" for r in rows), 0, len(users), items, _largest(paths))


# source -> (folder, raw counter, (rows, clicks, conversions) as SOURCE.md states them)
DATASETS = {
    "taobao": ("taobao_ad_display_click", raw_taobao, (2000 + 500, 97 + 210, 0)),
    "ali_ccp": ("ali_ccp", raw_ali_ccp, (100 + 50 + 50, 7 + 3 + 6, 1 + 1 + 1)),
    "aliexpress": ("aliexpress", raw_aliexpress, (100 + 100 + 100 + 20, 3 + 6 + 60 + 10, 2 + 1 + 2 + 2)),
    "criteo": ("criteo_kaggle_dac", raw_criteo, (200 + 1599, 49 + 334, 0)),
    "open_bandit": ("open_bandit_dataset", raw_open_bandit, (60_000, 38 + 46 + 46 + 42 + 69 + 46, 0)),
}

def _config(name: str) -> GemConfig:
    return GemConfig.from_dict({"world": {"n_days": 4, "holdout_days": 1}, "data": {"source": name}})


def _source(spark: SparkSession, name: str) -> Source:
    folder, _, _ = DATASETS[name]
    if not (ROOT / folder).is_dir():
        pytest.skip(f"{ROOT / folder} is absent")
    return importlib.import_module(MODULES[name]).Source(spark, _config(name), ROOT)


def _all_days(cfg: GemConfig, method: Callable[[date], DataFrame]) -> DataFrame:
    """`method(ds)` over the calendar, each row tagged with the day it was asked for (`_asked`)."""
    return reduce(DataFrame.unionByName, [method(d).select("*", F.lit(d).alias("_asked")) for d in cfg.world.days])


@dataclass(frozen=True)
class Bronze:
    """One dataset's source with its impressions and events of all days (cached for the module)."""

    name: str
    cfg: GemConfig
    source: Source
    raw: Raw
    impressions: DataFrame
    events: DataFrame


@pytest.fixture(scope="module")
def raw() -> dict[str, Raw]:
    return {name: counter(ROOT / folder) for name, (folder, counter, _) in DATASETS.items() if (ROOT / folder).is_dir()}


@pytest.fixture(scope="module", params=DATASETS)
def bronze(request, spark, raw) -> Iterator[Bronze]:
    name = request.param
    source, cfg = _source(spark, name), _config(name)
    impressions = _all_days(cfg, source.impressions).cache()
    events = _all_days(cfg, source.events).cache()
    try:
        impressions.count(), events.count()  # fail here, once, if the layout fails
        yield Bronze(name, cfg, source, raw[name], impressions, events)
    finally:
        impressions.unpersist(), events.unpersist()


@pytest.mark.parametrize("name", list(DATASETS))
def test_raw_files_hold_what_source_md_documents(raw, name):
    if name not in raw:
        pytest.skip(f"{name} is absent")
    r = raw[name]
    assert (r.rows, r.clicks, r.conversions) == DATASETS[name][2]


def test_bronze_columns_come_first_with_their_types(bronze):
    assert bronze.impressions.dtypes[: len(IMPRESSION_COLUMNS)] == IMPRESSION_COLUMNS
    assert bronze.events.dtypes[: len(EVENT_COLUMNS)] == EVENT_COLUMNS
    assert bronze.source.users().dtypes[: len(USER_COLUMNS)] == USER_COLUMNS
    assert bronze.source.ads().dtypes[: len(AD_COLUMNS)] == AD_COLUMNS


def _off_day() -> Column:
    """A row whose day is not its timestamp's date, or not the day it was asked for."""
    return (F.col("ds") != F.to_date("ts")) | (F.col("ds") != F.col("_asked"))


def test_impressions_conserve_rows_and_labels_on_the_calendar(bronze):
    r, days = bronze.raw, bronze.cfg.world.days
    stats = bronze.impressions.agg(
        F.count("*").alias("rows"), F.count_if("clicked").alias("clicks"), F.count_if("converted").alias("conversions"),
        F.count_distinct("impression_id").alias("ids"), F.count_if(_off_day()).alias("off_day"),
        F.count_if(~F.col("ds").between(days[0], days[-1])).alias("off_calendar"),
        F.count_if(F.col("surface").isNull() | ~F.col("surface").isin(*bronze.cfg.world.surfaces)).alias("bad_surface"),
        F.count_if(F.col("user_id").isNull()).alias("no_user"), F.count_if(F.col("ad_id").isNull()).alias("no_ad"),
        F.count_if(F.col("p_click").isNotNull() | F.col("p_convert").isNotNull()).alias("with_truth"),
        F.count_if(F.col("impression_id").isNull()).alias("no_id"),
    ).first().asDict()
    assert stats == {"rows": r.rows, "clicks": r.clicks, "conversions": r.conversions, "ids": r.rows,
                     "off_day": 0, "off_calendar": 0, "bad_surface": 0, "no_user": 0, "no_ad": r.rows_without_ad,
                     "with_truth": 0, "no_id": 0}


def test_the_test_split_fills_the_last_day(bronze):
    if bronze.raw.holdout_file is None:
        pytest.skip(f"{bronze.name} has no test split")
    last = bronze.impressions.where(F.col("ds") == bronze.cfg.world.days[-1])
    outside = ~F.col("impression_id").contains(bronze.raw.holdout_file)
    rows, from_elsewhere = last.agg(F.count("*"), F.count_if(outside)).first()
    assert rows > 0 and from_elsewhere == 0


def test_users_and_ads_are_unique_and_cover_the_impressions(bronze):
    r, users, ads = bronze.raw, bronze.source.users(), bronze.source.ads()
    missing_users = bronze.impressions.where("user_id IS NOT NULL").join(users, "user_id", "left_anti")
    missing_ads = bronze.impressions.where("ad_id IS NOT NULL").join(ads, "ad_id", "left_anti")
    stats = (users.agg(F.count("*").alias("users"), F.count_distinct("user_id").alias("user_ids"))
             .crossJoin(ads.agg(F.count("*").alias("ads"), F.count_distinct("ad_id").alias("ad_ids"),
                                F.count_if(F.col("ad_id").isNull()).alias("null_ads")))
             .crossJoin(missing_users.agg(F.count("*").alias("missing_users")))
             .crossJoin(missing_ads.agg(F.count("*").alias("missing_ads"))).first().asDict())
    null_ads = 1 if r.rows_without_ad else 0  # rows without an ad id share one null-keyed dimension row
    assert stats == {"users": r.users, "user_ids": r.users, "ads": r.ads + null_ads, "ad_ids": r.ads,
                     "null_ads": null_ads, "missing_users": 0, "missing_ads": 0}


def test_click_events_are_the_clicked_impressions(bronze):
    clicks = bronze.events.where(F.col("action") == "click")
    clicked = bronze.impressions.where("clicked").select(
        "user_id", F.col("ad_id").alias("item_id"), "ts", "surface", "_asked")
    keys = ["user_id", "item_id", "ts", "surface", "_asked"]
    matched = clicks.join(clicked, [clicks[k].eqNullSafe(clicked[k]) for k in keys])
    stats = clicks.agg(F.count("*").alias("events"), F.count_if(_off_day()).alias("off_day")).crossJoin(
        matched.agg(F.count("*").alias("matched"))).first().asDict()
    assert stats == {"events": bronze.raw.clicks, "off_day": 0, "matched": bronze.raw.clicks}


@pytest.mark.parametrize("bronze", ["taobao"], indirect=True)
def test_taobao_history_events_just_precede_their_impression(bronze):
    history = bronze.events.where(F.col("action") != "click")
    imps = bronze.impressions.select("impression_id", F.col("user_id").alias("imp_user"),
                                     F.col("ts").alias("imp_ts"), F.col("surface").alias("imp_surface"))
    joined = history.join(imps, "impression_id", "left")
    lag = F.unix_timestamp("imp_ts") - F.unix_timestamp("ts")
    stats = joined.agg(
        F.count("*").alias("events"), F.count_if(~lag.between(1, 50) | lag.isNull()).alias("not_just_before"),
        F.count_if((F.col("user_id") != F.col("imp_user")) | (F.col("surface") != F.col("imp_surface"))).alias("other"),
        F.count_if(_off_day()).alias("off_day"),
    ).first().asDict()
    steps = bronze.raw.history_steps
    assert stats == {"events": sum(steps.values()), "not_just_before": 0, "other": 0, "off_day": 0}
    per_code = history.groupBy("btag", "action").count().collect()
    assert {str(row["btag"]): row["count"] for row in per_code} == steps
    assert {row["action"] for row in per_code} == {"pv", "cart", "fav", "buy"}


def test_impressions_are_identical_whatever_the_partitioning(spark, bronze):
    day = bronze.cfg.world.days[-1]
    columns = bronze.source.impressions(day).columns

    def fingerprint(df: DataFrame) -> tuple:
        return tuple(df.agg(F.count("*"), F.bit_xor(F.xxhash64(*columns))).first())

    before = fingerprint(bronze.impressions.where(F.col("_asked") == day))
    previous = {k: spark.conf.get(k) for k in ("spark.sql.shuffle.partitions", "spark.sql.files.maxPartitionBytes")}
    try:  # the largest file split into two scan partitions (smaller ones stay whole), another shuffle width
        spark.conf.set("spark.sql.shuffle.partitions", "3")
        spark.conf.set("spark.sql.files.maxPartitionBytes", str(bronze.raw.largest_file // 2 + 1))
        after = fingerprint(bronze.source.impressions(day))
    finally:
        for key, value in previous.items():
            spark.conf.set(key, value)
    assert before == after and before[0] > 0
