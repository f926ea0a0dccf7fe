"""Batch-score one day with one model version into staged Parquet files.

    python jobs/score.py --model-version V --ds 2026-11-06 --out $GEM_HOME/staging/score/V/2026-11-06

Writes `<out>/{user_embeddings,ad_embeddings,teacher_logits}.parquet` from `silver.users` with
`gold.user_sequences` as of `ds`, `silver.ads`, and `gold.training_examples` of `ds`. The
Dagster export assets then commit each file to its Delta table atomically, replacing exactly
the (model_version, ds) partition, so re-runs never duplicate rows.
"""

from __future__ import annotations

import argparse
import os
from contextlib import nullcontext
from datetime import date
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from dagster_pipes import DAGSTER_PIPES_CONTEXT_ENV_VAR, open_dagster_pipes

from gem_model.data.loader import ds_filter, open_delta
from gem_model.export.checkpoint import LoadedModel, load_model
from gem_model.export.scoring import score_embeddings, score_impressions
from gem_model.paths import GemPaths

SCORED_TABLES = ("user_embeddings", "ad_embeddings", "teacher_logits")


def with_sequences(users: pa.Table, sequences: pa.Table, loaded: LoadedModel) -> pa.Table:
    """Attach each user's sequence as of the day (null, i.e. empty, for users with no history)."""
    column = loaded.config.features.sequence_idx_column
    rows = pc.index_in(users.column("user_id"), value_set=sequences.column("user_id"))
    return users.append_column(column, sequences.column(column).take(rows))


def score_day(paths: GemPaths, model_version: str, ds: date, out: Path) -> dict[str, int]:
    loaded = load_model(paths.model_dir(model_version))
    day = ds_filter(ds, date.fromordinal(ds.toordinal() + 1))
    users = with_sequences(open_delta(paths.table("silver.users")).to_table(),
                           open_delta(paths.table("gold.user_sequences")).to_table(filter=day), loaded)
    ads = open_delta(paths.table("silver.ads")).to_table()
    examples = open_delta(paths.table("gold.training_examples")).to_table(filter=day)
    if examples.num_rows == 0:
        raise ValueError(f"gold.training_examples has no rows for ds={ds}; materialise that partition first")
    outputs = {
        "user_embeddings": score_embeddings(loaded, users.sort_by("user_id"), "user_id", ds),
        "ad_embeddings": score_embeddings(loaded, ads.sort_by("ad_id"), "ad_id", ds),
        "teacher_logits": score_impressions(loaded, examples.sort_by("impression_id"), ds),
    }
    out.mkdir(parents=True, exist_ok=True)
    for name, table in outputs.items():
        pq.write_table(table, out / f"{name}.parquet")
    return {name: table.num_rows for name, table in outputs.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-version", required=True)
    parser.add_argument("--ds", type=date.fromisoformat, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    pipes_cm = open_dagster_pipes() if DAGSTER_PIPES_CONTEXT_ENV_VAR in os.environ else nullcontext(None)
    with pipes_cm as pipes:
        counts = score_day(GemPaths.from_env(), args.model_version, args.ds, args.out)
        message = f"scored ds={args.ds} with {args.model_version}: {counts}"
        print(message, flush=True)
        if pipes is not None:
            pipes.log.info(message)


if __name__ == "__main__":
    main()
