"""End to end: the whole asset graph at tiny scale (the session's `pipeline` lake, tests/conftest.py)."""

import json
import math
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import faiss
import numpy as np
import pytest
from pyspark.sql import functions as F

from dagster_project.resources.launchers import LocalTorchrunLauncher
from gem_lake.delta import read_table, table_rows
from gem_lake.table_contract import CONTRACT, schema_violations
from gem_model.config import GemConfig
from gem_model.data.loader import ds_filter, open_delta
from gem_model.export.index import read_index
from gem_model.export.scoring import read_embeddings

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.dist]


def _rejected(spark, lake, table, day=None):
    df = read_table(spark, lake.paths.table("bronze.rejected_rows")).where(F.col("source_table") == table)
    return df.where(F.col("source_partition") == day).count() if day else df.count()


def test_every_table_meets_its_contract_with_expected_rows(pipeline, spark):
    lake, _, _ = pipeline
    cfg = lake.config
    rejected_impressions = _rejected(spark, lake, "bronze.impressions")
    assert 0 < rejected_impressions < 0.01 * 4 * 3000  # the world's injected malformed rows, ~0.2 %
    accepted = 4 * 3000 - rejected_impressions
    holdout_days = ("2026-11-03", "2026-11-04")
    holdout = sum(3000 - _rejected(spark, lake, "bronze.impressions", day) for day in holdout_days)
    expected = {
        "bronze.users": cfg.world.n_users,
        "bronze.ads": cfg.world.n_ads,
        "bronze.impressions": accepted,
        "silver.user_features": cfg.world.n_users,
        "silver.ad_features": cfg.world.n_ads,
        "gold.training_examples": accepted,
        "gold.teacher_logits": holdout,
        "gold.user_embeddings": 2 * cfg.world.n_users,
        "gold.ad_embeddings": 2 * cfg.world.n_ads,
        # 6 predictors (teacher, adapted teacher, 4 students) x (all + 5 surfaces) x 2 tasks
        "gold.student_metrics": 72,
        "gold.user_ad_candidates": 2 * cfg.world.n_users * min(cfg.export.candidates_k, cfg.world.n_ads),
        "gold.index_builds": 4,
    }
    for table in CONTRACT:
        df = read_table(spark, lake.paths.table(table))
        assert schema_violations(table, {f.name: f.dataType.simpleString() for f in df.schema.fields}) == []
        if "model_version" in df.columns:  # test_export_e2e exports a second version beside the teacher
            df = df.where(F.col("model_version") == lake.latest_model_version())
        if table in expected:
            assert df.count() == expected[table], table
    emb = read_table(spark, lake.paths.table("gold.ad_embeddings")).first()["embedding"]
    assert len(emb) == cfg.model.repr_dim and abs(sum(x * x for x in emb) - 1) < 1e-4


def test_bronze_conserves_rows_and_sequences_are_point_in_time(pipeline, spark):
    from gem_lake.features.quality import sequence_stats, timeline_stats
    from gem_lake.features.tables import impression_sequences
    from gem_lake.sources.world import Source

    lake, _, _ = pipeline
    spec = lake.config.features
    raw = sum(Source(spark, lake.config).events(d).count() for d in lake.config.world.days)
    assert read_table(spark, lake.paths.table("bronze.events")).count() + _rejected(spark, lake, "bronze.events") == raw
    examples = read_table(spark, lake.paths.table("gold.training_examples"))
    timelines = read_table(spark, lake.paths.table("gold.user_timelines"))
    stats = timeline_stats(timelines, spec.max_seq_len)
    assert stats.point_in_time and stats.impressions == examples.count()  # each impression once, per user
    own = sequence_stats(impression_sequences(timelines, spec), spec.max_seq_len)  # each impression's, before `ts`
    assert own.point_in_time and own.rows == examples.count()
    assert own.p99 >= 10 * max(own.p50, 1)  # heavy-tailed, capped at max_seq_len


