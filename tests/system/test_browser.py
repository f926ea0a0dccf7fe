"""The Dagster UI in a real browser: lineage, an asset page, and a partition materialised by clicking.

The module starts the UI as a user does (`dagster dev -w workspace.yaml`, as `make ui`) on
127.0.0.1 and a free port, with DAGSTER_HOME and GEM_HOME in temporary folders and the `tiny`
preset (its configured days), and drives Debian's headless Chromium through its chromedriver
(selenium, no driver download). It checks that the global lineage renders the asset groups and the feature assets,
then launches `bronze.events` for the calendar's first day from the asset page's Materialize
dialog, waits on the run page for the run to succeed, and reads the materialisation's metadata
on the asset page. On a failure it saves a screenshot and the page's text next to the
`dagster dev` log in the module's temporary folder, and names them. `.ci/system_packages.sh`
installs `chromium` and `chromium-driver`; without them the module is skipped, unless
GEM_REQUIRE_SYSTEM_TESTS=1 (CI) makes that a failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dagster_project.run_monitoring import ensure_instance_config
from gem_model.config import GemConfig
from tests.conftest import system_test_unavailable

ROOT = Path(__file__).resolve().parents[2]
BROWSER, DRIVER = "chromium", "chromedriver"
GROUPS = ("export", "features", "reports", "student", "training")
# Feature assets the lineage must draw (their node shows the key's last part).
FEATURE_NODES = ("events", "impressions", "user_sequences", "training_examples", "user_timelines")
# Bounds on waits that poll, so they cost nothing when all goes well: they catch what never happens, not a slow
# machine (on 2 cores under a load of 20-40 the UI-launched run was still STARTED after 300 s).
SERVE_TIMEOUT_S = 900  # dagster dev serves the code location
RUN_TIMEOUT_S = 1800  # the UI-launched run (a run worker, its Spark JVM, one landing) reaches a terminal state
PAGE_TIMEOUT_S = 120  # a page loads, an element or text shows
# The tiny world's configured days only: an open-ended calendar would grow a partition a day, and the
# Materialize dialog lists only the last 90.
OVERRIDES = {"world": {"open_ended": False}}


def _require_system_tools() -> tuple[str, str]:
    found = {tool: shutil.which(tool) for tool in (BROWSER, DRIVER)}
    missing = [tool for tool, path in found.items() if path is None]
    problem = None
    if missing:
        problem = f"headless Chromium is not installed ({', '.join(missing)} missing): run .ci/system_packages.sh"
    else:
        try:
            import selenium  # noqa: F401
        except ImportError:
            problem = "selenium is not installed: pip install --no-deps -r requirements.lock"
    if problem:
        system_test_unavailable(problem)
    return found[BROWSER], found[DRIVER]


@dataclass
class DagsterUI:
    url: str
    gem_home: Path
    log: Path
    process: subprocess.Popen

    def graphql(self, query: str, **variables: object) -> dict:
        request = urllib.request.Request(
            f"{self.url}/graphql",
            method="POST",
            data=json.dumps({"query": query, "variables": variables}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            body = json.load(response)
        assert not body.get("errors"), body["errors"]
        return body["data"]

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.is_file() else ""


LOCATIONS = """{ workspaceOrError { ... on Workspace { locationEntries {
  name loadStatus locationOrLoadError { __typename ... on PythonError { message } } } } } }"""
RUN = """query($runId: ID!) { runOrError(runId: $runId) { __typename
  ... on Run { status startTime endTime tags { key value } } ... on PythonError { message } } }"""
MATERIALIZATIONS = """query($path: [String!]!, $partition: String!) { assetOrError(assetKey: {path: $path}) {
  ... on Asset { assetMaterializations(partitions: [$partition]) { runId partition
    metadataEntries { label ... on IntMetadataEntry { intValue } ... on PathMetadataEntry { path } } } } } }"""


def _wait_until_served(ui: DagsterUI) -> None:
    """Until the webserver answers and has loaded the code location (or fail with the log's tail)."""
    deadline = time.monotonic() + SERVE_TIMEOUT_S
    while time.monotonic() < deadline:
        if ui.process.poll() is not None:
            pytest.fail(f"dagster dev exited with {ui.process.returncode}:\n{ui.log_tail()}")
        with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
            entries = ui.graphql(LOCATIONS)["workspaceOrError"]["locationEntries"]
            location = next((e for e in entries if e["name"] == "gem_pipeline"), None)
            if location and location["loadStatus"] == "LOADED":
                loaded = location["locationOrLoadError"]
                assert loaded["__typename"] == "RepositoryLocation", f"the code location failed to load: {loaded}"
                return
        time.sleep(1)
    pytest.fail(f"dagster dev did not serve the code location within {SERVE_TIMEOUT_S} s:\n{ui.log_tail()}")


def _interruptible() -> None:
    """Give Ctrl-C its default action in dagster dev: a suite started in the background (`... &` in a script)
    ignores SIGINT, and every process it starts would inherit that, so `_stop` would wait its 30 s for nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stop(process: subprocess.Popen) -> None:
    """Stop `dagster dev` as Ctrl-C does (it stops the webserver, daemon and code servers), then kill whatever
    of its process group is left (a run worker, its Spark JVM)."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGINT)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@pytest.fixture(scope="module")
def ui(tmp_path_factory, free_port) -> Iterator[DagsterUI]:
    """`dagster dev -w workspace.yaml` on a fresh instance and lake, serving on 127.0.0.1."""
    _require_system_tools()
    root = tmp_path_factory.mktemp("ui")
    dagster_home, gem_home = root / "dagster", root / "gem"
    ensure_instance_config(dagster_home)  # the project's dagster.yaml, as `make ui` copies it
    with (dagster_home / "dagster.yaml").open("a") as config:
        config.write("\ntelemetry:\n  enabled: false\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GEM_", "DAGSTER_"))}
    (root / "overrides.json").write_text(json.dumps(OVERRIDES))
    env.update(
        DAGSTER_HOME=str(dagster_home),
        GEM_HOME=str(gem_home),
        GEM_PRESET="tiny",
        GEM_CONFIG=str(root / "overrides.json"),
        SPARK_LOCAL_IP="127.0.0.1",
    )
    port = free_port()
    log = root / "dagster-dev.log"
    with log.open("w") as out:
        # Its own process group, so teardown reaches the code servers, the daemon and any run worker.
        process = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("dagster")),
                "dev",
                "-w",
                str(ROOT / "workspace.yaml"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
            ],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_interruptible,
        )
    ui = DagsterUI(f"http://127.0.0.1:{port}", gem_home, log, process)
    try:
        _wait_until_served(ui)
        yield ui
    finally:
        _stop(process)


