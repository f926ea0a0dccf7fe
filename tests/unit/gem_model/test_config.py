import gzip
import json
import re
import sys
import types
from datetime import date

import pytest

from gem_model.config import (
    DATASET_CONFIGS,
    PRESETS,
    ConfigError,
    ExportConfig,
    FeatureSpec,
    GemConfig,
    SequenceConfig,
    SparseFeature,
    StudentConfig,
    TrainConfig,
    WorldConfig,
)
from gem_model.documents import MAX_BYTES

# A preset's fingerprint names its trained model versions, so only a change meant to make new models may
# change these: last, the timeline arch in place of the per-impression pyramid (model.sequence's keys).
PRESET_FINGERPRINTS = {"tiny": "012c42ce29", "small": "8f76ef6ace", "medium": "fd72668d9e"}


def test_presets_round_trip_through_json():
    for name in ("tiny", "small"):
        cfg = GemConfig.from_preset(name)
        assert GemConfig.from_dict(json.loads(cfg.to_json())) == cfg


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_datasets_model_config_loads_over_every_preset(preset):
    paths = sorted(DATASET_CONFIGS.glob("*.json"))
    assert [p.stem for p in paths] == ["frappe", "movielens"]
    for path in paths:
        cfg = GemConfig.load(preset, str(path))
        assert cfg.data.source == path.stem and cfg.preset == preset
        names = {f.name for f in cfg.features.features}
        assert set(cfg.student.features) == names - {cfg.features.domain_feature}  # a student sees them all


def test_partial_override_keeps_other_fields():
    cfg = GemConfig.from_dict({"world": {"n_days": 4, "start_date": "2026-01-01"}, "train": {"epochs": 1}})
    assert cfg.world.n_days == 4 and cfg.world.start_date == date(2026, 1, 1)
    assert cfg.train.epochs == 1 and cfg.train.batch_size == GemConfig().train.batch_size
    assert cfg.fingerprint != GemConfig().fingerprint
    downstream = GemConfig.from_dict({"index": {"nprobe": 8}, "export": {"nproc": 4}, "student": {"epochs": 9}})
    assert downstream.fingerprint == GemConfig().fingerprint  # the teacher's version does not change


def test_unknown_key_names_the_path_and_valid_keys():
    with pytest.raises(ValueError, match=r"config.world: unknown key\(s\) \['n_dayz'\]"):
        GemConfig.from_dict({"world": {"n_dayz": 3}})


def test_unknown_preset_and_bad_holdout():
    with pytest.raises(ValueError, match="unknown preset"):
        GemConfig.from_preset("huge")
    with pytest.raises(ValueError, match="holdout_days"):
        WorldConfig(n_days=2, holdout_days=2)


def test_holdout_start_is_first_holdout_day():
    world = WorldConfig(start_date=date(2026, 11, 1), n_days=6, holdout_days=2)
    assert world.holdout_start == date(2026, 11, 5)
    assert world.days[-1] == date(2026, 11, 6)


def test_a_training_window_starts_its_days_before_the_holdout_and_fits_the_calendar():
    world = {"start_date": "2026-11-01", "n_days": 6, "holdout_days": 2}
    assert GemConfig.from_dict({"world": world}).train_start is None
    cfg = GemConfig.from_dict({"world": world, "train": {"window_days": 3}})
    assert cfg.train_start == date(2026, 11, 2)
    assert cfg.fingerprint != GemConfig.from_dict({"world": world}).fingerprint
    with pytest.raises(
        ConfigError,
        match=r"train.window_days=5 is more than the 4 days before the holdout .* "
        r"at most 4, or 0 for every day",
    ):
        GemConfig.from_dict({"world": world, "train": {"window_days": 5}})


def test_data_source_is_validated_and_overridable(monkeypatch):
    with pytest.raises(ValueError, match="data.source='kaggle': must be one of"):
        GemConfig.from_dict({"data": {"source": "kaggle"}})
    monkeypatch.setenv("GEM_DATA_SOURCE", "kaggle")
    with pytest.raises(ConfigError, match=r"^data source 'kaggle' \(GEM_DATA_SOURCE or --data-source\): data.source="):
        GemConfig.from_env()
    monkeypatch.setenv("GEM_DATA_SOURCE", "criteo")
    assert GemConfig.from_env().data.source == "criteo"