def test_model_manifest_has_finite_holdout_metrics(pipeline):
    lake, _, _ = pipeline
    manifest = json.loads((lake.paths.model_dir(lake.latest_model_version()) / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and manifest["training_data"]["holdout_days"] == ["2026-11-03", "2026-11-04"]
    assert isinstance(manifest["training_data"]["delta_version"], int)
    for task in ("ctr", "cvr"):
        for name in ("auc", "ne", "calibration", "oracle_auc", "oracle_ne"):
            assert math.isfinite(manifest["metrics"][f"{task}/{name}"])
    assert manifest["metrics"]["ctr/auc"] > 0.55  # learns the interest/category signal


def test_each_day_has_its_own_index_holding_that_partition(pipeline):
    lake, _, _ = pipeline
    version = lake.latest_model_version()
    holdout = [d for d in lake.config.world.days if d >= lake.config.world.holdout_start]
    for day in holdout:
        for name, table, column in (
            ("ads", "gold.ad_embeddings", "ad_id"),
            ("users", "gold.user_embeddings", "user_id"),
        ):
            index, manifest = read_index(lake.paths.index_dir(name, version, day))
            ids, vectors = read_embeddings(lake.paths, table, column, version, day)
            assert (manifest["model_version"], manifest["ds"]) == (version, day.isoformat())
            assert index.ntotal == manifest["row_count"] == len(ids)
            assert manifest["recall_at_10"] >= lake.config.index.min_recall
            assert np.array_equal(np.sort(faiss.vector_to_array(index.id_map)), np.sort(ids))  # that day's rows
            scores, _ = index.search(vectors[:5], 1)  # each unit vector's best inner product is with itself
            assert np.allclose(scores[:, 0], 1.0, atol=1e-4)


def test_asset_checks_all_passed(pipeline):
    _, _, instance = pipeline
    import dagster as dg

    evaluations = [
        e
        for e in instance.get_event_records(
            dg.EventRecordsFilter(event_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
        )
    ]
    assert len(evaluations) >= 10
    failed = [
        e.event_log_entry.dagster_event.event_specific_data
        for e in evaluations
        if not e.event_log_entry.dagster_event.event_specific_data.passed
    ]
    assert failed == []


def _fingerprints(spark, lake):
    """Row count and an order-independent content hash of every feature table."""
    out = {}
    for table in (
        "bronze.events",
        "bronze.impressions",
        "bronze.rejected_rows",
        "gold.user_sequences",
        "gold.training_examples",
    ):
        df = read_table(spark, lake.paths.table(table))
        out[table] = tuple(df.agg(F.count(F.lit(1)), F.sum(F.xxhash64(*df.columns).cast("decimal(38,0)"))).first())
    return out


def test_rerunning_a_feature_day_gives_identical_contents(pipeline, spark):
    lake, defs, instance = pipeline
    before = _fingerprints(spark, lake)
    assert (
        defs.resolve_job_def("build_features_job")
        .execute_in_process(instance=instance, partition_key="2026-11-02")
        .success
    )
    assert _fingerprints(spark, lake) == before


def test_gem_sql_reads_the_lake(pipeline, capsys):
    from jobs.cli import main

    lake, _, _ = pipeline
    version = lake.latest_model_version()
    main(
        [
            "sql",
            "-e",
            f"SELECT count(*) AS n FROM gold.teacher_logits WHERE model_version = '{version}'",
            "--format",
            "json",
        ]
    )
    n = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["n"]
    assert 5800 < n <= 6000  # the two holdout days' accepted impressions
    main(["neighbors", "--user-id", "1", "--k", "3"])
    out = capsys.readouterr().out
    assert "rank" in out and "(3 rows)" in out


@pytest.mark.parametrize("query", sorted(p.name for p in (Path(__file__).parents[2] / "sql").glob("*.sql")))
def test_every_sql_query_returns_rows(pipeline, capsys, query):
    from jobs.cli import main

    main(["sql", str(Path(__file__).parents[2] / "sql" / query), "--format", "json"])
    rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines() if line.startswith("{")]
    assert rows, query
    if query == "top_ads_for_user.sql":
        assert [r["rank"] for r in rows] == list(range(1, 11))
        assert all(a["score"] >= b["score"] for a, b in zip(rows, rows[1:]))


def _train_command(lake, config_file: Path, model_dir: Path, data_version: int) -> list[str]:
    data = lake.paths.table("gold.user_timelines")
    args = [
        "--config",
        str(config_file),
        "--data",
        str(data),
        "--data-version",
        str(data_version),
        "--model-dir",
        str(model_dir),
    ]
    return LocalTorchrunLauncher().command("jobs.train", args, nproc=2)


def test_killed_training_resumes_to_the_metrics_of_an_uninterrupted_run(pipeline, tmp_path):
    """SIGKILL both ranks after their first checkpoint, re-launch, and land on the teacher's exact metrics.

    Checkpointing does not change the arithmetic, so the pipeline's teacher (same model, data,
    seeds; no mid-run checkpoint) is the uninterrupted run.
    """
    lake, _, _ = pipeline
    teacher = json.loads((lake.paths.model_dir(lake.latest_model_version()) / "manifest.json").read_text())
    cfg = GemConfig.from_dict({"train": {"checkpoint_every_steps": 10}}, base=lake.config)
    config_file = tmp_path / "config.json"
    config_file.write_text(cfg.to_json())
    model_dir = lake.paths.model_dir("resume-test")
    # The teacher's Delta version: later tests rewrite partitions, which renames files and so reorders them.
    command = _train_command(lake, config_file, model_dir, teacher["training_data"]["delta_version"])
    env = LocalTorchrunLauncher().environment(nproc=2)
    first = subprocess.Popen(
        command, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    resume_dir = model_dir.with_name(model_dir.name + ".partial") / "resume"
    deadline = time.monotonic() + 1800  # a run stuck before its first checkpoint, not a slow one
    while not list(resume_dir.glob("step-*/progress.json")) and first.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint within 30 minutes"
        time.sleep(0.05)
    # torchrun starts each worker in its own session: kill the workers and the agent, as a lost node would.
    workers = Path(f"/proc/{first.pid}/task/{first.pid}/children").read_text().split()
    for pid in [*map(int, workers), first.pid]:
        os.kill(pid, signal.SIGKILL)
    first.wait()
    assert not (model_dir / "manifest.json").exists(), "the run finished before it could be killed"
    second = subprocess.run(command, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr[-3000:]
    assert re.search(r"resumed from .*step-\d+ \(epoch \d, step [1-9]\d*\)", second.stdout), second.stdout[-2000:]
    resumed = json.loads((model_dir / "manifest.json").read_text())
    assert resumed["epoch_losses"] == pytest.approx(teacher["epoch_losses"], rel=1e-5)
    for key in ("ctr/auc", "ctr/ne", "cvr/auc", "cvr/ne", "feed/ctr/auc"):
        assert resumed["metrics"][key] == pytest.approx(teacher["metrics"][key], abs=1e-5), key
    assert not (model_dir.with_name(model_dir.name + ".partial")).exists()


def test_a_training_window_trains_on_its_last_days_alone(pipeline, tmp_path):
    lake, _, _ = pipeline
    teacher = json.loads((lake.paths.model_dir(lake.latest_model_version()) / "manifest.json").read_text())
    data_version = teacher["training_data"]["delta_version"]
    cfg = GemConfig.from_dict({"train": {"window_days": 1, "epochs": 1}}, base=lake.config)
    config_file = tmp_path / "config.json"
    config_file.write_text(cfg.to_json())
    model_dir = lake.paths.model_dir("window-test")
    run = subprocess.run(
        _train_command(lake, config_file, model_dir, data_version),
        env=LocalTorchrunLauncher().environment(nproc=2),
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    day, holdout = cfg.train_start, cfg.world.holdout_start
    days = teacher["training_data"]["train_days"]
    assert str(day) == days[-1] != days[0]  # the window is the last of several training days
    impressions = open_delta(lake.paths.table("gold.user_timelines"), data_version).to_table(
        columns=["impression_count"], filter=ds_filter(day, holdout)
    )
    rows = sum(impressions.column("impression_count").to_pylist())
    assert rows > 0
    assert f"{rows} training impressions from {day} to before {holdout}," in run.stdout
    manifest = json.loads((model_dir / "manifest.json").read_text())
    assert manifest["training_data"]["train_days"] == [str(day)]
    assert manifest["training_data"]["holdout_days"] == teacher["training_data"]["holdout_days"]
    assert all(math.isfinite(manifest["metrics"][k]) for k in ("ctr/auc", "ctr/ne", "cvr/auc", "cvr/ne"))


def test_students_train_on_the_first_holdout_day_and_are_evaluated_on_the_last(pipeline, spark):
    from gem_model.distill.artefact import read_student_manifest, student_version

    lake, defs, instance = pipeline
    version = lake.latest_model_version()
    directory = lake.paths.student_dir(student_version(lake.config, version))
    manifest = read_student_manifest(directory)
    assert {k: manifest["calendar"][k] for k in ("train", "adapter", "eval")} == {
        "train": ["2026-11-03"],
        "adapter": ["2026-11-03"],
        "eval": ["2026-11-04"],
    }
    assert manifest["teacher"]["model_version"] == version
    surfaces = lake.config.world.surfaces
    for predictor in ("labels", "kd", "adapter", "teacher", "teacher_adapted"):
        for scope in ("", *(f"{s}/" for s in surfaces)):
            for metric in ("ctr/ne", "ctr/auc"):
                assert math.isfinite(manifest["metrics"][f"{predictor}/{scope}{metric}"]), (predictor, scope)
    assert len(list(directory.glob("students/*/*.pt"))) == 3 * len(surfaces)
    logits = read_table(spark, lake.paths.table("gold.teacher_logits")).where(F.col("model_version") == version)
    for split, day in (("train", "2026-11-03"), ("eval", "2026-11-04")):
        rows = logits.where(F.col("ds") == day).groupBy("surface").count().collect()
        assert {r["surface"]: r["count"] for r in rows} == {s: manifest["rows"][s][split] for s in surfaces}, split
    before = read_table(spark, lake.paths.table("gold.student_metrics")).count()
    assert (
        defs.resolve_job_def("train_students_job").execute_in_process(instance=instance, partition_key=version).success
    )
    assert read_table(spark, lake.paths.table("gold.student_metrics")).count() == before
    assert [p.name for p in directory.parent.iterdir()] == [directory.name]


def test_the_report_asset_ran_every_query_of_the_sql_pack(pipeline):
    import dagster as dg

    _, _, instance = pipeline
    event = instance.get_latest_materialization_event(dg.AssetKey(["reports", "sql_pack"]))
    metadata = event.asset_materialization.metadata
    queries = sorted(p.stem for p in (Path(__file__).parents[2] / "sql").glob("*.sql"))
    assert metadata["queries_skipped"].value == {} and metadata["queries_run"].value == len(queries) >= 8
    assert all(metadata[f"{q}/rows"].value > 0 for q in queries)


def test_a_partitions_metadata_shows_its_rows_the_tables_and_the_key_columns(pipeline, spark):
    import dagster as dg

    lake, _, instance = pipeline
    event = instance.get_latest_materialization_event(dg.AssetKey(["bronze", "impressions"]))
    metadata = event.asset_materialization.metadata
    day = event.asset_materialization.partition
    table = read_table(spark, lake.paths.table("bronze.impressions"))
    assert metadata["dagster/row_count"].value == table.where(F.col("ds") == F.lit(day)).count()
    assert metadata["table_rows"].value == table.count() > metadata["dagster/row_count"].value
    columns = {c.name: c for c in metadata["dagster/column_schema"].value.columns}
    assert not columns["impression_id"].constraints.nullable
    assert columns["impression_id"].description.startswith("key: ")  # from the table contract
    assert all(c.description for c in columns.values()), [c.name for c in columns.values() if not c.description]
    assert columns["surface"].constraints.nullable


def test_the_ui_shows_which_version_exists_for_which_day_and_the_reports_beside_the_tables(pipeline):
    import dagster as dg

    lake, _, instance = pipeline
    version = lake.latest_model_version()
    holdout = {d.isoformat() for d in lake.config.world.days if d >= lake.config.world.holdout_start}

    def of_version(partitions):
        """Days, no partition, and `version`'s partitions: other test modules export more versions into the
        session's instance."""
        return {
            p
            for p in partitions
            if p is None or re.fullmatch(r"\d{4}-\d{2}-\d{2}", p) or version in (p, p.split("|")[-1])
        }

    assert version in instance.get_dynamic_partitions("model_versions")
    for asset in (["gold", "teacher_logits"], ["indexes", "ad_index"], ["gold", "user_ad_candidates"]):
        assert of_version(instance.get_materialized_partitions(dg.AssetKey(asset))) == {
            f"{d}|{version}" for d in holdout
        }
    assert of_version(instance.get_materialized_partitions(dg.AssetKey("student_models"))) == {version}
    # Checks are tied to the partition they checked.
    checked: dict[tuple[str, str], set[str | None]] = {}
    for record in instance.get_event_records(
        dg.EventRecordsFilter(event_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION)
    ):
        evaluation = record.event_log_entry.dagster_event.event_specific_data
        checked.setdefault((evaluation.asset_key.to_user_string(), evaluation.check_name), set()).add(
            evaluation.partition
        )
    checked = {check: of_version(partitions) for check, partitions in checked.items()}
    days = {d.isoformat() for d in lake.config.world.days}
    assert checked[("bronze/events", "row_conservation")] == checked[("gold/training_examples", "contract")] == days
    assert (
        checked[("gold/teacher_logits", "contract")]
        == checked[("indexes/ad_index", "recall_floor")]
        == {f"{d}|{version}" for d in holdout}
    )
    assert checked[("student_models", "finite_metrics")] == {version}
    assert checked[("bronze/users", "contract")] == checked[("teacher_model", "holdout_metrics")] == {None}
    teacher = instance.get_latest_materialization_event(dg.AssetKey("teacher_model")).asset_materialization
    baselines = teacher.metadata["baselines"].value.splitlines()
    assert baselines[0].startswith("| metric | this model |") and "oracle" in baselines[0]
    assert any(row.startswith("| ctr AUC |") for row in baselines)
    # The quarantine and the index builds are assets too, reported to by the steps that write them.
    for table in ("bronze.rejected_rows", "gold.index_builds"):
        reported = instance.get_latest_materialization_event(dg.AssetKey(table.split("."))).asset_materialization
        assert reported.metadata["table_rows"].value == table_rows(lake.paths.table(table)) > 0, table


def test_a_day_after_the_calendar_is_built_by_the_schedule_and_exported_with_the_promoted_model(
    pipeline, spark, tmp_path, monkeypatch
):
    import shutil
    from datetime import UTC, datetime, timedelta

    import dagster as dg

    from dagster_project.definitions import build_definitions
    from dagster_project.resources.lake import LakeResource

    lake, _, _ = pipeline
    home = tmp_path / "gem"  # a copy: the session's lake stays as the pipeline left it
    shutil.copytree(lake.home, home)
    monkeypatch.setenv("GEM_HOME", str(home))
    copy = LakeResource(home=str(home), preset="tiny", config_path=lake.config_path)
    defs, version = build_definitions(lake=copy), copy.latest_model_version()
    day = lake.config.world.days[-1] + timedelta(days=1)
    repository = defs.get_repository_def()
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("model_versions", [version])
        at = datetime.combine(day + timedelta(days=1), datetime.min.time(), UTC).replace(hour=1)
        tick = repository.get_schedule_def("build_features_job_schedule").evaluate_tick(
            dg.build_schedule_context(instance=instance, scheduled_execution_time=at)
        )
        assert [r.partition_key for r in tick.run_requests] == [day.isoformat()]
        assert (
            defs.resolve_job_def("build_features_job")
            .execute_in_process(instance=instance, partition_key=day.isoformat())
            .success
        )
        with dg.build_sensor_context(
            instance_ref=instance.get_ref(), definitions=defs, resources={"lake": copy}
        ) as context:
            [request] = repository.get_sensor_def("teacher_model_sensor").evaluate_tick(context).run_requests
        assert request.run_key == f"{version}:{day.isoformat()}"  # the holdout days were exported already
        assert (
            defs.resolve_job_def("export_job")
            .execute_in_process(instance=instance, partition_key=request.partition_key)
            .success
        )
    logits = read_table(spark, copy.paths.table("gold.teacher_logits"))
    examples = read_table(spark, copy.paths.table("gold.training_examples")).where(F.col("ds") == F.lit(day))
    assert (
        logits.where((F.col("ds") == F.lit(day)) & (F.col("model_version") == version)).count() == examples.count() > 0
    )
    assert (copy.paths.index_dir("ads", version, day) / "CURRENT").is_file()
