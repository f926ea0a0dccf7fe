"""Dagster's instance storage in a real PostgreSQL (dagster-postgres): the multi-host deployment's storage.

The module starts a PostgreSQL server from Debian's binaries (`initdb`, `pg_ctl`) with a data
directory of its own, on 127.0.0.1 and a free port, with password authentication, and stops it
afterwards. A run of the code location, launched as `gem demo` launches its runs, writes its run,
events and materialization there; they are read back through the instance, through a second
instance opened from another DAGSTER_HOME with the same `dagster.yaml`, and with plain SQL. As root
(CI) the server runs as the `postgres` user the Debian package creates, since PostgreSQL refuses
to run as root. `.ci/system_packages.sh` installs the package; without it the module is skipped,
unless GEM_REQUIRE_SYSTEM_TESTS=1 (CI) makes that a failure.
"""

import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import psycopg2
import pytest

from dagster_project.code_location_runs import CodeLocationRuns
from dagster_project.run_monitoring import INSTANCE_CONFIG
from gem_model.paths import GemPaths
from tests.conftest import system_test_unavailable

pytestmark = pytest.mark.dist  # a database server, a code server and a run worker
PASSWORD_VARIABLE = "GEM_TEST_POSTGRES_PASSWORD"
JOB, ASSET = "build_reports_job", dg.AssetKey(["reports", "sql_pack"])


@dataclass(frozen=True)
class Postgres:
    host: str
    port: int
    username: str
    password: str
    db_name: str

    def connect(self, db_name: str | None = None) -> "psycopg2.extensions.connection":
        """A psycopg2 connection to `db_name` (default: the test's database)."""
        return psycopg2.connect(
            host=self.host, port=self.port, user=self.username, password=self.password, dbname=db_name or self.db_name
        )


