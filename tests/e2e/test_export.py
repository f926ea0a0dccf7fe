"""The export on the session's pipeline lake: sharded scoring, candidates, versions, crashes, bad input."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import dagster as dg
import faiss
import numpy as np
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pytest
import torch
from pyspark.sql import functions as F

from dagster_project.definitions import build_definitions
from dagster_project.defs.partitions import MODEL_VERSIONS, model_day_key
from dagster_project.demo import summary
from dagster_project.resources.launchers import JobLauncher, JobLaunchError, LocalTorchrunLauncher
from gem_lake.delta import read_table, table_version
from gem_lake.export_tables import write_user_input
from gem_lake.locks import partition_lock
from gem_model.config import ExportConfig
from gem_model.export.checkpoint import bf16_supported
from gem_model.export.index import read_index
from gem_model.export.scoring import read_embeddings

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.dist]
DAY = "2026-11-04"
SCORED = ("gold.user_embeddings", "gold.ad_embeddings", "gold.teacher_logits")
# Ranks and one process score a row in different batches: equal to float32 rounding, or, where scoring
# runs in bfloat16 (export.bf16 on a CPU that multiplies it), to bfloat16's (8 bits of mantissa).
SCORING_ATOL = 5e-2 if ExportConfig().bf16 and bf16_supported(torch.device("cpu")) else 1e-4


def _parts(out: Path, name: str):
    """One scoring run's table, sorted by its key, as an Arrow table."""
    table = pads.dataset(out / name, format="parquet").to_table()
    key = "impression_id" if name == "teacher_logits" else table.column_names[0]
    return table.sort_by(key)


def _score(lake, spark, out: Path, nproc: int, version: str) -> subprocess.CompletedProcess:
    users = out.parent / "users"
    if not users.exists():
        write_user_input(spark, lake.paths, lake.config.features, date.fromisoformat(DAY), users, 4)
    args = ["--model-version", version, "--ds", DAY, "--users", str(users), "--out", str(out)]
    launcher = LocalTorchrunLauncher()
    return subprocess.run(
        launcher.command("jobs.score", args, nproc),
        env=launcher.environment(nproc),
        capture_output=True,
        text=True,
        timeout=1800,
    )


def test_sharded_scoring_is_repeatable_and_matches_one_process(pipeline, spark, tmp_path):
    lake, _, _ = pipeline
    version = lake.latest_model_version()
    runs = {}
    for name, nproc in (("two_ranks", 2), ("again", 2), ("one_process", 1)):
        done = _score(lake, spark, tmp_path / name, nproc, version)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = {t: _parts(tmp_path / name, t) for t in ("user_embeddings", "ad_embeddings", "teacher_logits")}
    assert len(list((tmp_path / "two_ranks" / "teacher_logits").glob("part-*.parquet"))) == 2
    success = json.loads((tmp_path / "two_ranks" / "_SUCCESS.json").read_text())
    assert success["world_size"] == 2 and success["rows"]["ad_embeddings"] == lake.config.world.n_ads
    for table, two in runs["two_ranks"].items():
        assert two.equals(runs["again"][table]), f"{table}: the same rows scored twice differ"
        one = runs["one_process"][table]
        assert two.num_rows == one.num_rows and two.column(0).equals(one.column(0))
        for column in two.column_names:
            if column in ("embedding", "ctr_logit", "cvr_logit"):
                a = np.stack(two.column(column).to_numpy(zero_copy_only=False)).astype(np.float64)
                b = np.stack(one.column(column).to_numpy(zero_copy_only=False)).astype(np.float64)
                assert np.isfinite(a).all() and np.allclose(a, b, atol=SCORING_ATOL), f"{table}.{column}"
    vectors = np.stack(runs["two_ranks"]["user_embeddings"].column("embedding").to_numpy(zero_copy_only=False))
    assert vectors.shape == (lake.config.world.n_users, lake.config.model.repr_dim)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)


def test_candidates_are_the_exact_top_k_by_embedding_inner_product(pipeline, spark):
    lake, _, _ = pipeline
    version, cfg = lake.latest_model_version(), lake.config
    k = min(cfg.export.candidates_k, cfg.world.n_ads)
    for day in (d for d in cfg.world.days if d >= cfg.world.holdout_start):
        user_ids, users = read_embeddings(lake.paths, "gold.user_embeddings", "user_id", version, day)
        ad_ids, ads = read_embeddings(lake.paths, "gold.ad_embeddings", "ad_id", version, day)
        candidates = (
            pads.dataset(lake.paths.table("gold.user_ad_candidates"))
            .to_table(filter=(pc.field("model_version") == version) & (pc.field("ds") == day))
            .to_pandas()
        )
        assert len(candidates) == len(user_ids) * k
        for user in user_ids[:25]:
            rows = candidates[candidates.user_id == user].sort_values("rank")
            assert rows["rank"].tolist() == list(range(1, k + 1))
            exact = ads @ users[user_ids == user][0]
            scores = dict(zip(ad_ids, exact))
            assert np.allclose(rows.score, [scores[a] for a in rows.ad_id], atol=1e-5)
            assert rows.score.iloc[-1] >= np.sort(exact)[-k] - 1e-5  # nothing better was left out


