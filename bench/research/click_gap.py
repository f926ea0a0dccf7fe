"""Which part of the world's click logit a trained model misses, against the well-specified learner.

    GEM_HOME=lakehouse-small python -m bench.research.click_gap --preset small --model-dir $GEM_HOME/models/V [...]

The synthetic world's true click logit is a sum of known terms (`gem_lake.sources.world`): the user's
affinity to the ad's category, the ad (quality and its mean drift over the training days, what a model
without a clock can know of it), the context (surface, objective, position), the recency of an event in
the category, the fourth-order segment, and the drift of the holdout day that no training row shows.
The bench recomputes each term for every holdout impression (their sum must be the stored p_click's
logit) and asks, for each model's holdout click logit s: how much does adding the true term t to s
help? It fits P(click) = sigmoid(a + b s + c t) on one half of the holdout's users and scores the
other half, both ways (so the three weights never see the rows they score), and reports the AUC
gained over the same fit without t. A term that adds as much to the model as to the well-specified
learner (refit here as in `bench/research/learnable_ceiling.py`) is not where the model falls short; a term
that adds more to the model is structure the learner recovered from the same rows and the model did not.

Each model's logits come from its checkpoint through the export's scoring path
(`gem_model.export.scoring.score_timelines`); their AUC is checked against the manifest's.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import torch
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from bench.research.learnable_ceiling import (
    CLICK_REFERENCE,
    CLICK_TERMS,
    Task,
    best_fit,
    examples_with_sequences,
    learner_rows,
)
from gem_lake.sources.world import CLICK_INTERCEPT, INTERACTION_STRENGTH, RECENCY_BOOST, Source
from gem_lake.spark.session import build_spark_session
from gem_model.config import GemConfig
from gem_model.data.loader import (
    ds_filter,
    impressions_in,
    open_delta,
    rank_fragments,
    scan_timelines,
    timeline_columns,
)
from gem_model.export.checkpoint import load_model
from gem_model.export.scoring import score_timelines
from gem_model.train.metrics import auc, normalized_entropy

TERMS = ("affinity", "ad", "context", "recency", "segment", "unseen_drift")
CHUNK_ROWS = 8192


def true_terms(examples: DataFrame, world: Source, cfg: GemConfig, rows: pd.DataFrame) -> pd.DataFrame:
    """The holdout's impressions with each term of the world's click logit and that logit itself; the recency and
    the segment are the learner's own columns of `rows` (`learner_rows`), scaled by the world's strengths."""
    w = cfg.world
    holdout = [d for d in w.days if d >= w.holdout_start]
    train = [d for d in w.days if d < w.holdout_start]
    aid, uid = F.col("ad_id"), F.col("user_id")
    mean_drift = sum(world.drift(aid, d) for d in train) / len(train)
    day_drift = F.lit(None).cast("double")
    for d in holdout:
        day_drift = F.when(F.col("ds") == F.lit(d), world.drift(aid, d)).otherwise(day_drift)
    truth = (
        examples.where(F.col("ds") >= F.lit(w.holdout_start))
        .select(
            "impression_id",
            "user_id",
            F.col("clicked").cast("int").alias("clicked"),
            F.log(F.col("p_click") / (1 - F.col("p_click"))).alias("true_logit"),
            world.click_affinity(uid, aid).alias("affinity"),
            (world.click_quality(aid) + mean_drift).alias("ad"),
            world.click_context(aid, F.col("surface"), F.col("position")).alias("context"),
            (day_drift - mean_drift).alias("unseen_drift"),
        )
        .toPandas()
    )
    sequence = rows[["impression_id", "recency", "interaction"]]
    truth = truth.merge(sequence, on="impression_id", how="left", validate="one_to_one")
    truth["recency"] *= RECENCY_BOOST
    truth["segment"] = INTERACTION_STRENGTH * truth.pop("interaction")
    return truth


def model_logits(model_dir: Path, cfg: GemConfig) -> tuple[pd.DataFrame, float]:
    """(impression_id, click logit) of the holdout scored with the model at `model_dir`, and its manifest's AUC."""
    loaded = load_model(model_dir)
    data = loaded.manifest["training_data"]
    dataset = open_delta(Path(data["path"]), data["delta_version"], loaded.config.features)
    parts = []
    columns = [c for part in timeline_columns(loaded.config.features, labels=False) for c in part]
    holdout = ds_filter(cfg.world.holdout_start, None)
    shard = rank_fragments(dataset, holdout, 0, 1, impressions_in)
    for chunk in scan_timelines(dataset, shard, holdout, columns, CHUNK_ROWS):
        scored = score_timelines(loaded, chunk, cfg.world.holdout_start)
        parts.append(
            pd.DataFrame(
                {
                    "impression_id": scored["impression_id"].to_numpy(zero_copy_only=False),
                    "logit": pc.cast(scored["ctr_logit"], "float64").to_numpy(),
                }
            )
        )
    return pd.concat(parts, ignore_index=True), float(loaded.manifest["metrics"]["ctr/auc"])


