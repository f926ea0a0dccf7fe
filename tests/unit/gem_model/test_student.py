"""Students, KD and the Student Adapter on a small world whose truth is known.

The world: users and ads match when user % 5 == ad % 5 (+2 click logit); the teacher knows that
exactly but is stale: every ad's click logit has since moved by DRIFT[ad] = +/-0.8, which it has
never seen. The GEM embeddings are one-hot codes of user % 5 and ad % 5, so their inner product
is the match. Delta tables for the job and the asset are written with delta-rs (no Spark).
"""

import json
import math
from collections.abc import Sequence
from datetime import date
from pathlib import Path

import dagster as dg
import numpy as np
import pyarrow as pa
import pytest
import torch
from deltalake import write_deltalake

from dagster_project.resources.launchers import JobLauncher
from gem_model.config import STUDENT_VARIANTS, GemConfig
from gem_model.distill.adapter import StudentAdapter, fit_adapter, fit_adapter_with_prior_choice
from gem_model.distill.artefact import load_student, metric_rows, read_student_manifest, student_version
from gem_model.distill.data import StudentCalendar, StudentData, load_student_data
from gem_model.distill.losses import distillation_loss, label_loss
from gem_model.distill.student import embedding_inputs
from gem_model.distill.variants import VARIANTS, train_students
from gem_model.paths import GemPaths
from gem_model.train.metrics import log_loss

N_USERS, N_ADS, REPR_DIM = 200, 40, 8
SURFACES = ("feed", "reels")
DRIFT = np.where(np.arange(N_ADS) % 2 == 0, 0.8, -0.8)
TRAIN_DAY, EVAL_DAY = date(2026, 11, 3), date(2026, 11, 4)
TEACHER = "teacher-v1"
OVERRIDES = {
    "world": {"n_days": 4, "holdout_days": 2},
    "model": {"repr_dim": REPR_DIM},
    "student": {"features": ["user_id", "ad_id", "advertiser_id"], "adapter_features": ["ad_id"], "epochs": 3},
}
CFG = GemConfig.from_dict(OVERRIDES)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """As jobs/train_student.py: the students' ops are too small for intra-op threads on a shared box."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def impressions(day: date, n: int, seed: int) -> pa.Table:
    """gold.training_examples rows of `day` with the stale teacher's logits beside them."""
    rng = np.random.default_rng(seed)
    user, ad = rng.integers(0, N_USERS, n), rng.integers(0, N_ADS, n)
    surface = rng.choice(SURFACES, n)
    match = (user % 5 == ad % 5).astype(np.float64)
    base = -2.0 + 2.0 * match + np.where(surface == "reels", 0.3, 0.0)  # what the teacher learned
    cvr_logit = -1.0 + 1.0 * match
    p_click, p_cvr = sigmoid(base + DRIFT[ad]), sigmoid(cvr_logit)
    clicked = rng.random(n) < p_click
    converted = clicked & (rng.random(n) < p_cvr)
    return pa.table(
        {
            "impression_id": [f"imp-{day}-{i:06d}" for i in range(n)],
            "user_id": user,
            "ad_id": ad,
            "surface": surface,
            "ds": pa.array([day] * n, pa.date32()),
            "clicked": clicked,
            "converted": converted,
            "p_click": p_click,
            "p_convert": p_click * p_cvr,
            "user_id_idx": user + 1,
            "ad_id_idx": ad + 1,
            "advertiser_id_idx": ad // 4 + 1,
            "ctr_logit": base.astype(np.float32),
            "cvr_logit": cvr_logit.astype(np.float32),
        }
    )


def codes(ids: np.ndarray) -> np.ndarray:
    """[N, REPR_DIM] unit one-hot of id % 5: the 'GEM embedding' whose inner product is the match."""
    out = np.zeros((len(ids), REPR_DIM), np.float32)
    out[np.arange(len(ids)), ids % 5] = 1.0
    return out


# --- losses -------------------------------------------------------------------------------------


