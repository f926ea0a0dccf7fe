"""bench.common's `train` reads a bench model back only if it was trained on the lake's Delta version."""

import json

import pytest

from bench.common import train
from gem_model.config import GemConfig
from gem_model.paths import GemPaths


@pytest.fixture
def trained(tmp_path) -> GemPaths:
    paths = GemPaths(tmp_path)
    model_dir = paths.model_dir("bench-v")
    model_dir.mkdir(parents=True)
    (model_dir / "manifest.json").write_text(
        json.dumps({"training_data": {"delta_version": 7}, "metrics": {"ctr/ne": 0.86}})
    )
    return paths


def test_a_bench_model_of_the_lakes_version_is_read_back_not_retrained(trained):
    assert train(GemConfig(), trained, "bench-v", data_version=7)["metrics"] == {"ctr/ne": 0.86}


def test_a_bench_model_of_another_version_of_the_lake_is_refused_with_the_fix(trained):
    with pytest.raises(
        SystemExit,
        match=r"bench-v was trained on Delta version 7 of gold.user_timelines and the "
        r"table is at version 8 now.*move the directory aside to retrain it",
    ):
        train(GemConfig(), trained, "bench-v", data_version=8)
