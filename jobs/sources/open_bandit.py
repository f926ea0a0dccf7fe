"""Open Bandit Dataset (ZOZOTOWN, small version) as bronze rows: 6 logs of 10,000 impressions.

Each (policy, campaign) log is read whole; rows keep their `policy` (random / bts) and
`propensity_score`, and are laid out in order of their real timestamp (late November 2019),
which is kept as `timestamp`. A campaign is a surface. There is no user id: the four hashed user
features (shared by all six logs) identify a user segment, 337 of them. Item ids are indexes
within a campaign's item list, so an ad is (campaign, item_id); ads come from the campaign's
`item_context.csv` under `random/` (the `bts/` copy hashes features 1-3 with another salt, and
its feature 0 is the same). `user-item_affinity_<k>` columns beyond a campaign's item count are
null. There are no conversions.
"""

from __future__ import annotations

from datetime import date
from functools import reduce
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from gem_model.config import GemConfig
from jobs.sources.timeline import click_events, derived_id, spread_over_days

FOLDER = "open_bandit_dataset"
POLICIES = ("random", "bts")
# Campaign -> (surface, number of items, hence of affinity columns); surface names are arbitrary.
CAMPAIGNS = {"all": ("feed", 80), "men": ("stories", 34), "women": ("reels", 46)}
USER_FIELDS = tuple(f"user_feature_{i}" for i in range(4))
ITEM_SCHEMA = "index int, item_id int, item_feature_0 double, item_feature_1 string, item_feature_2 string, " \
              "item_feature_3 string"
N_AFFINITY = max(n for _, n in CAMPAIGNS.values())


def _log_schema(n_items: int) -> str:
    return ", ".join(["index int", "timestamp timestamp", "item_id int", "position int", "click int",
                      "propensity_score double", *[f"{c} string" for c in USER_FIELDS],
                      *[f"user_item_affinity_{k} double" for k in range(n_items)]])


def _ad_id() -> Column:
    return derived_id(F.col("campaign"), F.col("item_id"))


class Source:
    """The Open Bandit logs as a `jobs.sources.Source`; behaviour events are the clicks."""

    def __init__(self, spark: SparkSession, cfg: GemConfig, root: Path) -> None:
        self.spark, self.world, self.folder = spark, cfg.world, root / FOLDER

    def _read(self, policy: str, campaign: str) -> DataFrame:
        """One log with its policy, campaign and ids; the file's own index column numbers its rows."""
        n_items = CAMPAIGNS[campaign][1]
        df = self.spark.read.csv(str(self.folder / policy / campaign / f"{campaign}.csv"),
                                 schema=_log_schema(n_items), header=True,
                                 timestampFormat="yyyy-MM-dd HH:mm:ss.SSSSSSXXX")
        missing = [F.lit(None).cast("double").alias(f"user_item_affinity_{k}") for k in range(n_items, N_AFFINITY)]
        return df.select(
            "*", *missing, F.lit(policy).alias("policy"), F.lit(campaign).alias("campaign"),
            F.concat(F.lit(f"open_bandit-{policy}-{campaign}-"), F.col("index").cast("string")).alias("impression_id"),
            derived_id(*[F.col(c) for c in USER_FIELDS]).alias("user_id"), _ad_id().alias("ad_id"),
        )

    def _rows(self) -> DataFrame:
        logs = [self._read(p, c) for p in POLICIES for c in CAMPAIGNS]
        return reduce(DataFrame.unionByName, logs)

    def impressions(self, ds: date) -> DataFrame:
        """bronze.impressions (raw) of day `ds`: the logged slot is `position` (1-3 = left, center, right)."""
        order = [F.col("timestamp"), F.col("policy"), F.col("campaign"), F.col("index")]
        rows = spread_over_days(self._rows(), order, self.world)
        surfaces = F.create_map(*[F.lit(x) for c, (s, _) in CAMPAIGNS.items() for x in (c, s)])
        surface = F.try_element_at(surfaces, F.col("campaign"))
        return rows.where(F.col("ds") == F.lit(ds)).select(
            "impression_id", "ts", "ds", "user_id", "ad_id", surface.alias("surface"),
            "position", (F.col("click") == 1).alias("clicked"), F.lit(False).alias("converted"),
            F.lit(None).cast("double").alias("p_click"), F.lit(None).cast("double").alias("p_convert"),
            F.col("campaign").alias("source_surface"), "policy", "propensity_score", "timestamp", "index",
            *[f"user_item_affinity_{k}" for k in range(N_AFFINITY)],
        )

    def events(self, ds: date) -> DataFrame:
        """Behaviour events of day `ds`: the day's clicks."""
        return click_events(self.impressions(ds))

    def users(self) -> DataFrame:
        """bronze.users: one row per user segment, its four hashed features as extras."""
        return self._rows().groupBy("user_id").agg(F.min_by(F.struct(*USER_FIELDS), F.struct(
            "timestamp", "policy", "campaign", "index")).alias("u")).select(
            "user_id", *[F.lit(None).cast("string").alias(c) for c in ("age_bucket", "country", "device")], "u.*")

    def ads(self) -> DataFrame:
        """bronze.ads: every item of every campaign (`random/` item lists), its features as extras."""
        items = [
            self.spark.read.csv(str(self.folder / "random" / c / "item_context.csv"), schema=ITEM_SCHEMA, header=True)
            .select("*", F.lit(c).alias("campaign"))
            for c in CAMPAIGNS
        ]
        return reduce(DataFrame.unionByName, items).select(
            _ad_id().alias("ad_id"), F.lit(None).cast("bigint").alias("advertiser_id"),
            F.lit(None).cast("bigint").alias("category"), F.lit(None).cast("string").alias("ad_format"),
            F.lit(None).cast("string").alias("objective"), "campaign", "item_id",
            *[f"item_feature_{i}" for i in range(4)],
        )
