"""The SQL pack (sql/*.sql) and the reports/sql_pack asset over a tiny hand-made lake.

The lake is written directly with Spark, as the pipeline writes it (contract schemas, a few rows, values
picked so that every expected number below is worked out by hand in its comment), and queried through
`gem_lake.sql.query` (DuckDB): two teacher versions, `m-old` trained on 2026-11-01 and `m-new` on
2026-11-01..02, both scoring 2026-11-02..03; gold.training_examples is committed one day at a time,
so its Delta versions are 0..3 for 2026-11-01..04.
"""

import json
import math
import shutil
from collections.abc import Iterator
from datetime import date, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest

from dagster_project.defs.reports.assets import ReportQueryError, run_report_queries, sql_pack
from dagster_project.resources.lake import LakeResource
from gem_lake.sql.query import LakeSQL, referenced_tables
from gem_lake.table_contract import CONTRACT
from gem_model.paths import GemPaths

pytestmark = pytest.mark.spark
SQL_DIR = Path(__file__).parents[3] / "sql"
D1, D2, D3, D4 = (date(2026, 11, d) for d in (1, 2, 3, 4))
LN3 = math.log(3)  # sigmoid(ln 3) = 0.75, sigmoid(-ln 3) = 0.25

# impression_id, ds, user_id, ad_id, surface, clicked, converted
IMPRESSIONS = [
    ("i0", D1, 1, 10, "feed", False, False),
    ("i1", D2, 1, 10, "feed", True, True),
    ("i2", D2, 2, 11, "feed", True, False),
    ("i3", D2, 3, 10, "feed", False, False),
    ("i4", D2, 4, 11, "feed", False, False),
    ("i5", D2, 1, 12, "stories", True, False),
    ("i6", D2, 2, 12, "stories", False, False),
    ("i7", D3, 1, 10, "feed", True, True),
    ("i8", D3, 5, 12, "stories", False, False),  # user 5 has no embedding
    ("i9", D4, 2, 11, "feed", True, False),  # newest data day, not scored
]
MODELS = {  # version: (created_at, architecture, training Delta version, train days, holdout days)
    "m-old": ("2026-11-04T00:00:00.000000+00:00", "dlrm", 1, [D1], [D2, D3]),
    "m-new": ("2026-11-05T00:00:00.000000+00:00", "gem", 2, [D1, D2], [D3]),
}


def _frame(spark, table: str, rows: list[dict]):
    columns = CONTRACT[table].columns
    schema = ", ".join(f"`{c}` {t}" for c, t in columns.items())
    return spark.createDataFrame([tuple(r.get(c) for c in columns) for r in rows], schema)


def _write(spark, paths: GemPaths, table: str, rows: list[dict], replace_where: str | None = None) -> None:
    writer = _frame(spark, table, rows).coalesce(1).write.format("delta").mode("overwrite")
    if replace_where:
        writer = writer.option("replaceWhere", replace_where)
    writer.partitionBy(*CONTRACT[table].partitioned_by).save(str(paths.table(table)))


def _manifest(
    paths: GemPaths,
    version: str,
    created_at: str,
    architecture: str,
    data_version: int,
    train_days: list[date],
    holdout_days: list[date],
) -> None:
    directory = paths.model_dir(version)
    (directory / "checkpoint").mkdir(parents=True)
    (directory / "manifest.json").write_text(
        json.dumps(
            {
                "model_version": version,
                "created_at": created_at,
                "world_size": 2,
                "train_seconds": 1.5,
                "config": {"preset": "tiny", "data": {"source": "synthetic"}, "model": {"architecture": architecture}},
                "training_data": {
                    "table": "gold.training_examples",
                    "path": str(paths.table("gold.training_examples")),
                    "delta_version": data_version,
                    "train_days": [str(d) for d in train_days],
                    "holdout_days": [str(d) for d in holdout_days],
                },
                "metrics": {"ctr/auc": 0.7, "ctr/ne": 0.9, "cvr/auc": 0.6, "feed/ctr/auc": 0.65},
            },
            indent=2,
        )
    )


def _logits(version: str) -> list[dict]:
    """m-new: ctr_logit ln 3 on feed, -ln 3 on stories, cvr_logit ln 3; m-old: ctr_logit 0.5 lower, cvr_logit 0."""
    rows = []
    for impression_id, ds, user_id, ad_id, surface, _, _ in IMPRESSIONS:
        if ds in (D2, D3):
            ctr = LN3 if surface == "feed" else -LN3
            rows.append(
                {
                    "impression_id": impression_id,
                    "user_id": user_id,
                    "ad_id": ad_id,
                    "surface": surface,
                    "ds": ds,
                    "model_version": version,
                    "ctr_logit": ctr if version == "m-new" else ctr - 0.5,
                    "cvr_logit": LN3 if version == "m-new" else 0.0,
                }
            )
    return rows