def logistic(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The weights of a logistic regression of `y` on the columns of `x` (no penalty: a handful of weights)."""
    xs, ys = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    weights = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([weights], max_iter=200, line_search_fn="strong_wolfe")

    def loss() -> torch.Tensor:
        optimizer.zero_grad()
        value = torch.nn.functional.binary_cross_entropy_with_logits(xs @ weights, ys)
        value.backward()
        return value

    optimizer.step(loss)
    return weights.detach().numpy()


def cross_fit(y: np.ndarray, x: np.ndarray, fold: np.ndarray) -> np.ndarray:
    """Logits of a logistic regression on columns `x`, fitted on one fold and applied to the other, both ways."""
    design = np.column_stack([np.ones(len(y)), x])
    out = np.empty(len(y))
    for k in (0, 1):
        out[fold == k] = design[fold == k] @ logistic(design[fold != k], y[fold != k])
    return out


def gains(y: np.ndarray, score: np.ndarray, terms: pd.DataFrame, fold: np.ndarray) -> dict[str, float]:
    """AUC of the score recalibrated, and what each term and all of them add to it (cross-fitted)."""
    alone = cross_fit(y, score[:, None], fold)
    result = {"auc": auc(y, alone), "ne": normalized_entropy(y, 1 / (1 + np.exp(-alone)))}
    for term in (*TERMS, "all"):
        columns = list(TERMS) if term == "all" else [term]
        result[term] = auc(y, cross_fit(y, np.column_stack([score, terms[columns].to_numpy()]), fold)) - result["auc"]
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--model-dir", type=Path, action="append", default=[], help="a trained model (repeatable)")
    args = parser.parse_args(argv)
    cfg = GemConfig.load(args.preset)
    spark = build_spark_session()
    world = Source(spark, cfg)
    examples = examples_with_sequences(spark, cfg.features)
    rows = learner_rows(examples, world)
    truth = true_terms(examples, world, cfg, rows)
    spark.stop()

    if truth[list(TERMS)].isna().any().any():
        raise SystemExit(f"a true term is null on some holdout rows: {truth[list(TERMS)].isna().sum().to_dict()}")
    mismatch = np.abs(truth[list(TERMS)].sum(axis=1) + CLICK_INTERCEPT - truth["true_logit"])
    print(
        f"holdout: {len(truth):,} impressions; the terms sum to the true click logit within 1e-4 on "
        f"{float(np.mean(mismatch < 1e-4)):.4%} of them (largest difference {mismatch.max():.2e})"
    )

    w = cfg.world
    clicks = Task.of(rows, "clicked", w.days, w.holdout_start)
    learner, penalty = best_fit(clicks, ("surface", "objective", "position"), CLICK_TERMS[CLICK_REFERENCE])
    with torch.no_grad():
        learned = learner(clicks.design, clicks.index["holdout"])[0].numpy()
    holdout_ids = rows["impression_id"].to_numpy()[clicks.index["holdout"].numpy()]
    scores = {f"well-specified learner (L2 {penalty})": pd.DataFrame({"impression_id": holdout_ids, "logit": learned})}
    for model_dir in args.model_dir:
        logits, manifest_auc = model_logits(model_dir, cfg)
        name = model_dir.name
        scores[name] = logits
        merged = truth.merge(logits, on="impression_id", validate="one_to_one")
        print(
            f"{name}: {len(merged):,} holdout rows scored, AUC {auc(merged['clicked'], merged['logit']):.4f} "
            f"(manifest: {manifest_auc:.4f})"
        )

    fold = (truth["user_id"].to_numpy() % 2).astype(int)
    y = truth["clicked"].to_numpy().astype(float)
    header = " | ".join(f"+ {t}" for t in (*TERMS, "all"))
    print(f"\n| model | ctr AUC | ctr NE | {header} |\n|---|---|---|{'---|' * (len(TERMS) + 1)}")
    oracle = truth["true_logit"].to_numpy()
    print(
        f"| true logit | {auc(y, oracle):.4f} | {normalized_entropy(y, 1 / (1 + np.exp(-oracle))):.4f} |"
        + " |" * (len(TERMS) + 1)
    )
    for name, logits in scores.items():
        score = truth[["impression_id"]].merge(logits, on="impression_id", how="left", validate="one_to_one")["logit"]
        if score.isna().any():
            raise SystemExit(f"{name}: {int(score.isna().sum())} holdout impressions have no score")
        g = gains(y, score.to_numpy(), truth, fold)
        cells = " | ".join(f"{g[t]:+.4f}" for t in (*TERMS, "all"))
        print(f"| {name} | {g['auc']:.4f} | {g['ne']:.4f} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