def test_label_loss_is_esmm_bce_by_hand():
    logits = torch.tensor([[0.0, 0.0]])
    # P(click) = 0.5 (clicked): log 2; P(click and conversion) = 0.25 (not converted): -log 0.75.
    expected = math.log(2) - math.log(0.75)
    assert label_loss(logits, torch.tensor([1.0]), torch.tensor([0.0])).item() == pytest.approx(expected, rel=1e-6)


def test_distillation_loss_by_hand_and_stationary_at_the_target():
    logits = torch.tensor([[0.0, 0.0]], requires_grad=True)
    target = torch.tensor([[0.0, math.log(3)]])  # soft targets 0.5 and 0.75
    # BCE(0.5 | 0.5) = log 2 and BCE(0.5 | 0.75) = -(0.75 + 0.25) log 0.5 = log 2.
    assert distillation_loss(logits, target).item() == pytest.approx(2 * math.log(2), rel=1e-6)
    # At T = 2 the student's p is still 0.5, so each term is still log 2, scaled by T^2 = 4.
    assert distillation_loss(logits, target, temperature=2.0).item() == pytest.approx(8 * math.log(2), rel=1e-6)
    at_target = target.clone().requires_grad_(True)
    distillation_loss(at_target, target, temperature=2.0).backward()
    assert at_target.grad.abs().max().item() < 1e-6
    with pytest.raises(ValueError, match=r"student logits \(1, 2\) and target logits \(2,\) differ"):
        distillation_loss(logits, target[0])


# --- the adapter ---------------------------------------------------------------------------------


def test_adapter_recovers_the_stale_teachers_per_ad_offset():
    table = impressions(TRAIN_DAY, 20_000, seed=1)
    adapter = StudentAdapter(SURFACES, {"ad_id": N_ADS + 1})
    ids = table.column("ad_id_idx").to_numpy().reshape(-1, 1)
    teacher = table.column("ctr_logit").to_numpy()
    surface = table.column("surface").to_numpy(zero_copy_only=False)
    clicked = table.column("clicked").to_numpy()
    fit = fit_adapter(adapter, teacher, surface, ids, clicked, prior_sd=1.0)
    offsets = adapter.offsets["ad_id"].weight.detach().numpy()[1:, 0]
    # The offsets' common level trades off against the per-surface bias; their contrast is the drift's 1.6.
    assert offsets[DRIFT > 0].mean() - offsets[DRIFT < 0].mean() == pytest.approx(1.6, abs=0.15)
    assert np.corrcoef(offsets, DRIFT)[0, 1] > 0.9
    assert fit["log_loss_adapted"] < fit["log_loss_teacher"] - 0.02
    # On fresh labels of the same day, the adapted teacher is within 0.003 of the truth's log loss.
    fresh = impressions(TRAIN_DAY, 20_000, seed=2)
    labels = fresh.column("clicked").to_numpy()
    adapted = adapter.adapt(
        fresh.column("ctr_logit").to_numpy(),
        fresh.column("surface").to_numpy(zero_copy_only=False),
        fresh.column("ad_id_idx").to_numpy().reshape(-1, 1),
    )
    truth = log_loss(labels, fresh.column("p_click").to_numpy())
    assert log_loss(labels, sigmoid(adapted)) < truth + 0.003
    assert log_loss(labels, sigmoid(fresh.column("ctr_logit").to_numpy())) > truth + 0.02


