"""The real-dataset adapters against their raw files: schema, row and label conservation, calendar, ids, events,
and strict parsing: corrupted copies of the samples land with each bad line rejected for its own reason.

Every expectation is counted from the raw files with Python's csv module and checked against the
numbers in each folder's SOURCE.md, never through the adapter. The data is read in place; the
corrupted copies (a few real lines each) are written to the test's temporary folder. The module is
skipped where the data is absent.
"""

from __future__ import annotations

import csv
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import date
from functools import reduce
from pathlib import Path

import pytest
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from gem_lake.delta import read_table
from gem_lake.features.bronze import Landing
from gem_lake.features.build import land_bronze
from gem_lake.sources import MODULES, Source
from gem_lake.sources.lines import SourceFormatError
from gem_model.config import GemConfig
from gem_model.paths import GemPaths
from tests.conftest import real_data_root

ROOT = real_data_root()

# Slow as a whole: each dataset's module-scoped fixture lands its sample with Spark first.
pytestmark = [pytest.mark.spark, pytest.mark.slow]

IMPRESSION_COLUMNS = [
    ("impression_id", "string"),
    ("ts", "timestamp"),
    ("ds", "date"),
    ("user_id", "bigint"),
    ("ad_id", "bigint"),
    ("surface", "string"),
    ("position", "int"),
    ("clicked", "boolean"),
    ("converted", "boolean"),
    ("p_click", "double"),
    ("p_convert", "double"),
]
EVENT_COLUMNS = [
    ("user_id", "bigint"),
    ("item_id", "bigint"),
    ("action", "string"),
    ("surface", "string"),
    ("ts", "timestamp"),
    ("ds", "date"),
]
USER_COLUMNS = [("user_id", "bigint"), ("age_bucket", "string"), ("country", "string"), ("device", "string")]
AD_COLUMNS = [
    ("ad_id", "bigint"),
    ("advertiser_id", "bigint"),
    ("category", "bigint"),
    ("ad_format", "string"),
    ("objective", "string"),
]


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
    history_steps: dict[str, int] | None = None  # Taobao: real sequence steps per btag code (first copies)
    holdout_file: str | None = None  # the test split, which must fill the last day
    holdout_rows: int | None = None  # its rows, where they fill exactly the holdout days (`holdout_files`)
    repeats: dict[str, int] = field(default_factory=dict)  # duplicate_<key> -> later copies of a key
    repeated_clicks: int = 0  # clicked later copies: rejected, so they click no event
    every_row_an_event: bool = False  # MovieLens: every rating is an event (action = the rating), not the clicks


def _repeats(keys: list[object]) -> list[bool]:
    """Whether each key repeats an earlier one."""
    seen: set[object] = set()
    repeated = []
    for key in keys:
        repeated.append(key in seen)
        seen.add(key)
    return repeated


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
    repeated = _repeats([tuple(r) for r in rows])  # no id: a repeated line is the duplicate
    steps: dict[str, int] = {}
    for r, again in zip(rows, repeated):
        for j in range(50):
            if r[150 + j] == "1" and not again:
                steps[r[j]] = steps.get(r[j], 0) + 1
    return Raw(
        len(rows),
        sum(r[266] == "1" for r in rows),
        0,
        len({r[250] for r in rows}),
        len({r[259] for r in rows}),
        _largest(paths),
        history_steps=steps,
        holdout_file="dmr_alimama_sampled_test",
        repeats={"duplicate_line": sum(repeated)},
        repeated_clicks=sum(r[266] == "1" and again for r, again in zip(rows, repeated)),
    )


def raw_ali_ccp(folder: Path) -> Raw:
    paths = [folder / f"ali_ccp_{split}_sample.csv" for split in ("train", "val", "test")]
    rows = [r for path in paths for r in _dicts(path)]
    repeated = _repeats([tuple(r.values()) for r in rows])
    return Raw(
        len(rows),
        sum(r["click"] == "1" for r in rows),
        sum(r["purchase"] == "1" for r in rows),
        len({r["101"] for r in rows}),
        len({r["205"] for r in rows}),
        _largest(paths),
        holdout_file="ali_ccp_test_sample",
        repeats={"duplicate_line": sum(repeated)},
        repeated_clicks=sum(r["click"] == "1" and again for r, again in zip(rows, repeated)),
    )


def raw_aliexpress(folder: Path) -> Raw:
    paths = sorted(folder.glob("*.csv"))
    rows = [r for path in paths for r in _dicts(path)]
    users = {tuple(r[f"categorical_{i}"] for i in range(1, 10)) for r in rows}
    ads = {tuple(r[f"categorical_{i}"] for i in range(10, 17)) for r in rows}
    assert not any(_repeats([tuple(r.values()) for r in rows]))  # else count them as for Ali-CCP
    return Raw(
        len(rows),
        sum(r["click"] == "1" for r in rows),
        sum(r["conversion"] == "1" for r in rows),
        len(users),
        len(ads),
        _largest(paths),
        holdout_file="_test",
    )


