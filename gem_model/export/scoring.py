"""Batch scoring with a loaded teacher: user and ad embeddings, and per-task teacher logits.

Inputs are Arrow tables (streamed in chunks of `chunk_rows`); outputs are Arrow tables in the
`gold.*` contract of docs/tables.md, stamped with the model version and the scoring day.
`read_embeddings` reads one (model version, day) of an exported embedding table back.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gem_model.data.loader import features_to_kjt, open_delta
from gem_model.export.checkpoint import LoadedModel
from gem_model.paths import GemPaths


def _chunks(table: pa.Table, chunk_rows: int) -> Iterator[pa.Table]:
    for start in range(0, table.num_rows, chunk_rows):
        yield table.slice(start, chunk_rows)


def _embedding_array(vectors: np.ndarray) -> pa.Array:
    flat = pa.array(vectors.astype(np.float32).ravel(), pa.float32())
    return pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1]).cast(pa.list_(pa.float32()))


def _stamp(columns: dict[str, pa.Array], n: int, loaded: LoadedModel, ds: date) -> pa.Table:
    columns["model_version"] = pa.array([loaded.version] * n, pa.string())
    columns["ds"] = pa.array([ds] * n, pa.date32())
    return pa.table(columns)


def score_embeddings(loaded: LoadedModel, rows: pa.Table, id_column: str, ds: date,
                     chunk_rows: int = 4096) -> pa.Table:
    """One embedding per row of `rows` (users: silver.users + sequences; ads: silver.ads)."""
    embed = loaded.model.user_embedding if id_column == "user_id" else loaded.model.ad_embedding
    parts = [embed(features_to_kjt(chunk, loaded.config.features)).numpy() for chunk in _chunks(rows, chunk_rows)]
    vectors = np.concatenate(parts) if parts else np.zeros((0, loaded.config.model.repr_dim), np.float32)
    if not np.isfinite(vectors).all():
        raise FloatingPointError(f"model {loaded.version} produced non-finite {id_column} embeddings")
    columns = {id_column: rows.column(id_column).cast(pa.int64()), "embedding": _embedding_array(vectors)}
    return _stamp(columns, rows.num_rows, loaded, ds)


def read_embeddings(paths: GemPaths, table: str, id_column: str, model_version: str,
                    ds: date) -> tuple[np.ndarray, np.ndarray]:
    """(ids [N], vectors [N, R]) of one model version and day of an exported embedding table."""
    rows = open_delta(paths.table(table)).to_table(
        columns=[id_column, "embedding"],
        filter=(pc.field("model_version") == model_version) & (pc.field("ds") == pa.scalar(ds, pa.date32())),
    )
    if rows.num_rows == 0:
        raise ValueError(f"{table} has no rows for model_version={model_version!r}, ds={ds}; "
                         "materialise the scored tables for that partition first")
    vectors = np.stack(rows.column("embedding").to_numpy(zero_copy_only=False)).astype(np.float32)
    return rows.column(id_column).to_numpy(), vectors


def score_impressions(loaded: LoadedModel, examples: pa.Table, ds: date, chunk_rows: int = 4096) -> pa.Table:
    """gold.teacher_logits rows: one `<task>_logit` column per task for each impression."""
    parts = [loaded.model(features_to_kjt(chunk, loaded.config.features)).logits.numpy()
             for chunk in _chunks(examples, chunk_rows)]
    tasks = loaded.config.model.tasks
    logits = np.concatenate(parts) if parts else np.zeros((0, len(tasks)), np.float32)
    columns = {c: examples.column(c) for c in ("impression_id", "user_id", "ad_id", "surface")}
    for i, task in enumerate(tasks):
        columns[f"{task}_logit"] = pa.array(logits[:, i].astype(np.float32))
    return _stamp(columns, examples.num_rows, loaded, ds)
