import json
import re
import subprocess
import sys
from datetime import UTC, date, datetime
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
        j.name for j in repo.get_all_jobs()
    }
    assert [s.name for s in repo.schedule_defs] == ["build_features_job_schedule"]
    assert [s.name for s in repo.sensor_defs] == ["teacher_model_sensor"]
    graph = repo.asset_graph
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert {
        "bronze/impressions",
        "gold/training_examples",
        "teacher_model",
        "gold/teacher_logits",
        "indexes/ad_index",
    } <= keys
    labels = [k.path[-1] for k in graph.get_all_asset_keys()]  # what the lineage graph shows on each node
    assert len(labels) == len(set(labels)), sorted(labels)
    assert {"bronze/rejected_rows", "gold/index_builds"} <= keys  # reported by the steps that write them
    assert all(graph.get(k).owners and graph.get(k).code_version for k in graph.get_all_asset_keys())
    daily = graph.get(dg.AssetKey(["bronze", "impressions"])).partitions_def
    yesterday = date.fromordinal(date.today().toordinal() - 1)  # the synthetic world's calendar is open-ended
    assert daily.get_partition_keys()[0] == "2026-11-01" and daily.get_partition_keys()[-1] == yesterday.isoformat()
    export = graph.get(dg.AssetKey(["gold", "teacher_logits"])).partitions_def
    assert set(export.partition_dimension_names) == {"model_version", "ds"}
    assert graph.get(dg.AssetKey("student_models")).partitions_def.name == "model_versions"
    assert len(list(graph.asset_check_keys)) >= 12


def test_the_jobs_a_missing_input_error_names_build_those_inputs(tmp_path):
    from gem_lake.features.build import BUILT_BY

    repo = build_definitions(lake=LakeResource(home=str(tmp_path))).get_repository_def()
    for table, job in BUILT_BY.items():
        assert dg.AssetKey(table.split(".")) in repo.get_job(job).asset_layer.executable_asset_keys, (table, job)


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
    child = (
        f"from dagster_project.definitions import build_definitions; "
        f"from dagster_project.resources.lake import LakeResource; "
        f"build_definitions(lake=LakeResource(home={str(tmp_path)!r})); import sys; "
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, check=True, cwd=Path(__file__).parents[3]
    )
    assert done.stdout.strip() == "[]", done.stdout


def test_sql_comments_and_quotes_do_not_split_statements():
    from gem_lake.sql.query import parse_sql

    parsed = parse_sql("-- a; b\nSET VARIABLE x = 'a;b';\n/* ; */ SELECT '--; kept' AS x -- trailing; comment\nFROM t")
    assert parsed.variables == ["x"]
    assert parsed.query.strip() == "/* ; */ SELECT '--; kept' AS x -- trailing; comment\nFROM t"


def _promoted(lake: LakeResource, version: str) -> None:
    """A trained version's manifest and the LATEST pointer, as the teacher asset leaves them once promoted."""
    directory = lake.paths.model_dir(version)
    directory.mkdir(parents=True)
    (directory / "manifest.json").write_text(json.dumps({"model_version": version}))
    lake.set_latest_model_version(version)


def test_the_sensor_requests_each_missing_version_and_day(tmp_path):
    lake = LakeResource(home=str(tmp_path))
    defs = build_definitions(lake=lake)
    sensor = defs.get_repository_def().get_sensor_def("teacher_model_sensor")
    with dg.instance_for_test() as instance:

        def tick():
            # With the instance's ref, as the daemon builds it: the tick's new partitions count when its runs resolve.
            with dg.build_sensor_context(
                instance_ref=instance.get_ref(), definitions=defs, resources={"lake": lake}
            ) as context:
                result = sensor.evaluate_tick(context)
            for request in result.dynamic_partitions_requests or []:
                instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
            return result

        nothing = tick()  # no promoted model yet
        assert nothing.run_requests == [] and "no promoted model" in nothing.skip_message
        _promoted(lake, "v1")  # promoted by hand (gem promote): the sensor makes it a partition
        first = tick()
        assert [(r.partition_key, r.run_key) for r in first.run_requests] == [
            ("2026-11-05|v1", "v1:2026-11-05"),
            ("2026-11-06|v1", "v1:2026-11-06"),
        ]
        assert instance.get_dynamic_partitions("model_versions") == ["v1"]
        # v2 is promoted; its first holdout day is already exported (both indexes published): only the second.
        _promoted(lake, "v2")
        for name in ("ads", "users"):
            directory = lake.paths.index_dir(name, "v2", date(2026, 11, 5))
            directory.mkdir(parents=True)
            (directory / "CURRENT").write_text("build-x\n")
        assert [r.run_key for r in tick().run_requests] == ["v2:2026-11-06"]
        # The daily schedule built a day after the configured calendar: it is exported with the promoted model.
        instance.report_runless_asset_event(
            dg.AssetMaterialization(["gold", "training_examples"], partition="2026-11-07")
        )
        assert [r.run_key for r in tick().run_requests] == ["v2:2026-11-06", "v2:2026-11-07"]
        assert instance.get_dynamic_partitions("model_versions") == ["v1", "v2"]


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


def test_the_daily_schedule_builds_the_day_that_just_ended(tmp_path):
    defs = build_definitions(lake=LakeResource(home=str(tmp_path)))
    schedule = defs.get_repository_def().get_schedule_def("build_features_job_schedule")
    tick = datetime(2026, 12, 3, 1, 0, tzinfo=UTC)
    with dg.instance_for_test() as instance:
        result = schedule.evaluate_tick(dg.build_schedule_context(instance=instance, scheduled_execution_time=tick))
    assert [r.partition_key for r in result.run_requests] == ["2026-12-02"]  # weeks after the configured days


def test_a_real_datasets_calendar_ends_with_its_days(tmp_path):
    overrides = tmp_path / "overrides.json"
    overrides.write_text(json.dumps({"data": {"source": "criteo"}}))
    defs = build_definitions(lake=LakeResource(home=str(tmp_path), config_path=str(overrides)))
    daily = defs.get_repository_def().asset_graph.get(dg.AssetKey(["bronze", "events"])).partitions_def
    assert daily.get_partition_keys() == [f"2026-11-0{d}" for d in range(1, 7)]