def _embeddings(id_column: str, vectors: dict[tuple[str, date], dict[int, list[float]]]) -> list[dict]:
    return [
        {id_column: i, "model_version": v, "ds": ds, "embedding": e}
        for (v, ds), by_id in vectors.items()
        for i, e in by_id.items()
    ]


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory) -> GemPaths:
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "2")  # a few rows: fewer tasks, a faster module
    paths = GemPaths(tmp_path_factory.mktemp("sql_pack") / "gem")
    impressions = [
        {
            "impression_id": i,
            "ds": ds,
            "ts": datetime.combine(ds, datetime.min.time()) + timedelta(hours=n),
            "user_id": u,
            "ad_id": a,
            "surface": s,
            "clicked": c,
            "converted": v,
            "position": 1,
        }
        for n, (i, ds, u, a, s, c, v) in enumerate(IMPRESSIONS)
    ]
    _write(spark, paths, "bronze.impressions", impressions)
    _write(
        spark,
        paths,
        "bronze.events",
        [{"user_id": 1, "item_id": 10, "action": "click", "surface": "feed", "ts": datetime(2026, 11, 1, 9), "ds": D1}],
    )
    for day in (D1, D2, D3, D4):  # one commit per day, as the pipeline writes them: Delta versions 0..3
        _write(
            spark,
            paths,
            "gold.training_examples",
            [r for r in impressions if r["ds"] == day],
            replace_where=f"ds = DATE'{day}'",
        )
    _write(spark, paths, "gold.teacher_logits", _logits("m-old") + _logits("m-new"))
    _write(spark, paths, "silver.user_features", [{"user_id": u, "user_id_idx": u} for u in (1, 2, 3, 4)])
    _write(spark, paths, "silver.ad_features", [{"ad_id": a, "ad_id_idx": a} for a in (10, 11, 12)])
    _write(
        spark,
        paths,
        "gold.user_embeddings",
        _embeddings(
            "user_id",
            {
                ("m-old", D2): {1: [1.0, 0.0], 2: [1.0, 0.0], 3: [1.0, 0.0]},
                ("m-old", D3): {1: [0.0, 1.0], 2: [1.0, 0.0]},
                ("m-new", D3): {1: [0.8, 0.6], 2: [1.0, 0.0], 3: [1.0, 0.0], 4: [1.0, 0.0], 99: [1.0, 0.0]},
            },
        ),
    )
    _write(
        spark,
        paths,
        "gold.ad_embeddings",
        _embeddings(
            "ad_id",
            {
                ("m-old", D2): {10: [1.0, 0.0], 11: [0.0, 1.0]},
                ("m-old", D3): {10: [1.0, 0.0], 11: [0.0, 1.0]},
                ("m-new", D3): {10: [1.0, 0.0], 11: [0.6, 0.8], 12: [0.0, 1.0]},
            },
        ),
    )
    build = {
        "factory": "Flat",
        "configured_factory": "HNSW32",
        "dimension": 2,
        "k": 10,
        "queries_per_second": 1e4,
        "build_seconds": 0.1,
        "sha256": "0" * 64,
    }
    _write(
        spark,
        paths,
        "gold.index_builds",
        [
            {
                **build,
                "index_name": "ads",
                "model_version": "m-old",
                "ds": D2,
                "row_count": 2,
                "recall_at_k": 0.9,
                "created_at": datetime(2026, 11, 4, 1),
            },
            {
                **build,
                "index_name": "ads",
                "model_version": "m-new",
                "ds": D3,
                "row_count": 3,
                "recall_at_k": 0.95,
                "created_at": datetime(2026, 11, 5, 1),
            },
            {
                **build,
                "index_name": "users",
                "model_version": "m-new",
                "ds": D3,
                "row_count": 5,
                "recall_at_k": 1.0,
                "created_at": datetime(2026, 11, 5, 1),
            },
        ],
    )
    for version, spec in MODELS.items():
        _manifest(paths, version, *spec)
    _manifest(paths, "m-wip.partial", "2026-11-06T00:00:00+00:00", "gem", 3, [D1], [D2])  # mid-rename: not a model
    paths.set_latest_model_version("m-new")
    spark.conf.set("spark.sql.shuffle.partitions", partitions)
    return paths


