"""AliExpress Searching System (Tianchi 74690) as bronze rows, from the FuxiCTR and torch-rechub samples.

All four files share one schema (search_id, 16 categorical, 63 numerical features, click,
conversion) but no user or item id, and the features are unnamed. Within a search (same
search_id in a file) `categorical_1..9` never change and `categorical_10..16` do, so the first
nine are user/query fields and the last seven item fields. The ids hash those groups:
`user_id` is a user/query profile (137 in the samples, most seen more than once) and `ad_id` an
item profile (40), not an individual; adding the item-side numericals would make every row its
own ad. search_id is renumbered per file, so it is kept as a feature, not used as an id. Rows
carry no timestamp and are laid out in file order, train files before test files, so the test
rows fill the last (holdout) days. There is no surface: every row is on `feed`. The format has
no row id: a line repeating an earlier line of any of the four files is a `duplicate_line`
(`jobs.sources.lines`).
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
from jobs.sources.timeline import click_events, derived_id, spread_over_days

FOLDER = "aliexpress"
USER_FIELDS = tuple(f"categorical_{i}" for i in range(1, 10))
AD_FIELDS = tuple(f"categorical_{i}" for i in range(10, 17))
NUMERICAL = tuple(f"numerical_{i}" for i in range(1, 64))
FIELDS = (Field("search_id", "bigint"), *[Field(c, "bigint") for c in USER_FIELDS + AD_FIELDS],
          *[Field(c, "double") for c in NUMERICAL], Field("click", "int"), Field("conversion", "int"))
FILES = tuple(TextFile(name, FIELDS, header=tuple(f.name for f in FIELDS), labels=("click", "conversion"))
              for name in ("fuxictr_tiny_mtl_train.csv", "torch_rechub_aliexpress_train_sample.csv",
                           "fuxictr_tiny_mtl_test.csv", "torch_rechub_aliexpress_test_sample.csv"))
SURFACE = "feed"


class Source:
    """The AliExpress samples as a `jobs.sources.Source`; behaviour events are the clicks."""

    def __init__(self, spark: SparkSession, cfg: GemConfig, root: Path) -> None:
        self.spark, self.world, self.folder = spark, cfg.world, root / FOLDER

    @cached_property
    def _rows(self) -> DataFrame:
        rows = read_text_files(self.spark, self.folder, "aliexpress", FILES)
        return rows.select("*", derived_id(*map(F.col, USER_FIELDS)).alias("user_id"),
                           derived_id(*map(F.col, AD_FIELDS)).alias("ad_id"))

    @cached_property
    def _laid_out(self) -> DataFrame:
        return spread_over_days(self._rows, [F.col("_file"), F.col("_row")], self.world)

    def impressions(self, ds: date) -> DataFrame:
        """bronze.impressions (raw) of day `ds`, with search_id and the 63 numerical features as extras."""
        return self._laid_out.where(F.col("ds") == F.lit(ds)).select(
            "impression_id", "ts", "ds", "user_id", "ad_id", F.lit(SURFACE).alias("surface"),
            F.lit(None).cast("int").alias("position"), (F.col("click") == 1).alias("clicked"),
            (F.col("conversion") == 1).alias("converted"), F.lit(None).cast("double").alias("p_click"),
            F.lit(None).cast("double").alias("p_convert"), "search_id", *NUMERICAL, LINE_COLUMN,
        )

    def events(self, ds: date) -> DataFrame:
        """Behaviour events of day `ds`: the day's clicks (the samples have no behaviour log)."""
        return click_events(self.impressions(ds))

    def users(self) -> DataFrame:
        """bronze.users: one row per user/query profile, its fields as extras (no age, country or device)."""
        first = self._rows.where(parsed()).groupBy("user_id").agg(
            F.min_by(F.struct(*USER_FIELDS), F.struct("_file", "_row")).alias("u"))
        return first.select(
            "user_id", *[F.lit(None).cast("string").alias(c) for c in ("age_bucket", "country", "device")], "u.*")

    def ads(self) -> DataFrame:
        """bronze.ads: one row per item profile, its fields as extras (no advertiser, category, format)."""
        first = self._rows.where(parsed()).groupBy("ad_id").agg(
            F.min_by(F.struct(*AD_FIELDS), F.struct("_file", "_row")).alias("a"))
        return first.select(
            "ad_id", F.lit(None).cast("bigint").alias("advertiser_id"), F.lit(None).cast("bigint").alias("category"),
            F.lit(None).cast("string").alias("ad_format"), F.lit(None).cast("string").alias("objective"), "a.*",
        )
