"""How much of the synthetic world a learner can recover from the training days' rows.

    GEM_HOME=lakehouse-small python -m bench.research.learnable_ceiling --preset small
    GEM_HOME=lakehouse-medium python -m bench.research.learnable_ceiling --preset medium --config med4.json \\
        --reference-only

(the second: a lake built with the overrides of `med4.json`, e.g. `{"world": {"n_days": 4, "holdout_days": 1}}`,
and only each task's full learner, the reference of the acceptance criteria)

The oracle (true p) knows every user's interests and every ad's quality and drift. A model has
to estimate them from a finite number of rows: at `small`, about 150 impressions and 20 clicks
per user. This bench fits a well-specified learner. It is handed the exact form of the world's
logits (`gem_lake.sources.world`) and learns every parameter from the training days by logistic
regression with an L2 penalty:

- click: biases per surface, objective and position; a quality per ad; an affinity per
  (user, category); the fourth-order term's segment (age x format x surface x hour of day); and,
  from the point-in-time sequence, the recency term 0.5^(hours/6) of the last event in the
  target's category and the share of the history in that category; and once more with the
  recency term replaced by a learned step function of that event's age bucket, the clock the
  model's tokens carry (floor(log2(1 + minutes))): what the coarser clock costs;
- conversion (on clicked rows): a bias per objective, a quality per ad, an affinity per
  (user, category), the recency term 0.5^(hours/24) of the last add-to-cart in the target's
  category and the same share.

Like the world, the recency terms look at the events since the start of the day before the
impression.

The penalty is chosen on the last training day with the earlier days as training data, then
the learner is refit on all training days and scored on the holdout. Its AUC is what the
features and the row count allow a model that knows the structure; a neural model has to find
the structure too, so this is a ceiling for it, though not a strict bound.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F_nn
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gem_lake.delta import read_table
from gem_lake.features.tables import age_bucket, impression_sequences
from gem_lake.sources.world import (
    CART_ACTION,
    CART_HALF_LIFE_H,
    RECENCY_HALF_LIFE_H,
    Source,
    decayed,
    hours_since_last,
    in_segment,
)
from gem_lake.spark.session import build_spark_session
from gem_model.config import FeatureSpec, GemConfig
from gem_model.paths import GemPaths
from gem_model.train.metrics import auc, normalized_entropy

PENALTIES = (0.003, 0.01, 0.03, 0.1, 0.3)
# The model's clock: one indicator per age bucket (floor(log2(1 + minutes)), gem_lake.features.tables.age_bucket) of
# the newest same-category event, a step function in place of the exact 0.5^(hours/6).
CLOCK = tuple(f"clock_{k}" for k in range(16))
CLICK_TERMS = {
    "static, without the fourth-order term": (),
    "static": ("interaction",),
    "+ recency": ("interaction", "recency"),
    "+ recency + sequence share": ("interaction", "recency", "share"),
    "+ recency by the model's age bucket": ("interaction", *CLOCK),
    "+ recency by the model's age bucket + sequence share": ("interaction", *CLOCK, "share"),
}
CVR_TERMS = {"static": (), "+ cart recency": ("cart",), "+ cart recency + sequence share": ("cart", "share")}
TERMS = ("interaction", "recency", "cart", "share", *CLOCK)
# Each task's full learner with the world's exact clock: the reference of the acceptance criteria (docs/MODEL.md).
CLICK_REFERENCE, CVR_REFERENCE = "+ recency + sequence share", "+ cart recency + sequence share"


def examples_with_sequences(spark: SparkSession, spec: FeatureSpec) -> DataFrame:
    """gold.training_examples, each impression with its own sequence from gold.user_timelines."""
    paths = GemPaths.from_env()
    sequences = impression_sequences(read_table(spark, paths.table("gold.user_timelines")), spec)
    own = sequences.select("impression_id", "ds", "seq_item_ids", "seq_ts", "seq_actions")
    return read_table(spark, paths.table("gold.training_examples")).join(own, ["impression_id", "ds"])


def learner_rows(examples: DataFrame, world: Source) -> pd.DataFrame:
    """One row per impression of `examples_with_sequences`: the ids the learner embeds and its real-valued
    terms."""
    events = F.arrays_zip(
        F.col("seq_item_ids").alias("item"), F.col("seq_ts").alias("ts"), F.col("seq_actions").alias("action")
    )
    same = F.filter(events, lambda e: world.category(e["item"]) == F.col("category"))
    recent = F.filter(same, lambda e: e["ts"] >= F.to_timestamp(F.date_sub("ds", 1)))
    carts = F.filter(recent, lambda e: e["action"] == CART_ACTION)
    newest = F.array_max(F.transform(recent, lambda e: e["ts"]))
    clock = age_bucket(newest, F.col("ts"), len(CLOCK))  # null without such an event: every indicator 0
    return examples.select(
        "impression_id",
        "ds",
        "user_id",
        "ad_id",
        "category",
        "surface",
        "objective",
        "position",
        F.col("clicked").cast("int").alias("clicked"),
        F.col("converted").cast("int").alias("converted"),
        in_segment(F.col("age_bucket"), F.col("ad_format"), F.col("surface"), F.col("hour_of_day")).alias(
            "interaction"
        ),
        decayed(hours_since_last(recent, F.col("ts")), RECENCY_HALF_LIFE_H).alias("recency"),
        decayed(hours_since_last(carts, F.col("ts")), CART_HALF_LIFE_H).alias("cart"),
        (F.size(same) / F.greatest(F.size("seq_item_ids"), F.lit(1))).alias("share"),
        *[F.coalesce((clock == k).cast("double"), F.lit(0.0)).alias(name) for k, name in enumerate(CLOCK)],
    ).toPandas()


@dataclass
class Design:
    """Integer codes and real-valued terms of the rows, as tensors."""

    codes: dict[str, torch.Tensor]
    terms: dict[str, torch.Tensor]
    sizes: dict[str, int]

    @staticmethod
    def of(rows: pd.DataFrame) -> Design:
        codes = {
            c: torch.tensor(pd.factorize(rows[c])[0])
            for c in ("surface", "objective", "position", "user_id", "ad_id", "category")
        }
        terms = {c: torch.tensor(rows[c].to_numpy(), dtype=torch.float32) for c in TERMS}
        return Design(codes, terms, {c: int(v.max()) + 1 for c, v in codes.items()})


class WellSpecified(torch.nn.Module):
    """logit = b + sum of per-id biases + quality[ad] + affinity[user, category] + sum of w_t * term_t."""

    def __init__(self, design: Design, biases: tuple[str, ...], terms: tuple[str, ...]) -> None:
        super().__init__()
        self.biases, self.terms = biases, terms
        self.b = torch.nn.Parameter(torch.zeros(1))
        self.bias = torch.nn.ParameterDict({c: torch.zeros(design.sizes[c]) for c in biases})
        self.quality = torch.nn.Parameter(torch.zeros(design.sizes["ad_id"]))
        self.affinity = torch.nn.Parameter(torch.zeros(design.sizes["user_id"], design.sizes["category"]))
        self.weight = torch.nn.ParameterDict({t: torch.zeros(1) for t in terms})

    def forward(self, d: Design, i: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits, the L2 penalty's per-row mean) for rows `i`."""
        z = self.b + self.quality[d.codes["ad_id"][i]] + self.affinity[d.codes["user_id"][i], d.codes["category"][i]]
        for c in self.biases:
            z = z + self.bias[c][d.codes[c][i]]
        for t in self.terms:
            z = z + self.weight[t] * d.terms[t][i]
        users, ads = d.codes["user_id"][i], d.codes["ad_id"][i]
        penalty = self.affinity[users].pow(2).sum(1).mean() + self.quality[ads].pow(2).mean()
        return z, penalty


