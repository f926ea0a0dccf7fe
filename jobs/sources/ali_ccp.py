"""Ali-CCP (Tianchi 408, the ESMM data) as bronze rows, from the Scenario-Wise-Rec samples.

Of the three formats in the folder, `ali_ccp_{train,val,test}_sample.csv` is the richest
consistent one: 200 rows in a train/val/test split under one header, all 23 sparse fields plus
the 8 dense values (`D*`), field 301 with its three scenarios, and no purchase outside a click.
The AITM files (98 rows) use another id encoding and lack field 210 and the dense values; in the
ESMM files (20 rows) field 301 has a single value. Ids are label-encoded (an id seen fewer than
10 times in train is 0) and kept as they are: 0 is the shared rare-item bucket, a valid id.
Rows carry no timestamp and are laid out in file order (train, val, test), so
the test file fills the last (holdout) day. The format has no row id: a line repeating an earlier
line of any of the three files is a `duplicate_line` (`jobs.sources.lines`). Mappings:
docs/datasets.md.
"""

from __future__ import annotations

from datetime import date
from functools import cached_property
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gem_model.config import GemConfig
from jobs.features.quarantine import LINE_COLUMN
from jobs.sources.lines import Field, TextFile, parsed, read_text_files
from jobs.sources.timeline import click_events, spread_over_days

FOLDER = "ali_ccp"
# Field ids, in header order; a sparse field `<id>` becomes column f_<id>, its dense value `D<id>` d_<id>.
SPARSE = ("101", "121", "122", "124", "125", "126", "127", "128", "129", "205", "206", "207", "210", "216",
          "508", "509", "702", "853", "301", "109_14", "110_14", "127_14", "150_14")
DENSE = ("109_14", "110_14", "127_14", "150_14", "508", "509", "702", "853")
FIELDS = (Field("click", "int"), Field("purchase", "int"), *[Field(f"f_{f}", "bigint") for f in SPARSE],
          *[Field(f"d_{f}", "double") for f in DENSE])
HEADER = ("click", "purchase", *SPARSE, *[f"D{f}" for f in DENSE])
FILES = tuple(TextFile(f"ali_ccp_{split}_sample.csv", FIELDS, HEADER, labels=("click", "purchase"))
              for split in ("train", "val", "test"))
USER_FIELDS = ("f_121", "f_122", "f_124", "f_125", "f_126", "f_127", "f_128", "f_129")
# Field 301's three scenarios; which Taobao scenario each code is is not documented.
SCENARIO_SURFACE = {1: "feed", 2: "stories", 3: "reels"}
# Per-impression fields: the user's behaviour summaries (109_14 ...), the user-item crosses and their values.
ROW_FIELDS = ("f_109_14", "f_110_14", "f_127_14", "f_150_14", "f_508", "f_509", "f_702", "f_853",
              *[f"d_{f}" for f in DENSE])


class Source:
    """The Ali-CCP samples as a `jobs.sources.Source`; behaviour events are the clicks."""

    def __init__(self, spark: SparkSession, cfg: GemConfig, root: Path) -> None:
        self.spark, self.world, self.folder = spark, cfg.world, root / FOLDER

    @cached_property
    def _rows(self) -> DataFrame:
        return read_text_files(self.spark, self.folder, "ali_ccp", FILES)

    @cached_property
    def _laid_out(self) -> DataFrame:
        return spread_over_days(self._rows, [F.col("_file"), F.col("_row")], self.world)

    def impressions(self, ds: date) -> DataFrame:
        """bronze.impressions (raw) of day `ds`: user 101, item 205, surface from scenario 301."""
        surface = F.try_element_at(F.create_map(*[F.lit(x) for kv in SCENARIO_SURFACE.items() for x in kv]),
                                   F.col("f_301"))
        return self._laid_out.where(F.col("ds") == F.lit(ds)).select(
            "impression_id", "ts", "ds", F.col("f_101").alias("user_id"), F.col("f_205").alias("ad_id"),
            surface.alias("surface"), F.lit(None).cast("int").alias("position"),
            (F.col("click") == 1).alias("clicked"), (F.col("purchase") == 1).alias("converted"),
            F.lit(None).cast("double").alias("p_click"), F.lit(None).cast("double").alias("p_convert"),
            F.col("f_301").cast("string").alias("source_surface"), *ROW_FIELDS, LINE_COLUMN,
        )

    def events(self, ds: date) -> DataFrame:
        """Behaviour events of day `ds`: the day's clicks (the samples have no behaviour log)."""
        return click_events(self.impressions(ds))

    def users(self) -> DataFrame:
        """bronze.users: field 101 with its profile fields from its earliest parsed row; `age_bucket` is field 125."""
        first = self._rows.where(parsed()).groupBy(F.col("f_101").alias("user_id")).agg(
            F.min_by(F.struct(*USER_FIELDS), F.struct("_file", "_row")).alias("u"))
        return first.select(
            "user_id", F.col("u.f_125").cast("string").alias("age_bucket"),
            F.lit(None).cast("string").alias("country"), F.lit(None).cast("string").alias("device"),
            *[F.col(f"u.{c}").alias(c) for c in USER_FIELDS if c != "f_125"],
        )

    def ads(self) -> DataFrame:
        """bronze.ads: item 205 with advertiser = shop (207), category = 206, from its earliest parsed row."""
        first = self._rows.where(parsed()).groupBy(F.col("f_205").alias("ad_id")).agg(F.min_by(
            F.struct("f_207", "f_206", "f_210", "f_216"), F.struct("_file", "_row")).alias("a"))
        return first.select(
            "ad_id", F.col("a.f_207").alias("advertiser_id"), F.col("a.f_206").alias("category"),
            F.lit(None).cast("string").alias("ad_format"), F.lit(None).cast("string").alias("objective"),
            "a.f_210", "a.f_216",
        )
