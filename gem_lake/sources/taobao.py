"""Taobao Ad Display/Click (Tianchi 56) as bronze rows, from the DMR-format samples.

The DMR files are the richest format in the folder: each of their 2,500 rows is one impression
joined with the user profile, the ad's features and the user's 50 most recent behaviours before
it (behaviour type, category, brand), which become behaviour events. The FuxiCTR tiny files are
left out: 200 rows without behaviour types, 87 of their test rows repeat train rows, and their
raw pid strings cannot be matched to DMR's 0/1 slot code. DMR rows carry no timestamp, so they
are laid out in file order, train file first, so the test file fills the last (holdout) days.

The 267 columns are read strictly (`gem_lake.sources.lines`) by the layout below (SOURCE.md, schema
A): each block of 50 history values becomes one array column right at the parse, which keeps the
plans small. The format has no row id: a line repeating an earlier line of either file is a
`duplicate_line` (the train file repeats each of its 14 distinct positive lines 15 times).
Mappings: docs/datasets.md.
"""

from __future__ import annotations

from datetime import date
from functools import cached_property
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from gem_lake.quarantine import LINE_COLUMN
from gem_lake.sources.files import Field, TextFile
from gem_lake.sources.lines import parsed, read_text_files
from gem_lake.sources.timeline import click_events, spread_over_days
from gem_model.config import GemConfig

FOLDER = "taobao_ad_display_click"
SEQ_LEN = 50
USER_FIELDS = (
    "cms_segid",
    "cms_group_id",
    "final_gender_code",
    "age_level",
    "pvalue_level",
    "shopping_level",
    "occupation",
    "new_user_class_level",
)
# The two ad slots; which Taobao page each code is is not documented, so the names are arbitrary.
PID_SURFACE = {0: "feed", 1: "stories"}
# btag codes in the order the dataset lists the behaviour types (pv, cart, fav, buy); 0 is padding.
BTAG_ACTION = {1: "pv", 2: "cart", 3: "fav", 4: "buy"}
# Layout of a line: 4 blocks of SEQ_LEN history values (btag, category, brand, mask), a fifth
# (match_mask, unused), then these scalar fields in order.
SCALARS = [
    ("uid", "bigint"),
    *[(c, "int") for c in USER_FIELDS],
    ("mid", "bigint"),
    ("cate_id", "bigint"),
    ("campaign_id", "bigint"),
    ("customer", "bigint"),
    ("brand", "bigint"),
    ("price", "double"),
    ("pid", "int"),
    ("target", "int"),
]
FIELDS = (
    Field("his_btag", "int", SEQ_LEN),
    Field("his_cate", "bigint", SEQ_LEN),
    Field("his_brand", "bigint", SEQ_LEN),
    Field("his_mask", "int", SEQ_LEN),
    Field("match_mask", "int", SEQ_LEN),
    *[Field(name, kind) for name, kind in SCALARS],
)
FILES = tuple(
    TextFile(name, FIELDS, header=None, labels=("target",))
    for name in ("dmr_alimama_sampled_train.txt", "dmr_alimama_sampled_test.txt")
)


def _lookup(mapping: dict[int, str], key: Column) -> Column:
    """`mapping[key]`, null for a code the dataset does not document (the quarantine rejects it)."""
    return F.try_element_at(F.create_map(*[F.lit(x) for kv in mapping.items() for x in kv]), key)