@pytest.fixture(scope="module")
def sql(lake) -> Iterator[LakeSQL]:
    with LakeSQL(lake) as session:
        yield session


def _rows(sql: LakeSQL, text: str, **variables: object) -> list[dict]:
    relation = sql.query(text, {k: str(v) for k, v in variables.items()})
    return [dict(zip(relation.columns, row)) for row in relation.fetchall()]


def _query(sql: LakeSQL, name: str, **variables: object) -> list[dict]:
    return _rows(sql, (SQL_DIR / f"{name}.sql").read_text(), **variables)


@pytest.mark.slow
def test_calibration_per_surface_task_and_day(sql):
    rows = {(r["model_version"], r["ds"], r["surface"], r["task"]): r for r in _query(sql, "calibration_by_surface")}
    # m-new, 2026-11-02, feed (i1..i4): P(click) 0.75 vs 2 clicks in 4; P(conv | click) 0.75 vs 1 of the 2
    # clicks; P(conv | impression) 0.75 * 0.75 = 0.5625 vs 1 in 4.
    feed = {task: rows[("m-new", D2, "feed", task)] for task in ("ctr", "cvr", "ctcvr")}
    assert (feed["ctr"]["examples"], feed["ctr"]["positives"], feed["cvr"]["examples"]) == (4, 2, 2)
    assert feed["ctr"]["predicted_rate"] == pytest.approx(0.75) and feed["ctr"]["observed_rate"] == 0.5
    assert feed["ctr"]["calibration"] == pytest.approx(1.5)
    assert feed["cvr"]["calibration"] == pytest.approx(1.5)
    assert feed["ctcvr"]["predicted_rate"] == pytest.approx(0.5625)
    assert feed["ctcvr"]["calibration"] == pytest.approx(2.25)
    # stories: P(click) 0.25 vs 1 in 2; its one click did not convert: no positives, no ratio.
    assert rows[("m-new", D2, "stories", "ctr")]["calibration"] == pytest.approx(0.5)
    assert rows[("m-new", D2, "stories", "cvr")]["positives"] == 0
    assert rows[("m-new", D2, "stories", "cvr")]["calibration"] is None
    # all surfaces: (4 * 0.75 + 2 * 0.25) / 6 predicted vs 3 clicks in 6.
    assert rows[("m-new", D2, "all", "ctr")]["calibration"] == pytest.approx((3.5 / 6) / 0.5)
    assert {(v, ds) for v, ds, _, _ in rows} == {("m-old", D2), ("m-old", D3), ("m-new", D2), ("m-new", D3)}


def test_label_rates_by_surface(sql):
    rows = {(r["ds"], r["surface"]): r for r in _query(sql, "label_rates_by_surface")}
    assert (rows[(D2, "feed")]["impressions"], rows[(D2, "feed")]["clicks"], rows[(D2, "feed")]["conversions"]) == (
        4,
        2,
        1,
    )
    assert rows[(D2, "all")]["ctr"] == 0.5 and rows[(D2, "all")]["cvr_given_click"] == pytest.approx(1 / 3)
    assert rows[(D1, "feed")]["cvr_given_click"] is None  # no clicks that day


def test_top_ads_for_user_is_exact_search_of_the_newest_version(sql):
    # m-new on 2026-11-03, user 1 = [0.8, 0.6]: ad 11 0.96, ad 10 0.8, ad 12 0.6.
    rows = _query(sql, "top_ads_for_user")
    assert [(r["model_version"], r["ds"], r["user_id"], r["rank"], r["ad_id"]) for r in rows] == [
        ("m-new", D3, 1, 1, 11),
        ("m-new", D3, 1, 2, 10),
        ("m-new", D3, 1, 3, 12),
    ]
    assert [r["score"] for r in rows] == pytest.approx([0.96, 0.8, 0.6])
    # m-old's latest day with user 1 is 2026-11-03 ([0, 1]): ad 11 scores 1, ad 10 scores 0.
    older = _query(sql, "top_ads_for_user", for_model_version="m-old", top_k=1)
    assert [(r["ds"], r["ad_id"], r["score"]) for r in older] == [(D3, 11, 1.0)]


