"""Shared fixtures: one local Spark session for the whole run, a temporary GEM_HOME per test."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def spark():
    from jobs.spark_session import build_spark_session

    session = build_spark_session()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def gem_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GEM_HOME", str(tmp_path / "gem"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    (tmp_path / "dagster").mkdir()
    return tmp_path / "gem"
