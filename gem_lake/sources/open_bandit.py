"""Open Bandit Dataset (ZOZOTOWN, small version) as bronze rows: 6 logs of 10,000 impressions.

Each (policy, campaign) log is read whole; rows keep their `policy` (random / bts) and
`propensity_score`, and are laid out in order of their real timestamp (late November 2019),
which is kept as `timestamp`. A campaign is a surface. There is no user id: the four hashed user
features (shared by all six logs) identify a user segment, 337 of them. Item ids are indexes
within a campaign's item list, so an ad is (campaign, item_id); ads come from the campaign's
`item_context.csv` under `random/` (the `bts/` copy hashes features 1-3 with another salt, and
its feature 0 is the same). `user-item_affinity_<k>` columns beyond a campaign's item count are
null. There are no conversions. Lines are read strictly (`gem_lake.sources.lines`): a log line
repeating an earlier `index` of its log is a `duplicate_index`, an item list line repeating an
`item_id` a `duplicate_item_id`.
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
from gem_lake.sources.timeline import click_events, derived_id, spread_over_days
from gem_model.config import GemConfig

FOLDER = "open_bandit_dataset"
POLICIES = ("random", "bts")
# Campaign -> (surface, number of items, hence of affinity columns); surface names are arbitrary.
CAMPAIGNS = {"all": ("feed", 80), "men": ("stories", 34), "women": ("reels", 46)}
USER_FIELDS = tuple(f"user_feature_{i}" for i in range(4))
N_AFFINITY = max(n for _, n in CAMPAIGNS.values())
LOGS = tuple((policy, campaign) for policy in POLICIES for campaign in CAMPAIGNS)  # in read order


def _log(policy: str, campaign: str) -> TextFile:
    """A (policy, campaign) log: the unnamed first column is the log's index, its row key."""
    n_items = CAMPAIGNS[campaign][1]
    fields = (
        Field("index", "int"),
        Field("timestamp", "timestamp"),
        Field("item_id", "int"),
        Field("position", "int"),
        Field("click", "int"),
        Field("propensity_score", "double"),
        *[Field(c, "string") for c in USER_FIELDS],
        *[Field(f"user_item_affinity_{k}", "double") for k in range(n_items)],
    )
    header = ("", *[f.name for f in fields[1:-n_items]], *[f"user-item_affinity_{k}" for k in range(n_items)])
    return TextFile(
        f"{policy}/{campaign}/{campaign}.csv",
        fields,
        header,
        labels=("click",),
        key=("index",),
        timestamp_format="yyyy-MM-dd HH:mm:ss.SSSSSSXXX",
    )


def _items(campaign: str) -> TextFile:
    fields = (
        Field("index", "int"),
        Field("item_id", "int"),
        Field("item_feature_0", "double"),
        *[Field(f"item_feature_{i}", "string") for i in range(1, 4)],
    )
    return TextFile(
        f"random/{campaign}/item_context.csv", fields, ("", *[f.name for f in fields[1:]]), key=("item_id",)
    )


def _by_file(values: list[str]) -> Column:
    """`values[_file]`: a per-file constant of rows read by `read_text_files`."""
    return F.element_at(F.array(*map(F.lit, values)), F.col("_file") + 1)


def _ad_id() -> Column:
    return derived_id(F.col("campaign"), F.col("item_id"))


class Source:
    """The Open Bandit logs as a `gem_lake.sources.Source`; behaviour events are the clicks."""

    def __init__(self, spark: SparkSession, cfg: GemConfig, root: Path) -> None:
        self.spark, self.world, self.folder = spark, cfg.world, root / FOLDER

    @cached_property
    def _rows(self) -> DataFrame:
        """The six logs with their policy, campaign and ids; a log's own index column numbers its rows."""
        rows = read_text_files(self.spark, self.folder, "open_bandit", [_log(p, c) for p, c in LOGS])
        policy, campaign = _by_file([p for p, _ in LOGS]), _by_file([c for _, c in LOGS])
        rows = rows.select(
            *[c for c in rows.columns if c != "impression_id"], policy.alias("policy"), campaign.alias("campaign")
        )
        return rows.select(
            "*",
            F.concat(
                F.lit("open_bandit-"), "policy", F.lit("-"), "campaign", F.lit("-"), F.col("index").cast("string")
            ).alias("impression_id"),
            derived_id(*[F.col(c) for c in USER_FIELDS]).alias("user_id"),
            _ad_id().alias("ad_id"),
        )

    @cached_property
    def _laid_out(self) -> DataFrame:
        # The file and line end the order: a garbled line has no timestamp or index.
        order = [F.col("timestamp"), F.col("policy"), F.col("campaign"), F.col("index"), F.col("_file"), F.col("_row")]
        return spread_over_days(self._rows, order, self.world)

    def impressions(self, ds: date) -> DataFrame:
        """bronze.impressions (raw) of day `ds`: the logged slot is `position` (1-3 = left, center, right)."""
        surfaces = F.create_map(*[F.lit(x) for c, (s, _) in CAMPAIGNS.items() for x in (c, s)])
        surface = F.try_element_at(surfaces, F.col("campaign"))
        return self._laid_out.where(F.col("ds") == F.lit(ds)).select(
            "impression_id",
            "ts",
            "ds",
            "user_id",
            "ad_id",
            surface.alias("surface"),
            "position",
            (F.col("click") == 1).alias("clicked"),
            F.lit(False).alias("converted"),
            F.lit(None).cast("double").alias("p_click"),
            F.lit(None).cast("double").alias("p_convert"),
            F.col("campaign").alias("source_surface"),
            "policy",
            "propensity_score",
            "timestamp",
            "index",
            *[f"user_item_affinity_{k}" for k in range(N_AFFINITY)],
            LINE_COLUMN,
        )

    def events(self, ds: date) -> DataFrame:
        """Behaviour events of day `ds`: the day's clicks."""
        return click_events(self.impressions(ds))

    def users(self) -> DataFrame:
        """bronze.users: one row per user segment, its four hashed features as extras."""
        return (
            self._rows.where(parsed())
            .groupBy("user_id")
            .agg(F.min_by(F.struct(*USER_FIELDS), F.struct("timestamp", "policy", "campaign", "index")).alias("u"))
            .select(
                "user_id", *[F.lit(None).cast("string").alias(c) for c in ("age_bucket", "country", "device")], "u.*"
            )
        )

    def ads(self) -> DataFrame:
        """bronze.ads: every item of every campaign (`random/` item lists), its features as extras."""
        items = read_text_files(self.spark, self.folder, "open_bandit", [_items(c) for c in CAMPAIGNS])
        items = items.select("*", _by_file(list(CAMPAIGNS)).alias("campaign"))
        return items.select(
            _ad_id().alias("ad_id"),
            F.lit(None).cast("bigint").alias("advertiser_id"),
            F.lit(None).cast("bigint").alias("category"),
            F.lit(None).cast("string").alias("ad_format"),
            F.lit(None).cast("string").alias("objective"),
            "campaign",
            "item_id",
            *[f"item_feature_{i}" for i in range(4)],
            LINE_COLUMN,
        )
