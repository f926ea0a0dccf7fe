"""Shared fixtures (one local Spark session, a temporary GEM_HOME per test, one e2e pipeline lake, free ports)
and the tiers: tests under tests/e2e are marked `slow`, those under tests/system `system`, so that
`-m "not slow and not system"` is the unit tier (`make test-fast`)."""

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest

# Spark (the tests' sessions and the JVMs their subprocesses start) binds to loopback only.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

# The device the kernel tests run on: cpu (Triton's interpreter) or cuda (compiled kernels, bench/perf/gpu_check.sh).
KERNEL_DEVICE = os.environ.get("GEM_KERNEL_DEVICE", "cpu")
if KERNEL_DEVICE == "cpu":
    # Triton decides once, when triton.language is first imported, whether its functions run compiled or in
    # the CPU interpreter, and a test of any tier may import it first (fbgemm, torch.compile). So it is imported
    # here, before any test, under TRITON_INTERPRET=1, which is then unset again: left in the environment it
    # would reach every torchrun worker the other tests start. The kernel tests set it for themselves.
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.language  # noqa: E402, F401

    os.environ.pop("TRITON_INTERPRET")

# The end-to-end lake: tiny, 4 days (2 of them the holdout the export scores).
PIPELINE_OVERRIDES = {"world": {"n_days": 4, "impressions_per_day": 3000}}

TESTS = Path(__file__).parent
# Each tier's folder and the marker its tests get, so a test is in a tier by where it lives.
TIER_MARKERS = {"e2e": "slow", "system": "system"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for folder, marker in TIER_MARKERS.items():
            if item.path.is_relative_to(TESTS / folder):
                item.add_marker(marker)


def system_test_unavailable(problem: str) -> NoReturn:
    """Skip the calling test (or module) for a system tool or setup this machine lacks, or fail it where
    GEM_REQUIRE_SYSTEM_TESTS=1 (CI, which installs them all: every system test must run)."""
    if os.environ.get("GEM_REQUIRE_SYSTEM_TESTS") == "1":
        pytest.fail(problem)
    pytest.skip(problem)


def real_data_root() -> Path:
    """The real datasets' folder (`gem_lake.sources.data_dir`); skips the calling test, or module, where it is
    absent."""
    from gem_lake.sources import data_dir
    from gem_model.config import GemConfig

    try:
        return data_dir(GemConfig())
    except FileNotFoundError as missing:
        pytest.skip(f"real datasets are not on this machine: {missing}", allow_module_level=True)


@pytest.fixture(scope="session")
def free_port() -> Callable[[], int]:
    """A function returning a TCP port on 127.0.0.1 that is free when asked (a server should bind it soon)."""

    def port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    return port


@pytest.fixture(scope="session")
def spark():
    from gem_lake.spark.session import build_spark_session

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


@pytest.fixture(scope="session")
def pipeline(tmp_path_factory, spark):
    """(lake, defs, instance) after materialising the whole asset graph once into a temporary GEM_HOME."""
    from dagster_project.definitions import build_definitions
    from dagster_project.demo import in_process, instance_for, run_pipeline
    from dagster_project.resources.lake import LakeResource

    root = tmp_path_factory.mktemp("e2e")
    (root / "overrides.json").write_text(json.dumps(PIPELINE_OVERRIDES))
    lake = LakeResource(home=str(root / "gem"), preset="tiny", config_path=str(root / "overrides.json"))
    mp = pytest.MonkeyPatch()
    mp.setenv("GEM_HOME", lake.home)
    mp.setenv("DAGSTER_HOME", str(root / "dagster"))
    defs = build_definitions(lake=lake)
    instance = instance_for(lake)
    run_pipeline(lake, in_process(defs, instance))
    yield lake, defs, instance
    mp.undo()
