"""FAISS indexes over exported embeddings, published atomically with a manifest.

An index maps table ids (`ad_id`, `user_id`) to vectors with inner-product scoring, which is
the score the model trains its embeddings for. The index type is a FAISS factory string
(IndexConfig.factory: Flat, IVF-Flat, IVF-PQ or HNSW), built as exact `Flat` below
`IndexConfig.exact_below` rows. With faiss-gpu and a CUDA device, Flat and IVF indexes are trained,
filled and measured on the first GPU and copied back to the CPU for writing; HNSW has no FAISS GPU
version and stays on the CPU. Recall@k is measured against exact inner-product search over the
same vectors. Search parameters (`nprobe`, `hnsw_ef_search`) are stored in the manifest and
re-applied by `read_index`.

Each (index, model version, day) has its own directory (`GemPaths.index_dir`). A build is written
to a fresh `build-*` directory inside it and published by atomically replacing the `CURRENT`
pointer, so a reader sees the previous build or the new one, never a half-written file, and two
days or two versions never share files. `read_index` verifies the index file's size and sha256
against the manifest before returning it: a truncated or overwritten file is an error naming it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import time
import uuid
import warnings
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from gem_model.config import IndexConfig
from gem_model.integrity import file_sha256, read_manifest_file, verify_files

INDEX_FILE = "index.faiss"
CURRENT = "CURRENT"  # names the published build directory
KEEP_BUILDS = 2  # the current build and the one before it (a reader may still be opening it)
TRAIN_SEED = 0  # fixed, so rebuilding from the same table trains the same lists
# index_cpu_to_gpu raises for HNSW: FAISS only has GPU versions of these families.
GPU_FAMILIES = frozenset({"flat", "ivf_flat", "ivf_pq"})


def factory_for(rows: int, cfg: IndexConfig) -> str:
    """The factory string actually built: `cfg.factory`, or exact `Flat` below `cfg.exact_below` rows."""
    return "Flat" if rows < cfg.exact_below else cfg.factory


@functools.cache
def _gpu_resources() -> faiss.StandardGpuResources:
    """One set of GPU resources for the process; it must outlive every GPU index made with it."""
    return faiss.StandardGpuResources()


def index_device(factory: str) -> str:
    """`gpu` when faiss-gpu sees a CUDA device and has a GPU version of `factory`, else `cpu`."""
    on_gpu = faiss.get_num_gpus() > 0 and IndexConfig.factory_family(factory) in GPU_FAMILIES
    return "gpu" if on_gpu else "cpu"


def train_rows(rows: int, factory: str, cfg: IndexConfig) -> int:
    """How many of `rows` vectors train `factory`: 0 if it needs no training, else up to `cfg.train_sample`."""
    return min(rows, cfg.train_sample) if IndexConfig.min_train_rows(factory) else 0


def build_index(vectors: np.ndarray, ids: np.ndarray, cfg: IndexConfig) -> faiss.Index:
    """vectors [N, R] float32, ids [N] int64 -> a trained, filled inner-product index returning ids.

    The index lives where `index_device` says; `faiss.index_gpu_to_cpu` brings a GPU one back.
    """
    if vectors.ndim != 2 or len(vectors) != len(ids):
        raise ValueError(f"vectors {vectors.shape} and ids {ids.shape} must be [N, R] and [N]")
    if len(np.unique(ids)) != len(ids):
        raise ValueError("ids must be unique: each table row is indexed once")
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    factory = factory_for(len(vectors), cfg)
    try:
        index = faiss.index_factory(vectors.shape[1], f"IDMap,{factory}", faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as err:
        raise ValueError(
            f"index.factory={factory!r} cannot index {vectors.shape[1]}-dimensional vectors: the m "
            f"of PQ<m> must divide {vectors.shape[1]} ({err})"
        ) from err
    inner = faiss.downcast_index(index.index)
    if isinstance(inner, faiss.IndexIVFPQ):
        # The factory turns on polysemous training (reorders codes for Hamming pre-filtering, which we never
        # search with): 15x the training time of the codebooks themselves.
        inner.do_polysemous_training = False
    set_search_params(index, cfg.nprobe, cfg.hnsw_ef_search)  # before the GPU copy, which inherits nprobe
    if index_device(factory) == "gpu":
        # One device: replicas on several GPUs would each train their own centroids.
        index = faiss.index_cpu_to_gpu(_gpu_resources(), 0, index)
    if not index.is_trained:
        index.train(_training_sample(vectors, factory, cfg))
    index.add_with_ids(vectors, ids.astype(np.int64))
    return index


def _training_sample(vectors: np.ndarray, factory: str, cfg: IndexConfig) -> np.ndarray:
    needed = IndexConfig.min_train_rows(factory)
    if len(vectors) < needed:
        raise ValueError(
            f"index.factory={factory!r} trains {needed} k-means centroids but the table has only {len(vectors)} "
            f"rows; use fewer IVF lists (nlist ~ 4 * sqrt(rows)) or raise index.exact_below above {len(vectors)} "
            "to index it exactly"
        )
    n = train_rows(len(vectors), factory, cfg)
    sample = (
        vectors
        if n == len(vectors)
        else vectors[np.sort(np.random.default_rng(TRAIN_SEED).choice(len(vectors), n, replace=False))]
    )
    if n < 39 * needed:
        warnings.warn(
            f"index.factory={factory!r}: {n} training rows for {needed} centroids, under the 39 a "
            "centroid k-means needs for stable lists; expect lower recall or raise index.train_sample",
            stacklevel=3,
        )
    return sample


def set_search_params(index: faiss.Index, nprobe: int, hnsw_ef_search: int) -> None:
    """Set the search parameter of a CPU IDMap index's family (Flat has none)."""
    inner = faiss.downcast_index(index.index)
    if isinstance(inner, faiss.IndexIVF):
        inner.nprobe = nprobe
    if isinstance(inner, faiss.IndexHNSW):
        inner.hnsw.efSearch = hnsw_ef_search


