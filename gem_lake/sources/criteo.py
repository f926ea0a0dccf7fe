"""Criteo Display Advertising Challenge (Kaggle 2014) as bronze rows, from the fun-rec and DeepCTR samples.

Criteo rows have no user or ad id and their 26 hashed categorical fields are unnamed. In the
samples they form chains of functional dependence: C3 determines C4, C12, C16, C21 and C24, and
C15 determines C2, C14 and C18, with neither chain determining the other. The ids take the finest
field of each chain, C3 for the ad (1,183 values in the samples) and C15 for the user (786), so
both repeat and each dimension row's fields are consistent; a row with C3 empty has no ad id
(the quarantine rejects it). Order: fun-rec's rows by Kaggle `Id` (the Kaggle train file is in
time order, and these rows are its start), then DeepCTR's in file order. No surface: `feed`.
Lines are read strictly (`gem_lake.sources.lines`): a fun-rec line repeating an earlier `Id` is a
`duplicate_id`, a DeepCTR line (no id) repeating an earlier line a `duplicate_line`.
"""

from __future__ import annotations

from datetime import date
from functools import cached_property
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gem_lake.quarantine import LINE_COLUMN
from gem_lake.sources.files import Field, TextFile
from gem_lake.sources.lines import parsed, read_text_files
from gem_lake.sources.timeline import click_events, derived_id, spread_over_days
from gem_model.config import GemConfig

FOLDER = "criteo_kaggle_dac"
INTEGER = tuple(f"i{i}" for i in range(1, 14))
CATEGORICAL = tuple(f"c{i}" for i in range(1, 27))
# Integer features are written as "260.0" in one file, so they are read as doubles and cast back.
_FEATURES = (*[Field(c, "double") for c in INTEGER], *[Field(c, "string") for c in CATEGORICAL])
_HEADER = (*[c.upper() for c in INTEGER], *[c.upper() for c in CATEGORICAL])
FILES = (  # fun-rec first: see the module docstring
    TextFile(
        "funrec_kaggle_train.csv",
        (Field("id", "bigint"), Field("label", "int"), *_FEATURES),
        header=("Id", "Label", *_HEADER),
        labels=("label",),
        key=("id",),
    ),
    TextFile(
        "deepctr_criteo_sample.csv", (Field("label", "int"), *_FEATURES), header=("label", *_HEADER), labels=("label",)
    ),
)
USER_FIELDS = ("c15", "c2", "c14", "c18")
AD_FIELDS = ("c3", "c4", "c12", "c16", "c21", "c24")
SURFACE = "feed"


class Source:
    """The Criteo samples as a `gem_lake.sources.Source`; behaviour events are the clicks."""

    def __init__(self, spark: SparkSession, cfg: GemConfig, root: Path) -> None:
        self.spark, self.world, self.folder = spark, cfg.world, root / FOLDER

    @cached_property
    def _rows(self) -> DataFrame:
        rows = read_text_files(self.spark, self.folder, "criteo", FILES)
        return rows.select("*", derived_id(F.col("c15")).alias("user_id"), derived_id(F.col("c3")).alias("ad_id"))

    @cached_property
    def _laid_out(self) -> DataFrame:
        return spread_over_days(self._rows, [F.col("_file"), F.col("id"), F.col("_row")], self.world)

    def impressions(self, ds: date) -> DataFrame:
        """bronze.impressions (raw) of day `ds`, with Kaggle `id`, I1..I13 and C1..C26 as extras."""
        return self._laid_out.where(F.col("ds") == F.lit(ds)).select(
            "impression_id",
            "ts",
            "ds",
            "user_id",
            "ad_id",
            F.lit(SURFACE).alias("surface"),
            F.lit(None).cast("int").alias("position"),
            (F.col("label") == 1).alias("clicked"),
            F.lit(False).alias("converted"),
            F.lit(None).cast("double").alias("p_click"),
            F.lit(None).cast("double").alias("p_convert"),
            "id",
            *[F.col(c).try_cast("bigint").alias(c) for c in INTEGER],
            *CATEGORICAL,
            LINE_COLUMN,
        )

    def events(self, ds: date) -> DataFrame:
        """Behaviour events of day `ds`: the day's clicks (the samples have no behaviour log)."""
        return click_events(self.impressions(ds))

    def users(self) -> DataFrame:
        """bronze.users: one row per C15 value with its chain's fields from its earliest row."""
        return self._first("user_id", USER_FIELDS).select(
            "user_id", *[F.lit(None).cast("string").alias(c) for c in ("age_bucket", "country", "device")], "f.*"
        )

    def ads(self) -> DataFrame:
        """bronze.ads: one row per C3 value with its chain's fields (semantics undisclosed: no advertiser, category)."""
        return self._first("ad_id", AD_FIELDS).select(
            "ad_id",
            F.lit(None).cast("bigint").alias("advertiser_id"),
            F.lit(None).cast("bigint").alias("category"),
            F.lit(None).cast("string").alias("ad_format"),
            F.lit(None).cast("string").alias("objective"),
            "f.*",
        )

    def _first(self, key: str, fields: tuple[str, ...]) -> DataFrame:
        """Per `key`, `fields` (as struct `f`) from its earliest parsed row in layout order."""
        return (
            self._rows.where(parsed())
            .groupBy(key)
            .agg(F.min_by(F.struct(*fields), F.struct("_file", "id", "_row")).alias("f"))
        )
