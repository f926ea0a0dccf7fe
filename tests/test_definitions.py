import dagster as dg

from dagster_project.definitions import build_definitions
from dagster_project.resources.lake import LakeResource


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
            "indexes/ads"} <= keys
    daily = graph.get(dg.AssetKey(["bronze", "impressions"])).partitions_def
    assert daily.get_partition_keys()[0] == "2026-11-01" and len(daily.get_partition_keys()) == 6
    assert len(list(graph.asset_check_keys)) >= 12


def test_sql_comments_and_quotes_do_not_split_statements():
    from jobs.lake_sql import parse_sql

    parsed = parse_sql("-- a; b\nSET VARIABLE x = 'a;b';\n/* ; */ SELECT '--; kept' AS x -- trailing; comment\nFROM t")
    assert parsed.variables == ["x"]
    assert parsed.query.strip() == "/* ; */ SELECT '--; kept' AS x -- trailing; comment\nFROM t"


def test_new_teacher_requests_an_export_of_every_holdout_day_with_valid_config(tmp_path):
    lake = LakeResource(home=str(tmp_path))
    defs = build_definitions(lake=lake)
    sensor = defs.get_repository_def().get_sensor_def("teacher_model_sensor")
    with dg.instance_for_test() as instance:
        event = dg.AssetMaterialization(["teacher_model"], metadata={"model_version": "v1"})
        instance.report_runless_asset_event(event)
        requests = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=defs)).run_requests
    assert [(r.partition_key, r.run_key) for r in requests] == [("2026-11-05", "v1:2026-11-05"),
                                                                  ("2026-11-06", "v1:2026-11-06")]
    job = defs.resolve_job_def("export_job")
    for request in requests:
        assert dg.validate_run_config(job, request.run_config)["ops"]["scored_tables"]["config"] == {
            "model_version": "v1"}
