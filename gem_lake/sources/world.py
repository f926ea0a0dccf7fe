"""The synthetic multi-surface ads world: a data source whose truth is known.

Every random draw is a hash of (seed, purpose, day, row id), never `rand()`, so the output is the
same whatever the partitioning or cluster size, and each day is generated independently in
parallel (`spark.range` rows, no driver-side data). Latent attributes are `true_*` columns
(never features), and impressions carry the click and conversion probabilities their labels
were drawn from (`p_click`, `p_convert`), so oracle metrics can be computed for any window.

The world:
- users (age, country, device, signup date) with a primary and a secondary latent interest
  category and a log-normal activity level; ads in campaigns of advertisers, with category,
  creative format, objective, a launch date, a quality and a popularity trend. Users and ads
  arrive over the days: cold start.
- behaviour events (item, action, surface, time): a user's daily count is log-normal, so
  sequence lengths are heavy-tailed; items follow the user's interests.
- click probability from user-ad affinity (primary/secondary interest), surface, position, ad
  quality, the ad's popularity trend (drift), the recency of a related event (same category)
  in the last day, and a fourth-order interaction: `INTERACTION_STRENGTH` more on the
  impressions of one segment, where the user's age, the ad's format, the surface and the hour
  of day each fall in their half at once (a conjunction: part of it shows at every lower order,
  all of it only to a model that crosses the four features);
  conversion from click, objective, affinity, quality and the recency of an add-to-cart event
  in the ad's category. Carts happen off-site (`CART_SURFACE`) and raise conversions on every
  surface: behaviour on one surface predicts another. The surface mix shifts from the first
  day to the last.
- `malformed_rate` of the raw rows are corrupted (null key, unknown surface, timestamp on
  another day, negative id, conversion without click) for the quarantine to catch.
"""

from __future__ import annotations

import math
from datetime import date
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from gem_model.config import GemConfig, WorldConfig

AGE_BUCKETS = ("18-24", "25-34", "35-44", "45-54", "55-64", "65+")
COUNTRIES = ("US", "BR", "IN", "ID", "MX", "GB", "DE", "FR")
DEVICES = ("ios", "android", "web")
AD_FORMATS = ("image", "video", "carousel", "collection")
OBJECTIVES = ("awareness", "consideration", "conversion")
ACTIONS = {"view": 0.52, "like": 0.2, "share": 0.05, "ad_click": 0.15, "add_to_cart": 0.08}
# Per-surface click bias (logit); traffic share on the first and on the last day.
SURFACE_CLICK_BIAS = {"feed": 0.0, "stories": -0.3, "reels": 0.2, "messaging": 0.5, "offsite": -0.6}
SURFACE_SHARE_FIRST = {"feed": 0.4, "stories": 0.2, "reels": 0.15, "messaging": 0.1, "offsite": 0.15}
SURFACE_SHARE_LAST = {"feed": 0.3, "stories": 0.2, "reels": 0.3, "messaging": 0.1, "offsite": 0.1}
OBJECTIVE_CLICK_BIAS = {"awareness": -0.2, "consideration": 0.1, "conversion": 0.0}
OBJECTIVE_CVR_BIAS = {"awareness": -1.5, "consideration": -0.8, "conversion": 0.2}
RECENCY_BOOST, RECENCY_HALF_LIFE_H = 1.0, 6.0
# Conversion logit gained from an add-to-cart in the ad's category, halving every CART_HALF_LIFE_H hours.
CART_ACTION, CART_SURFACE = "add_to_cart", "offsite"
CART_BOOST, CART_HALF_LIFE_H = 1.5, 24.0
# The click logit's fourth-order term: INTERACTION_STRENGTH on the segment where all four hold. With each
# condition a half of its feature's values, the term is S/16 * prod(1 + s_i) over four signs s_i: every order
# from one to four carries a part of it (the fourth S/16).
INTERACTION_STRENGTH = 1.5
SEGMENT_AGES = ("18-24", "25-34", "35-44")
SEGMENT_FORMATS = ("video", "carousel")
SEGMENT_SURFACES = ("stories", "reels")
SEGMENT_HOURS = (18, 6)  # from 18:00 to 06:00
POSITION_PENALTY = 0.2  # click logit lost per slot below the first
CLICK_INTERCEPT = -3.0
_RESOLUTION = 1 << 40


def uniform(seed: int, purpose: str, *cols: Column) -> Column:
    """A deterministic U[0, 1) draw per row from a hash of the seed, a purpose tag and `cols`."""
    h = F.xxhash64(F.lit(seed), F.lit(purpose), *cols)
    return F.pmod(h, F.lit(_RESOLUTION)).cast("double") / float(_RESOLUTION)