def test_the_code_locations_lake_loads_the_config_the_environment_names(tmp_path, monkeypatch):
    from dagster_project.resources.lake import LakeResource

    overrides = tmp_path / "overrides.json"
    overrides.write_text(json.dumps({"train": {"epochs": 3}}))
    mapping = tmp_path / "my_logs.yaml"
    for name, value in {
        "GEM_HOME": str(tmp_path / "gem"),
        "GEM_PRESET": "small",
        "GEM_CONFIG": str(overrides),
        "GEM_DATA_SOURCE": "criteo",
        "GEM_SOURCE_MAPPING": str(mapping),
    }.items():
        monkeypatch.setenv(name, value)
    lake = LakeResource.from_env()
    assert lake.config == GemConfig.from_env()
    assert (lake.config.preset, lake.config.train.epochs) == ("small", 3)
    assert (lake.config.data.source, lake.config.data.mapping) == ("mapping", str(mapping))


def test_presets_scale_up_to_long_sequences():
    small, medium = GemConfig.from_preset("small"), GemConfig.from_preset("medium")
    assert small.world.impressions_per_day * small.world.n_days == 1_000_000
    assert medium.world.impressions_per_day * medium.world.n_days == 10_000_000
    assert medium.features.max_seq_len == 8192


def test_cosine_dense_lr_decays_monotonically_from_dense_lr_to_its_floor():
    from gem_model.train.trainer import dense_lr

    tc = TrainConfig(dense_lr=0.01, min_lr_fraction=0.1)
    rates = [dense_lr(tc, step, 50) for step in range(50)]
    assert rates[0] == pytest.approx(0.01) and rates[-1] == pytest.approx(0.001)
    assert all(a > b for a, b in zip(rates, rates[1:]))
    assert dense_lr(TrainConfig(dense_lr=0.01, dense_lr_schedule="constant"), 49, 50) == 0.01
    with pytest.raises(ValueError, match="train.dense_lr_schedule"):
        TrainConfig(dense_lr_schedule="step")


def test_an_epoch_loss_is_the_mean_over_real_rows_so_a_step_of_padding_alone_does_not_lower_it():
    from gem_model.train.trainer import Progress

    progress = Progress()
    for loss, rows in [(0.6, 2048), (0.3, 1024), (0.0, 0)]:  # a full step, a part-padded one, padding alone
        progress.record_step(loss, rows)
    assert (progress.step_in_epoch, progress.steps_done) == (3, 3)
    assert progress.epoch_loss == pytest.approx((0.6 * 2048 + 0.3 * 1024) / 3072)  # what the step log shows
    progress.end_epoch()
    progress.record_step(0.2, 512)
    progress.end_epoch()
    assert progress.epoch_losses == pytest.approx([(0.6 * 2048 + 0.3 * 1024) / 3072, 0.2])
    assert (progress.epoch, progress.step_in_epoch, progress.steps_done, progress.rows_in_epoch) == (2, 0, 4, 0)


def test_a_teacher_manifest_with_outdated_downstream_settings_still_loads_its_config():
    from gem_model.export.checkpoint import teacher_config

    saved = GemConfig.from_dict({"model": {"repr_dim": 16}}).to_dict()
    saved["student"]["a_renamed_field"] = 1  # written by an older version of the student settings
    cfg = teacher_config({"config": saved})
    assert cfg.model.repr_dim == 16 and cfg.student == GemConfig().student
    # A teacher on a dataset's own features keeps the student feature lists that name them.
    own = GemConfig.load("tiny", str(DATASET_CONFIGS / "frappe.json")).to_dict()
    own["student"]["epochs"] = 9
    cfg = teacher_config({"config": own})
    assert cfg.student.features == tuple(own["student"]["features"]) and cfg.student.epochs == 3