def test_embedding_coverage_and_freshness(sql):
    rows = {(r["model_version"], r["entity"]): r for r in _query(sql, "embedding_coverage")}
    got = {
        k: (r["days_exported"], r["latest_ds"], r["embedded"], r["covered"], r["known"], r["days_behind"])
        for k, r in rows.items()
    }
    # silver knows users 1-4 and ads 10-12; the newest training day is 2026-11-04, one after every export.
    assert got == {
        ("m-old", "user"): (2, D3, 2, 2, 4, 1),
        ("m-old", "ad"): (2, D3, 2, 2, 3, 1),
        ("m-new", "user"): (1, D3, 5, 4, 4, 1),
        ("m-new", "ad"): (1, D3, 3, 3, 3, 1),
    }
    assert rows[("m-old", "user")]["coverage"] == 0.5 and rows[("m-new", "user")]["coverage"] == 1.0
    assert list(rows)[:2] == [("m-new", "user"), ("m-new", "ad")]  # newest model first


def test_teacher_logit_shift_between_the_two_newest_versions(sql):
    rows = {(r["surface"], r["logit"]): r for r in _query(sql, "teacher_logit_shift")}
    ctr = rows[("all", "ctr_logit")]
    assert (ctr["version_a"], ctr["version_b"], ctr["impressions"]) == ("m-old", "m-new", 8)
    # b = a + 0.5 on every impression; 5 feed (ln 3) and 3 stories (-ln 3) impressions in b.
    assert ctr["mean_diff"] == pytest.approx(0.5, abs=1e-6) and ctr["mean_abs_diff"] == pytest.approx(0.5, abs=1e-6)
    assert ctr["correlation"] == pytest.approx(1.0, abs=1e-6)
    assert ctr["mean_b"] == pytest.approx(2 * LN3 / 8, abs=1e-6)
    assert ctr["p50_b"] == pytest.approx(LN3, abs=1e-6) and ctr["p05_b"] == pytest.approx(-LN3, abs=1e-6)
    cvr = rows[("all", "cvr_logit")]
    assert cvr["mean_abs_diff"] == pytest.approx(LN3, abs=1e-6) and cvr["stddev_a"] == 0.0
    assert cvr["correlation"] is None  # a is constant
    assert rows[("feed", "ctr_logit")]["impressions"] == 5 and rows[("stories", "ctr_logit")]["impressions"] == 3
    itself = _query(sql, "teacher_logit_shift", baseline_version="m-old", candidate_version="m-old")
    assert all(r["mean_abs_diff"] == 0 and r["version_b"] == "m-old" for r in itself)


def test_teacher_logit_shift_with_one_version_compares_it_with_itself(spark, tmp_path):
    single = GemPaths(tmp_path / "gem")
    _write(spark, single, "gold.teacher_logits", _logits("m-new"))
    _manifest(single, "m-new", *MODELS["m-new"])
    with LakeSQL(single) as sql:
        rows = {(r["surface"], r["logit"]): r for r in _query(sql, "teacher_logit_shift")}
        assert "gold.index_builds" not in sql.tables  # only this lake's tables
    ctr = rows[("all", "ctr_logit")]
    assert (ctr["version_a"], ctr["version_b"], ctr["impressions"]) == ("m-new", "m-new", 8)
    assert ctr["mean_abs_diff"] == 0 and ctr["mean_a"] == pytest.approx(2 * LN3 / 8, abs=1e-6)
    assert len(rows) == 6  # 3 surfaces ('all' included) x 2 logits


def test_model_lineage_links_each_model_to_its_data_version(sql):
    rows = {r["model_version"]: r for r in _query(sql, "model_lineage")}
    assert list(rows) == ["m-new", "m-old"]  # newest first; the .partial directory is not a model
    new, old = rows["m-new"], rows["m-old"]
    assert (new["training_delta_version"], new["architecture"], new["is_latest"]) == (2, "gem", True)
    assert (old["training_delta_version"], old["architecture"], old["is_latest"]) == (1, "dlrm", False)
    # version 2 of gold.training_examples is the commit that replaced 2026-11-03; versions 3 came after it.
    assert new["data_operation"] == "WRITE" and "2026-11-03" in new["data_operation_parameters"]["predicate"]
    assert "2026-11-02" in old["data_operation_parameters"]["predicate"]
    assert (new["newer_data_versions"], old["newer_data_versions"]) == (1, 2)
    assert new["data_committed_at"] is not None and (new["first_train_day"], new["last_train_day"]) == (D1, D2)
    assert (new["ctr_auc"], new["cvr_auc"], new["cvr_ne"]) == (0.7, 0.6, None)


def test_table_history_has_one_row_per_commit(sql):
    rows = sql.query(
        "SELECT table_name, version, operation FROM meta.table_history "
        "WHERE table_name = 'gold.training_examples' ORDER BY version"
    ).fetchall()
    assert rows == [("gold.training_examples", v, "WRITE") for v in range(4)]


