import os
from datetime import date, timedelta
from pathlib import Path

import faiss
import numpy as np
import pytest

from gem_model.config import GemConfig, IndexConfig
from gem_model.export.index import build_index, current_build, factory_for, publish_index, read_index, recall_at_k
from gem_model.integrity import CorruptArtefactError
from gem_model.paths import GemPaths

DAY = date(2026, 11, 6)


def _unit(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _clustered(rng, centers, n):
    """Unit vectors scattered around `centers`, like embeddings of users or ads that share features."""
    x = centers[rng.integers(len(centers), size=n)] + 1.2 * rng.standard_normal((n, centers.shape[1])) / np.sqrt(
        centers.shape[1]
    )
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(autouse=True, scope="module")
def _one_faiss_thread():
    """Indexes this small train and search faster on one OpenMP thread than on a shared two-core box."""
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    yield
    faiss.omp_set_num_threads(threads)


@pytest.fixture(scope="module")
def table():
    """10k clustered vectors [N, 16] with shuffled table ids, and 200 queries from the same clusters."""
    rng = np.random.default_rng(0)
    centers = _unit(rng, 50, 16)
    vectors, queries = _clustered(rng, centers, 10_000), _clustered(rng, centers, 200)
    return vectors, 70_000 + rng.permutation(10_000).astype(np.int64), queries


def _exact_overlap(found, vectors, ids, queries, k=10):
    """Mean share of the exact top-k ids (numpy brute force; no ties in continuous data) found."""
    exact = ids[np.argsort(-(queries @ vectors.T), axis=1)[:, :k]]
    return float(np.mean([len(set(f) & set(e)) / k for f, e in zip(found, exact)]))


def test_flat_index_returns_table_ids_and_exact_top_k():
    rng = np.random.default_rng(0)
    vectors, ids = _unit(rng, 300, 16), np.arange(1000, 1300, dtype=np.int64)
    queries = _unit(rng, 20, 16)
    index = build_index(vectors, ids, IndexConfig(factory="Flat"))
    _, found = index.search(queries, 5)
    expected = ids[np.argsort(-(queries @ vectors.T), axis=1)[:, :5]]
    assert (found == expected).all()
    assert recall_at_k(index, vectors, ids, queries, 10) == 1.0


@pytest.mark.parametrize(
    ("factory", "params", "low", "high"),
    [
        ("Flat", {}, 1.0, 1.0),
        ("IVF64,Flat", {"nprobe": 16}, 0.95, 1.0),
        ("HNSW16,Flat", {"hnsw_ef_search": 64}, 0.97, 1.0),
        ("IVF64,PQ4", {"nprobe": 16}, 0.3, 0.8),  # 4 bytes a 16-d vector: measured, and lower
    ],
)
def test_each_family_returns_table_ids_with_measured_recall(table, factory, params, low, high):
    vectors, ids, queries = table
    index = build_index(vectors, ids, IndexConfig(factory=factory, exact_below=0, **params))
    assert index.ntotal == len(ids)
    _, found = index.search(queries, 10)
    assert np.isin(found, ids).all()  # table ids, never row numbers or -1
    recall = _exact_overlap(found, vectors, ids, queries)
    assert low <= recall <= high
    assert recall_at_k(index, vectors, ids, queries, 10) == pytest.approx(recall, abs=1e-3)
    if factory in ("Flat", "IVF64,Flat"):  # a stored vector's own list is the first one probed
        assert (index.search(vectors[:100], 1)[1][:, 0] == ids[:100]).all()


def test_ivf_recall_grows_with_nprobe(table):
    vectors, ids, queries = table
    recalls = [
        _exact_overlap(
            build_index(vectors, ids, IndexConfig(factory="IVF64,Flat", exact_below=0, nprobe=p)).search(queries, 10)[
                1
            ],
            vectors,
            ids,
            queries,
        )
        for p in (1, 64)
    ]
    assert recalls[0] < 0.8 and recalls[1] == 1.0  # nprobe = nlist scans every list: exact


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
    directory = GemPaths(tmp_path).index_dir("ads", "v1", DAY)

    builds = []
    for _ in range(3):  # each publish is a new build; CURRENT moves to it, the one before is kept
        manifest = publish_index(
            vectors, ids, queries, directory, IndexConfig(exact_below=100), "v1", DAY, "gold.ad_embeddings"
        )
        builds.append(current_build(directory))
    index, read_back = read_index(directory)
    assert index.ntotal == 500 == read_back["row_count"] == manifest["row_count"]
    assert (read_back["name"], read_back["model_version"], read_back["ds"]) == ("ads", "v1", DAY.isoformat())
    assert read_back["dimension"] == 8 and read_back["metric"] == "inner_product"
    assert read_back["recall_at_10"] >= 0.9 and read_back["factory"] == "HNSW32,Flat"
    assert read_back["index_bytes"] == (builds[-1] / "index.faiss").stat().st_size
    assert read_back["faiss_version"] == faiss.__version__
    assert sorted(p.name for p in directory.iterdir()) == sorted(["CURRENT", builds[1].name, builds[2].name])


def test_indexes_of_two_days_do_not_share_files(tmp_path):
    rng = np.random.default_rng(2)
    paths = GemPaths(tmp_path)
    for n, day in ((100, DAY), (120, DAY + timedelta(days=1))):
        vectors, queries = _unit(rng, n, 8), _unit(rng, 10, 8)
        publish_index(
            vectors,
            np.arange(n, dtype=np.int64),
            queries,
            paths.index_dir("ads", "v1", day),
            IndexConfig(),
            "v1",
            day,
            "gold.ad_embeddings",
        )
    for n, day in ((100, DAY), (120, DAY + timedelta(days=1))):
        index, manifest = read_index(paths.index_dir("ads", "v1", day))
        assert index.ntotal == n == manifest["row_count"] and manifest["ds"] == day.isoformat()


@pytest.fixture
def published(tmp_path) -> Path:
    rng = np.random.default_rng(3)
    directory = GemPaths(tmp_path).index_dir("ads", "v1", DAY)
    publish_index(
        _unit(rng, 300, 8),
        np.arange(300, dtype=np.int64),
        _unit(rng, 10, 8),
        directory,
        IndexConfig(),
        "v1",
        DAY,
        "gold.ad_embeddings",
    )
    return directory


def test_an_overwritten_index_file_is_refused_naming_it_and_the_fix(published):
    path = current_build(published) / "index.faiss"
    with path.open("r+b") as fh:  # 4 KB overwritten in place: same size, different bytes
        fh.seek(path.stat().st_size // 2)
        fh.write(os.urandom(4096))
    with pytest.raises(
        CorruptArtefactError,
        match=r"index\.faiss is corrupt: sha256 .* gem export --ds 2026-11-06 "
        r"--model-version v1",
    ):
        read_index(published)


def test_a_truncated_index_or_manifest_is_refused(published):
    build = current_build(published)
    index_bytes = (build / "index.faiss").read_bytes()
    (build / "index.faiss").write_bytes(index_bytes[:1000])
    with pytest.raises(CorruptArtefactError, match="has 1,000 bytes, its manifest recorded"):
        read_index(published)
    (build / "index.faiss").write_bytes(index_bytes)
    (build / "manifest.json").write_text((build / "manifest.json").read_text()[:50])
    with pytest.raises(CorruptArtefactError, match=r"manifest\.json is not valid JSON .* rebuild it"):
        read_index(published)
    (published / "CURRENT").write_text("build-gone\n")
    with pytest.raises(FileNotFoundError, match="names build-gone, which does not exist; rebuild it"):
        read_index(published)


@pytest.mark.parametrize(
    ("factory", "params", "trained_on"),
    [
        ("IVF64,Flat", {"nprobe": 3, "train_sample": 5_000}, 5_000),  # a sample of the 10k rows
        ("IVF64,PQ4", {"nprobe": 5}, 10_000),
        ("HNSW16,Flat", {"hnsw_ef_search": 17}, 0),
    ],
)
def test_search_params_survive_publish_and_read(tmp_path, monkeypatch, table, factory, params, trained_on):
    monkeypatch.setattr(faiss, "get_num_gpus", lambda: 0)  # the CPU path, whatever faiss build is installed
    vectors, ids, queries = table
    cfg = IndexConfig(factory=factory, exact_below=0, **params)
    directory = GemPaths(tmp_path).index_dir("ads", "v1", DAY)
    manifest = publish_index(vectors, ids, queries, directory, cfg, "v1", DAY, "gold.ad_embeddings")
    index, read_back = read_index(directory)
    inner = faiss.downcast_index(index.index)
    if "nprobe" in params:
        assert inner.nprobe == params["nprobe"] == read_back["nprobe"]
    else:
        assert inner.hnsw.efSearch == 17 == read_back["hnsw_ef_search"]
    assert read_back["train_rows"] == trained_on
    assert read_back["device"] == "cpu" and read_back["factory"] == factory
    _, found = index.search(queries, 10)  # the published index searches as the measured one did
    assert recall_at_k(index, vectors, ids, queries, 10) == pytest.approx(manifest["recall_at_10"])
    assert np.isin(found, ids).all()


def test_training_sample_is_seeded(table):
    vectors, ids, _ = table
    cfg = IndexConfig(factory="IVF64,Flat", exact_below=0, train_sample=3_000)
    first, second = build_index(vectors, ids, cfg), build_index(vectors, ids, cfg)  # alive while read: SWIG
    centroids = [faiss.downcast_index(index.index).quantizer.reconstruct_n(0, 64) for index in (first, second)]
    assert np.array_equal(*centroids)


@pytest.mark.parametrize(
    "factory", ["IVF,Flat", "IVF0,Flat", "HNSW", "HNSW32,PQ8", "IVF64,PQ", "PQ16", "LSH", "IVF64,Flat,Refine"]
)
def test_unsupported_factory_names_the_field_and_the_families(factory):
    with pytest.raises(ValueError, match=r"index\.factory=.*'IVF<nlist>,PQ<m>'.*'HNSW<M>,Flat'"):
        IndexConfig(factory=factory)
    with pytest.raises(ValueError, match=r"index\.factory"):  # config files fail at load, not after training
        GemConfig.from_dict({"index": {"factory": factory}})


def test_pq_that_does_not_divide_the_dimension_is_a_clear_error():
    with pytest.raises(ValueError, match=r"index\.factory='IVF8,PQ5'.*must divide 16"):
        build_index(np.zeros((400, 16), np.float32), np.arange(400), IndexConfig(factory="IVF8,PQ5", exact_below=0))


def test_too_small_training_sample_is_a_clear_error(table):
    with pytest.raises(ValueError, match=r"index\.train_sample=500 .* 1024 k-means centroids"):
        IndexConfig(factory="IVF1024,Flat", train_sample=500)
    with pytest.raises(ValueError, match=r"index\.train_sample=200 .* 256"):  # the PQ codebooks
        IndexConfig(factory="IVF16,PQ4", train_sample=200)
    vectors, ids, _ = table
    with pytest.raises(ValueError, match=r"trains 512 k-means centroids but the table has only 300 rows"):
        build_index(vectors[:300], ids[:300], IndexConfig(factory="IVF512,Flat", exact_below=0))
    with pytest.warns(UserWarning, match=r"2000 training rows for 64 centroids"):
        build_index(vectors[:2000], ids[:2000], IndexConfig(factory="IVF64,Flat", exact_below=0))


def test_duplicate_ids_are_rejected():
    with pytest.raises(ValueError, match="unique"):
        build_index(np.zeros((2, 4), np.float32), np.array([1, 1]), IndexConfig(factory="Flat"))


def test_small_tables_get_an_exact_index_whatever_the_factory():
    rng = np.random.default_rng(2)
    vectors, ids = _unit(rng, 50, 8), np.arange(50, dtype=np.int64)
    cfg = IndexConfig(factory="HNSW32,Flat", exact_below=100)
    assert factory_for(50, cfg) == "Flat" and factory_for(100, cfg) == "HNSW32,Flat"
    assert recall_at_k(build_index(vectors, ids, cfg), vectors, ids, -vectors, 10) == 1.0