def test_a_teacher_saved_with_a_setting_since_removed_is_refused_with_the_fix():
    """A teacher section this code no longer reads cannot be rebuilt as it was trained: retrain, never guess."""
    from gem_model.export.checkpoint import teacher_config

    saved = GemConfig.load("small").to_dict()
    saved["model"]["sequence"]["candidate_token"] = False  # a try that lost, since removed
    with pytest.raises(
        ConfigError,
        match=r"^model version 'v1' was trained with a config this code no longer reads "
        r"\(config.model.sequence: unknown key\(s\) \['candidate_token'\].*\); "
        r"materialise teacher_model again",
    ):
        teacher_config({"model_version": "v1", "config": saved})


def test_sequence_item_attributes_are_ad_attributes_with_their_own_side_columns():
    spec = FeatureSpec()
    category = spec.by_name("category").buckets
    assert spec.sequence_side_columns == {"seq_action_idx": 16, "seq_age_idx": 16, "seq_category_idx": category}
    assert spec.kjt_keys[-6:] == (
        "seq_category_idx",
        "seq_minutes",
        "timeline_start",
        "visible",
        "target_age_idx",
        "target_minutes",
    )
    assert FeatureSpec(sequence_item_attributes=()).sequence_side_columns.keys() == {"seq_action_idx", "seq_age_idx"}
    with pytest.raises(ValueError, match="'country' is not an ad attribute"):
        FeatureSpec(sequence_item_attributes=("country",))


def test_every_preset_builds_and_keeps_its_fingerprint():
    assert sorted(PRESETS) == sorted(PRESET_FINGERPRINTS)
    for name, fingerprint in PRESET_FINGERPRINTS.items():
        cfg = GemConfig.from_preset(name)
        assert cfg.fingerprint == fingerprint, name
        assert GemConfig.from_dict(json.loads(cfg.to_json())).fingerprint == fingerprint


def _refused(overrides: dict, message: str) -> None:
    """`overrides` is a ConfigError (a ValueError) whose message starts with `message`."""
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        GemConfig.from_dict(overrides)


def test_a_string_false_is_not_a_boolean():
    _refused(
        {"train": {"compile": "false"}}, "train.compile='false': must be true or false (a JSON boolean), not a string"
    )
    _refused({"train": {"bf16": 0}}, "train.bf16=0: must be true or false (a JSON boolean), not an integer")
    with pytest.raises(ConfigError, match=re.escape("train.compile='false': must be true or false")):
        TrainConfig(compile="false")


def test_a_string_is_not_a_tuple_of_surfaces():
    _refused(
        {"world": {"surfaces": "feed"}},
        "world.surfaces='feed': must be a non-empty JSON array without "
        "duplicates, each element one of ['feed', 'stories', 'reels', 'messaging', 'offsite'], not a string",
    )
    with pytest.raises(ConfigError, match=re.escape("world.surfaces='feed': must be a non-empty JSON array")):
        WorldConfig(surfaces="feed")


@pytest.mark.parametrize(
    "surfaces, message",
    [
        ([], "world.surfaces=[]: must be a non-empty JSON array"),
        (["feed", "feed"], "world.surfaces=['feed', 'feed']: must be a non-empty JSON array without duplicates"),
        (["feed", "tv"], "world.surfaces[1]='tv': must be one of ['feed', 'stories', 'reels', 'messaging', 'offsite']"),
    ],
)
def test_surfaces_are_a_non_empty_set_of_known_surfaces(surfaces, message):
    _refused({"world": {"surfaces": surfaces}}, message)


@pytest.mark.parametrize(
    "section, key, value, allowed",
    [
        ("train", "epochs", 0, "an integer in [1, 10000]"),
        ("train", "nproc", 0, "an integer in [1, 4096]"),
        ("train", "batch_size", -8, "an integer in [1, 16777216]"),
        ("export", "nproc", 0, "an integer in [1, 4096]"),
        ("export", "chunk_rows", 0, "an integer in [1, 16777216]"),
        ("student", "epochs", 0, "an integer in [1, 10000]"),
        ("world", "n_users", 0, "an integer in [1, 2147483647]"),
        ("world", "n_days", -1, "an integer in [1, 3660]"),
        ("world", "holdout_days", 0, "an integer in [1, 3660]"),
        ("features", "max_seq_len", 0, "an integer in [1, 1048576]"),
        ("features", "action_buckets", 1, "an integer in [2, 2147483647]"),
        ("index", "train_sample", 0, "an integer in [1, 2147483647]"),
    ],
)
def test_zero_and_negative_sizes_are_refused_when_the_config_is_built(section, key, value, allowed):
    _refused({section: {key: value}}, f"{section}.{key}={value}: must be {allowed}")


