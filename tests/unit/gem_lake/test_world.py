"""The synthetic world: deterministic, heavy-tailed, cold start, drift, labels from known truth, and the
structure each model part exists for (a fourth-order interaction, a behaviour term in conversions)."""

import pytest
from pyspark.sql import functions as F

from gem_lake.quarantine import split
from gem_lake.sources.world import (
    CART_ACTION,
    CART_SURFACE,
    INTERACTION_STRENGTH,
    SEGMENT_AGES,
    SEGMENT_FORMATS,
    SEGMENT_HOURS,
    SEGMENT_SURFACES,
    Source,
)
from gem_model.config import GemConfig

pytestmark = pytest.mark.spark
CFG = GemConfig.from_dict({"world": {"n_days": 4, "holdout_days": 1}})


@pytest.fixture(scope="module")
def world(spark):
    source = Source(spark, CFG)
    days = CFG.world.days
    events = source.events(days[0])
    impressions = source.impressions(days[0])
    for d in days[1:]:
        events, impressions = events.unionByName(source.events(d)), impressions.unionByName(source.impressions(d))
    return source, events.cache(), impressions.cache()


@pytest.mark.slow
def test_same_rows_whatever_the_partitioning(spark):
    day = CFG.world.days[1]
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    try:
        spark.conf.set("spark.sql.shuffle.partitions", "2")
        a = Source(spark, CFG).impressions(day).orderBy("impression_id").collect()
        spark.conf.set("spark.sql.shuffle.partitions", "7")
        b = Source(spark, CFG).impressions(day).repartition(5).orderBy("impression_id").collect()
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", previous)
    assert len(a) == CFG.world.impressions_per_day and a == b


@pytest.mark.slow
def test_sequence_lengths_are_heavy_tailed(world):
    _, events, _ = world
    counts = events.groupBy("user_id").count()
    p50, p99 = counts.select(F.percentile_approx("count", [0.5, 0.99])).first()[0]
    assert 10 <= p50 <= 100  # median in the tens
    assert p99 >= 10 * p50  # a long tail of very active users


@pytest.mark.slow
def test_cold_start_users_and_ads_arrive_over_the_days(world):
    source, events, impressions = world
    ads = source.ads()
    late = ads.where(F.col("launch_date") > CFG.world.start_date)
    assert late.count() > 0
    shown = impressions.join(ads.select("ad_id", "launch_date"), "ad_id")
    assert shown.where(F.col("ds") < F.col("launch_date")).count() == 0  # never shown before launch
    assert (
        shown.where(F.col("ds") == F.col("launch_date")).where(F.col("launch_date") > CFG.world.start_date).count() > 0
    )
    users = source.users()
    active = events.join(users.select("user_id", "signup_date"), "user_id")
    assert active.where(F.col("ds") < F.col("signup_date")).count() == 0
    assert users.where(F.col("signup_date") > CFG.world.start_date).count() > 0


def test_labels_follow_the_stored_probabilities(world):
    _, _, impressions = world
    row = impressions.agg(
        F.avg(F.col("clicked").cast("double")).alias("ctr"), F.avg("p_click").alias("p"), F.count(F.lit(1)).alias("n")
    ).first()
    sd = (row["p"] * (1 - row["p"]) / row["n"]) ** 0.5
    assert abs(row["ctr"] - row["p"]) < 4 * sd
    assert 0.03 < row["p"] < 0.4


def test_click_probability_rises_with_interest_match(world):
    source, _, impressions = world
    users = source.users().select("user_id", "true_interest")
    ads = source.ads().select("ad_id", "category")
    joined = impressions.join(users, "user_id").join(ads, "ad_id")
    rates = {
        r["match"]: r["p"]
        for r in joined.groupBy((F.col("category") == F.col("true_interest")).alias("match"))
        .agg(F.avg("p_click").alias("p"))
        .collect()
    }
    assert rates[True] > 2 * rates[False]


def test_surface_mix_drifts_towards_reels(world):
    _, _, impressions = world
    first, last = CFG.world.days[0], CFG.world.days[-1]
    share = {
        r["ds"]: r["share"]
        for r in impressions.groupBy("ds")
        .agg(F.avg((F.col("surface") == "reels").cast("double")).alias("share"))
        .collect()
    }
    assert share[last] > share[first] + 0.05