def test_adapter_prior_is_loose_for_a_drifted_teacher_and_tight_for_an_exact_one():
    table = impressions(TRAIN_DAY, 20_000, seed=5)
    surface = table.column("surface").to_numpy(zero_copy_only=False)
    ids, clicked = table.column("ad_id_idx").to_numpy().reshape(-1, 1), table.column("clicked").to_numpy()
    stale = table.column("ctr_logit").to_numpy()
    exact = stale + DRIFT[table.column("ad_id").to_numpy()]  # the truth: nothing left to correct
    chosen = {}
    for name, teacher in (("stale", stale), ("exact", exact)):
        _, fit = fit_adapter_with_prior_choice(
            lambda: StudentAdapter(SURFACES, {"ad_id": N_ADS + 1}),
            teacher,
            surface,
            ids,
            clicked,
            (0.05, 0.1, 0.5, 1.0),
            0.2,
            seed=0,
        )
        chosen[name] = fit["prior_sd"]
        assert set(fit["holdout_log_loss"]) == {"0.05", "0.1", "0.5", "1.0"}
    assert chosen["stale"] >= 0.5 and chosen["exact"] <= 0.1


def test_adapter_rejects_a_surface_it_was_not_built_for():
    adapter = StudentAdapter(SURFACES, {"ad_id": 4})
    with pytest.raises(ValueError, match=r"surfaces \['offsite'\] are not in the adapter's \['feed', 'reels'\]"):
        adapter.adapt(np.zeros(1), np.array(["offsite"]), np.zeros((1, 1), np.int64))


# --- students ------------------------------------------------------------------------------------


def student_data(n_per_day: int = 5000) -> StudentData:
    table = pa.concat_tables([impressions(TRAIN_DAY, n_per_day, seed=3), impressions(EVAL_DAY, n_per_day, seed=4)])
    return StudentData(table, codes(table.column("user_id").to_numpy()), codes(table.column("ad_id").to_numpy()))


def test_variants_are_the_configs_choices():
    assert tuple(VARIANTS) == STUDENT_VARIANTS


def test_adapter_targets_beat_the_stale_teachers_and_embeddings_carry_its_knowledge():
    cfg = GemConfig.from_dict({"student": {"variants": list(STUDENT_VARIANTS)}}, base=CFG)
    run = train_students(student_data(), StudentCalendar.from_config(cfg), cfg, REPR_DIM)
    m = run.metrics
    # Served directly, the adapted teacher is within 0.02 NE of the truth; the stale one is 0.09 behind.
    assert m["teacher_adapted/ctr/ne"] < m["oracle/ctr/ne"] + 0.02 < m["teacher/ctr/ne"] - 0.05
    # Same inputs, other targets: the adapter's beat the stale teacher's, with or without the embeddings.
    assert m["adapter/ctr/ne"] < m["kd_embeddings/ctr/ne"] - 0.007
    assert m["adapter_no_embeddings/ctr/ne"] < m["kd/ctr/ne"] - 0.003
    for surface in SURFACES:
        assert m[f"adapter/{surface}/ctr/ne"] < m[f"kd_embeddings/{surface}/ctr/ne"]
        assert run.rows[surface]["train"] > 2000 and run.rows[surface]["eval"] > 2000
    # The match is an id interaction a one-day student cannot learn from ids; the embeddings hand it over.
    assert m["kd_embeddings/ctr/ne"] < m["kd/ctr/ne"] - 0.05
    gain = run.gains["all"]["ctr"]
    assert gain["adapter_ne_gain"] == pytest.approx(m["labels/ctr/ne"] - m["adapter/ctr/ne"])
    # Distilling a teacher this stale loses to the labels alone, and then the ratio is undefined.
    assert gain["kd_ne_gain"] < 0 and math.isnan(gain["ne_gain_ratio"])
    assert all(0 < ms < 50 for ms in run.inference_ms_per_1000.values())


# --- the job on Delta tables ---------------------------------------------------------------------