def test_direct_construction_is_checked_like_json():
    for build, message in [
        (lambda: TrainConfig(epochs=0), "train.epochs=0: must be an integer in [1, 10000]"),
        (lambda: TrainConfig(nproc=100_000), "train.nproc=100000: must be an integer in [1, 4096]"),
        (lambda: ExportConfig(nproc=0), "export.nproc=0: must be an integer in [1, 4096]"),
        (lambda: TrainConfig(dense_lr=-1.0), "train.dense_lr=-1.0: must be a number in (0, 10]"),
        (lambda: SequenceConfig(layers=0), "model.sequence.layers=0: must be an integer in [1, 2147483647]"),
        (
            lambda: SparseFeature("user_id", 1, "user"),
            "features.features['user_id'].buckets=1: must be an integer in [2, 2147483647]",
        ),
        (lambda: StudentConfig(validation_fraction=1.0), "student.validation_fraction=1.0: must be a number in (0, 1)"),
    ]:
        with pytest.raises(ConfigError, match="^" + re.escape(message)):
            build()


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"train": {"epochs": 2.5}}, "train.epochs=2.5: must be an integer in [1, 10000], not a float"),
        ({"train": {"epochs": "3"}}, "train.epochs='3': must be an integer in [1, 10000], not a string"),
        ({"train": {"epochs": True}}, "train.epochs=True: must be an integer in [1, 10000], not a boolean"),
        ({"train": {"dense_lr": "0.01"}}, "train.dense_lr='0.01': must be a number in (0, 10], not a string"),
        ({"train": {"dense_lr": 0}}, "train.dense_lr=0: must be a number in (0, 10]"),
        ({"train": {"min_lr_fraction": 1.5}}, "train.min_lr_fraction=1.5: must be a number in [0, 1]"),
        ({"train": {"retrieval_weight": -0.1}}, "train.retrieval_weight=-0.1: must be a number in [0, 1000]"),
        (
            {"train": {"grad_clip": float("inf")}},
            "train.grad_clip=inf: must be a number in (0, 1000000] (a finite number)",
        ),
        ({"train": {"seed": -1}}, "train.seed=-1: must be an integer in [0, 4294967295]"),
        (
            {"train": {"dense_lr_schedule": "step"}},
            "train.dense_lr_schedule='step': must be one of ['constant', 'cosine']",
        ),
        ({"world": {"new_ad_fraction": 1}}, "world.new_ad_fraction=1: must be a number in [0, 1)"),
        (
            {"world": {"start_date": "01/11/2026"}},
            "world.start_date='01/11/2026': must be an ISO date string (YYYY-MM-DD)",
        ),
        (
            {"world": {"start_date": 20261101}},
            "world.start_date=20261101: must be an ISO date string (YYYY-MM-DD), not an integer",
        ),
        ({"world": 3}, "world=3: must be a JSON object of WorldConfig settings, not an integer"),
        (
            {"data": {"click_rate_bounds": [0.1]}},
            "data.click_rate_bounds=[0.1]: must be a JSON array of exactly 2 "
            "elements, each a number in [0, 1], not an array of 1",
        ),
        ({"data": {"click_rate_bounds": [0.5, 0.1]}}, "data.click_rate_bounds=[0.5, 0.1]: the low bound exceeds"),
        ({"data": {"data_dir": None}}, "data.data_dir=None: must be a string, not null"),
        (
            {"model": {"architecture": "xgboost"}},
            "model.architecture='xgboost': must be one of ['gem', 'dlrm', 'dcnv2', 'lr']",
        ),
        ({"model": {"sequence": {"window": -1}}}, "model.sequence.window=-1: must be an integer in [0, 1048576]"),
        ({"model": {"wukong": {"mlp_dims": [128, 0]}}}, "model.wukong.mlp_dims[1]=0: must be an integer in [1, 65536]"),
        (
            {"model": {"surface_dims": [32, 16]}},
            "model.surface_dims=[32, 16]: must be a JSON array of exactly one "
            "element, an integer in [1, 65536], not an array of 2",
        ),
        ({"model": {"use_sequence": "no"}}, "model.use_sequence='no': must be true or false (a JSON boolean)"),
        ({"features": {"features": "user_id"}}, "features.features='user_id': must be a non-empty JSON array"),
        (
            {"features": {"features": [{"name": "user_id", "buckets": 0, "side": "user"}]}},
            "features.features[0].buckets=0: must be an integer in [2, 2147483647]",
        ),
        (
            {"features": {"features": [{"name": "user_id", "buckets": 8, "side": "person"}]}},
            "features.features[0].side='person': must be one of ['user', 'ad', 'context']",
        ),
        (
            {"features": {"features": [{"name": "user_id", "buckets": 8}]}},
            "config.features.features[0]: missing key(s) ['side']",
        ),
        (
            {"features": {"features": [{"name": "user_id", "buckets": 8, "side": "user", "dim": 4}]}},
            "config.features.features[0]: unknown key(s) ['dim']",
        ),
        ({"index": {"min_recall": 1.01}}, "index.min_recall=1.01: must be a number in [0, 1]"),
        (
            {"student": {"adapter_prior_sds": [0.1, 0]}},
            "student.adapter_prior_sds[1]=0: must be a number in (0, 1000000]",
        ),
        (
            {"student": {"variants": ["kd", "kd"]}},
            "student.variants=['kd', 'kd']: must be a non-empty JSON array without "
            "duplicates, each element one of ['labels', 'kd', 'adapter', ",
        ),
        ({"student": {"variants": ["labels", "distill"]}}, "student.variants[1]='distill': must be one of ['labels', "),
        ({"student": {"features": "user_id"}}, "student.features='user_id': must be a non-empty JSON array"),
    ],
)
def test_type_and_range_errors_name_the_key_the_value_and_what_is_allowed(overrides, message):
    _refused(overrides, message)