def raw_criteo(folder: Path) -> Raw:
    paths = [folder / "deepctr_criteo_sample.csv", folder / "funrec_kaggle_train.csv"]
    rows = [r for path in paths for r in _dicts(path)]
    clicks = sum(r.get("label", r.get("Label")) == "1" for r in rows)
    assert not any(_repeats([r.get("Id") or tuple(r.values()) for r in rows]))  # by Kaggle Id, else by line
    return Raw(
        len(rows),
        clicks,
        0,
        len({r["C15"] for r in rows}),
        len({r["C3"] for r in rows if r["C3"]}),
        _largest(paths),
        rows_without_ad=sum(not r["C3"] for r in rows),
    )


def raw_open_bandit(folder: Path) -> Raw:
    paths = [folder / policy / c / f"{c}.csv" for policy in ("random", "bts") for c in ("all", "men", "women")]
    rows = [r for path in paths for r in _dicts(path)]
    users = {tuple(r[f"user_feature_{i}"] for i in range(4)) for r in rows}
    items = sum(1 for c in ("all", "men", "women") for _ in _csv(folder / "random" / c / "item_context.csv"))
    assert not any(_repeats([(path, r[""]) for path in paths for r in _dicts(path)]))  # by each log's index
    return Raw(len(rows), sum(r["click"] == "1" for r in rows), 0, len(users), items, _largest(paths))


def raw_frappe(folder: Path) -> Raw:
    paths = [folder / "valid.csv", folder / "test.csv"]
    rows = [r for path in paths for r in _dicts(path)]
    repeated = _repeats([tuple(r.values()) for r in rows])  # no id: a repeated line is the duplicate
    return Raw(
        len(rows),
        sum(r["label"] == "1" for r in rows),
        0,
        len({r["user"] for r in rows}),
        len({r["item"] for r in rows}),
        _largest(paths),
        holdout_file="frappe-test-",
        holdout_rows=len(_dicts(paths[1])),
        repeats={"duplicate_line": sum(repeated)},
        repeated_clicks=sum(r["label"] == "1" and again for r, again in zip(rows, repeated)),
    )


def raw_movielens(folder: Path) -> Raw:
    path = folder / "all_ratings_from_u1.tsv"
    rows = [line.split("\t") for line in path.read_text().splitlines()]
    assert not any(_repeats([(r[0], r[1]) for r in rows]))  # one rating per (user, movie)
    movies = len((folder / "u.item").read_bytes().splitlines())
    return Raw(
        len(rows),
        sum(r[2] in ("4", "5") for r in rows),
        0,
        len({r[0] for r in rows}),
        movies,
        path.stat().st_size,
        every_row_an_event=True,
    )


