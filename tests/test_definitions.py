import json
import re
import subprocess
import sys
from datetime import date
from pathlib import Path

import dagster as dg
import pytest

from dagster_project.definitions import build_definitions
from dagster_project.resources.lake import LakeResource

HEAVY = ("torch", "torchrec", "fbgemm_gpu", "faiss", "pyspark", "delta", "deltalake", "duckdb", "triton")


def test_definitions_load_with_jobs_schedule_sensor_and_checks(tmp_path):
    defs = build_definitions(lake=LakeResource(home=str(tmp_path)))
    repo = defs.get_repository_def()
    assert {"build_dimensions_job", "build_features_job", "train_teacher_job", "export_job"} <= {
        j.name for j in repo.get_all_jobs()}
    assert [s.name for s in repo.schedule_defs] == ["build_features_job_schedule"]
    assert [s.name for s in repo.sensor_defs] == ["teacher_model_sensor"]
    graph = repo.asset_graph
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert {"bronze/impressions", "gold/training_examples", "teacher_model", "gold/teacher_logits",
            "indexes/ad_index"} <= keys
    labels = [k.path[-1] for k in graph.get_all_asset_keys()]  # what the lineage graph shows on each node
    assert len(labels) == len(set(labels)), sorted(labels)
    assert {"bronze/rejected_rows", "gold/index_builds"} <= keys  # reported by the steps that write them
    assert all(graph.get(k).owners and graph.get(k).code_version for k in graph.get_all_asset_keys())
    daily = graph.get(dg.AssetKey(["bronze", "impressions"])).partitions_def
    assert daily.get_partition_keys()[0] == "2026-11-01" and len(daily.get_partition_keys()) == 6
    assert len(list(graph.asset_check_keys)) >= 12


def test_runs_execute_in_process_unless_the_environment_asks_otherwise(tmp_path, monkeypatch):
    lake = LakeResource(home=str(tmp_path))
    assert build_definitions(lake=lake).resolve_job_def("build_features_job").executor_def.name == "in_process"
    monkeypatch.setenv("GEM_DAGSTER_EXECUTOR", "multiprocess")
    assert build_definitions(lake=lake).resolve_job_def("export_job").executor_def.name == "multiprocess"
    monkeypatch.setenv("GEM_DAGSTER_EXECUTOR", "celery")
    with pytest.raises(ValueError, match="GEM_DAGSTER_EXECUTOR='celery' is not one of"):
        build_definitions(lake=lake)


def test_the_code_location_loads_without_torch_faiss_or_spark(tmp_path):
    """Every Dagster process (webserver, daemon, each run worker) loads it: heavy libraries wait for the step."""
    child = (f"from dagster_project.definitions import build_definitions; "
             f"from dagster_project.resources.lake import LakeResource; "
             f"build_definitions(lake=LakeResource(home={str(tmp_path)!r})); import sys; "
             f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).parents[1])
    assert done.stdout.strip() == "[]", done.stdout


def test_sql_comments_and_quotes_do_not_split_statements():
    from jobs.lake_sql import parse_sql

    parsed = parse_sql("-- a; b\nSET VARIABLE x = 'a;b';\n/* ; */ SELECT '--; kept' AS x -- trailing; comment\nFROM t")
    assert parsed.variables == ["x"]
    assert parsed.query.strip() == "/* ; */ SELECT '--; kept' AS x -- trailing; comment\nFROM t"


def _promoted(lake: LakeResource, version: str) -> None:
    """A trained version's manifest and the LATEST pointer, as the teacher asset leaves them once promoted."""
    directory = lake.paths.model_dir(version)
    directory.mkdir(parents=True)
    (directory / "manifest.json").write_text(json.dumps({"model_version": version}))
    lake.set_latest_model_version(version)


def test_the_sensor_requests_each_promoted_version_and_day_once(tmp_path):
    lake = LakeResource(home=str(tmp_path))
    defs = build_definitions(lake=lake)
    sensor = defs.get_repository_def().get_sensor_def("teacher_model_sensor")
    job = defs.resolve_job_def("export_job")
    with dg.instance_for_test() as instance:
        def tick(cursor: str | None):
            context = dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs,
                                              resources={"lake": lake})
            return sensor.evaluate_tick(context)

        nothing = tick(None)  # no promoted model yet
        assert nothing.run_requests == [] and "no promoted model" in nothing.skip_message
        _promoted(lake, "v1")
        first = tick(None)
        assert [(r.partition_key, r.run_key) for r in first.run_requests] == [("2026-11-05", "v1:2026-11-05"),
                                                                            ("2026-11-06", "v1:2026-11-06")]
        for request in first.run_requests:
            assert dg.validate_run_config(job, request.run_config)["ops"]["scored_tables"]["config"] == {
                "model_version": "v1"}
        again = tick(first.cursor)  # the next tick: v1 was requested already
        assert again.run_requests == [] and "already requested" in again.skip_message
        # v2 is promoted; its first holdout day is already exported (both indexes published): only the second.
        _promoted(lake, "v2")
        for name in ("ads", "users"):
            directory = lake.paths.index_dir(name, "v2", date(2026, 11, 5))
            directory.mkdir(parents=True)
            (directory / "CURRENT").write_text("build-x\n")
        second = tick(again.cursor)
        assert [r.run_key for r in second.run_requests] == ["v2:2026-11-06"]


def test_descriptions_render_whole_in_the_ui(tmp_path):
    """The UI renders descriptions as Markdown, which drops a bare `<name>` as an HTML tag."""
    defs = build_definitions(lake=LakeResource(home=str(tmp_path)))
    descriptions = {spec.key.to_user_string(): spec.description or "" for spec in defs.resolve_all_asset_specs()}
    assert descriptions["reports/sql_pack"].count("`sql/<name>.sql`") == 1
    for key, text in descriptions.items():
        outside_code = re.sub(r"`[^`]*`", "", text)
        assert not re.search(r"<[A-Za-z_][\w ]*>", outside_code), f"{key}: {text!r}"


def test_code_versions_follow_the_settings_each_group_reads(tmp_path):
    from dagster_project.defs.provenance import GROUPS, code_version
    from gem_model.config import GemConfig

    base = GemConfig.from_preset("tiny")
    wider = GemConfig.from_dict({"features": {"max_seq_len": base.features.max_seq_len * 2}}, base)
    changed = {g for g, p in GROUPS.items() if code_version(base, p) != code_version(wider, p)}
    assert changed == {"features", "training"}