def _content(spark, lake, table: str, version: str):
    df = read_table(spark, lake.paths.table(table)).where((F.col("model_version") == version) & (F.col("ds") == DAY))
    return tuple(df.agg(F.count(F.lit(1)), F.sum(F.xxhash64(*df.columns).cast("decimal(38,0)"))).first())


class KillingLauncher(JobLauncher):
    """Starts the real scoring job, SIGKILLs its agent and workers once a rank has written output."""

    def launch(self, context, module, args, nproc):
        local = LocalTorchrunLauncher()
        proc = subprocess.Popen(
            local.command(module, args, nproc),
            env=local.environment(nproc),
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        out = Path(args[args.index("--out") + 1])
        deadline = time.monotonic() + 1800  # a scoring run stuck before its first output, not a slow one
        while not list(out.glob("*/part-*.parquet")) and proc.poll() is None:
            assert time.monotonic() < deadline, "no scoring output within 30 minutes"
            time.sleep(0.02)
        workers = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        for pid in [*map(int, workers), proc.pid]:
            os.kill(pid, signal.SIGKILL)
        proc.wait()
        raise JobLaunchError(f"{module} was killed")


def _export(lake, instance, version: str, launcher: JobLauncher | None = None) -> dg.ExecuteInProcessResult:
    """Export (version, DAY), the version made a partition first as `gem export` does for one trained elsewhere."""
    defs = build_definitions(lake=lake, launcher=launcher)
    if not instance.has_dynamic_partition(MODEL_VERSIONS.name, version):
        instance.add_dynamic_partitions(MODEL_VERSIONS.name, [version])
    return defs.resolve_job_def("export_job").execute_in_process(
        instance=instance, partition_key=model_day_key(version, date.fromisoformat(DAY)), raise_on_error=False
    )


def test_killed_scoring_commits_nothing_and_a_rerun_replaces_the_partition(pipeline, spark):
    lake, _, instance = pipeline
    version = lake.latest_model_version()
    before = {t: _content(spark, lake, t, version) for t in SCORED}
    versions = {t: table_version(lake.paths.table(t)) for t in SCORED}
    killed = _export(lake, instance, version, KillingLauncher())
    assert not killed.success
    assert {t: table_version(lake.paths.table(t)) for t in SCORED} == versions
    assert _export(lake, instance, version).success
    assert {t: _content(spark, lake, t, version) for t in SCORED} == before


def test_a_second_model_version_is_exported_beside_the_first(pipeline, spark):
    lake, _, instance = pipeline
    first = lake.latest_model_version()
    second = f"{first}-copy"
    shutil.copytree(lake.paths.model_dir(first), lake.paths.model_dir(second))
    manifest_path = lake.paths.model_dir(second) / "manifest.json"
    manifest_path.write_text(json.dumps({**json.loads(manifest_path.read_text()), "model_version": second}))
    before = {t: _content(spark, lake, t, first) for t in (*SCORED, "gold.user_ad_candidates")}
    assert _export(lake, instance, second).success
    for table, (rows, digest) in before.items():
        assert _content(spark, lake, table, first) == (rows, digest), table
        assert _content(spark, lake, table, second)[0] == rows, table  # same weights, same row count
    builds = read_table(spark, lake.paths.table("gold.index_builds")).where(F.col("ds") == DAY)
    assert {(r.index_name, r.model_version) for r in builds.collect()} == {
        (n, v) for n in ("ads", "users") for v in (first, second)
    }
    # The demo's summary tells the promoted model's rows from the other version's.
    logits = read_table(spark, lake.paths.table("gold.teacher_logits"))
    versions = logits.select("model_version").distinct().count()  # the modules sharing this lake may add more
    line = next(x for x in summary(lake).splitlines() if x.split()[:1] == ["gold.teacher_logits"])
    assert versions >= 2 and line.split()[1:] == [
        f"{logits.count():,}",
        "rows",
        f"({logits.where(F.col('model_version') == first).count():,}",
        "of",
        f"{first},",
        str(versions),
        "model",
        "versions)",
    ]


def test_exporting_a_missing_model_version_fails_naming_the_known_ones(pipeline):
    lake, _, instance = pipeline
    result = _export(lake, instance, "gem-tiny-nope")
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure).step_failure_data.error
    assert "'gem-tiny-nope' not found" in str(failure.cause or failure) and lake.latest_model_version() in str(
        failure.cause or failure
    )