def write_lake(
    home: Path, repr_dim: int = REPR_DIM, drop_logits: int = 0, days: tuple[date, ...] = (TRAIN_DAY, EVAL_DAY)
) -> GemPaths:
    """gold.training_examples, the teacher's exports and its manifest, as the pipeline would leave them."""
    paths = GemPaths(home)
    examples = pa.concat_tables([impressions(d, 3000, seed=10 + i) for i, d in enumerate((TRAIN_DAY, EVAL_DAY))])
    write_deltalake(
        str(paths.table("gold.training_examples")),
        examples.drop_columns(["ctr_logit", "cvr_logit"]),
        partition_by=["ds"],
    )
    scored = examples.filter(pa.array(np.isin(examples.column("ds").to_numpy(), np.array(days, "datetime64[D]"))))
    scored = scored.slice(drop_logits)
    logits = scored.select(["impression_id", "user_id", "ad_id", "surface", "ds", "ctr_logit", "cvr_logit"])
    write_deltalake(
        str(paths.table("gold.teacher_logits")),
        logits.append_column("model_version", pa.array([TEACHER] * logits.num_rows)),
        partition_by=["model_version", "ds"],
    )
    for table, column, n in (("gold.user_embeddings", "user_id", N_USERS), ("gold.ad_embeddings", "ad_id", N_ADS)):
        ids = np.arange(n)
        vectors = np.zeros((n, repr_dim), np.float32)
        vectors[:, :REPR_DIM] = codes(ids)[:, :repr_dim]
        for d in days:
            write_deltalake(
                str(paths.table(table)),
                pa.table(
                    {
                        column: ids,
                        "model_version": [TEACHER] * n,
                        "ds": pa.array([d] * n, pa.date32()),
                        "embedding": pa.array(list(vectors), pa.list_(pa.float32())),
                    }
                ),
                partition_by=["model_version", "ds"],
                mode="append",
            )
    model_dir = paths.model_dir(TEACHER)
    model_dir.mkdir(parents=True)
    (model_dir / "manifest.json").write_text(
        json.dumps(
            {
                "model_version": TEACHER,
                "config": CFG.to_dict(),
                "training_data": {
                    "train_days": ["2026-11-01", "2026-11-02"],
                    "holdout_days": ["2026-11-03", "2026-11-04"],
                },
            }
        )
    )
    paths.set_latest_model_version(TEACHER)
    return paths


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> GemPaths:
    return write_lake(tmp_path_factory.mktemp("student") / "gem")


def _read(paths: GemPaths, cfg: GemConfig = CFG) -> StudentData:
    manifest = json.loads((paths.model_dir(TEACHER) / "manifest.json").read_text())
    return load_student_data(paths, cfg, manifest, StudentCalendar.from_config(cfg))


def test_data_joins_every_impression_to_its_logit_and_embeddings(lake):
    data = _read(lake)
    assert len(data) == 6000 and data.missing_embeddings == {"user_id": 0, "ad_id": 0}
    ids = data.column("impression_id")
    assert list(ids[:2]) == ["imp-2026-11-03-000000", "imp-2026-11-03-000001"]  # sorted by (ds, impression_id)
    users, ads = data.column("user_id"), data.column("ad_id")
    np.testing.assert_array_equal(data.user_embedding, codes(users))
    np.testing.assert_array_equal(
        embedding_inputs(data.user_embedding, data.ad_embedding)[:, -1], (users % 5 == ads % 5).astype(np.float32)
    )


def test_missing_model_version_names_the_known_ones(lake):
    from gem_model.distill.training import train

    with pytest.raises(FileNotFoundError, match=r"model version 'gem-nope' not found .* versions: \['teacher-v1'\]"):
        train(lake, CFG, "gem-nope")


def test_missing_logit_partition_names_the_version_the_day_and_the_fix(tmp_path):
    paths = write_lake(tmp_path / "gem", days=(TRAIN_DAY,))
    with pytest.raises(
        ValueError,
        match=r"gold.teacher_logits for model_version='teacher-v1' has no rows for "
        r"ds=\['2026-11-04'\]; materialise export_job for those partitions",
    ):
        _read(paths)


def test_impressions_without_a_teacher_logit_are_an_error_not_dropped(tmp_path):
    paths = write_lake(tmp_path / "gem", drop_logits=3)
    with pytest.raises(
        ValueError,
        match=r"3 impressions of gold.training_examples have no gold.teacher_logits row "
        r"for model_version='teacher-v1' \(per day: \{'2026-11-03': 3\}",
    ):
        _read(paths)


