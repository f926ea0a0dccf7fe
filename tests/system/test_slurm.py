"""The Slurm launcher against a real Slurm: one node on this host (Debian's slurmctld, slurmd and munge).

The module starts munged, slurmctld and slurmd with a configuration of its own on 127.0.0.1 and
free ports, and stops them afterwards. `.ci/system_packages.sh` installs the packages; without
them the module is skipped, unless GEM_REQUIRE_SYSTEM_TESTS=1 (CI) makes that a failure.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import dagster as dg
import pytest

from dagster_project.definitions import build_definitions
from dagster_project.resources.lake import LakeResource
from dagster_project.resources.launchers import JobLauncher, JobLaunchError, SlurmTorchrunLauncher, scontrol_job
from tests.conftest import system_test_unavailable

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch")
pytestmark = pytest.mark.dist


def _config(root: Path, host: str, free_port: Callable[[], int]) -> str:
    return f"""\
ClusterName=gemtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=600
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@pytest.fixture(scope="module")
def slurm(tmp_path_factory, free_port) -> Iterator[dict[str, str]]:
    """The environment (SLURM_CONF) of a one-node Slurm cluster running on this host."""
    missing = [tool for tool in DAEMONS if shutil.which(tool) is None]
    if missing:
        message = f"Slurm is not installed ({', '.join(missing)} missing): run .ci/system_packages.sh"
        system_test_unavailable(message)
    root = tmp_path_factory.mktemp("slurm")
    for folder in ("state", "spool"):
        (root / folder).mkdir()
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    conf = root / "slurm.conf"
    host = socket.gethostname().split(".")[0]  # the node's name, which the rendezvous host must resolve
    conf.write_text(_config(root, host, free_port))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    subprocess.run(
        [
            "munged",
            "--force",
            f"--key-file={key}",
            f"--socket={root}/munge.socket",
            f"--pid-file={root}/munged.pid",
            f"--log-file={root}/munged.log",
            f"--seed-file={root}/seed",
        ],
        check=True,
    )
    try:
        subprocess.run(["slurmctld", "-i", "-f", str(conf)], check=True, env=env)
        subprocess.run(["slurmd", "-f", str(conf), "-N", host], check=True, env=env)
        deadline = time.monotonic() + 600  # a node that never registers, not a slow daemon start
        while "idle" not in subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True).stdout:
            if time.monotonic() > deadline:
                pytest.fail(f"the Slurm node never became idle:\n{(root / 'slurmctld.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield {"SLURM_CONF": str(conf)}
    finally:
        subprocess.run(["scancel", "--user", str(os.getuid())], env=env, check=False)
        for daemon in ("slurmd", "slurmctld", "munged"):
            pid_file = root / f"{daemon}.pid"
            if pid_file.is_file():
                try:
                    os.kill(int(pid_file.read_text()), signal.SIGTERM)
                except ProcessLookupError:
                    pass


@pytest.fixture
def on_slurm(slurm, monkeypatch) -> None:
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)


@dg.asset
def probe(context: dg.AssetExecutionContext, launcher: JobLauncher) -> dg.MaterializeResult:
    """The module `probe`, which a test writes into the launcher's `workdir`."""
    return launcher.launch(context, "probe", [], nproc=1).get_materialize_result()


def test_gem_launcher_slurm_trains_the_teacher_with_pipes_messages_in_dagster(
    on_slurm, pipeline, tmp_path, monkeypatch
):
    lake, _, _ = pipeline
    home = tmp_path / "gem"
    shutil.copytree(lake.paths.lake, home / "lake")  # the features; the model is trained anew here
    (tmp_path / "launcher.json").write_text(json.dumps({"cpus_per_task": os.cpu_count(), "poll_interval_s": 1}))
    monkeypatch.setenv("GEM_LAUNCHER", "slurm")
    monkeypatch.setenv("GEM_LAUNCHER_CONFIG", str(tmp_path / "launcher.json"))
    monkeypatch.setenv("GEM_HOME", str(home))
    here = LakeResource(home=str(home), preset=lake.preset, config_path=lake.config_path)
    defs = build_definitions(lake=here)
    assert isinstance(defs.resources["launcher"], SlurmTorchrunLauncher)
    instance = dg.DagsterInstance.ephemeral()

    result = defs.resolve_job_def("train_teacher_job").execute_in_process(instance=instance)

    assert result.success
    [materialization] = result.get_asset_materialization_events()
    metadata = {k: v.value for k, v in materialization.materialization.metadata.items()}
    job = scontrol_job(metadata["slurm_job_id"])
    assert (job["JobState"], job["ExitCode"], job["NumNodes"]) == ("COMPLETED", "0:0", "1")
    assert metadata["promoted"] is True and here.latest_model_version() == metadata["model_version"]
    manifest = json.loads((here.paths.model_dir(metadata["model_version"]) / "manifest.json").read_text())
    assert manifest["world_size"] == lake.config.train.nproc and manifest["metrics"]["ctr/auc"] > 0.5
    # The ranks' threads: the node's CPUs shared between them, not torchrun's 1.
    script = Path(metadata["slurm_log"]).with_suffix(".sbatch").read_text()
    assert f"--cpus-per-task={os.cpu_count()}" in script and "export OMP_NUM_THREADS=" in script
    # Rank 0's progress lines crossed from the Slurm job to Dagster through Pipes.
    messages = [e.message for e in instance.all_logs(result.run_id) if e.step_key == "teacher_model"]
    assert any("examples/s" in m for m in messages)


def test_a_job_that_can_never_start_is_cancelled_naming_the_reason(on_slurm, tmp_path):
    launcher = SlurmTorchrunLauncher(
        gem_home=str(tmp_path / "gem"), nnodes=2, workdir=str(tmp_path), poll_interval_s=0.5
    )  # a cluster of one node
    (tmp_path / "probe.py").write_text("print('never runs')\n")
    with pytest.raises(
        JobLaunchError,
        match=r"Slurm job (\d+) is pending with Reason=Partition\w+: it can "
        r"never start as submitted; cancelling it",
    ) as failed:
        dg.materialize([probe], resources={"launcher": launcher})
    job_id = str(failed.value).split()[2]
    assert scontrol_job(job_id)["JobState"] == "CANCELLED"


def test_a_failed_job_reports_its_state_and_the_exception_it_died_of(on_slurm, tmp_path):
    (tmp_path / "probe.py").write_text("raise ValueError('train.batch_size=0 must be >= 1')\n")
    launcher = SlurmTorchrunLauncher(gem_home=str(tmp_path / "gem"), workdir=str(tmp_path), poll_interval_s=0.5)
    with pytest.raises(JobLaunchError) as failed:
        dg.materialize([probe], resources={"launcher": launcher})
    message = str(failed.value)
    assert "JobState FAILED" in message and "ExitCode 1:0" in message
    assert "ValueError: train.batch_size=0 must be >= 1" in message