def _bindir() -> Path | None:
    """Debian's newest /usr/lib/postgresql/<major>/bin (not on PATH there), else that of an `initdb` on PATH."""
    debian = sorted(
        Path("/usr/lib/postgresql").glob("[0-9]*/bin/initdb"),
        key=lambda p: [int(part) for part in p.parts[-3].split(".") if part.isdigit()],
    )
    if debian:
        return debian[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@pytest.fixture(scope="module")
def postgres(free_port) -> Iterator[Postgres]:
    """A PostgreSQL server on 127.0.0.1 with an empty database `dagster` owned by the user `gem`."""
    bindir = _bindir()
    as_root = os.geteuid() == 0
    problem = None
    if bindir is None or not (bindir / "pg_ctl").exists():
        problem = "PostgreSQL is not installed (no initdb and pg_ctl): run .ci/system_packages.sh"
    elif as_root and (
        shutil.which("runuser") is None or subprocess.run(["id", "postgres"], capture_output=True).returncode != 0
    ):
        problem = "running as root, with no `postgres` user (or no runuser) to run PostgreSQL as"
    if problem:
        system_test_unavailable(problem)
    as_server = ["runuser", "-u", "postgres", "--"] if as_root else []
    # Not under pytest's tmp dir: as root that is mode 0700, which the postgres user cannot enter.
    root = Path(tempfile.mkdtemp(prefix="gem-postgres-"))
    data, log = root / "data", root / "server.log"
    server = Postgres(
        host="127.0.0.1", port=free_port(), username="gem", password=secrets.token_hex(16), db_name="dagster"
    )
    (root / "password").write_text(server.password)
    if as_root:
        for path in (root, root / "password"):
            shutil.chown(path, "postgres", "postgres")

    def pg(tool: str, *args: str) -> None:
        try:
            subprocess.run(
                [*as_server, str(bindir / tool), *args], check=True, cwd=root, capture_output=True, text=True
            )
        except subprocess.CalledProcessError as error:
            server_log = log.read_text()[-3000:] if log.exists() else ""
            pytest.fail(f"{tool} {' '.join(args)} failed: {error.stdout}{error.stderr}{server_log}")

    try:
        pg(
            "initdb",
            "-D",
            str(data),
            "--username",
            server.username,
            "--pwfile",
            str(root / "password"),
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--locale=C",
        )
        with (data / "postgresql.conf").open("a") as conf:  # owner unchanged: appending keeps it
            conf.write(
                f"listen_addresses = '127.0.0.1'\nport = {server.port}\n"
                f"unix_socket_directories = '{root}'\nfsync = off\n"
            )
        pg("pg_ctl", "-D", str(data), "-l", str(log), "-w", "-t", "60", "start")
        connection = server.connect("postgres")
        try:
            connection.autocommit = True  # CREATE DATABASE cannot run in a transaction
            with connection.cursor() as cursor:
                cursor.execute(f"CREATE DATABASE {server.db_name}")
        finally:
            connection.close()
        yield server
    finally:
        if (data / "postmaster.pid").exists():
            subprocess.run(
                [*as_server, str(bindir / "pg_ctl"), "-D", str(data), "stop", "-m", "fast"],
                cwd=root,
                capture_output=True,
                check=False,
            )
        shutil.rmtree(root, ignore_errors=True)


def _instance_config(server: Postgres) -> str:
    """The project's dagster.yaml (launcher, run monitoring) plus Postgres storage, its password from the env.

    `scheme` names the driver: SQLAlchemy 2.1 maps a bare `postgresql://` to psycopg 3, which is not
    installed; dagster-postgres depends on psycopg2.
    """
    return (
        INSTANCE_CONFIG.read_text()
        + f"""
storage:
  postgres:
    postgres_db:
      hostname: {server.host}
      port: {server.port}
      username: {server.username}
      password:
        env: {PASSWORD_VARIABLE}
      db_name: {server.db_name}
      scheme: postgresql+psycopg2

# The test's own: leaving the workspace waits for its code server to exit, before the database stops.
code_servers:
  wait_for_local_processes_on_shutdown: true
"""
    )


def test_a_code_location_run_is_stored_in_postgres(postgres, gem_home, tmp_path, monkeypatch):
    dagster_home = GemPaths.from_env().dagster_home
    (dagster_home / "dagster.yaml").write_text(_instance_config(postgres))
    monkeypatch.setenv(PASSWORD_VARIABLE, postgres.password)  # the code server and run worker inherit it
    # Another DAGSTER_HOME with the same dagster.yaml, as on another host.
    elsewhere = tmp_path / "dagster_elsewhere"
    elsewhere.mkdir()
    shutil.copyfile(dagster_home / "dagster.yaml", elsewhere / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        with CodeLocationRuns(instance) as runs:
            run = runs.run(JOB)
        assert run.status == dg.DagsterRunStatus.SUCCESS

        # Through the instance: the run, its materialization events, the asset's latest materialization.
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.SUCCESS
        materializations = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
        assert [event.dagster_event.asset_key for event in materializations] == [ASSET]
        assert instance.get_latest_materialization_event(ASSET).run_id == run.run_id
        events = len(instance.all_logs(run.run_id))

    # In the database itself: the run, its materialization, and every event the instance read.
    connection = postgres.connect()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pipeline_name, status FROM runs WHERE run_id = %s", (run.run_id,))
            assert cursor.fetchall() == [(JOB, "SUCCESS")]
            cursor.execute(
                "SELECT asset_key FROM event_logs WHERE run_id = %s AND dagster_event_type = %s",
                (run.run_id, "ASSET_MATERIALIZATION"),
            )
            assert cursor.fetchall() == [('["reports", "sql_pack"]',)]
            cursor.execute("SELECT count(*) FROM event_logs WHERE run_id = %s", (run.run_id,))
            assert cursor.fetchone()[0] == events > 10
    finally:
        connection.close()

    with dg.DagsterInstance.from_config(str(elsewhere)) as other:  # the same runs and assets
        assert [r.run_id for r in other.get_runs()] == [run.run_id]
        assert other.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.SUCCESS
        assert other.get_latest_materialization_event(ASSET).run_id == run.run_id
    # Nothing went to Dagster's default SQLite files.
    for home in (dagster_home, elsewhere):
        assert not (home / "history" / "runs.db").exists()
        assert list(home.rglob("*.db")) == [], f"SQLite files under {home}"
