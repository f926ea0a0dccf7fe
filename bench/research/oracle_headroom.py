"""How much of the oracle's holdout AUC a model could reach from the features it is given.

    GEM_HOME=lakehouse-small python -m bench.research.oracle_headroom --preset small

The synthetic world's true click logit has one term no feature of the FeatureSpec reveals: the
ad's trend drift on the day (a static model, trained on earlier days, has no clock: the best it
can learn is the ad's mean drift over the training days). Replacing it in the true logit by what a
perfect static model could know gives the oracle restricted to the features. The rows without the
position term show what the logged slot (one of the context features) is worth to the oracle.
"""

from __future__ import annotations

import argparse

import numpy as np
from pyspark.sql import functions as F

from gem_lake.delta import read_table
from gem_lake.sources.world import POSITION_PENALTY, Source
from gem_lake.spark.session import build_spark_session
from gem_model.config import GemConfig
from gem_model.paths import GemPaths
from gem_model.train.metrics import auc


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    args = parser.parse_args(argv)
    cfg = GemConfig.load(args.preset)
    spark = build_spark_session()
    world = Source(spark, cfg)
    rows = read_table(spark, GemPaths.from_env().table("gold.training_examples"))
    print("| oracle | ctr AUC on the holdout |\n|---|---|")
    train_days = [d for d in cfg.world.days if d < cfg.world.holdout_start]
    for ds in (d for d in cfg.world.days if d >= cfg.world.holdout_start):
        day = (
            rows.where(F.col("ds") == F.lit(ds))
            .select(
                "clicked",
                F.log(F.col("p_click") / (1 - F.col("p_click"))).alias("logit"),
                (
                    world.drift(F.col("ad_id"), ds)
                    - sum(world.drift(F.col("ad_id"), d) for d in train_days) / len(train_days)
                ).alias("drift"),
                (-POSITION_PENALTY * (F.col("position") - 1)).alias("position_term"),
            )
            .toPandas()
        )
        clicked = day["clicked"].to_numpy(bool)
        variants = {
            "true p_click": day["logit"],
            "without the unseen drift": day["logit"] - day["drift"],
            "without position": day["logit"] - day["position_term"],
            "without the unseen drift and position": day["logit"] - day["drift"] - day["position_term"],
        }
        for name, score in variants.items():
            print(f"| {name} ({ds}) | {auc(clicked, np.asarray(score)):.4f} |")
    spark.stop()


if __name__ == "__main__":
    main()