def test_malformed_rows_are_injected_at_the_configured_rate(world):
    _, _, impressions = world
    day = CFG.world.days[2]
    _, rejected = split(impressions.where(F.col("ds") == day), "bronze.impressions", CFG.world.surfaces, day)
    n = rejected.count()
    expected = CFG.world.malformed_rate * CFG.world.impressions_per_day
    assert 0 < n < 5 * expected + 5
    reasons = {r["reason"] for r in rejected.collect()}
    assert reasons <= {
        "null_user_id",
        "unknown_surface",
        "ts_outside_partition",
        "negative_ad_id",
        "conversion_without_click",
    }


def _logit(p):
    return F.log(p / (1 - p))


def test_click_logit_has_a_fourth_order_term(world):
    """The hour of day moves the click logit by INTERACTION_STRENGTH when the other three conditions hold, and
    not at all otherwise (the hour has no other term)."""
    source, _, impressions = world
    rows = (
        impressions.where(F.col("p_click").isNotNull())
        .join(source.users().select("user_id", "age_bucket"), "user_id")
        .join(source.ads().select("ad_id", "ad_format"), "ad_id")
    )
    three = (
        F.col("age_bucket").isin(*SEGMENT_AGES)
        & F.col("ad_format").isin(*SEGMENT_FORMATS)
        & F.col("surface").isin(*SEGMENT_SURFACES)
    )
    start, end = SEGMENT_HOURS
    hour = (F.hour("ts") >= start) | (F.hour("ts") < end)
    means = {
        (r["three"], r["hour"]): r["z"]
        for r in rows.groupBy(three.alias("three"), hour.alias("hour"))
        .agg(F.avg(_logit(F.col("p_click"))).alias("z"))
        .collect()
    }
    assert abs(means[(True, True)] - means[(True, False)] - INTERACTION_STRENGTH) < 0.25
    assert abs(means[(False, True)] - means[(False, False)]) < 0.1


@pytest.mark.slow
def test_offsite_carts_raise_conversion_on_every_surface(world):
    source, events, impressions = world
    carts = events.where((F.col("action") == CART_ACTION) & F.col("surface").isin(*CFG.world.surfaces))
    assert {r["surface"] for r in carts.select("surface").distinct().collect()} == {CART_SURFACE}
    ads = source.ads().select("ad_id", "category")
    cart_times = carts.join(ads.withColumnRenamed("ad_id", "item_id"), "item_id").select(
        "user_id", "category", F.col("ts").alias("cart_ts")
    )
    matched = (
        impressions.where(F.col("p_click").isNotNull())
        .join(ads, "ad_id")
        .join(source.users().select("user_id", "true_interest"), "user_id")
        .where(F.col("category") == F.col("true_interest"))
    )  # the same affinity term on both sides
    last_cart = (
        matched.join(cart_times, ["user_id", "category"], "left")
        .where(F.col("cart_ts").isNull() | (F.col("cart_ts") < F.col("ts")))
        .groupBy("impression_id", "surface", "ts", "ds", "p_click", "p_convert")
        .agg(F.max("cart_ts").alias("cart_ts"))
    )
    hours = (F.unix_timestamp("ts") - F.unix_timestamp("cart_ts")) / 3600.0
    window_start = F.to_timestamp(F.date_sub("ds", 1))
    group = F.when(F.col("cart_ts").isNull() | (F.col("cart_ts") < window_start), "none").when(hours < 2, "recent")
    z = _logit(F.col("p_convert") / F.col("p_click"))
    means = {
        (r["g"], r["on"]): r["z"]
        for r in last_cart.groupBy(group.alias("g"), (F.col("surface") != CART_SURFACE).alias("on"))
        .agg(F.avg(z).alias("z"))
        .collect()
    }
    # Onsite impressions gain what offsite carts give: CART_BOOST * 0.5^(<2h / 24h) ~ 1.4-1.5.
    assert 1.2 < means[("recent", True)] - means[("none", True)] < 1.6
