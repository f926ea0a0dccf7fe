"""FAISS index types over embedding-like vectors: build time, queries/s, recall@10 against exact, bytes.

    nice -n 10 .venv/bin/python -m bench.perf.faiss_indexes --sizes 100000,1000000 --queries 1000

For each size N: N unit vectors of dimension `model.repr_dim` (32) around 1,000 cluster centres
with Zipf-distributed cluster sizes (embeddings of ads or users that share categories), and
--queries queries from the same clusters, seeded. Each index type is built and measured by the
shipped `publish_index` into a temporary directory: build seconds around `build_index`
(training on up to `index.train_sample` rows included), queries/s of one batch search of every
query at k=10, recall@10 by `recall_at_k` against exact IndexFlatIP search of the same vectors in
the same run, and the bytes of the written index file. IVF uses nlist = 4 * sqrt(N); search
parameters are the IndexConfig defaults unless --nprobe / --ef-search are given. Prints one JSON
line per measurement, then a markdown table and the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

import faiss
import numpy as np

from gem_model.config import IndexConfig, ModelConfig
from gem_model.export.index import publish_index

CLUSTERS = 1_000


def embeddings(rng: np.random.Generator, centres: np.ndarray, weights: np.ndarray, n: int) -> np.ndarray:
    """n unit vectors [n, R] scattered around `centres` (cosine to their centre ~0.7)."""
    x = centres[rng.choice(len(centres), size=n, p=weights)]
    x += rng.standard_normal(x.shape, dtype=np.float32) / np.sqrt(x.shape[1])
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def factories(rows: int) -> dict[str, str]:
    nlist = int(4 * math.sqrt(rows))
    return {"Flat": "Flat", "IVF-Flat": f"IVF{nlist},Flat", "IVF-PQ": f"IVF{nlist},PQ16", "HNSW": "HNSW32,Flat"}


def machine() -> str:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")), "unknown CPU"
    )
    return (
        f"{model}, {os.cpu_count()} cores, faiss {faiss.__version__} ({faiss.omp_get_max_threads()} OpenMP "
        f"threads, {faiss.get_num_gpus()} GPUs)"
    )


def synthetic_table(rows: int, n_queries: int, dim: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """vectors [N, R], their table ids [N] and queries [Q, R] from the same clusters."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((CLUSTERS, dim), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    weights = 1.0 / np.arange(1, CLUSTERS + 1)
    weights /= weights.sum()
    vectors, queries = embeddings(rng, centres, weights, rows), embeddings(rng, centres, weights, n_queries)
    return vectors, rng.permutation(rows).astype(np.int64) + 1_000_000_000, queries  # ids are not row numbers


def measure(vectors: np.ndarray, ids: np.ndarray, queries: np.ndarray, kind: str, cfg: IndexConfig) -> dict[str, Any]:
    rows = len(vectors)
    with tempfile.TemporaryDirectory() as tmp:
        manifest = publish_index(vectors, ids, queries, Path(tmp) / "bench", cfg, "bench", date.today(), "bench")
    return {
        "rows": rows,
        "type": kind,
        "factory": manifest["factory"],
        "device": manifest["device"],
        "nprobe": cfg.nprobe,
        "hnsw_ef_search": cfg.hnsw_ef_search,
        "train_rows": manifest["train_rows"],
        "build_seconds": round(manifest["build_seconds"], 2),
        "queries_per_second": round(manifest["queries_per_second"]),
        "queries": manifest["recall_queries"],
        "recall_at_10": round(manifest["recall_at_10"], 4),
        "index_bytes": manifest["index_bytes"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,1000000", help="comma-separated row counts")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--types", default="Flat,IVF-Flat,IVF-PQ,HNSW")
    parser.add_argument("--nprobe", type=int, default=IndexConfig.nprobe)
    parser.add_argument("--ef-search", type=int, default=IndexConfig.hnsw_ef_search)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    dim = ModelConfig().repr_dim
    results = []
    for rows in (int(s) for s in args.sizes.split(",")):
        vectors, ids, queries = synthetic_table(rows, args.queries, dim, args.seed)
        for kind in args.types.split(","):
            cfg = IndexConfig(
                factory=factories(rows)[kind],
                recall_k=10,
                recall_queries=args.queries,
                nprobe=args.nprobe,
                hnsw_ef_search=args.ef_search,
                exact_below=0,
            )
            results.append(measure(vectors, ids, queries, kind, cfg))
            print(json.dumps(results[-1]), flush=True)
    print("\n| rows | type | factory | search params | build s | queries/s | recall@10 | index MiB | bytes/vector |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        params = {
            "IVF-Flat": f"nprobe={r['nprobe']}",
            "IVF-PQ": f"nprobe={r['nprobe']}",
            "HNSW": f"efSearch={r['hnsw_ef_search']}",
        }.get(r["type"], "exact")
        print(
            f"| {r['rows']:,} | {r['type']} | `{r['factory']}` | {params} | {r['build_seconds']:.2f} | "
            f"{r['queries_per_second']:,} | {r['recall_at_10']:.4f} | {r['index_bytes'] / 2**20:.1f} | "
            f"{r['index_bytes'] / r['rows']:.0f} |"
        )
    print(f"\nmachine: {machine()}; dimension {dim}, {args.queries} queries, k=10")


if __name__ == "__main__":
    main()