def fit(
    d: Design,
    labels: torch.Tensor,
    train: torch.Tensor,
    biases: tuple[str, ...],
    terms: tuple[str, ...],
    penalty: float,
    epochs: int = 6,
    batch: int = 4096,
) -> WellSpecified:
    torch.manual_seed(0)
    model = WellSpecified(d, biases, terms)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(epochs):
        for rows in train[torch.randperm(len(train))].split(batch):
            z, l2 = model(d, rows)
            loss = F_nn.binary_cross_entropy_with_logits(z, labels[rows]) + penalty * l2
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model


def evaluate(model: WellSpecified, d: Design, labels: torch.Tensor, rows: torch.Tensor) -> tuple[float, float]:
    with torch.no_grad():
        z = model(d, rows)[0].numpy()
    y = labels[rows].numpy().astype(bool)
    return auc(y, z), normalized_entropy(y, 1.0 / (1.0 + np.exp(-z)))


@dataclass
class Task:
    """One task's design, labels and row split, built once for every learner fit on it."""

    design: Design
    labels: torch.Tensor
    index: dict[str, torch.Tensor]

    @staticmethod
    def of(rows: pd.DataFrame, label: str, days: list, holdout_start) -> Task:
        ds = rows["ds"].to_numpy()
        last_train = max(x for x in days if x < holdout_start)
        masks = {
            "fit": ds < last_train,
            "validation": ds == last_train,
            "train": ds < holdout_start,
            "holdout": ds >= holdout_start,
        }
        return Task(
            Design.of(rows),
            torch.tensor(rows[label].to_numpy(), dtype=torch.float32),
            {name: torch.tensor(np.flatnonzero(mask)) for name, mask in masks.items()},
        )