class Source:
    """The DMR samples as a `gem_lake.sources.Source`: users, ads, impressions and behaviour events."""

    def __init__(self, spark: SparkSession, cfg: GemConfig, root: Path) -> None:
        self.spark, self.world, self.folder = spark, cfg.world, root / FOLDER

    @cached_property
    def _rows(self) -> DataFrame:
        """Both files' lines: the scalar fields, `history` (array of btag, item_id = category, brand, mask;
        oldest first), `_file` (place in FILES), `_row` (0-based line in the file), `impression_id`, `_line`."""
        rows = read_text_files(self.spark, self.folder, "taobao", FILES)
        history = F.arrays_zip(
            F.col("his_btag").alias("btag"),
            F.col("his_cate").alias("item_id"),
            F.col("his_brand").alias("brand"),
            F.col("his_mask").alias("mask"),
        )
        return rows.select(
            *[name for name, _ in SCALARS], history.alias("history"), "_file", "_row", "impression_id", LINE_COLUMN
        )

    @cached_property
    def _laid_out(self) -> DataFrame:
        return spread_over_days(self._rows, [F.col("_file"), F.col("_row")], self.world)

    @staticmethod
    def _impressions(rows: DataFrame) -> DataFrame:
        return rows.select(
            "impression_id",
            "ts",
            "ds",
            F.col("uid").alias("user_id"),
            F.col("mid").alias("ad_id"),
            _lookup(PID_SURFACE, F.col("pid")).alias("surface"),
            F.lit(None).cast("int").alias("position"),
            (F.col("target") == 1).alias("clicked"),
            F.lit(False).alias("converted"),
            F.lit(None).cast("double").alias("p_click"),
            F.lit(None).cast("double").alias("p_convert"),
            F.col("pid").cast("string").alias("source_surface"),
            LINE_COLUMN,
        )

    def impressions(self, ds: date) -> DataFrame:
        """bronze.impressions (raw) of day `ds`: click label only (the dataset has no conversions)."""
        return self._impressions(self._laid_out.where(F.col("ds") == F.lit(ds)))

    def events(self, ds: date) -> DataFrame:
        """Behaviour events of day `ds`: each row's history just before it, plus clicks.

        History step k (k=1 most recent; real steps are right-aligned, padding leads) of an
        impression at ts is placed at ts - k seconds, so it precedes its impression but follows
        the previous one. Its item is the behaviour's category (the data has no item ids), so
        `item_id` is a category for pv/cart/fav/buy and an ad id for `click`. Extras: `btag`,
        `brand` and the source `impression_id` (null on clicks). Only lines that parsed have events.
        """
        rows = self._laid_out
        # Only rows from ds up to SEQ_LEN seconds into the next day can have history on ds.
        reach = F.to_date(F.col("ts") - F.make_interval(secs=F.lit(SEQ_LEN))) <= F.lit(ds)
        near = rows.where((F.col("ds") >= F.lit(ds)) & reach & parsed())
        steps = near.select("impression_id", "uid", "pid", "ts", F.posexplode("history").alias("j", "step"))
        history = steps.select(
            "impression_id", "uid", "pid", "ts", (F.lit(SEQ_LEN) - F.col("j")).alias("k"), "step.*"
        ).where(F.col("mask") == 1)
        ts = F.col("ts") - F.make_interval(secs=F.col("k"))
        sequence = history.select(
            F.col("uid").alias("user_id"),
            "item_id",
            _lookup(BTAG_ACTION, F.col("btag")).alias("action"),
            _lookup(PID_SURFACE, F.col("pid")).alias("surface"),
            ts.alias("ts"),
            F.to_date(ts).alias("ds"),
            "btag",
            "brand",
            "impression_id",
        ).where(F.col("ds") == F.lit(ds))
        clicks = click_events(self._impressions(rows.where(F.col("ds") == F.lit(ds)))).select(
            "*",
            F.lit(None).cast("int").alias("btag"),
            F.lit(None).cast("bigint").alias("brand"),
            F.lit(None).cast("string").alias("impression_id"),
        )
        return sequence.unionByName(clicks)

    def users(self) -> DataFrame:
        """bronze.users: the profile of each uid from its earliest parsed row; `age_bucket` is age_level."""
        first = (
            self._rows.where(parsed())
            .groupBy(F.col("uid").alias("user_id"))
            .agg(F.min_by(F.struct(*USER_FIELDS), F.struct("_file", "_row")).alias("u"))
        )
        return first.select(
            "user_id",
            F.col("u.age_level").cast("string").alias("age_bucket"),
            F.lit(None).cast("string").alias("country"),
            F.lit(None).cast("string").alias("device"),
            *[F.col(f"u.{c}").alias(c) for c in USER_FIELDS if c != "age_level"],
        )

    def ads(self) -> DataFrame:
        """bronze.ads: adgroup (mid) with advertiser = customer, category = cate_id, from its earliest parsed row."""
        first = (
            self._rows.where(parsed())
            .groupBy(F.col("mid").alias("ad_id"))
            .agg(
                F.min_by(
                    F.struct("customer", "cate_id", "campaign_id", "brand", "price"), F.struct("_file", "_row")
                ).alias("a")
            )
        )
        return first.select(
            "ad_id",
            F.col("a.customer").alias("advertiser_id"),
            F.col("a.cate_id").alias("category"),
            F.lit(None).cast("string").alias("ad_format"),
            F.lit(None).cast("string").alias("objective"),
            "a.campaign_id",
            "a.brand",
            "a.price",
        )