@pytest.fixture(scope="module")
def browser(ui: DagsterUI):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = _require_system_tools()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-extensions",
        "--disable-sync",
        "--no-first-run",
        "--mute-audio",
        "--window-size=1920,1600",
    ):
        options.add_argument(argument)
    session = webdriver.Chrome(service=Service(driver), options=options)  # this chromedriver: no Selenium Manager
    session.set_page_load_timeout(PAGE_TIMEOUT_S)
    try:
        session.get(ui.url)
        # Dagster's first-visit "Join the Dagster community" dialog would cover the page; this is the key its
        # Skip button sets.
        session.execute_script("window.localStorage.setItem('communityNux', '1')")
        yield session
    finally:
        session.quit()


@contextlib.contextmanager
def _evidence_on_failure(browser, ui: DagsterUI, name: str) -> Iterator[None]:
    """On a failure, save the page's screenshot and text beside the dagster dev log and name them."""
    try:
        yield
    except Exception as error:
        shot, text = ui.log.with_name(f"{name}.png"), ui.log.with_name(f"{name}.txt")
        with contextlib.suppress(Exception):
            browser.save_screenshot(str(shot))
            text.write_text(f"{browser.current_url}\n\n{browser.find_element('tag name', 'body').text}")
        error.add_note(f"screenshot {shot}, page text {text}, dagster dev log {ui.log}:\n{ui.log_tail(2000)}")
        raise


def _wait(browser, condition: Callable, timeout: float = PAGE_TIMEOUT_S, message: str = ""):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, timeout, poll_frequency=0.5).until(condition, message)


def _rendered_nodes(browser) -> set[str]:
    # The graph's node titles carry their label as a tooltip; nodes outside the viewport are not rendered.
    return {e.text for e in browser.find_elements("css selector", "[data-tooltip]")}


def test_the_global_lineage_draws_the_groups_and_the_feature_assets(ui, browser):
    from selenium.webdriver.common.by import By

    with _evidence_on_failure(browser, ui, "lineage"):
        browser.get(f"{ui.url}/asset-groups")
        _wait(browser, lambda b: set(GROUPS) <= _rendered_nodes(b), message=f"group nodes {GROUPS}")
        # The page's heading, as a user reads it. (Not the document title: in some full-suite CI runs it stayed
        # "Dagster" for 30 s with the heading and every node drawn.)
        _wait(
            browser,
            lambda b: "Global asset lineage" in b.find_element(By.TAG_NAME, "body").text,
            message="the heading 'Global asset lineage'",
        )
        # Open the features group as a user does: its node's unfold toggle.
        group = browser.find_element(By.CSS_SELECTOR, "[data-tooltip='features']").find_element(
            By.XPATH, "ancestor::div[.//*[@aria-label='unfold_more']][1]"
        )
        group.find_element(By.CSS_SELECTOR, "[aria-label='unfold_more']").click()
        # Which of its assets fall in the viewport depends on the layout; two of them drawn is the group expanded.
        _wait(browser, lambda b: len(set(FEATURE_NODES) & _rendered_nodes(b)) >= 2, message="expanded features")
        # The group's own lineage draws its assets; which fall in the first view depends on the layout.
        browser.get(f"{ui.url}/locations/gem_pipeline/asset-groups/features/lineage")
        _wait(browser, lambda b: len(set(FEATURE_NODES) & _rendered_nodes(b)) >= 2, message="the group's lineage")
        # Its list names every one of them.
        browser.get(f"{ui.url}/locations/gem_pipeline/asset-groups/features/list")
        _wait(
            browser,
            lambda b: all(n in b.find_element(By.TAG_NAME, "body").text for n in FEATURE_NODES),
            message=f"the group's list naming {FEATURE_NODES}",
        )