def test_embedding_dimension_mismatch_names_the_manifest_dimension(tmp_path):
    paths = write_lake(tmp_path / "gem", repr_dim=4)
    with pytest.raises(
        ValueError,
        match=r"gold.user_embeddings embeddings of model_version='teacher-v1', "
        r"ds=2026-11-03 have lengths \[4\], expected \[8\]",
    ):
        _read(paths)


def test_a_teacher_trained_on_student_days_and_a_short_calendar_are_refused(lake):
    manifest = {"model_version": "t", "training_data": {"train_days": ["2026-11-03"]}}
    with pytest.raises(ValueError, match=r"teacher 't' was trained on student day\(s\) \['2026-11-03'\]"):
        StudentCalendar.from_config(CFG).check_teacher(manifest)
    with pytest.raises(ValueError, match=r"world.holdout_days=1 must exceed student.eval_days=1"):
        StudentCalendar.from_config(GemConfig.from_dict({"world": {"holdout_days": 1}}))
    with pytest.raises(ValueError, match=r"student.adapter_days=2 exceeds the 1 student training day"):
        StudentCalendar.from_config(GemConfig.from_dict({"student": {"adapter_days": 2}}))
    with pytest.raises(ValueError, match=r"student.features=\('user_id', 'surface'\): \['surface'\]; each must"):
        GemConfig.from_dict({"student": {"features": ["user_id", "surface"]}})
    with pytest.raises(ValueError, match=r"student.variants\[1\]='distill': must be one of \['labels', 'kd', "):
        GemConfig.from_dict({"student": {"variants": ["labels", "distill"]}})


def test_job_writes_a_manifest_with_finite_metrics_and_a_rerun_replaces_it(lake, monkeypatch):
    from jobs.train_student import main

    monkeypatch.setenv("GEM_HOME", str(lake.home))
    config = lake.home / "student.json"
    config.write_text(CFG.to_json())
    main(["--model-version", TEACHER, "--config", str(config)])
    directory = lake.student_dir(student_version(CFG, TEACHER))
    first = read_student_manifest(directory)
    assert first["calendar"] == {
        "train": ["2026-11-03"],
        "adapter": ["2026-11-03"],
        "eval": ["2026-11-04"],
        "embedding_days": {"2026-11-03": "2026-11-03", "2026-11-04": "2026-11-04"},
    }
    assert first["teacher"] == {
        "model_version": TEACHER,
        "repr_dim": REPR_DIM,
        "train_days": ["2026-11-01", "2026-11-02"],
    }
    for variant in ("labels", "kd", "adapter", "teacher", "teacher_adapted"):
        for surface in ("", "feed/", "reels/"):
            for name in ("ne", "auc"):
                assert math.isfinite(first["metrics"][f"{variant}/{surface}ctr/{name}"])
    assert first["metrics"]["adapter/ctr/ne"] < first["metrics"]["kd/ctr/ne"]
    assert sorted(p.name for p in (directory / "students" / "feed").iterdir()) == ["adapter.pt", "kd.pt", "labels.pt"]

    main(["--model-version", TEACHER, "--config", str(config)])  # a re-run: same version, replaced
    assert sorted(p.name for p in directory.parent.iterdir()) == [directory.name]
    second = read_student_manifest(directory)
    assert second["created_at"] > first["created_at"]
    assert second["metrics"]["adapter/ctr/ne"] == pytest.approx(first["metrics"]["adapter/ctr/ne"], abs=1e-6)

    # The saved student predicts what the trained one did: reload and score the eval day.
    data = _read(lake).on_days((EVAL_DAY,)).on_surface("feed")
    ids = np.stack([data.column(c).astype(np.int64) for c in ("user_id_idx", "ad_id_idx", "advertiser_id_idx")], 1)
    dense = embedding_inputs(data.user_embedding, data.ad_embedding)
    p = sigmoid(load_student(directory, "feed", "adapter").predict(ids, dense)[:, 0])
    assert log_loss(data.column("clicked"), p) == pytest.approx(
        second["metrics"]["adapter/feed/ctr/log_loss"], rel=1e-5
    )
    rows = metric_rows(second)
    assert len(rows) == 6 * 3 * 2  # (3 students, teacher, teacher_adapted, oracle) x (all, feed, reels) x tasks
    oracle = next(r for r in rows if r["variant"] == "oracle" and r["surface"] == "all" and r["task"] == "ctr")
    assert oracle["calibration"] is None and oracle["ne"] == second["metrics"]["oracle/ctr/ne"]