def normal(seed: int, purpose: str, *cols: Column) -> Column:
    """A deterministic standard normal draw (Box-Muller over two hashed uniforms)."""
    u1 = 1.0 - uniform(seed, f"{purpose}_1", *cols)
    u2 = uniform(seed, f"{purpose}_2", *cols)
    return F.sqrt(-2.0 * F.log(u1)) * F.cos(2.0 * math.pi * u2)


def pick(values: tuple[str, ...], u: Column) -> Column:
    """Choose uniformly from `values` with the uniform draw `u`."""
    idx = F.floor(u * len(values)).cast("int") + 1
    return F.element_at(F.array(*[F.lit(v) for v in values]), idx)


def pick_weighted(weights: dict[str, float], u: Column) -> Column:
    total = sum(weights.values())
    expr, cumulative = None, 0.0
    for name, w in weights.items():
        cumulative += w / total
        expr = F.when(u < cumulative, F.lit(name)) if expr is None else expr.when(u < cumulative, F.lit(name))
    return expr.otherwise(F.lit(list(weights)[-1]))


def _lookup(mapping: dict[str, float], key: Column) -> Column:
    return F.element_at(F.create_map(*[F.lit(x) for kv in mapping.items() for x in kv]), key)


def _sigmoid(x: Column) -> Column:
    return 1.0 / (1.0 + F.exp(-x))


def in_segment(age_bucket: Column, ad_format: Column, surface: Column, hour: Column) -> Column:
    """1.0 for an impression in the fourth-order term's segment (all four conditions at once), else 0.0."""
    start, end = SEGMENT_HOURS
    return (
        age_bucket.isin(*SEGMENT_AGES)
        & ad_format.isin(*SEGMENT_FORMATS)
        & surface.isin(*SEGMENT_SURFACES)
        & ((hour >= start) | (hour < end))
    ).cast("double")


def hours_since_last(events: Column, ts: Column) -> Column:
    """Hours from the latest `ts` field of the array of structs `events` to `ts`; null when it is empty."""
    last = F.array_max(F.transform(events, lambda e: e["ts"]))
    return (F.unix_timestamp(ts) - F.unix_timestamp(last)) / 3600.0


def decayed(hours_since: Column, half_life_h: float) -> Column:
    """0.5^(hours / half life), 0 when there was no such event (null hours)."""
    return F.coalesce(F.pow(F.lit(0.5), hours_since / half_life_h), F.lit(0.0))


def _arrival_day(ids: Column, total: int, new_fraction: float, n_days: int) -> Column:
    """Day index on which entity `ids` (1..total) arrives: the first ones on day 0, the rest spread."""
    new = round(total * new_fraction)
    initial = total - new
    if new == 0 or n_days == 1:
        return F.lit(0)
    return F.when(ids <= initial, 0).otherwise(1 + F.floor((ids - initial - 1) * (n_days - 1) / new)).cast("int")