def test_a_partition_materialised_from_the_asset_page_succeeds_and_shows_its_metadata(ui, browser):
    from deltalake import DeltaTable
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as EC

    day = GemConfig.from_preset("tiny").world.start_date.isoformat()  # bronze.events needs nothing upstream
    with _evidence_on_failure(browser, ui, "materialize"):
        browser.get(f"{ui.url}/assets/bronze/events")
        _wait(browser, EC.text_to_be_present_in_element((By.TAG_NAME, "body"), "Never materialized"))
        _wait(
            browser, EC.element_to_be_clickable((By.XPATH, "//button[starts-with(normalize-space(), 'Materialize')]"))
        ).click()
        dialog = _wait(
            browser,
            EC.visibility_of_element_located(
                (
                    By.XPATH,
                    "//div[contains(@class, 'dialog')][contains(., 'Launch runs to materialize bronze / events')]",
                )
            ),
        )
        partitions = dialog.find_element(By.CSS_SELECTOR, "input[type='text']")
        partitions.send_keys(day, Keys.ENTER)
        _wait(browser, EC.element_to_be_clickable((By.XPATH, "//button[normalize-space()='Launch 1 run']"))).click()
        # The toast names the run; its View link opens the run page.
        _wait(
            browser,
            EC.element_to_be_clickable((By.XPATH, "//*[contains(., 'Launched run')]//a[normalize-space()='View']")),
        ).click()
        _wait(browser, EC.url_contains("/runs/"))
        run_id = browser.current_url.rstrip("/").rsplit("/", 1)[-1].split("?")[0]

        # The instance's view (GraphQL) is the robust one; the run page must end up saying the same.
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while (run := ui.graphql(RUN, runId=run_id)["runOrError"])["status"] not in ("SUCCESS", "FAILURE", "CANCELED"):
            assert time.monotonic() < deadline, f"run {run_id} still {run['status']} after {RUN_TIMEOUT_S} s"
            time.sleep(1)
        assert run["status"] == "SUCCESS", f"run {run_id} ended {run['status']}"
        assert {"key": "dagster/partition", "value": day} in run["tags"]
        if "[SUCCESS]" not in browser.title:  # the page follows the run live; a reload settles a missed update
            with contextlib.suppress(TimeoutException):
                _wait(browser, lambda b: "[SUCCESS]" in b.title, timeout=10)
            browser.refresh()
        _wait(browser, lambda b: "[SUCCESS]" in b.title, message="the run page's title says SUCCESS")
        print(f"UI-launched run {run_id} of bronze.events [{day}]: {run['endTime'] - run['startTime']:.1f} s")

        # What the run wrote, read from the Delta table itself.
        table = ui.gem_home / "lake" / "bronze" / "events"
        rows = DeltaTable(str(table)).to_pyarrow_dataset().count_rows()
        assert rows > 0
        [materialization] = ui.graphql(MATERIALIZATIONS, path=["bronze", "events"], partition=day)["assetOrError"][
            "assetMaterializations"
        ]
        assert materialization["runId"] == run_id
        metadata = {e["label"]: e.get("intValue", e.get("path")) for e in materialization["metadataEntries"]}
        assert metadata["dagster/row_count"] == metadata["table_rows"] == rows
        assert metadata["path"] == str(table)

        browser.get(f"{ui.url}/assets/bronze/events")

        # The page fills its panels from separate queries: wait for the partition too, not only the row count.
        def _body(b) -> str:
            return b.find_element(By.TAG_NAME, "body").text

        _wait(
            browser,
            lambda b: "Row count" in (text := _body(b)) and day in text,
            message=f"the asset page shows the row count and the latest materialisation's partition {day}",
        )
        page = _body(browser)
        assert "Never materialized" not in page
        assert f"Row count\n{rows:,}" in page
        for label, value in (("table_rows", str(rows)), ("path", str(table))):
            assert label in page and value in page, f"{label} = {value} is not on the asset page"
