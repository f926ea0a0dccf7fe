import json
from datetime import date

import pytest

from gem_model.config import FeatureSpec, GemConfig, TrainConfig, WorldConfig


def test_presets_round_trip_through_json():
    for name in ("tiny", "small"):
        cfg = GemConfig.from_preset(name)
        assert GemConfig.from_dict(json.loads(cfg.to_json())) == cfg


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


def test_data_source_is_validated_and_overridable(monkeypatch):
    with pytest.raises(ValueError, match="data.source='kaggle' is not one of"):
        GemConfig.from_dict({"data": {"source": "kaggle"}})
    monkeypatch.setenv("GEM_DATA_SOURCE", "criteo")
    assert GemConfig.from_env().data.source == "criteo"


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


def test_a_teacher_manifest_with_outdated_downstream_settings_still_loads_its_config():
    from gem_model.export.checkpoint import teacher_config

    saved = GemConfig.from_dict({"model": {"repr_dim": 16}}).to_dict()
    saved["student"]["a_renamed_field"] = 1  # written by an older version of the student settings
    cfg = teacher_config({"config": saved})
    assert cfg.model.repr_dim == 16 and cfg.student == GemConfig().student


def test_sequence_item_attributes_are_ad_attributes_with_their_own_side_columns():
    spec = FeatureSpec()
    category = spec.by_name("category").buckets
    assert spec.sequence_side_columns == {"seq_action_idx": 16, "seq_age_idx": 16, "seq_category_idx": category}
    assert spec.kjt_keys[-1] == "seq_category_idx"
    assert FeatureSpec(sequence_item_attributes=()).sequence_side_columns.keys() == {"seq_action_idx", "seq_age_idx"}
    with pytest.raises(ValueError, match="'country' is not an ad attribute"):
        FeatureSpec(sequence_item_attributes=("country",))
