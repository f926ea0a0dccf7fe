import numpy as np
import pytest

from gem_model.config import IndexConfig
from gem_model.export.index import build_index, factory_for, publish_index, read_index, recall_at_k


def _unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_flat_index_returns_table_ids_and_exact_top_k():
    rng = np.random.default_rng(0)
    vectors, ids = _unit(rng, 300, 16), np.arange(1000, 1300, dtype=np.int64)
    queries = _unit(rng, 20, 16)
    index = build_index(vectors, ids, IndexConfig(factory="Flat"))
    _, found = index.search(queries, 5)
    expected = ids[np.argsort(-(queries @ vectors.T), axis=1)[:, :5]]
    assert (found == expected).all()
    assert recall_at_k(index, vectors, ids, queries, 10) == 1.0


def test_recall_counts_any_choice_among_tied_vectors_and_catches_wrong_ones():
    rng = np.random.default_rng(2)
    distinct = _unit(rng, 5, 8)
    vectors = np.repeat(distinct, 20, axis=0)  # 5 embeddings, each shared by 20 ids
    ids = rng.permutation(np.arange(1, 101)).astype(np.int64)
    queries = distinct[:3]
    index = build_index(vectors, ids, IndexConfig(factory="Flat"))
    assert recall_at_k(index, vectors, ids, queries, 10) == 1.0  # every returned id ties the exact top-10
    wrong = build_index(-vectors, ids, IndexConfig(factory="Flat"))  # returns the worst matches
    assert recall_at_k(wrong, vectors, ids, queries, 10) == 0.0


def test_publish_writes_manifest_and_replaces_atomically(tmp_path):
    rng = np.random.default_rng(1)
    vectors, ids, queries = _unit(rng, 500, 8), np.arange(500, dtype=np.int64), _unit(rng, 50, 8)
    directory = tmp_path / "indexes" / "ads" / "v1"
    from datetime import date

    for _ in range(2):  # publishing twice leaves one complete index
        manifest = publish_index(vectors, ids, queries, directory, IndexConfig(exact_below=100), "v1",
                                 date(2026, 11, 6), "gold.ad_embeddings")
    index, read_back = read_index(directory)
    assert index.ntotal == 500 == read_back["row_count"] == manifest["row_count"]
    assert read_back["dimension"] == 8 and read_back["metric"] == "inner_product"
    assert read_back["recall_at_10"] >= 0.9 and read_back["factory"] == "HNSW32,Flat"
    assert sorted(p.name for p in directory.parent.iterdir()) == ["v1"]


def test_duplicate_ids_are_rejected():
    with pytest.raises(ValueError, match="unique"):
        build_index(np.zeros((2, 4), np.float32), np.array([1, 1]), IndexConfig(factory="Flat"))


def test_small_tables_get_an_exact_index_whatever_the_factory():
    rng = np.random.default_rng(2)
    vectors, ids = _unit(rng, 50, 8), np.arange(50, dtype=np.int64)
    cfg = IndexConfig(factory="HNSW32,Flat", exact_below=100)
    assert factory_for(50, cfg) == "Flat" and factory_for(100, cfg) == "HNSW32,Flat"
    assert recall_at_k(build_index(vectors, ids, cfg), vectors, ids, -vectors, 10) == 1.0
