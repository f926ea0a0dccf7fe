"""Batch scoring with a loaded teacher: user and ad embeddings, and per-task teacher logits.

Each function scores one chunk (an Arrow table; `jobs/score.py` streams the chunks) into an
Arrow table in the `gold.*` contract of docs/tables.md, stamped with the model version and the
scoring day. `read_embeddings` reads one (model version, day) of an exported embedding table back.
"""

from __future__ import annotations

from datetime import date

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from gem_model.config import TASKS
from gem_model.data.loader import features_to_kjt, impression_rows, open_delta, timelines_to_kjt
from gem_model.export.checkpoint import LoadedModel
from gem_model.paths import GemPaths


def _embedding_array(vectors: np.ndarray) -> pa.Array:
    flat = pa.array(vectors.astype(np.float32).ravel(), pa.float32())
    return pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1]).cast(pa.list_(pa.float32()))


def _stamp(columns: dict[str, pa.Array], n: int, loaded: LoadedModel, ds: date) -> pa.Table:
    columns["model_version"] = pa.repeat(pa.scalar(loaded.version, pa.string()), n)
    columns["ds"] = pa.repeat(pa.scalar(ds, pa.date32()), n)
    return pa.table(columns)


def _features(loaded: LoadedModel, rows: pa.Table) -> KeyedJaggedTensor:
    return features_to_kjt(rows, loaded.config.features).to(loaded.device)


@torch.inference_mode()
def score_embeddings(loaded: LoadedModel, rows: pa.Table, id_column: str, ds: date) -> pa.Table:
    """One embedding per row of `rows` (users: their features and sequence as of `ds`; ads: silver.ad_features)."""
    embed = loaded.model.user_embedding if id_column == "user_id" else loaded.model.ad_embedding
    with loaded.autocast():
        vectors = embed(_features(loaded, rows)).float().cpu().numpy()
    if not np.isfinite(vectors).all():
        raise FloatingPointError(f"model {loaded.version} produced non-finite {id_column} embeddings")
    columns = {id_column: rows.column(id_column).cast(pa.int64()), "embedding": _embedding_array(vectors)}
    return _stamp(columns, rows.num_rows, loaded, ds)


def read_embeddings(
    paths: GemPaths, table: str, id_column: str, model_version: str, ds: date, dimension: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(ids [N], vectors [N, R]) of one model version and day of an exported embedding table.

    With `dimension`, vectors of another length (a table written by another model) are an error.
    """
    rows = open_delta(paths.table(table)).to_table(
        columns=[id_column, "embedding"],
        filter=(pc.field("model_version") == model_version) & (pc.field("ds") == pa.scalar(ds, pa.date32())),
    )
    if rows.num_rows == 0:
        raise ValueError(
            f"{table} has no rows for model_version={model_version!r}, ds={ds}; "
            "materialise the scored tables for that partition first"
        )
    lengths = set(pc.list_value_length(rows.column("embedding")).to_pylist())
    expected = {dimension} if dimension is not None else lengths
    if len(lengths) != 1 or lengths != expected:
        raise ValueError(
            f"{table} embeddings of model_version={model_version!r}, ds={ds} have lengths "
            f"{sorted(lengths)}, expected {sorted(expected)} (model.repr_dim of the model's "
            "manifest); re-score the partition with that model"
        )
    vectors = np.stack(rows.column("embedding").to_numpy(zero_copy_only=False)).astype(np.float32)
    return rows.column(id_column).to_numpy(), vectors


@torch.inference_mode()
def score_timelines(loaded: LoadedModel, timelines: pa.Table, ds: date) -> pa.Table:
    """gold.teacher_logits rows: one `<task>_logit` column per task for each impression of `timelines` (rows of
    gold.user_timelines), each user's events encoded once for all of the user's impressions."""
    with loaded.autocast():
        logits = loaded.model.logits(timelines_to_kjt(timelines, loaded.config.features).to(loaded.device))
    logits = logits.float().cpu().numpy()
    rows = impression_rows(timelines, ["user_id"], ["impression_id", "ad_id", "surface"])
    columns = {c: rows.column(c) for c in ("impression_id", "user_id", "ad_id", "surface")}
    for i, task in enumerate(TASKS):
        columns[f"{task}_logit"] = pa.array(logits[:, i].astype(np.float32))
    return _stamp(columns, rows.num_rows, loaded, ds)