def test_embeddings_of_another_dimension_are_refused(pipeline):
    lake, _, _ = pipeline
    version = lake.latest_model_version()
    with pytest.raises(ValueError, match=r"have lengths \[32\], expected \[16\]"):
        read_embeddings(lake.paths, "gold.ad_embeddings", "ad_id", version, date.fromisoformat(DAY), 16)


def _gem_export(lake, version: str) -> subprocess.Popen:
    """`gem export` of DAY in its own process, as a user would start it."""
    env = {**os.environ, "GEM_HOME": lake.home, "GEM_PRESET": lake.preset, "GEM_CONFIG": lake.config_path}
    return subprocess.Popen(
        [sys.executable, "-m", "jobs.cli", "export", "--ds", DAY, "--model-version", version],
        env=env,
        cwd=Path(__file__).parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _partition_is_complete_and_matches(spark, lake, version: str, expected: dict) -> None:
    for table, (rows, digest) in expected.items():
        assert _content(spark, lake, table, version) == (rows, digest), table
    ads, _ = read_embeddings(lake.paths, "gold.ad_embeddings", "ad_id", version, date.fromisoformat(DAY))
    index, manifest = read_index(lake.paths.index_dir("ads", version, date.fromisoformat(DAY)))
    assert (manifest["model_version"], manifest["ds"]) == (version, DAY)
    assert np.array_equal(np.sort(faiss.vector_to_array(index.id_map)), np.sort(ads))


def test_an_export_of_a_partition_another_run_holds_is_refused_and_changes_nothing(pipeline, spark):
    lake, _, instance = pipeline
    version = lake.latest_model_version()
    versions = {t: table_version(lake.paths.table(t)) for t in (*SCORED, "gold.user_ad_candidates")}
    with partition_lock(lake.paths, "export", version, DAY, holder="dagster run other-run"):
        result = _export(lake, instance, version)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure).step_failure_data.error
    assert "is locked by another run" in str(failure.cause or failure) and "other-run" in str(failure.cause or failure)
    assert {t: table_version(lake.paths.table(t)) for t in versions} == versions


def test_two_concurrent_exports_of_a_day_end_with_exactly_one_correct_partition(pipeline, spark):
    lake, _, _ = pipeline
    version = lake.latest_model_version()
    before = {t: _content(spark, lake, t, version) for t in (*SCORED, "gold.user_ad_candidates")}
    procs = [_gem_export(lake, version) for _ in range(2)]
    results = [(p, *p.communicate(timeout=1800)) for p in procs]
    assert any(p.returncode == 0 for p, _, _ in results), [err[-2000:] for _, _, err in results]
    for p, _, err in results:  # a loser is refused by the lock, never half-way through a commit
        assert p.returncode == 0 or "is locked by another run" in err, err[-3000:]
    _partition_is_complete_and_matches(spark, lake, version, before)
    assert not list((lake.paths.staging / "score").glob("*/output")), "a run left its staging behind"


def test_a_corrupt_checkpoint_or_dangling_latest_is_refused_naming_the_fix(pipeline, tmp_path):
    from gem_model.export.checkpoint import load_model
    from gem_model.integrity import CorruptArtefactError
    from gem_model.paths import GemPaths
    from gem_model.train.manifest import read_manifest

    lake, _, _ = pipeline
    version = lake.latest_model_version()
    paths = GemPaths(tmp_path)  # a copy: the session's lake stays intact
    shutil.copytree(lake.paths.model_dir(version), paths.model_dir(version))
    directory = paths.model_dir(version)
    assert load_model(directory).version == version
    shard = max((directory / "checkpoint").glob("*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptArtefactError, match=rf"{shard.name} is corrupt: sha256 .* materialise teacher_model"):
        load_model(directory)
    shutil.rmtree(directory / "checkpoint")
    with pytest.raises(CorruptArtefactError, match=r"checkpoint is missing \(the manifest is there\)"):
        load_model(directory)
    manifest = directory / "manifest.json"
    manifest.write_text(manifest.read_text()[:100])
    with pytest.raises(CorruptArtefactError, match=r"manifest\.json is not valid JSON"):
        read_manifest(directory)
    paths.set_latest_model_version("gem-tiny-deleted")
    with pytest.raises(
        FileNotFoundError,
        match=rf"LATEST names model version 'gem-tiny-deleted', which has no "
        rf"manifest .* known versions: \['{version}'\].*gem promote VERSION",
    ):
        paths.latest_model_version()