def recall_at_k(index: faiss.Index, vectors: np.ndarray, ids: np.ndarray, queries: np.ndarray, k: int) -> float:
    """Mean fraction of the exact top-k (brute-force inner product, IndexFlatIP) that `index` returns.

    Tie-aware: a returned vector counts when its exact score reaches the k-th best score, so among
    equal scores (identical embeddings, e.g. users with the same features) any choice is correct.
    """
    k = min(k, len(ids))
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    exact = faiss.IndexFlatIP(vectors.shape[1])
    exact.add(vectors)
    kth = exact.search(queries, k)[0][:, k - 1]  # [Q]; no [Q, N] score matrix, which is 4 GB at 1M rows
    _, found = index.search(queries, k)
    order = np.argsort(ids)
    rows = order[np.searchsorted(ids, found.clip(min=ids.min()), sorter=order)]  # found id -> vector row
    found_scores = np.einsum("qr,qkr->qk", queries, vectors[rows])
    hits = (found >= 0) & (found_scores >= kth[:, None] - 1e-5)
    return float(hits.sum(axis=1).mean()) / k


def _rebuild_hint(directory: Path) -> str:
    name, version, ds = directory.parts[-3:]
    return (
        f"rebuild it: gem export --ds {ds} --model-version {version} (or materialise indexes/{name} for "
        f"partition {ds} with that model version)"
    )


def current_build(directory: Path) -> Path:
    """The published build directory of the index at `directory` (`GemPaths.index_dir`)."""
    pointer = directory / CURRENT
    if not pointer.is_file():
        raise FileNotFoundError(f"no index published at {directory} ({CURRENT} missing); {_rebuild_hint(directory)}")
    build = directory / pointer.read_text().strip()
    if not build.is_dir():
        raise FileNotFoundError(f"{pointer} names {build.name}, which does not exist; {_rebuild_hint(directory)}")
    return build


def read_index(directory: Path) -> tuple[faiss.Index, dict[str, Any]]:
    """The published CPU index at `directory`, verified against its manifest, with its search parameters."""
    build = current_build(directory)
    hint = _rebuild_hint(directory)
    manifest = read_manifest_file(build / "manifest.json", hint)
    verify_files(build, {INDEX_FILE: {"bytes": manifest["index_bytes"], "sha256": manifest["sha256"]}}, hint)
    index = faiss.read_index(str(build / INDEX_FILE))
    set_search_params(index, manifest["nprobe"], manifest["hnsw_ef_search"])
    return index, manifest


def _publish(directory: Path, build: Path) -> None:
    """Point `CURRENT` at `build` atomically, then drop all but the newest `KEEP_BUILDS` builds."""
    tmp = directory / f"{CURRENT}.{uuid.uuid4().hex}.tmp"
    tmp.write_text(build.name + "\n")
    os.replace(tmp, directory / CURRENT)
    builds = sorted(directory.glob("build-*"), key=lambda p: p.name)
    for old in builds[:-KEEP_BUILDS]:
        if old != build:
            shutil.rmtree(old, ignore_errors=True)


def publish_index(
    vectors: np.ndarray,
    ids: np.ndarray,
    queries: np.ndarray,
    directory: Path,
    cfg: IndexConfig,
    model_version: str,
    ds: date,
    source_table: str,
) -> dict[str, Any]:
    """Build, measure (on the build device) and atomically publish an index; returns its manifest."""
    factory = factory_for(len(vectors), cfg)
    device = index_device(factory)
    started = time.perf_counter()
    index = build_index(vectors, ids, cfg)
    build_seconds = time.perf_counter() - started
    queries = np.ascontiguousarray(queries[: cfg.recall_queries], dtype=np.float32)
    started = time.perf_counter()
    index.search(queries, cfg.recall_k)
    qps = len(queries) / max(time.perf_counter() - started, 1e-9)
    recall = recall_at_k(index, vectors, ids, queries, cfg.recall_k)
    if device == "gpu":
        index = faiss.index_gpu_to_cpu(index)
    created = datetime.now(UTC)
    build = directory / f"build-{created:%Y%m%dT%H%M%S%f}-{uuid.uuid4().hex[:8]}"  # sorts by time
    build.mkdir(parents=True)
    faiss.write_index(index, str(build / INDEX_FILE))
    manifest = {
        "name": directory.parts[-3],
        "model_version": model_version,
        "ds": ds.isoformat(),
        "source_table": source_table,
        "dimension": int(vectors.shape[1]),
        "metric": "inner_product",
        "factory": factory,
        "configured_factory": cfg.factory,
        "nprobe": cfg.nprobe,
        "hnsw_ef_search": cfg.hnsw_ef_search,
        "train_rows": train_rows(len(vectors), factory, cfg),
        "device": device,
        "faiss_version": faiss.__version__,
        "row_count": int(index.ntotal),
        f"recall_at_{cfg.recall_k}": recall,
        "recall_queries": len(queries),
        "queries_per_second": qps,
        "build_seconds": build_seconds,
        "index_bytes": (build / INDEX_FILE).stat().st_size,
        "sha256": file_sha256(build / INDEX_FILE),
        "created_at": created.isoformat(),
    }
    (build / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    _publish(directory, build)
    return manifest