def test_student_training_set_joins_fresh_labels_to_the_teacher(sql):
    # m-new trained up to 2026-11-02: its fresh, scored days are 2026-11-03 only (i7, i8).
    rows = _query(sql, "student_training_set")
    assert [(r["model_version"], r["impression_id"], r["clicked"], r["converted"]) for r in rows] == [
        ("m-new", "i7", True, True),
        ("m-new", "i8", False, False),
    ]
    i7, i8 = rows
    assert i7["ctr_logit"] == pytest.approx(LN3) and i7["teacher_p_click"] == pytest.approx(0.75)
    assert i7["teacher_p_conversion"] == pytest.approx(0.5625)
    assert i7["user_embedding"] == pytest.approx([0.8, 0.6]) and i7["ad_embedding"] == [1.0, 0.0]
    assert i8["user_embedding"] is None and i8["ad_embedding"] == [0.0, 1.0]
    # m-old trained on 2026-11-01 only: 2026-11-02 and 03 are fresh for it (i1..i8).
    assert len(_query(sql, "student_training_set", for_model_version="m-old")) == 8


def test_index_recall_history(sql):
    rows = _query(sql, "index_recall_history")
    assert [(r["index_name"], r["model_version"], r["recall_at_k"]) for r in rows] == [
        ("ads", "m-old", 0.9),
        ("ads", "m-new", 0.95),
        ("users", "m-new", 1.0),
    ]
    assert rows[0]["recall_change"] is None and rows[1]["recall_change"] == pytest.approx(0.05)


def test_gem_sql_sets_variables_and_prints_the_query_rows(lake, capsys, monkeypatch):
    from jobs.cli import main

    monkeypatch.setenv("GEM_HOME", str(lake.home))
    main(["sql", str(SQL_DIR / "top_ads_for_user.sql"), "--var", "top_k=2", "--format", "json"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert [json.loads(line)["ad_id"] for line in lines] == [11, 10]


def test_report_asset_attaches_every_query_as_metadata(lake):
    result = dg.materialize([sql_pack], resources={"lake": LakeResource(home=str(lake.home))})
    assert result.success
    metadata = result.asset_materializations_for_node("reports__sql_pack")[0].metadata
    queries = sorted(p.stem for p in SQL_DIR.glob("*.sql"))
    assert metadata["queries_run"].value == len(queries) >= 8
    assert metadata["queries_skipped"].value == {}
    assert metadata["index_recall_history/rows"].value == 3
    assert metadata["student_training_set/rows"].value == 2
    assert "| ads | m-new |" in metadata["index_recall_history"].value
    assert all(metadata[f"{q}/rows"].value > 0 for q in queries)


def test_report_queries_skip_missing_tables_and_fail_naming_the_file(lake, tmp_path):
    (tmp_path / "a_missing.sql").write_text(
        "-- reads gold.teacher_logits in a comment only\nSELECT * FROM gold.no_such_table"
    )
    assert referenced_tables((tmp_path / "a_missing.sql").read_text()) == ["gold.no_such_table"]
    (tmp_path / "b_broken.sql").write_text("SELECT no_such_column FROM gold.teacher_logits")
    with pytest.raises(ReportQueryError, match="b_broken.sql failed: .*no_such_column"):
        run_report_queries(lake, tmp_path)
    (tmp_path / "b_broken.sql").unlink()
    [report] = run_report_queries(lake, tmp_path)
    assert report.markdown() == "skipped: table gold.no_such_table not materialised"


def test_a_query_over_an_unreadable_table_is_skipped_naming_it_and_the_rest_of_the_pack_runs(lake, tmp_path):
    home = tmp_path / "gem"
    shutil.copytree(lake.home, home)
    paths = GemPaths(home)
    builds = paths.table("gold.index_builds")
    for commit in (builds / "_delta_log").glob("*.json"):
        commit.write_text(commit.read_text()[:40])  # every commit truncated mid-write
    with pytest.warns(UserWarning) as caught:
        reports = {r.name: r for r in run_report_queries(paths)}
    first_commit = builds / "_delta_log" / "00000000000000000000.json"
    assert sorted(str(w.message).split(":")[0] for w in caught) == [
        "gold.index_builds is skipped",
        f"meta.table_history skips {first_commit}",
    ]
    skipped = reports.pop("index_recall_history")
    assert skipped.rows is None
    assert skipped.markdown().startswith(f"skipped: gold.index_builds: {builds} cannot be read by delta-rs (")
    assert all(r.rows for r in reports.values())  # every other report ran and has rows