def test_the_top_level_must_be_an_object():
    _refused([{"train": {"epochs": 1}}], "config=[{'train': {'epochs': 1}}]: must be a JSON object")


def test_valid_edge_values_and_json_forms_are_accepted():
    cfg = GemConfig.from_dict(
        {
            "world": {"surfaces": ["feed"], "start_date": "2026-01-01"},
            "features": {"lookback_days": 0, "sequence_item_attributes": []},
            "train": {"retrieval_weight": 0, "min_lr_fraction": 1, "dense_lr": 1},
            "model": {"sequence": {"n_recent": 0}, "tower_dims": []},
            "index": {"exact_below": 0, "min_recall": 0},
            "data": {"label_check_min_rows": 0, "click_rate_bounds": [0, 1]},
            "student": {"embedding_lag_days": 0, "kd_weight": 0},
        }
    )
    assert cfg.world.surfaces == ("feed",) and cfg.world.start_date == date(2026, 1, 1)
    assert cfg.train.dense_lr == 1.0 and isinstance(cfg.train.dense_lr, float)  # an int is a JSON number
    assert cfg.data.click_rate_bounds == (0.0, 1.0) and cfg.model.tower_dims == ()


def test_an_integer_for_a_float_field_does_not_rename_the_model():
    assert GemConfig.from_dict({"train": {"grad_clip": 1}}).fingerprint == PRESET_FINGERPRINTS["tiny"]
    assert TrainConfig(grad_clip=1) == TrainConfig() and isinstance(TrainConfig(grad_clip=1).grad_clip, float)