def _arrived(total: int, new_fraction: float, n_days: int, day: int) -> int:
    """How many entities have arrived by day index `day` (the ids 1..n): matches `_arrival_day`."""
    new = round(total * new_fraction)
    if new == 0 or n_days == 1:
        return total
    return total - new + min(new, -(-day * new // (n_days - 1)))


def surface_share(world: WorldConfig, day: int) -> dict[str, float]:
    """The day's traffic mix: linear drift from the first day's mix to the last day's."""
    t = day / max(world.n_days - 1, 1)
    return {s: (1 - t) * SURFACE_SHARE_FIRST[s] + t * SURFACE_SHARE_LAST[s] for s in world.surfaces}


class Source:
    """The synthetic world as a `gem_lake.sources.Source`; `root` is unused (nothing is read)."""

    def __init__(self, spark: SparkSession, cfg: GemConfig, root: Path | None = None) -> None:
        self.spark, self.world, self.seed = spark, cfg.world, cfg.world.seed

    # Latent and observable attributes are functions of the id, so any job can recompute them
    # without reading (or joining) the dimension tables.
    def _interest(self, uid: Column, which: str) -> Column:
        return F.floor(uniform(self.seed, f"interest_{which}", uid) * self.world.n_categories).cast("bigint")

    def _activity(self, uid: Column) -> Column:
        w = self.world
        return w.events_per_user_day * F.exp(w.activity_sigma * normal(self.seed, "activity", uid))

    def _age_bucket(self, uid: Column) -> Column:
        return pick(AGE_BUCKETS, uniform(self.seed, "age", uid))

    def _ad_format(self, aid: Column) -> Column:
        return pick(AD_FORMATS, uniform(self.seed, "format", aid))

    def _advertiser(self, aid: Column) -> Column:
        return (F.floor(uniform(self.seed, "advertiser", aid) * self.world.n_advertisers) + 1).cast("bigint")

    def _campaign(self, aid: Column) -> Column:
        k = self.world.campaigns_per_advertiser
        return ((self._advertiser(aid) - 1) * k + F.floor(uniform(self.seed, "campaign", aid) * k) + 1).cast("bigint")

    def _objective(self, aid: Column) -> Column:
        return pick(OBJECTIVES, uniform(self.seed, "objective", self._campaign(aid)))

    def category(self, aid: Column) -> Column:
        return F.pmod(aid - 1, F.lit(self.world.n_categories)).cast("bigint")

    def _quality(self, aid: Column) -> Column:
        return normal(self.seed, "quality", aid) * 0.6

    def interest_match(self, uid: Column, aid: Column, which: str) -> Column:
        """1.0 where the ad's category is the user's `which` ("primary" or "secondary") interest, else 0.0."""
        return (self.category(aid) == self._interest(uid, which)).cast("double")

    # The click logit's terms that the impression alone decides (the others: the day's drift, the recency of a
    # related event and the segment); `bench/research/click_gap.py` takes the logit apart with these same terms.
    def click_affinity(self, uid: Column, aid: Column) -> Column:
        return 1.6 * self.interest_match(uid, aid, "primary") + 0.8 * self.interest_match(uid, aid, "secondary")

    def click_quality(self, aid: Column) -> Column:
        return 0.7 * self._quality(aid)

    def click_context(self, aid: Column, surface: Column, position: Column) -> Column:
        return (
            _lookup(SURFACE_CLICK_BIAS, surface)
            + _lookup(OBJECTIVE_CLICK_BIAS, self._objective(aid))
            - POSITION_PENALTY * (position - 1)
        )

    def _trend(self, aid: Column) -> Column:
        return uniform(self.seed, "trend", aid) * 3.0 - 1.5

    def drift(self, aid: Column, ds: date) -> Column:
        """The ad's click-logit drift on day `ds`: its trend, scaled from -1/2 (first day) to +1/2 (last)."""
        w = self.world
        return self._trend(aid) * (self._day(ds) - (w.n_days - 1) / 2) / max(w.n_days - 1, 1)

    def _day(self, ds: date) -> int:
        """The index of `ds` in the world's dynamics. A day after the configured calendar (open-ended worlds)
        is the world as it stood on its last day: everyone arrived, traffic mix and drift held; its draws
        are its own (they hash the date)."""
        w = self.world
        day = (ds - w.start_date).days
        if day < 0 or (day >= w.n_days and not w.open_ended):
            end = "" if w.open_ended else str(w.days[-1])
            raise ValueError(
                f"ds={ds} is outside the world's calendar {w.days[0]}..{end}"
                + ("" if w.open_ended or day < 0 else "; set world.open_ended to go on after it")
            )
        return min(day, w.n_days - 1)

    def users(self) -> DataFrame:
        """bronze.users: demographic/device attributes, signup date, latent interests and activity."""
        w, s, uid = self.world, self.seed, F.col("user_id")
        signup = _arrival_day(uid, w.n_users, w.new_user_fraction, w.n_days)
        return (
            self.spark.range(1, w.n_users + 1)
            .select(F.col("id").alias("user_id"))
            .select(
                "user_id",
                self._age_bucket(uid).alias("age_bucket"),
                pick(COUNTRIES, uniform(s, "country", uid)).alias("country"),
                pick(DEVICES, uniform(s, "device", uid)).alias("device"),
                F.date_add(F.lit(w.start_date), signup).alias("signup_date"),
                self._interest(uid, "primary").alias("true_interest"),
                self._interest(uid, "secondary").alias("true_interest2"),
                self._activity(uid).alias("true_activity"),
            )
        )

    def ads(self) -> DataFrame:
        """bronze.ads: advertiser, campaign, category, format, objective, launch date, quality, trend."""
        w, aid = self.world, F.col("ad_id")
        launch = _arrival_day(aid, w.n_ads, w.new_ad_fraction, w.n_days)
        return (
            self.spark.range(1, w.n_ads + 1)
            .select(F.col("id").alias("ad_id"))
            .select(
                "ad_id",
                self._advertiser(aid).alias("advertiser_id"),
                self.category(aid).alias("category"),
                self._ad_format(aid).alias("ad_format"),
                self._objective(aid).alias("objective"),
                self._campaign(aid).alias("campaign_id"),
                F.date_add(F.lit(w.start_date), launch).alias("launch_date"),
                self._quality(aid).alias("true_quality"),
                self._trend(aid).alias("true_trend"),
            )
        )

    def _ad_in_category(self, day: int, category: Column, u: Column) -> Column:
        """A launched ad of `category`: ads of category c are c+1, c+1+C, c+1+2C, ... up to the day's count."""
        w = self.world
        launched = _arrived(w.n_ads, w.new_ad_fraction, w.n_days, day)
        per_category = F.floor((launched - 1 - category) / w.n_categories) + 1
        return (category + 1 + F.floor(u * per_category) * w.n_categories).cast("bigint")

    def _clean_events(self, ds: date) -> DataFrame:
        w, s, day = self.world, self.seed, self._day(ds)
        active = _arrived(w.n_users, w.new_user_fraction, w.n_days, day)
        uid, dl = F.col("user_id"), F.lit(ds.isoformat())
        jitter = 0.5 + uniform(s, "event_count", dl, uid)
        count = F.least(F.floor(self._activity(uid) * jitter), F.lit(w.max_events_per_user_day)).cast("int")
        per_user = (
            self.spark.range(1, active + 1)
            .select(F.col("id").alias("user_id"))
            .select("user_id", F.explode(F.sequence(F.lit(1), F.greatest(count, F.lit(0)))).alias("k"))
            .where(F.col("k") <= count)
        )  # sequence(1, 0) counts down: keep only k in 1..count
        k = F.col("k")
        u_topic = uniform(s, "event_topic", dl, uid, k)
        category = (
            F.when(u_topic < 0.6, self._interest(uid, "primary"))
            .when(u_topic < 0.85, self._interest(uid, "secondary"))
            .otherwise(F.floor(uniform(s, "event_category", dl, uid, k) * w.n_categories).cast("bigint"))
        )
        ts = F.to_timestamp(F.lit(ds.isoformat())) + F.make_interval(
            secs=F.floor(uniform(s, "event_ts", dl, uid, k) * 86400)
        )
        action = pick_weighted(ACTIONS, uniform(s, "event_action", dl, uid, k))
        surface = pick_weighted(surface_share(w, day), uniform(s, "event_surface", dl, uid, k))
        if CART_SURFACE in w.surfaces:
            surface = F.when(action == CART_ACTION, F.lit(CART_SURFACE)).otherwise(surface)
        return per_user.select(
            "user_id",
            self._ad_in_category(day, category, uniform(s, "event_item", dl, uid, k)).alias("item_id"),
            action.alias("action"),
            surface.alias("surface"),
            ts.alias("ts"),
            F.lit(ds).alias("ds"),
            category.alias("category"),
            F.xxhash64(dl, uid, k).alias("_row"),
        )

    def events(self, ds: date) -> DataFrame:
        """bronze.events (raw) for day `ds`: each active user's behaviour events (item, action, surface, ts)."""
        clean = self._clean_events(ds)
        corrupted = self._corrupt(
            clean,
            "events",
            ds,
            {
                "user_id": F.lit(None).cast("bigint"),
                "surface": F.lit("unknown_surface"),
                "ts": F.col("ts") + F.expr("INTERVAL 3 DAYS"),
                "item_id": -F.col("item_id"),
            },
        )
        return corrupted.select("user_id", "item_id", "action", "surface", "ts", "ds")

    def _recent_related(self, ds: date) -> DataFrame:
        """Per user, the (ts, category, action) of their events on ds and the day before: recency of interest."""
        days = [d for d in (ds.fromordinal(ds.toordinal() - 1), ds) if d >= self.world.start_date]
        events = self._clean_events(days[0])
        for d in days[1:]:
            events = events.unionByName(self._clean_events(d))
        return events.groupBy("user_id").agg(F.collect_list(F.struct("ts", "category", "action")).alias("recent"))

    def impressions(self, ds: date) -> DataFrame:
        """bronze.impressions (raw) for day `ds`, with labels drawn from stored true probabilities."""
        w, s, day = self.world, self.seed, self._day(ds)
        row, dl = F.col("row"), F.lit(ds.isoformat())
        active_users = _arrived(w.n_users, w.new_user_fraction, w.n_days, day)
        launched_ads = _arrived(w.n_ads, w.new_ad_fraction, w.n_days, day)
        uid = (F.floor(uniform(s, "imp_user", dl, row) * active_users) + 1).cast("bigint")
        base = (
            self.spark.range(w.impressions_per_day).select(F.col("id").alias("row")).select("row", uid.alias("user_id"))
        )
        u_target = uniform(s, "imp_targeted", dl, row)
        u_ad = uniform(s, "imp_ad", dl, row)
        uid = F.col("user_id")
        ad = (
            F.when(u_target < 0.4, self._ad_in_category(day, self._interest(uid, "primary"), u_ad))
            .when(u_target < 0.6, self._ad_in_category(day, self._interest(uid, "secondary"), u_ad))
            .otherwise(F.floor(u_ad * launched_ads) + 1)
            .cast("bigint")
        )
        ts = F.to_timestamp(F.lit(ds.isoformat())) + F.make_interval(
            secs=F.floor(uniform(s, "imp_ts", dl, row) * 86400)
        )
        placed = base.select(
            "row",
            "user_id",
            ad.alias("ad_id"),
            ts.alias("ts"),
            pick_weighted(surface_share(w, day), uniform(s, "imp_surface", dl, row)).alias("surface"),
            (F.floor(uniform(s, "imp_position", dl, row) * 5) + 1).cast("int").alias("position"),
        ).join(self._recent_related(ds), "user_id", "left")
        aid, category = F.col("ad_id"), self.category(F.col("ad_id"))
        related = F.filter(
            F.coalesce(F.col("recent"), F.array()), lambda e: (e["ts"] < F.col("ts")) & (e["category"] == category)
        )
        carts = F.filter(related, lambda e: e["action"] == CART_ACTION)
        recency = RECENCY_BOOST * decayed(hours_since_last(related, F.col("ts")), RECENCY_HALF_LIFE_H)
        cart = CART_BOOST * decayed(hours_since_last(carts, F.col("ts")), CART_HALF_LIFE_H)
        interaction = INTERACTION_STRENGTH * in_segment(
            self._age_bucket(uid), self._ad_format(aid), F.col("surface"), F.hour("ts")
        )
        click_logit = (
            CLICK_INTERCEPT
            + self.click_affinity(uid, aid)
            + self.click_quality(aid)
            + self.click_context(aid, F.col("surface"), F.col("position"))
            + self.drift(aid, ds)
            + recency
            + interaction
        )
        cvr_logit = (
            -1.2
            + _lookup(OBJECTIVE_CVR_BIAS, self._objective(aid))
            + 0.6 * self.interest_match(uid, aid, "primary")
            + 0.4 * self._quality(aid)
            + cart
        )
        labelled = placed.select(
            "*",
            _sigmoid(click_logit).alias("p_click"),
            _sigmoid(cvr_logit).alias("p_convert_given_click"),
        )
        clicked = uniform(s, "imp_click", dl, row) < F.col("p_click")
        converted = clicked & (uniform(s, "imp_convert", dl, row) < F.col("p_convert_given_click"))
        clean = labelled.select(
            F.concat(F.lit(f"imp-{ds.isoformat()}-"), F.lpad(row.cast("string"), 9, "0")).alias("impression_id"),
            "ts",
            F.lit(ds).alias("ds"),
            "user_id",
            "ad_id",
            "surface",
            "position",
            clicked.alias("clicked"),
            converted.alias("converted"),
            F.col("p_click").cast("double"),
            (F.col("p_click") * F.col("p_convert_given_click")).cast("double").alias("p_convert"),
            row.alias("_row"),
        )
        corrupted = self._corrupt(
            clean,
            "impressions",
            ds,
            {
                "user_id": F.lit(None).cast("bigint"),
                "surface": F.lit("unknown_surface"),
                "ts": F.col("ts") + F.expr("INTERVAL 3 DAYS"),
                "ad_id": -F.col("ad_id"),
                "clicked": F.lit(False),  # with converted forced true below: conversion without click
            },
        )
        return corrupted.drop("_row")

    def _corrupt(self, df: DataFrame, table: str, ds: date, damage: dict[str, Column]) -> DataFrame:
        """Apply one of `damage` (column -> bad value) to a `malformed_rate` share of rows, by hash of `_row`."""
        s, dl = self.seed, F.lit(ds.isoformat())
        bad = uniform(s, f"{table}_bad", dl, F.col("_row")) < self.world.malformed_rate
        kind = F.floor(uniform(s, f"{table}_bad_kind", dl, F.col("_row")) * len(damage)).cast("int")
        cols = {c: F.col(c) for c in df.columns}
        for i, (name, value) in enumerate(damage.items()):
            cols[name] = F.when(bad & (kind == i), value).otherwise(F.col(name))
            if name == "clicked":
                cols["converted"] = F.when(bad & (kind == i), F.lit(True)).otherwise(F.col("converted"))
        return df.select(*[col.alias(name) for name, col in cols.items()])
