"""`gem` argument errors: one line naming the argument and what is allowed, before anything starts.

Each refused command runs against a temporary GEM_HOME of model stand-ins (manifests only) and, for
`gem export`, a one-column `gold.user_timelines` written by delta-rs; the command's body is replaced by
one that fails the test if called, and the GEM_HOME and Dagster folders are compared file by file.
"""

from datetime import date
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

import jobs.cli
from gem_model.paths import GemPaths
from gem_model.testing.models import write_model
from jobs.cli import main

DAYS = [date(2026, 11, 1), date(2026, 11, 2), date(2026, 11, 3)]


@pytest.fixture
def home(gem_home: Path, monkeypatch: pytest.MonkeyPatch) -> GemPaths:
    """Two models (gem-a promoted), an ads index of gem-a for 2026-11-03, training examples for the calendar's
    first three days and a stray day before it, and `neighbors` / `export` that fail the test if reached."""
    monkeypatch.delenv("GEM_CONFIG", raising=False)
    monkeypatch.delenv("GEM_DATA_SOURCE", raising=False)
    monkeypatch.setenv("GEM_PRESET", "tiny")
    paths = GemPaths(gem_home)
    write_model(paths, "gem-a", ctr_auc=0.62)
    write_model(paths, "gem-b", ctr_auc=0.63)
    paths.set_latest_model_version("gem-a")
    published = paths.index_dir("ads", "gem-a", DAYS[-1])
    published.mkdir(parents=True)
    (published / "CURRENT").write_text("build-1\n")
    stray = date(2026, 10, 31)  # rows, but not a day of the calendar (it starts on world.start_date)
    examples = pa.table(
        {"ds": pa.array([d for d in [stray, *DAYS] for _ in range(2)], pa.date32()), "label": [0, 1] * 4}
    )
    write_deltalake(str(paths.table("gold.user_timelines")), examples, partition_by=["ds"])

    def started(*args: object) -> None:
        pytest.fail(f"the command started with arguments {args}")

    monkeypatch.setattr(jobs.cli, "neighbors", started)
    monkeypatch.setattr(jobs.cli, "export", started)
    return paths


def _files(*roots: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for root in roots for p in sorted(root.rglob("*")) if p.is_file()}


def _refused(home: GemPaths, capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one line `gem argv` wrote to stderr, after checking it exited 2 and changed no file."""
    dagster = home.dagster_home
    before = _files(home.home, dagster)
    with pytest.raises(SystemExit) as refused:
        main(argv)
    err = capsys.readouterr().err
    assert refused.value.code == 2 and err.count("\n") == 1 and err.endswith("\n"), err
    assert _files(home.home, dagster) == before
    return err.rstrip("\n")


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--k", "0"], "argument --k: '0' is not allowed: give a whole number from 1 to 1,000"),
        (["--k", "1001"], "argument --k: '1001' is not allowed: give a whole number from 1 to 1,000"),
        (["--k", "ten"], "argument --k: 'ten' is not allowed: give a whole number from 1 to 1,000"),
        (
            ["--user-id", "-3"],
            "argument --user-id: '-3' is not allowed: give a whole number from 0 to 9,223,372,036,854,775,807",
        ),
        (["--ds", "notadate"], "argument --ds: 'notadate' is not a day: give an ISO date YYYY-MM-DD, e.g. 2026-11-06"),
        (["--ds", "20261103"], "argument --ds: '20261103' is not a day: give an ISO date YYYY-MM-DD, e.g. 2026-11-06"),
        (
            ["--ds", "2026-02-30"],
            "argument --ds: '2026-02-30' is not a day: give an ISO date YYYY-MM-DD, e.g. 2026-11-06",
        ),
        (["--ds", "2026-11-02"], "argument --ds: model gem-a has no ads index for 2026-11-02; its indexes: 2026-11-03"),
        (
            ["--model-version", "gem-b"],
            "argument --model-version: model gem-b has no ads index; export a day first: gem export --ds D",
        ),
    ],
)
def test_neighbors_arguments_are_refused_in_one_line_before_the_search(home, capsys, argv, line):
    argv = ["neighbors", *(["--user-id", "1"] if "--user-id" not in argv else []), *argv]
    assert _refused(home, capsys, argv) == f"gem neighbors: error: {line}"


def test_neighbors_model_version_must_be_a_known_plain_name(home, capsys):
    assert _refused(home, capsys, ["neighbors", "--user-id", "1", "--model-version", "../gem-a"]) == (
        "gem neighbors: error: argument --model-version: '../gem-a' is not a model version name (a plain name such "
        "as gem-tiny-0123456789-d5: no '/' or '..'); known versions: gem-a, gem-b"
    )
    assert _refused(home, capsys, ["neighbors", "--user-id", "1", "--model-version", "gem-c"]).endswith(
        f"'gem-c' is not a model version under {home.models}; known versions: gem-a, gem-b"
    )


def test_neighbors_valid_arguments_reach_the_search_with_the_newest_indexed_day(home, monkeypatch):
    calls = []
    monkeypatch.setattr(jobs.cli, "neighbors", lambda *args: calls.append(args))
    main(["neighbors", "--user-id", "7", "--k", "1000"])
    assert calls == [(home, 7, 1000, "gem-a", DAYS[-1])]


@pytest.mark.parametrize("ds", ["2030-01-01", "2026-10-31", "2026-11-04"])
def test_export_of_a_day_without_data_names_the_days_that_exist_and_starts_nothing(home, capsys, ds):
    assert _refused(home, capsys, ["export", "--ds", ds]) == (
        f"gem export: error: argument --ds: {ds} has no data to export; the days with gold.user_timelines rows: "
        "2026-11-01, 2026-11-02, 2026-11-03"
    )


def test_export_arguments_are_refused_in_one_line(home, capsys):
    assert _refused(home, capsys, ["export", "--ds", "11/03/2026"]) == (
        "gem export: error: argument --ds: '11/03/2026' is not a day: give an ISO date YYYY-MM-DD, e.g. 2026-11-06"
    )
    assert _refused(home, capsys, ["export", "--ds", "2026-11-03", "--model-version", "gem-c"]).startswith(
        "gem export: error: argument --model-version: 'gem-c' is not a model version under "
    )
    (home.models / "LATEST").unlink()
    assert _refused(home, capsys, ["export", "--ds", "2026-11-03"]).startswith(
        "gem export: error: argument --model-version not given, and no promoted model under "
    )


def test_export_valid_arguments_reach_the_run(home, monkeypatch):
    calls = []
    monkeypatch.setattr(jobs.cli, "export", lambda *args: calls.append(args))
    main(["export", "--ds", "2026-11-02"])
    main(["export", "--ds", "2026-11-03", "--model-version", "gem-b"])
    assert calls == [(DAYS[1], "gem-a"), (DAYS[2], "gem-b")]