def test_config_errors_are_value_errors():
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize(
    "text, message",
    [
        (None, " does not exist; point GEM_CONFIG at an existing file, or unset it"),
        ("", " is empty; write a JSON object of overrides, e.g. {"),
        ("  \n", " is empty; write a JSON object of overrides"),
        (
            '{"train": {"epochs": 1,}}',
            " is not valid JSON: Expecting property name enclosed in double quotes at line 1, "
            "column 24; fix the syntax there",
        ),
        (
            '{\n  "train": {"epochs": 1}\n  "world": {}\n}',
            " is not valid JSON: Expecting ',' delimiter at line 3, column 3",
        ),
        ("[1, 2]", ": the top level is an array, not a JSON object; write a JSON object of overrides"),
        ('"train"', ": the top level is a string, not a JSON object"),
    ],
)
def test_a_bad_gem_config_file_is_named_with_the_problem_and_the_fix(tmp_path, monkeypatch, text, message):
    path = tmp_path / "overrides.json"
    if text is not None:
        path.write_text(text)
    monkeypatch.setenv("GEM_CONFIG", str(path))
    with pytest.raises(ConfigError, match="^" + re.escape(f"config file {path} (GEM_CONFIG or --config){message}")):
        GemConfig.from_env()


def test_a_bad_value_in_a_gem_config_file_names_the_file_and_the_key(tmp_path, monkeypatch):
    path = tmp_path / "overrides.json"
    path.write_text('{"train": {"compile": "false", "epochs": 1}}')
    monkeypatch.setenv("GEM_CONFIG", str(path))
    with pytest.raises(ConfigError, match="^" + re.escape(f"config file {path}: train.compile='false': must be true")):
        GemConfig.from_env()
    path.write_text('{"train": {"epochs": 1}}')
    assert GemConfig.from_env().train.epochs == 1


@pytest.mark.parametrize(
    "section, key, value, allowed",
    [
        ("world", "n_days", 100_000_000, "an integer in [1, 3660]"),
        ("train", "nproc", 100_000, "an integer in [1, 4096]"),
        ("export", "nproc", 4097, "an integer in [1, 4096]"),
        ("world", "impressions_per_day", 2**31, "an integer in [1, 2147483647]"),
        ("world", "activity_sigma", 50, "a number in [0, 10]"),
        ("train", "batch_size", 2**24 + 1, "an integer in [1, 16777216]"),
        ("train", "epochs", 1_000_000, "an integer in [1, 10000]"),
        ("train", "window_days", 3661, "an integer in [0, 3660]"),
        ("train", "dense_lr", 30, "a number in (0, 10]"),
        ("train", "temperature", 1000, "a number in (0, 100]"),
        ("train", "retrieval_weight", 1e9, "a number in [0, 1000]"),
        ("train", "seed", 2**32, "an integer in [0, 4294967295]"),
        ("model", "embedding_dim", 1_000_000, "an integer in [1, 65536]"),
        ("features", "max_seq_len", 2**21, "an integer in [1, 1048576]"),
        ("student", "eval_days", 5000, "an integer in [1, 3660]"),
        ("index", "nprobe", 2**40, "an integer in [1, 2147483647]"),
    ],
)
def test_values_past_their_upper_bound_are_refused_naming_the_key_the_value_and_the_range(section, key, value, allowed):
    _refused({section: {key: value}}, f"{section}.{key}={value!r}: must be {allowed}")


def test_a_gem_config_file_with_a_huge_calendar_or_process_count_is_refused_before_anything_runs(tmp_path, monkeypatch):
    path = tmp_path / "overrides.json"
    monkeypatch.setenv("GEM_CONFIG", str(path))
    for text, message in [
        ('{"world": {"n_days": 100000000}}', "world.n_days=100000000: must be an integer in [1, 3660]"),
        ('{"train": {"nproc": 100000}}', "train.nproc=100000: must be an integer in [1, 4096]"),
    ]:
        path.write_text(text)
        with pytest.raises(ConfigError, match="^" + re.escape(f"config file {path}: {message}")):
            GemConfig.from_env()


def test_a_calendar_running_past_the_last_date_is_refused():
    _refused(
        {"world": {"start_date": "9999-12-30", "n_days": 3}},
        "world.start_date=9999-12-30 with world.n_days=3 runs past 9999-12-31; start the calendar earlier",
    )
    assert GemConfig.from_dict({"world": {"start_date": "9999-12-29", "n_days": 3}}).world.days[-1] == date.max