def best_fit(
    task: Task, biases: tuple[str, ...], terms: tuple[str, ...], penalties: tuple[float, ...] = PENALTIES
) -> tuple[WellSpecified, float]:
    """The learner refit on every training day with the penalty that scored best on the last one, and that penalty."""
    d, labels, index = task.design, task.labels, task.index
    scores = {
        p: evaluate(fit(d, labels, index["fit"], biases, terms, p), d, labels, index["validation"])[1]
        for p in penalties
    }
    best = min(scores, key=scores.get)
    return fit(d, labels, index["train"], biases, terms, best), best


def ceiling(
    task: Task, biases: tuple[str, ...], terms: tuple[str, ...], penalties: tuple[float, ...] = PENALTIES
) -> tuple[float, float, float]:
    """(holdout AUC, holdout NE, chosen penalty) of the learner refit on every training day."""
    model, best = best_fit(task, biases, terms, penalties)
    return *evaluate(model, task.design, task.labels, task.index["holdout"]), best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--config", help="JSON file of overrides (the world the lake was built with)")
    parser.add_argument(
        "--reference-only",
        action="store_true",
        help="fit only each task's full learner (the reference of the acceptance), not every row",
    )
    parser.add_argument(
        "--penalties",
        default=",".join(map(str, PENALTIES)),
        help="the L2 penalties to choose from on the last training day",
    )
    args = parser.parse_args(argv)
    cfg = GemConfig.load(args.preset, args.config)
    penalties = tuple(float(p) for p in args.penalties.split(","))
    if cfg.features.age_buckets != len(CLOCK):
        raise SystemExit(
            f"features.age_buckets is {cfg.features.age_buckets}; the learner's clock has {len(CLOCK)} "
            "buckets: set CLOCK in bench/research/learnable_ceiling.py to the preset's age_buckets"
        )
    spark = build_spark_session()
    rows = learner_rows(examples_with_sequences(spark, cfg.features), Source(spark, cfg))
    spark.stop()
    w = cfg.world
    print("| learner | task | holdout AUC | holdout NE | L2 (chosen on the last training day) |\n|---|---|---|---|---|")
    click_terms, cvr_terms = CLICK_TERMS, CVR_TERMS
    if args.reference_only:
        click_terms = {CLICK_REFERENCE: CLICK_TERMS[CLICK_REFERENCE]}
        cvr_terms = {CVR_REFERENCE: CVR_TERMS[CVR_REFERENCE]}
    clicks = Task.of(rows, "clicked", w.days, w.holdout_start)
    for name, terms in click_terms.items():
        a, ne, p = ceiling(clicks, ("surface", "objective", "position"), terms, penalties)
        print(f"| well-specified, {name} | ctr | {a:.4f} | {ne:.4f} | {p} |", flush=True)
    conversions = Task.of(rows[rows["clicked"] == 1].reset_index(drop=True), "converted", w.days, w.holdout_start)
    for name, terms in cvr_terms.items():
        a, ne, p = ceiling(conversions, ("objective",), terms, penalties)
        print(f"| well-specified, {name} | cvr | {a:.4f} | {ne:.4f} | {p} |", flush=True)


if __name__ == "__main__":
    main()