# source -> (folder, raw counter, (rows, clicks, conversions) as SOURCE.md states them)
DATASETS = {
    "taobao": ("taobao_ad_display_click", raw_taobao, (2000 + 500, 97 + 210, 0)),
    "ali_ccp": ("ali_ccp", raw_ali_ccp, (100 + 50 + 50, 7 + 3 + 6, 1 + 1 + 1)),
    "aliexpress": ("aliexpress", raw_aliexpress, (100 + 100 + 100 + 20, 3 + 6 + 60 + 10, 2 + 1 + 2 + 2)),
    "criteo": ("criteo_kaggle_dac", raw_criteo, (200 + 1599, 49 + 334, 0)),
    "open_bandit": ("open_bandit_dataset", raw_open_bandit, (60_000, 38 + 46 + 46 + 42 + 69 + 46, 0)),
    "frappe": ("frappe_x1", raw_frappe, (57_722 + 28_860, 19_063 + 9_536, 0)),  # source mappings
    "movielens": ("movielens_100k", raw_movielens, (100_000, 34_174 + 21_201, 0)),
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
    stats = (
        bronze.impressions.agg(
            F.count("*").alias("rows"),
            F.count_if("clicked").alias("clicks"),
            F.count_if("converted").alias("conversions"),
            F.count_distinct("impression_id").alias("ids"),
            F.count_if(_off_day()).alias("off_day"),
            F.count_if(~F.col("ds").between(days[0], days[-1])).alias("off_calendar"),
            F.count_if(F.col("surface").isNull() | ~F.col("surface").isin(*bronze.cfg.world.surfaces)).alias(
                "bad_surface"
            ),
            F.count_if(F.col("user_id").isNull()).alias("no_user"),
            F.count_if(F.col("ad_id").isNull()).alias("no_ad"),
            F.count_if(F.col("p_click").isNotNull() | F.col("p_convert").isNotNull()).alias("with_truth"),
            F.count_if(F.col("impression_id").isNull()).alias("no_id"),
        )
        .first()
        .asDict()
    )
    assert stats == {
        "rows": r.rows,
        "clicks": r.clicks,
        "conversions": r.conversions,
        "ids": r.rows,
        "off_day": 0,
        "off_calendar": 0,
        "bad_surface": 0,
        "no_user": 0,
        "no_ad": r.rows_without_ad,
        "with_truth": 0,
        "no_id": 0,
    }


def test_the_test_split_fills_the_last_day(bronze):
    if bronze.raw.holdout_file is None:
        pytest.skip(f"{bronze.name} has no test split")
    last = bronze.impressions.where(F.col("ds") == bronze.cfg.world.days[-1])
    outside = ~F.col("impression_id").contains(bronze.raw.holdout_file)
    rows, from_elsewhere = last.agg(F.count("*"), F.count_if(outside)).first()
    assert rows > 0 and from_elsewhere == 0
    if bronze.raw.holdout_rows is not None:  # the split is the teacher's: every test row held out, no other
        held = F.col("ds") >= F.lit(bronze.cfg.world.holdout_start)
        counts = bronze.impressions.agg(
            F.count_if(held), F.count_if(held & outside), F.count_if(~held & ~outside)
        ).first()
        assert tuple(counts) == (bronze.raw.holdout_rows, 0, 0)


def test_users_and_ads_are_unique_and_cover_the_impressions(bronze):
    r, users, ads = bronze.raw, bronze.source.users(), bronze.source.ads()
    missing_users = bronze.impressions.where("user_id IS NOT NULL").join(users, "user_id", "left_anti")
    missing_ads = bronze.impressions.where("ad_id IS NOT NULL").join(ads, "ad_id", "left_anti")
    stats = (
        users.agg(F.count("*").alias("users"), F.count_distinct("user_id").alias("user_ids"))
        .crossJoin(
            ads.agg(
                F.count("*").alias("ads"),
                F.count_distinct("ad_id").alias("ad_ids"),
                F.count_if(F.col("ad_id").isNull()).alias("null_ads"),
            )
        )
        .crossJoin(missing_users.agg(F.count("*").alias("missing_users")))
        .crossJoin(missing_ads.agg(F.count("*").alias("missing_ads")))
        .first()
        .asDict()
    )
    null_ads = 1 if r.rows_without_ad else 0  # rows without an ad id share one null-keyed dimension row
    assert stats == {
        "users": r.users,
        "user_ids": r.users,
        "ads": r.ads + null_ads,
        "ad_ids": r.ads,
        "null_ads": null_ads,
        "missing_users": 0,
        "missing_ads": 0,
    }


def test_click_events_are_the_clicked_impressions(bronze):
    if bronze.raw.every_row_an_event:
        pytest.skip(f"{bronze.name}'s events are all its impressions (test_every_rating_is_an_event)")
    clicks = bronze.events.where(F.col("action") == "click")
    clicked = bronze.impressions.where("clicked").select(
        "user_id", F.col("ad_id").alias("item_id"), "ts", "surface", "_asked"
    )
    keys = ["user_id", "item_id", "ts", "surface", "_asked"]
    matched = clicks.join(clicked, [clicks[k].eqNullSafe(clicked[k]) for k in keys])
    stats = (
        clicks.agg(F.count("*").alias("events"), F.count_if(_off_day()).alias("off_day"))
        .crossJoin(matched.agg(F.count("*").alias("matched")))
        .first()
        .asDict()
    )
    # A repeated line is rejected (as an impression), so its click is no event.
    events = bronze.raw.clicks - bronze.raw.repeated_clicks
    assert stats == {"events": events, "off_day": 0, "matched": events}


def test_on_the_samples_only_repeated_lines_fail_to_parse(bronze):
    errors = bronze.impressions.where(F.col("_line.error").isNotNull()).groupBy("_line.error").count().collect()
    assert {r["error"]: r["count"] for r in errors} == {k: v for k, v in bronze.raw.repeats.items() if v}
    ads = bronze.source.ads()
    if "_line" in ads.columns:  # an item list read line by line
        assert ads.where(F.col("_line.error").isNotNull()).count() == 0


@pytest.mark.parametrize("bronze", ["movielens"], indirect=True)
def test_every_rating_is_an_event_and_the_days_follow_rating_time(bronze):
    keys = ["user_id", "item_id", "ts", "surface", "_asked"]
    rated = bronze.impressions.select(*keys[:1], F.col("ad_id").alias("item_id"), *keys[2:])
    matched = bronze.events.join(rated, keys)
    stats = (
        bronze.events.agg(F.count("*").alias("events"), F.count_if(_off_day()).alias("off_day"))
        .crossJoin(matched.agg(F.count("*").alias("matched")))
        .first()
        .asDict()
    )
    assert stats == {"events": bronze.raw.rows, "off_day": 0, "matched": bronze.raw.rows}
    actions = {r["action"]: r["count"] for r in bronze.events.groupBy("action").count().collect()}
    assert actions == {"1": 6_110, "2": 11_370, "3": 27_145, "4": 34_174, "5": 21_201}  # SOURCE.md
    # A time-based split: every day's ratings are no earlier than any of the day before's.
    lines = (ROOT / "movielens_100k" / "all_ratings_from_u1.tsv").read_text().splitlines()
    rated_at = {(int(u), int(i)): int(t) for u, i, _, t in (line.split("\t") for line in lines)}
    times: dict[date, list[int]] = {}
    for r in bronze.impressions.select("user_id", "ad_id", "ds").collect():
        times.setdefault(r["ds"], []).append(rated_at[r["user_id"], r["ad_id"]])
    spans = [(min(t), max(t)) for _, t in sorted(times.items())]
    assert len(spans) == len(bronze.cfg.world.days) and all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    # u.item is Latin-1: its lines are decoded, not rejected as invalid UTF-8.
    assert "Misérables" in bronze.source.ads().where("ad_id = 543").first()["_line"]["raw"]


@pytest.mark.parametrize("bronze", ["taobao"], indirect=True)
def test_taobao_history_events_just_precede_their_impression(bronze):
    history = bronze.events.where(F.col("action") != "click")
    imps = bronze.impressions.select(
        "impression_id",
        F.col("user_id").alias("imp_user"),
        F.col("ts").alias("imp_ts"),
        F.col("surface").alias("imp_surface"),
    )
    joined = history.join(imps, "impression_id", "left")
    lag = F.unix_timestamp("imp_ts") - F.unix_timestamp("ts")
    stats = (
        joined.agg(
            F.count("*").alias("events"),
            F.count_if(~lag.between(1, 50) | lag.isNull()).alias("not_just_before"),
            F.count_if((F.col("user_id") != F.col("imp_user")) | (F.col("surface") != F.col("imp_surface"))).alias(
                "other"
            ),
            F.count_if(_off_day()).alias("off_day"),
        )
        .first()
        .asDict()
    )
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


# Strict parsing: a corrupted copy of each sample (its header, a few real lines, then damaged ones)
# is written to a temporary data folder and landed in bronze with the real code. Expectations are
# the lines themselves: which were written where, and what their fields say.

COPY_CALENDAR = {"n_days": 2, "holdout_days": 1}  # the shortest: every landing costs seconds


def _lines(path: Path) -> list[bytes]:
    """A file's lines as bytes, without their line ends."""
    return path.read_bytes().splitlines()


def _fields(line: bytes) -> list[bytes]:
    return line.split(b",")


def _join(fields: list[bytes]) -> bytes:
    return b",".join(fields)


@dataclass(frozen=True)
class Copy:
    """A corrupted copy of a dataset's files: file (under its folder) -> lines, and the lines' fate."""

    files: dict[str, list[bytes]]
    header: bool = True  # the files start with a header line
    bad: dict[tuple[str, int], str] = field(default_factory=dict)  # (file, 1-based line) -> expected reason

    def data_lines(self, names: list[str] | None = None) -> int:
        return sum(len(lines) - self.header for name, lines in self.files.items() if names is None or name in names)

    def good(self, name: str) -> list[tuple[int, bytes]]:
        """(0-based data row, line) of the file's lines expected to be accepted."""
        first = 2 if self.header else 1
        return [
            (n - first, line)
            for n, line in enumerate(self.files[name], start=1)
            if n >= first and (name, n) not in self.bad
        ]


@dataclass(frozen=True)
class Landed:
    copy: Copy
    folder: str
    source: Source
    landings: dict[tuple[str, date | None], Landing]
    accepted: dict[str, list]  # table -> rows
    rejected: list  # bronze.rejected_rows rows


def _write_copy(root: Path, folder: str, copy: Copy, trailing_newline: bool = True) -> None:
    for name, lines in copy.files.items():
        path = root / folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\n".join(lines) + (b"\n" if trailing_newline else b""))


def _land_copy(
    spark: SparkSession, tmp: Path, name: str, copy: Copy, tables: tuple[str, ...], trailing_newline: bool = True
) -> Landed:
    folder = DATASETS[name][0]
    _write_copy(tmp / "data", folder, copy, trailing_newline)
    cfg = GemConfig.from_dict({"world": COPY_CALENDAR, "data": {"source": name, "data_dir": str(tmp / "data")}})
    paths = GemPaths(tmp / "gem")
    landings = {}
    for table in tables:
        for ds in cfg.world.days if table in ("bronze.impressions", "bronze.events") else [None]:
            landings[table, ds] = land_bronze(spark, cfg, paths, table, ds)
    accepted = {t: read_table(spark, paths.table(t)).collect() for t in tables}
    rejected = read_table(spark, paths.table("bronze.rejected_rows")).collect()
    source = importlib.import_module(MODULES[name]).Source(spark, cfg, tmp / "data")
    return Landed(copy, folder, source, landings, accepted, rejected)


def _rejections(landed: Landed, table: str) -> dict[tuple[str, int], tuple]:
    """(file, line) -> (reason, raw line as bytes) of the table's rejected rows."""
    prefix = landed.folder + "/"
    return {
        (r["source_file"].removeprefix(prefix), r["source_line"]): (r["reason"], r["raw_line"].encode())
        for r in landed.rejected
        if r["source_table"] == table
    }


def _assert_lines_conserved(landed: Landed, impression_files: list[str] | None = None) -> None:
    """Each landing conserves its rows, and the impression landings hold every line of the impression files."""
    impressions = [v for (t, _), v in landed.landings.items() if t == "bronze.impressions"]
    lines = landed.copy.data_lines(impression_files)
    assert all(landing.conserved for landing in landed.landings.values())
    assert sum(landing.rows_in for landing in impressions) == lines
    assert sum(landing.accepted + landing.rejected for landing in impressions) == lines


def _assert_bad_lines_rejected(landed: Landed, table: str = "bronze.impressions", exact: bool = True) -> None:
    """Every bad line is in bronze.rejected_rows with its reason, its line number and its raw line."""
    expected = {key: (reason, landed.copy.files[key[0]][key[1] - 1]) for key, reason in landed.copy.bad.items()}
    found = _rejections(landed, table)
    if exact:
        assert found == expected
    else:  # lines that are not valid UTF-8 are stored with U+FFFD for their invalid bytes
        assert {k: v[0] for k, v in found.items()} == {k: v[0] for k, v in expected.items()}


def _header_and_good(
    path: Path, n: int, ok: Callable[[list[bytes]], bool] = lambda f: True, header: bool = True
) -> tuple[list[bytes], list[bytes]]:
    """The header (if any) and the first `n` lines of `path` whose fields pass `ok`, then the next lines."""
    lines = _lines(path)
    head, body = (lines[:1], lines[1:]) if header else ([], lines)
    good = [line for line in body if ok(_fields(line))]
    return head + good[:n], good[n:]


# -- Criteo: every observed kind of damage in the fun-rec file, and a repeated DeepCTR line ----------------

CRITEO_FUNREC, CRITEO_DEEPCTR = "funrec_kaggle_train.csv", "deepctr_criteo_sample.csv"


def _criteo_copy() -> Copy:
    folder = ROOT / DATASETS["criteo"][0]
    # fun-rec fields: Id, Label, I1..I13 (2-14), C1..C26 (15-40): C3 is 17, C15 is 29; DeepCTR has no Id
    funrec, spare = _header_and_good(folder / CRITEO_FUNREC, 4, lambda f: f[17] != b"" and f[29] != b"")
    bad = {}

    def add(line: bytes, reason: str) -> None:
        funrec.append(line)
        bad[CRITEO_FUNREC, len(funrec)] = reason

    f = _fields(spare[0])
    add(_join(f[:6] + f[7:]), "too_few_fields")  # I5 missing: C3's place holds C4, an ad that does not exist
    f = _fields(spare[1])
    add(_join(f[:2] + [b"7"] + f[2:]), "too_many_fields")  # an extra field after the label
    f = _fields(spare[2])
    add(_join(f[:29] + [b"\xff\xfe" + f[29][2:]] + f[30:]), "invalid_utf8")  # C15: a user that does not exist
    f = _fields(spare[3])
    add(_join(f[:1] + [b"2"] + f[2:]), "invalid_label_label")
    f = _fields(spare[4])
    add(_join(f[:1] + [b"-1"] + f[2:]), "invalid_label_label")
    add(funrec[2], "duplicate_id")  # an exact copy of an earlier line: same Kaggle Id
    f = _fields(spare[5])
    add(_join([b"99999999999999999999"] + f[1:]), "unparsable_id")  # overflows bigint
    funrec.append(spare[6])  # one more good line after the damaged ones
    add(spare[7][: len(spare[7]) // 3], "too_few_fields")  # truncated: the file's last line, cut short
    deepctr, _ = _header_and_good(folder / CRITEO_DEEPCTR, 3, lambda f: f[16] != b"" and f[28] != b"")
    deepctr.append(deepctr[1])
    bad[CRITEO_DEEPCTR, len(deepctr)] = "duplicate_line"
    return Copy({CRITEO_FUNREC: funrec, CRITEO_DEEPCTR: deepctr}, bad=bad)


@pytest.fixture(scope="module")
def criteo_copy(spark, tmp_path_factory) -> Landed:
    if not (ROOT / DATASETS["criteo"][0]).is_dir():
        pytest.skip("criteo is absent")
    # Written without a final line end: the truncated line is the file's last, as a cut-off copy leaves it.
    return _land_copy(
        spark,
        tmp_path_factory.mktemp("criteo"),
        "criteo",
        _criteo_copy(),
        ("bronze.impressions", "bronze.users", "bronze.ads"),
        trailing_newline=False,
    )


def _criteo_good(copy: Copy) -> dict[str, dict]:
    """impression_id -> what the accepted row must hold, from the good lines' own fields."""
    expected = {}
    for name, stem, offset in ((CRITEO_FUNREC, "funrec_kaggle_train", 1), (CRITEO_DEEPCTR, "deepctr_criteo_sample", 0)):
        for row, line in copy.good(name):
            f = [x.decode() for x in _fields(line)]
            expected[f"criteo-{stem}-{row}"] = {
                "clicked": f[offset] == "1",
                "c3": f[offset + 16],
                "c15": f[offset + 28],
                "id": int(f[0]) if offset else None,
            }
    return expected


def test_criteo_good_lines_are_accepted_with_their_values(criteo_copy):
    accepted = {
        r["impression_id"]: {"clicked": r["clicked"], "c3": r["c3"], "c15": r["c15"], "id": r["id"]}
        for r in criteo_copy.accepted["bronze.impressions"]
    }
    assert accepted == _criteo_good(criteo_copy.copy)
    assert "_line" not in criteo_copy.accepted["bronze.impressions"][0].asDict()


def test_criteo_missing_and_extra_columns_and_truncated_lines_are_rejected_by_field_count(criteo_copy):
    found = _rejections(criteo_copy, "bronze.impressions")
    counted = {k: v for k, v in criteo_copy.copy.bad.items() if v.endswith("_fields")}
    assert sorted(counted.values()) == ["too_few_fields", "too_few_fields", "too_many_fields"]
    for (name, number), reason in counted.items():
        assert found[name, number] == (reason, criteo_copy.copy.files[name][number - 1])


def test_criteo_non_utf8_line_is_rejected_and_creates_no_user(criteo_copy):
    found = _rejections(criteo_copy, "bronze.impressions")
    (key,) = [k for k, v in criteo_copy.copy.bad.items() if v == "invalid_utf8"]
    raw = criteo_copy.copy.files[key[0]][key[1] - 1]
    assert found[key] == ("invalid_utf8", raw.decode("utf-8", errors="replace").encode())
    good_users = {e["c15"] for e in _criteo_good(criteo_copy.copy).values()}
    assert {r["c15"] for r in criteo_copy.accepted["bronze.users"]} == good_users


def test_criteo_labels_outside_0_1_are_rejected_not_read_as_no_click(criteo_copy):
    found = _rejections(criteo_copy, "bronze.impressions")
    labels = sorted(raw.split(b",")[1] for reason, raw in found.values() if reason == "invalid_label_label")
    assert labels == [b"-1", b"2"]


def test_criteo_repeated_lines_are_rejected_as_duplicates_of_their_key(criteo_copy):
    found = _rejections(criteo_copy, "bronze.impressions")
    dups = {k: v for k, v in found.items() if v[0].startswith("duplicate_")}
    assert {(k[0], v[0]) for k, v in dups.items()} == {
        (CRITEO_FUNREC, "duplicate_id"),
        (CRITEO_DEEPCTR, "duplicate_line"),
    }
    ids = [r["id"] for r in criteo_copy.accepted["bronze.impressions"] if r["id"] is not None]
    assert len(ids) == len(set(ids))  # the first copy landed once


def test_criteo_overflowing_id_is_unparsable_not_null(criteo_copy):
    found = _rejections(criteo_copy, "bronze.impressions")
    assert [raw.split(b",")[0] for reason, raw in found.values() if reason == "unparsable_id"] == [
        b"99999999999999999999"
    ]


def test_criteo_every_bad_line_is_kept_and_rows_are_conserved(criteo_copy):
    _assert_bad_lines_rejected(criteo_copy, exact=False)
    _assert_lines_conserved(criteo_copy)
    good_ads = {e["c3"] for e in _criteo_good(criteo_copy.copy).values()}
    assert {r["c3"] for r in criteo_copy.accepted["bronze.ads"]} == good_ads  # no ad from a shifted line


def test_a_changed_header_fails_the_landing_and_nothing_lands(spark, tmp_path):
    copy = _criteo_copy()
    renamed = copy.files[CRITEO_FUNREC][0].replace(b"Label", b"Click")
    copy = Copy({**copy.files, CRITEO_FUNREC: [renamed, *copy.files[CRITEO_FUNREC][1:]]}, bad={})
    with pytest.raises(
        SourceFormatError,
        match=r"funrec_kaggle_train\.csv.*expected 41 columns.*'Label'.*found 41.*"
        r"'Click'.*missing \['Label'\], unexpected \['Click'\]",
    ):
        _land_copy(spark, tmp_path, "criteo", copy, ("bronze.impressions",))
    assert not (tmp_path / "gem" / "lake" / "bronze" / "impressions").exists()
    assert not (tmp_path / "gem" / "lake" / "bronze" / "rejected_rows").exists()


def _dataset_copy(
    name: str,
    tmp_path_factory,
    copy: Callable[[Path], Copy],
    tables: tuple[str, ...],
    spark: SparkSession,
    trailing_newline: bool = True,
) -> Landed:
    folder = ROOT / DATASETS[name][0]
    if not folder.is_dir():
        pytest.skip(f"{name} is absent")
    return _land_copy(spark, tmp_path_factory.mktemp(name), name, copy(folder), tables, trailing_newline)


def _with_bad(files: dict[str, list[bytes]], bad_lines: list[tuple[str, bytes, str]], header: bool = True) -> Copy:
    """`files` with each (file, line, reason) of `bad_lines` appended to its file."""
    files = {k: list(v) for k, v in files.items()}
    bad = {}
    for name, line, reason in bad_lines:
        files[name].append(line)
        bad[name, len(files[name])] = reason
    return Copy(files, header, bad)


# -- Ali-CCP: an overflowing item id, a purchase label of 2, exact repeats within and across files --------


def _ali_ccp_copy(folder: Path) -> Copy:
    names = [f"ali_ccp_{split}_sample.csv" for split in ("train", "val", "test")]
    (train, spare), (val, _), (test, _) = [_header_and_good(folder / n, k) for n, k in zip(names, (4, 2, 2))]
    f = _fields(spare[0])
    overflow = _join(f[:11] + [b"99999999999999999999"] + f[12:])  # field 205, the item (ad) id
    f = _fields(spare[1])
    return _with_bad(
        {names[0]: train, names[1]: val, names[2]: test},
        [
            (names[0], overflow, "unparsable_f_205"),
            (names[0], _join(f[:1] + [b"2"] + f[2:]), "invalid_label_purchase"),
            (names[0], train[2], "duplicate_line"),
            (names[1], train[3], "duplicate_line"),  # a train line again in val
        ],
    )


@pytest.fixture(scope="module")
def ali_ccp_copy(spark, tmp_path_factory) -> Landed:
    return _dataset_copy(
        "ali_ccp", tmp_path_factory, _ali_ccp_copy, ("bronze.impressions",), spark, trailing_newline=False
    )  # as the real files are


def test_ali_ccp_overflowing_item_id_label_and_repeats_are_rejected_with_their_lines(ali_ccp_copy):
    copy = ali_ccp_copy.copy
    _assert_bad_lines_rejected(ali_ccp_copy)
    _assert_lines_conserved(ali_ccp_copy)
    good = [(f"ali_ccp-{Path(name).stem}-{row}", _fields(line)) for name in copy.files for row, line in copy.good(name)]
    accepted = {
        r["impression_id"]: (r["ad_id"], r["clicked"], r["converted"])
        for r in ali_ccp_copy.accepted["bronze.impressions"]
    }
    assert accepted == {i: (int(f[11]), f[0] == b"1", f[1] == b"1") for i, f in good}
    # bronze.ads would land what the adapter derives (Criteo's copy lands its dimensions too)
    assert {r["ad_id"] for r in ali_ccp_copy.source.ads().collect()} == {int(f[11]) for _, f in good}


# -- Taobao (DMR, no header): a missing history field, an overflowing uid, a label of 2, a repeated line --

TAOBAO_TRAIN, TAOBAO_TEST = "dmr_alimama_sampled_train.txt", "dmr_alimama_sampled_test.txt"


def _taobao_copy(folder: Path) -> Copy:
    train, spare = _header_and_good(folder / TAOBAO_TRAIN, 3, header=False)
    test, _ = _header_and_good(folder / TAOBAO_TEST, 3, header=False)
    clicked = next(line for line in spare if _fields(line)[266] == b"1")
    train.append(clicked)
    f, g, h = (_fields(line) for line in [line for line in spare if line != clicked][:3])
    return _with_bad(
        {TAOBAO_TRAIN: train, TAOBAO_TEST: test},
        [
            (TAOBAO_TRAIN, _join(f[:10] + f[11:]), "too_few_fields"),  # a history value missing
            (TAOBAO_TRAIN, _join(g[:250] + [b"99999999999999999999"] + g[251:]), "unparsable_uid"),
            (TAOBAO_TRAIN, _join(h[:266] + [b"2"]), "invalid_label_target"),
            (TAOBAO_TRAIN, clicked, "duplicate_line"),  # a clicked line again: no second click, no second history
        ],
        header=False,
    )


@pytest.fixture(scope="module")
def taobao_copy(spark, tmp_path_factory) -> Landed:
    return _dataset_copy("taobao", tmp_path_factory, _taobao_copy, ("bronze.impressions",), spark)


def test_taobao_bad_lines_are_rejected_and_create_no_user_or_event(taobao_copy):
    copy = taobao_copy.copy
    _assert_bad_lines_rejected(taobao_copy)
    _assert_lines_conserved(taobao_copy)
    good = [_fields(line) for name in copy.files for _, line in copy.good(name)]
    assert {r["user_id"] for r in taobao_copy.source.users().collect()} == {int(f[250]) for f in good}
    assert {r["ad_id"] for r in taobao_copy.source.ads().collect()} == {int(f[259]) for f in good}
    events = reduce(DataFrame.unionByName, [taobao_copy.source.events(d) for d in taobao_copy.source.world.days])
    clicks, history = events.agg(F.count_if(F.col("action") == "click"), F.count_if(F.col("action") != "click")).first()
    assert (clicks, history) == (sum(f[266] == b"1" for f in good), sum(f[150:200].count(b"1") for f in good))


# -- AliExpress: an extra column, a conversion label of -1, a train line repeated in a test file ---------


def _aliexpress_copy(folder: Path) -> Copy:
    names = [
        "fuxictr_tiny_mtl_train.csv",
        "torch_rechub_aliexpress_train_sample.csv",
        "fuxictr_tiny_mtl_test.csv",
        "torch_rechub_aliexpress_test_sample.csv",
    ]
    copies = [_header_and_good(folder / name, 2) for name in names]
    files = {name: lines for name, (lines, _) in zip(names, copies)}
    f, g = _fields(copies[0][1][0]), _fields(copies[1][1][0])
    return _with_bad(
        files,
        [
            (names[0], _join(f[:5] + [b"0"] + f[5:]), "too_many_fields"),
            (names[1], _join(g[:-1] + [b"-1"]), "invalid_label_conversion"),
            (names[2], files[names[0]][1], "duplicate_line"),
        ],
    )


@pytest.fixture(scope="module")
def aliexpress_copy(spark, tmp_path_factory) -> Landed:
    return _dataset_copy("aliexpress", tmp_path_factory, _aliexpress_copy, ("bronze.impressions",), spark)


def test_aliexpress_bad_lines_are_rejected_with_their_lines(aliexpress_copy):
    copy = aliexpress_copy.copy
    _assert_bad_lines_rejected(aliexpress_copy)
    _assert_lines_conserved(aliexpress_copy)
    expected = {
        f"aliexpress-{Path(name).stem}-{row}": (_fields(line)[-2] == b"1", _fields(line)[-1] == b"1")
        for name in copy.files
        for row, line in copy.good(name)
    }
    assert {
        r["impression_id"]: (r["clicked"], r["converted"]) for r in aliexpress_copy.accepted["bronze.impressions"]
    } == expected


# -- Open Bandit: a repeated log index, a malformed timestamp, a repeated item in an item list -----------


def _open_bandit_copy(folder: Path) -> Copy:
    files: dict[str, list[bytes]] = {}
    for policy in ("random", "bts"):
        for campaign in ("all", "men", "women"):
            name = f"{policy}/{campaign}/{campaign}.csv"
            files[name], _ = _header_and_good(folder / name, 2)
    for campaign in ("all", "men", "women"):
        name = f"random/{campaign}/item_context.csv"
        files[name], _ = _header_and_good(folder / name, 3)
    log, items = "random/all/all.csv", "random/men/item_context.csv"
    f = _fields(_lines(folder / log)[10])
    g = _fields(_lines(folder / log)[11])
    return _with_bad(
        files,
        [
            (log, _join([_fields(files[log][1])[0]] + f[1:]), "duplicate_index"),  # the index of the log's first line
            (log, _join(g[:1] + [b"2019-11-31 25:00:00"] + g[2:]), "unparsable_timestamp"),
            (items, _join([b"99"] + _fields(files[items][2])[1:]), "duplicate_item_id"),  # a new index, an old item
        ],
    )


@pytest.fixture(scope="module")
def open_bandit_copy(spark, tmp_path_factory) -> Landed:
    return _dataset_copy(
        "open_bandit", tmp_path_factory, _open_bandit_copy, ("bronze.impressions", "bronze.ads"), spark
    )


def test_open_bandit_repeated_index_bad_timestamp_and_repeated_item_are_rejected(open_bandit_copy):
    copy = open_bandit_copy.copy
    log_bad = {k: v for k, v in copy.bad.items() if not k[0].endswith("item_context.csv")}
    item_bad = {k: v for k, v in copy.bad.items() if k[0].endswith("item_context.csv")}
    assert _rejections(open_bandit_copy, "bronze.impressions") == {
        k: (v, copy.files[k[0]][k[1] - 1]) for k, v in log_bad.items()
    }
    assert _rejections(open_bandit_copy, "bronze.ads") == {
        k: (v, copy.files[k[0]][k[1] - 1]) for k, v in item_bad.items()
    }
    logs = [name for name in copy.files if not name.endswith("item_context.csv")]
    _assert_lines_conserved(open_bandit_copy, logs)
    expected = {
        "-".join(["open_bandit", *name.split("/")[:2], str(int(_fields(line)[0]))]): _fields(line)[4] == b"1"
        for name in logs
        for _, line in copy.good(name)
    }
    assert {r["impression_id"]: r["clicked"] for r in open_bandit_copy.accepted["bronze.impressions"]} == expected
    items = {
        (name.split("/")[1], int(_fields(line)[1]))
        for name in copy.files
        if name.endswith("item_context.csv")
        for _, line in copy.good(name)
    }
    assert {(r["campaign"], r["item_id"]) for r in open_bandit_copy.accepted["bronze.ads"]} == items
