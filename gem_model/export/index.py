"""FAISS indexes over exported embeddings, published atomically with a manifest.

An index maps table ids (`ad_id`, `user_id`) to vectors with inner-product scoring, which is
the score the model trains its embeddings for. The index type is a FAISS factory string
(IndexConfig.factory), built as exact `Flat` below `IndexConfig.exact_below` rows. Recall@k is
measured against exact inner-product search over the same vectors. The index is written to
`<dir>.partial` and renamed into place, so a reader sees the previous version or the new one,
never a half-written file.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from gem_model.config import IndexConfig

INDEX_FILE = "index.faiss"


def factory_for(rows: int, cfg: IndexConfig) -> str:
    """The factory string actually built: `cfg.factory`, or exact `Flat` below `cfg.exact_below` rows."""
    return "Flat" if rows < cfg.exact_below else cfg.factory


def build_index(vectors: np.ndarray, ids: np.ndarray, cfg: IndexConfig) -> faiss.Index:
    """vectors [N, R] float32, ids [N] int64 -> a trained, filled inner-product index."""
    if vectors.ndim != 2 or len(vectors) != len(ids):
        raise ValueError(f"vectors {vectors.shape} and ids {ids.shape} must be [N, R] and [N]")
    if len(np.unique(ids)) != len(ids):
        raise ValueError("ids must be unique: each table row is indexed once")
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    index = faiss.index_factory(vectors.shape[1], f"IDMap,{factory_for(len(vectors), cfg)}",
                                faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        index.train(vectors)
    index.add_with_ids(vectors, ids.astype(np.int64))
    _set_search_params(index, cfg)
    return index


def _set_search_params(index: faiss.Index, cfg: IndexConfig) -> None:
    inner = faiss.downcast_index(index.index) if hasattr(index, "index") else index
    if hasattr(inner, "hnsw"):
        inner.hnsw.efSearch = cfg.hnsw_ef_search


def recall_at_k(index: faiss.Index, vectors: np.ndarray, ids: np.ndarray, queries: np.ndarray, k: int) -> float:
    """Mean fraction of the exact top-k (brute-force inner product) that `index` returns.

    Tie-aware: a returned vector counts when its exact score reaches the k-th best score, so among
    equal scores (identical embeddings, e.g. users with the same features) any choice is correct.
    """
    k = min(k, len(ids))
    scores = queries @ vectors.T  # [Q, N]
    kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1]
    _, found = index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
    order = np.argsort(ids)
    rows = order[np.searchsorted(ids, found.clip(min=ids.min()), sorter=order)]  # found id -> vector row
    found_scores = np.take_along_axis(scores, rows, axis=1)
    hits = (found >= 0) & (found_scores >= kth[:, None] - 1e-5)
    return float(hits.sum(axis=1).mean()) / k


def read_index(directory: Path) -> tuple[faiss.Index, dict[str, Any]]:
    manifest_path = directory / "manifest.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(f"no index at {directory} (manifest.json missing); materialise it first")
    manifest = json.loads(manifest_path.read_text())
    index = faiss.read_index(str(directory / INDEX_FILE))
    _set_search_params(index, IndexConfig(hnsw_ef_search=manifest.get("hnsw_ef_search", 64)))
    return index, manifest


def publish_index(vectors: np.ndarray, ids: np.ndarray, queries: np.ndarray, directory: Path,
                  cfg: IndexConfig, model_version: str, ds: date, source_table: str) -> dict[str, Any]:
    """Build, measure and atomically publish an index; returns its manifest."""
    started = time.perf_counter()
    index = build_index(vectors, ids, cfg)
    build_seconds = time.perf_counter() - started
    queries = np.ascontiguousarray(queries[: cfg.recall_queries], dtype=np.float32)
    started = time.perf_counter()
    index.search(queries, cfg.recall_k)
    qps = len(queries) / max(time.perf_counter() - started, 1e-9)
    recall = recall_at_k(index, vectors, ids, queries, cfg.recall_k)
    staging = directory.with_name(directory.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    faiss.write_index(index, str(staging / INDEX_FILE))
    manifest = {
        "name": directory.parent.name,
        "model_version": model_version,
        "ds": ds.isoformat(),
        "source_table": source_table,
        "dimension": int(vectors.shape[1]),
        "metric": "inner_product",
        "factory": factory_for(len(vectors), cfg),
        "configured_factory": cfg.factory,
        "hnsw_ef_search": cfg.hnsw_ef_search,
        "row_count": int(index.ntotal),
        f"recall_at_{cfg.recall_k}": recall,
        "recall_queries": len(queries),
        "queries_per_second": qps,
        "build_seconds": build_seconds,
        "sha256": hashlib.sha256((staging / INDEX_FILE).read_bytes()).hexdigest(),
        "created_at": datetime.now(UTC).isoformat(),
    }
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    if directory.exists():
        retired = directory.with_name(directory.name + ".old")
        shutil.rmtree(retired, ignore_errors=True)
        directory.rename(retired)
        staging.rename(directory)
        shutil.rmtree(retired)
    else:
        staging.rename(directory)
    return manifest