HOSTILE_CONFIG_FILES = [
    (
        b'{"train": {"epochs": 1},\n "world": {},\n "train": {"epochs": 9}}',
        " repeats the key 'train' at line 3, first given at line 1 (only one copy would be kept, silently); keep one",
    ),
    (b'{"train": {"epochs": 1, "epochs": 9}}', " repeats the key 'epochs' at line 1, first given at line 1"),
    (b"[" * 50_000 + b"]" * 50_000, " nests deeper than 50 levels at line 1; flatten it"),
    (gzip.compress(b'{"train": {"epochs": 1}}'), " is gzip-compressed; decompress it: it must be UTF-8 text"),
    (
        '{"data": {"data_dir": "/données"}}'.encode("latin-1"),
        " is not UTF-8 text (byte 0xe9 at line 1); save it as UTF-8",
    ),
    (b'{"train": {"epochs": 1}}\x00\x00', " is binary (a NUL byte at line 1); it must be UTF-8 text"),
    (b" " * (MAX_BYTES + 1), f" is larger than {MAX_BYTES} bytes"),
]


@pytest.mark.parametrize("data, message", HOSTILE_CONFIG_FILES)
def test_a_hostile_gem_config_file_is_refused_naming_the_file_and_the_problem(tmp_path, monkeypatch, data, message):
    """Repeated keys (JSON keeps the last silently), deep nesting (a RecursionError), gzip, Latin-1, binary, huge."""
    path = tmp_path / "overrides.json"
    path.write_bytes(data)
    monkeypatch.setenv("GEM_CONFIG", str(path))
    with pytest.raises(ConfigError, match="^" + re.escape(f"config file {path} (GEM_CONFIG or --config){message}")):
        GemConfig.from_env()


def test_allowing_data_outside_the_data_root_does_not_rename_the_teacher():
    allowed = GemConfig.from_dict({"data": {"allow_outside_data_root": True}})
    assert allowed.data.allow_outside_data_root and allowed.fingerprint == PRESET_FINGERPRINTS["tiny"]


def test_the_gem_cli_prints_a_config_error_instead_of_a_traceback(tmp_path, monkeypatch):
    from jobs.cli import main

    (tmp_path / "empty.json").write_text("")
    monkeypatch.setenv("GEM_CONFIG", str(tmp_path / "empty.json"))
    # The demo stand-in reads the config as dagster_project.demo does, without importing Dagster.
    demo = types.ModuleType("dagster_project.demo")
    demo.main = lambda verbose=False: GemConfig.from_env()
    monkeypatch.setitem(sys.modules, "dagster_project.demo", demo)
    with pytest.raises(SystemExit) as exit_info:
        main(["demo"])
    assert str(exit_info.value).startswith(
        f"gem demo: config file {tmp_path / 'empty.json'} (GEM_CONFIG or --config) is empty"
    )


def test_wukong_experts_must_divide_each_block():
    _refused(
        {"model": {"experimental": {"wukong_experts": 3}}},
        "model.wukong.n_fm=8 must be divisible by model.experimental.wukong_experts=3",
    )


@pytest.mark.parametrize(
    "where, key",
    [
        ("model.sequence", "candidate_token"),
        ("model.sequence", "keep_by"),
        ("model.sequence", "dropout"),
        ("model.sequence", "summary_mean"),
        ("model.sequence", "causal"),
        ("model.wukong", "attentive"),
        ("model", "tasks"),
        ("train", "sparse_weight_decay"),
        ("train", "dense_weight_decay"),
        # Moved to model.experimental.
        ("model", "interleave"),
        ("model.sequence", "activation"),
        ("model.sequence", "summary"),
        ("model.wukong", "n_experts"),
        # The per-impression pyramid's, retired with it for the timeline arch.
        ("model.sequence", "pyramid"),
        ("model.sequence", "n_cls"),
        ("model.experimental", "interleave"),
        ("model.experimental", "pffn"),
        ("model.experimental", "attention_activation"),
        ("model.experimental", "attention_window"),
        ("model.experimental", "seed_pooling"),
        ("model.experimental", "comp_skip"),
    ],
)
def test_removed_and_moved_settings_are_unknown_keys(where, key):
    """Tries that lost went with their code, the research options live in model.experimental alone, and the
    pyramid's settings went with it."""
    overrides: dict = {key: 1}
    for section in reversed(where.split(".")):
        overrides = {section: overrides}
    _refused(overrides, f"config.{where}: unknown key(s) ['{key}']")