# --- Dagster ---------------------------------------------------------------------------------------


def test_definitions_have_the_student_asset_job_and_contract_check(tmp_path):
    from dagster_project.definitions import build_definitions
    from dagster_project.resources.lake import LakeResource

    repo = build_definitions(lake=LakeResource(home=str(tmp_path))).get_repository_def()
    assert "train_students_job" in {j.name for j in repo.get_all_jobs()}
    graph = repo.asset_graph
    assert {k.to_user_string() for k in graph.get(dg.AssetKey("student_models")).parent_keys} >= {
        "gold/teacher_logits",
        "gold/user_embeddings",
        "gold/ad_embeddings",
    }
    checks = {(c.asset_key.to_user_string(), c.name) for c in graph.asset_check_keys}
    assert {("student_models", "finite_metrics"), ("gold/student_metrics", "contract")} <= checks


class InProcessLauncher(JobLauncher):
    """Runs the job's `main` in this process: the asset's own logic, without a torchrun start-up per run."""

    def launch(self, context: dg.AssetExecutionContext, module: str, args: Sequence[str], nproc: int) -> None:
        from jobs.train_student import main

        assert (module, nproc) == ("jobs.train_student", 1)
        main(list(args))


@pytest.mark.slow
@pytest.mark.spark
def test_asset_materialises_students_and_a_metrics_partition_without_duplicates(tmp_path, spark, monkeypatch):
    from dagster_project.defs.student.assets import student_models
    from dagster_project.resources.lake import LakeResource
    from dagster_project.resources.spark import SparkResource
    from gem_lake.delta import read_table
    from gem_lake.table_contract import schema_violations

    paths = write_lake(tmp_path / "gem")
    (tmp_path / "overrides.json").write_text(json.dumps(OVERRIDES))
    lake = LakeResource(home=str(paths.home), config_path=str(tmp_path / "overrides.json"))
    monkeypatch.setenv("GEM_HOME", str(paths.home))
    resources = {"lake": lake, "spark": SparkResource(), "launcher": InProcessLauncher()}
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("model_versions", [TEACHER])
    for _ in range(2):  # the second run replaces the partition
        result = dg.materialize([student_models], resources=resources, instance=instance, partition_key=TEACHER)
        assert result.success
    metadata = next(
        m.metadata
        for m in result.asset_materializations_for_node("student_models")
        if m.asset_key == dg.AssetKey("student_models")
    )
    assert metadata["student_version"].value == student_version(lake.config, TEACHER)
    assert metadata["adapter/ctr/ne"].value < metadata["kd/ctr/ne"].value
    table = metadata["ctr_ne_by_surface"].value.splitlines()
    assert table[0].startswith("| scope | teacher |") and table[0].endswith("| KD gain | adapter gain |")
    scopes = [row.split(" | ")[0].removeprefix("| ") for row in table[2:]]
    assert scopes[0] == "all" and len(scopes) > 2 and set(scopes[1:]) <= set(lake.config.world.surfaces)
    assert {row.count("|") for row in table} == {table[0].count("|")}
    assert len(metadata) < 30  # a summary, not every metric (those are rows of gold.student_metrics)
    df = read_table(spark, paths.table("gold.student_metrics"))
    schema = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert schema_violations("gold.student_metrics", schema) == []
    assert df.count() == 36 and df.where("variant = 'adapter' AND surface = 'all' AND task = 'ctr'").count() == 1
