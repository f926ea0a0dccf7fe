"""Cluster launchers: their rendered specs, their selection by GEM_LAUNCHER, and their launch paths
through Dagster Pipes (Slurm via fake sbatch/srun/scontrol that run the batch script on this host,
Kubernetes via a fake client whose 'operator' runs the master pod's command here)."""

import json
import os
import re
import shlex
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from dagster_pipes import decode_param

from dagster_project.definitions import build_definitions
from dagster_project.resources.lake import LakeResource
from dagster_project.resources.launchers import (
    JobLauncher,
    JobLaunchError,
    KubernetesTorchrunLauncher,
    LocalTorchrunLauncher,
    SlurmTorchrunLauncher,
    job_name,
    launcher_from_env,
)

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
RUN_ID = "3F2A1B2C-9d8e-4f00-aaaa-0123456789ab"
TRAIN_ARGS = ["--config", "/gem/staging/train/v1.json", "--model-dir", "/gem/models/v1"]

# Reports what torchrun gave rank 0 and the arguments it received, as a Pipes materialisation.
PIPES_PROBE = """\
import os
import sys

from dagster_pipes import open_dagster_pipes

if os.environ["RANK"] == "0":
    with open_dagster_pipes() as pipes:
        pipes.log.info("probe rank 0 reporting")
        pipes.report_asset_materialization(metadata={
            "world_size": int(os.environ["WORLD_SIZE"]), "argv": " | ".join(sys.argv[1:]),
            "gem_home": os.environ["GEM_HOME"]})
"""
PROBE_ARGS = ["--greeting", "it's a $(HOME) test"]


def k8s_launcher(**fields: Any) -> KubernetesTorchrunLauncher:
    return KubernetesTorchrunLauncher(
        **{"image": "registry.example/gem:1", "gem_home": "/gem", "gem_home_claim": "gem-home", **fields}
    )


def containers(pod_template: dict[str, Any]) -> list[dict[str, Any]]:
    return pod_template["spec"]["containers"]


def test_pytorchjob_has_master_and_workers_running_torchrun_with_c10d():
    launcher = k8s_launcher(
        nnodes=3,
        gpus=8,
        cpu="32",
        memory="256Gi",
        service_account="trainer",
        namespace="ml",
        env={"NCCL_DEBUG": "WARN"},
    )
    job = launcher.render("jobs.train", TRAIN_ARGS, nproc=8, run_id=RUN_ID)

    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    name = job["metadata"]["name"]
    assert DNS_LABEL.fullmatch(name) and len(name) <= 63 and name.startswith("gem-train-3f2a1b2c")
    assert job["metadata"]["namespace"] == "ml"
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 2)
    assert job["spec"]["nprocPerNode"] == "8"
    for role in ("Master", "Worker"):
        pod = replicas[role]["template"]
        [container] = containers(pod)
        assert container["name"] == "pytorch"
        assert container["command"] == [
            "torchrun",
            "--nnodes=3",
            "--node-rank=$(RANK)",
            "--nproc-per-node=8",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=$(MASTER_ADDR):29400",
            f"--rdzv-id={name}",
            "-m",
            "jobs.train",
            *TRAIN_ARGS,
        ]
        assert "workingDir" not in container  # the image's WORKDIR: the module is found in its environment
        assert container["resources"]["limits"] == {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": "8"}
        assert {"name": "pytorchjob-port", "containerPort": 29400} in container["ports"]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env == {"GEM_HOME": "/gem", "NCCL_DEBUG": "WARN", "OMP_NUM_THREADS": "4"}  # 32 CPUs / 8 ranks
        assert {"name": "gem-home", "mountPath": "/gem"} in container["volumeMounts"]
        assert {"name": "gem-home", "persistentVolumeClaim": {"claimName": "gem-home"}} in pod["spec"]["volumes"]
        assert pod["spec"]["serviceAccountName"] == "trainer"
        assert pod["spec"]["restartPolicy"] == "Never"


def test_single_node_pytorchjob_has_no_workers_and_nproc_defaults_to_the_assets():
    job = k8s_launcher().render("jobs.score", ["--ds", "2026-11-03"], nproc=2, run_id=RUN_ID)
    assert set(job["spec"]["pytorchReplicaSpecs"]) == {"Master"}
    assert job["spec"]["nprocPerNode"] == "2"
    [container] = containers(job["spec"]["pytorchReplicaSpecs"]["Master"]["template"])
    assert "--nnodes=1" in container["command"] and "--nproc-per-node=2" in container["command"]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert {"name": "OMP_NUM_THREADS", "value": "1"} in container["env"]  # 2 ranks and no CPU request


def test_one_rank_per_pod_takes_the_pods_cpus_and_env_can_pin_the_threads():
    job = k8s_launcher(nproc_per_node=1).render("jobs.train", [], nproc=4, run_id=RUN_ID)
    [container] = containers(job["spec"]["pytorchReplicaSpecs"]["Master"]["template"])
    assert {
        "name": "OMP_NUM_THREADS",
        "valueFrom": {"resourceFieldRef": {"containerName": "pytorch", "resource": "limits.cpu", "divisor": "1"}},
    } in container["env"]
    job = k8s_launcher(cpu="7500m", nproc_per_node=2).render("jobs.train", [], nproc=1, run_id=RUN_ID)
    [container] = containers(job["spec"]["pytorchReplicaSpecs"]["Master"]["template"])
    assert {"name": "OMP_NUM_THREADS", "value": "3"} in container["env"]
    job = k8s_launcher(env={"OMP_NUM_THREADS": "16"}).render("jobs.train", [], nproc=2, run_id=RUN_ID)
    [container] = containers(job["spec"]["pytorchReplicaSpecs"]["Master"]["template"])
    assert [e for e in container["env"] if e["name"] == "OMP_NUM_THREADS"] == [
        {"name": "OMP_NUM_THREADS", "value": "16"}
    ]


def test_a_single_process_job_runs_once_on_one_node_whatever_the_launchers_nodes(tmp_path):
    job = (
        k8s_launcher(nnodes=3, nproc_per_node=8)
        .single_process()
        .render("jobs.train_student", ["--x"], nproc=1, run_id=RUN_ID)
    )
    assert set(job["spec"]["pytorchReplicaSpecs"]) == {"Master"}
    [container] = containers(job["spec"]["pytorchReplicaSpecs"]["Master"]["template"])
    assert "--nnodes=1" in container["command"] and "--nproc-per-node=1" in container["command"]
    script = (
        SlurmTorchrunLauncher(gem_home=str(tmp_path), nnodes=4, nproc_per_node=8)
        .single_process()
        .render("jobs.train_student", ["--x"], nproc=1, run_id=RUN_ID)
    )
    assert "#SBATCH --nodes=1" in script and "--nproc-per-node=1" in script
    assert LocalTorchrunLauncher().single_process() == LocalTorchrunLauncher()


def test_indexed_job_uses_completion_index_and_a_headless_service_for_rendezvous(tmp_path):
    manifest = k8s_launcher(kind="IndexedJob", nnodes=4, gpus=2, nproc_per_node=2, rdzv_port=29500).render(
        "jobs.train", TRAIN_ARGS, nproc=1, run_id=RUN_ID
    )

    assert (manifest["apiVersion"], manifest["kind"]) == ("v1", "List")
    service, job = manifest["items"]
    name = job["metadata"]["name"]
    assert DNS_LABEL.fullmatch(name) and len(name) <= 52
    assert (service["apiVersion"], service["kind"], service["metadata"]["name"]) == ("v1", "Service", name)
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["ports"] == [{"name": "rdzv", "port": 29500}]
    assert (job["apiVersion"], job["kind"]) == ("batch/v1", "Job")
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (
        "Indexed",
        4,
        4,
        0,
    )
    pod = spec["template"]
    # The Service selects exactly this job's pods, and they live in its DNS subdomain.
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["subdomain"] == name
    [container] = containers(pod)
    assert container["command"][:2] == ["sh", "-c"]
    shell = container["command"][2]
    # Pod 0 hosts the rendezvous without resolving its own name; the others wait until it resolves.
    for index, is_host, waits in (("0", "1", False), ("3", "0", True)):
        lookups = []
        words = run_shell(shell, {"JOB_COMPLETION_INDEX": index}, tmp_path, lookups)
        assert words == [
            "torchrun",
            "--nnodes=4",
            f"--node-rank={index}",
            "--nproc-per-node=2",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={name}-0.{name}:29500",
            f"--rdzv-id={name}",
            f"--rdzv-conf=is_host={is_host}",
            "-m",
            "jobs.train",
            *TRAIN_ARGS,
        ]
        assert lookups == ([f"hosts {name}-0.{name}"] if waits else [])
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert {"name": "gem-home", "mountPath": "/gem"} in container["volumeMounts"]


def run_shell(shell: str, env: dict[str, str], bin_dir: Path, lookups: list[str]) -> list[str]:
    """What a pod's `sh -c shell` would exec (Kubernetes turns `$$` into `$`), with getent answering at once and
    torchrun printing its argv."""
    (bin_dir / "getent").write_text('#!/bin/sh\necho "$@" >> "$LOOKUPS"\n')
    (bin_dir / "torchrun").write_text('#!/bin/sh\nprintf "%s\\n" torchrun "$@"\n')
    for tool in ("getent", "torchrun"):
        (bin_dir / tool).chmod(0o755)
    log = bin_dir / "lookups"
    log.write_text("")
    out = subprocess.run(
        ["sh", "-c", shell.replace("$$", "$")],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "LOOKUPS": str(log), **env},
    )
    lookups += log.read_text().splitlines()
    return out.stdout.splitlines()


def test_launchers_start_modules_not_script_paths():
    assert LocalTorchrunLauncher().command("jobs.train", ["--x"], nproc=2)[-5:] == [
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "jobs.train",
        "--x",
    ]
    refused = r"module='jobs/train.py' is not a Python module name: launchers start modules, e.g. 'jobs.train'"
    with pytest.raises(ValueError, match=refused):
        LocalTorchrunLauncher().command("jobs/train.py", [], nproc=1)
    with pytest.raises(ValueError, match=refused):
        k8s_launcher().render("jobs/train.py", [], 1, RUN_ID)
    with pytest.raises(ValueError, match=refused):
        SlurmTorchrunLauncher(gem_home="/gem").render("jobs/train.py", [], 1, RUN_ID)


def test_job_names_are_dns_labels_unique_per_launch():
    names = {job_name("jobs.My_Score", ["--ds", ds], "EPHEMERAL_Run" * 9) for ds in ("2026-11-01", "2026-11-02")}
    assert len(names) == 2
    for name in names:
        assert DNS_LABEL.fullmatch(name) and len(name) <= 52 and name.startswith("gem-my-score-ephemeral-run")
    assert job_name("jobs.train", TRAIN_ARGS, RUN_ID) == job_name("jobs.train", TRAIN_ARGS, RUN_ID)


def test_rendered_specs_carry_the_pipes_session_env(tmp_path):
    rendered: dict[str, Any] = {}

    @dg.asset
    def probe(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        with dg.open_pipes_session(
            context=context,
            context_injector=dg.PipesEnvContextInjector(),
            message_reader=dg.PipesFileMessageReader(str(messages)),
        ) as session:
            env = session.get_bootstrap_env_vars()
            rendered["env"] = env
            rendered["k8s"] = k8s_launcher().render("jobs.train", [], 1, context.run_id, env=env)
            rendered["slurm"] = SlurmTorchrunLauncher(gem_home="/gem").render(
                "jobs.train", [], 1, context.run_id, env=env
            )
        return dg.MaterializeResult()

    messages = tmp_path / "messages.jsonl"
    assert dg.materialize([probe]).success
    env = rendered["env"]
    assert set(env) == {"DAGSTER_PIPES_CONTEXT", "DAGSTER_PIPES_MESSAGES"}
    assert decode_param(env["DAGSTER_PIPES_CONTEXT"])["data"]["asset_keys"] == ["probe"]
    assert decode_param(env["DAGSTER_PIPES_MESSAGES"])["path"] == str(messages)
    [container] = containers(rendered["k8s"]["spec"]["pytorchReplicaSpecs"]["Master"]["template"])
    pod_env = {e["name"]: e.get("value") for e in container["env"]}
    assert {k: pod_env[k] for k in env} == env
    for key, value in env.items():
        assert f"export {key}={shlex.quote(value)}\n" in rendered["slurm"]


def test_sbatch_script_has_directives_and_srun_torchrun_per_node():
    launcher = SlurmTorchrunLauncher(
        gem_home="/shared/gem",
        nnodes=4,
        gpus_per_node=8,
        cpus_per_task=64,
        mem="480G",
        time_limit="12:00:00",
        partition="gpu",
        account="ads",
        extra_directives=["exclusive", "--qos=high"],
        python="/shared/venv/bin/python",
        workdir="/shared/gem-pipeline",
        env={"NCCL_DEBUG": "WARN"},
    )
    args = ["--config", "/shared/gem/staging/train/it's v1.json"]
    script = launcher.render("jobs.train", args, nproc=8, run_id=RUN_ID)
    name = job_name("jobs.train", args, RUN_ID)

    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    directives = [line.removeprefix("#SBATCH ") for line in lines if line.startswith("#SBATCH ")]
    assert directives == [
        f"--job-name={name}",
        "--nodes=4",
        "--ntasks-per-node=1",
        f"--output=/shared/gem/staging/slurm/{name}.out",
        "--export=ALL",
        "--gpus-per-node=8",
        "--cpus-per-task=64",
        "--mem=480G",
        "--time=12:00:00",
        "--partition=gpu",
        "--account=ads",
        "--exclusive",
        "--qos=high",
    ]
    assert "cd /shared/gem-pipeline" in lines
    assert "export GEM_HOME=/shared/gem" in lines and "export NCCL_DEBUG=WARN" in lines
    assert 'export GEM_RDZV_HOST="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"' in lines
    [srun] = [line for line in lines if line.startswith("srun ")]
    words = shlex.split(srun)
    assert words[:6] == [
        "srun",
        "--ntasks-per-node=1",
        "--cpus-per-task=$SLURM_CPUS_ON_NODE",
        "--kill-on-bad-exit=1",
        "bash",
        "-c",
    ]
    # What each node's bash runs: torchrun with the rendezvous on the first node, then the module + args.
    torchrun = shlex.split(words[6])
    assert torchrun == [
        "exec",
        "/shared/venv/bin/python",
        "-m",
        "torch.distributed.run",
        "--nnodes=$SLURM_NNODES",
        "--node-rank=$SLURM_NODEID",
        "--nproc-per-node=8",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=$GEM_RDZV_HOST:29400",
        "--rdzv-id=$SLURM_JOB_ID",
        "-m",
        "jobs.train",
        *args,
    ]
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_gem_launcher_selects_the_launcher_with_settings_from_the_config_file(tmp_path, monkeypatch):
    monkeypatch.delenv("GEM_LAUNCHER", raising=False)
    monkeypatch.delenv("GEM_LAUNCHER_CONFIG", raising=False)
    assert isinstance(launcher_from_env(str(tmp_path)), LocalTorchrunLauncher)

    settings = tmp_path / "launcher.json"
    settings.write_text(json.dumps({"partition": "gpu", "nnodes": 2, "gpus_per_node": 8}))
    monkeypatch.setenv("GEM_LAUNCHER", "slurm")
    monkeypatch.setenv("GEM_LAUNCHER_CONFIG", str(settings))
    defs = build_definitions(lake=LakeResource(home=str(tmp_path / "gem")))
    slurm = defs.resources["launcher"]
    assert isinstance(slurm, SlurmTorchrunLauncher)
    assert (slurm.gem_home, slurm.partition, slurm.nnodes, slurm.gpus_per_node) == (str(tmp_path / "gem"), "gpu", 2, 8)

    settings.write_text(
        json.dumps(
            {
                "image": "registry.example/gem:1",
                "gem_home_claim": "gem-home",
                "kind": "IndexedJob",
                "gem_home": "/mnt/gem",
            }
        )
    )
    monkeypatch.setenv("GEM_LAUNCHER", "kubernetes")
    k8s = launcher_from_env(str(tmp_path))
    assert isinstance(k8s, KubernetesTorchrunLauncher)
    assert (k8s.kind, k8s.gem_home, k8s.gem_home_claim) == ("IndexedJob", "/mnt/gem", "gem-home")


def test_gem_launcher_errors_name_the_variable_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("GEM_LAUNCHER", "ray")
    with pytest.raises(ValueError, match=r"GEM_LAUNCHER='ray'.*\['kubernetes', 'local', 'slurm'\]"):
        build_definitions(lake=LakeResource(home=str(tmp_path)))

    monkeypatch.setenv("GEM_LAUNCHER", "kubernetes")
    monkeypatch.delenv("GEM_LAUNCHER_CONFIG", raising=False)
    with pytest.raises(ValueError, match=r"GEM_LAUNCHER_CONFIG[\s\S]*image"):
        launcher_from_env(str(tmp_path))

    settings = tmp_path / "launcher.json"
    settings.write_text(json.dumps({"partition": "gpu", "gpus": 8}))
    monkeypatch.setenv("GEM_LAUNCHER", "slurm")
    monkeypatch.setenv("GEM_LAUNCHER_CONFIG", str(settings))
    with pytest.raises(ValueError, match=r"unknown SlurmTorchrunLauncher fields \['gpus'\]"):
        launcher_from_env(str(tmp_path))


def test_render_rejects_non_positive_node_counts():
    with pytest.raises(ValueError, match=r"KubernetesTorchrunLauncher.nnodes=0"):
        k8s_launcher(nnodes=0).render("jobs.train", [], 1, RUN_ID)
    with pytest.raises(ValueError, match=r"SlurmTorchrunLauncher.gpus_per_node=0"):
        SlurmTorchrunLauncher(gem_home="/gem", gpus_per_node=0).render("jobs.train", [], 1, RUN_ID)


def test_kubernetes_launch_without_the_client_names_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # makes `import kubernetes` raise ImportError
    with pytest.raises(ImportError, match=r"pip install kubernetes"):
        k8s_launcher().launch(dg.build_asset_context(), "jobs.train", [], nproc=1)


def test_slurm_launch_without_sbatch_says_so(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"'sbatch' is not on PATH.*GEM_LAUNCHER=local"):
        SlurmTorchrunLauncher(gem_home=str(tmp_path)).launch(dg.build_asset_context(), "jobs.train", [], nproc=1)


@dg.asset
def launched_probe(context: dg.AssetExecutionContext, launcher: JobLauncher) -> dg.MaterializeResult:
    """The module `probe` on two ranks: PIPES_PROBE, where a test wrote it (`write_probe`)."""
    return launcher.launch(context, "probe", PROBE_ARGS, nproc=2).get_materialize_result()


def write_probe(directory: Path) -> str:
    """`probe.py` in `directory`, from which `-m probe` finds it when it is the launch's working directory."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "probe.py").write_text(PIPES_PROBE)
    return str(directory)


def materialized_metadata(result: dg.ExecuteInProcessResult) -> dict[str, Any]:
    [event] = result.get_asset_materialization_events()
    return {k: v.value for k, v in event.materialization.metadata.items()}


@pytest.mark.slow
@pytest.mark.dist
def test_local_launch_runs_the_module_under_torchrun_through_pipes(tmp_path, monkeypatch):
    monkeypatch.chdir(write_probe(tmp_path / "code"))  # the workers start in this process's working directory
    monkeypatch.setenv("GEM_HOME", str(tmp_path / "gem"))

    result = dg.materialize([launched_probe], resources={"launcher": LocalTorchrunLauncher()})

    assert result.success
    assert materialized_metadata(result) == {
        "world_size": 2,
        "argv": " | ".join(PROBE_ARGS),
        "gem_home": str(tmp_path / "gem"),
    }


# Stand-ins for the Slurm client tools on a one-node "cluster": sbatch runs the batch script here.
FAKE_SLURM = {
    "sbatch": """#!/bin/bash
[[ $1 == --wait && $2 == --parsable ]] || { echo "fake sbatch: expected --wait --parsable" >&2; exit 2; }
grep -q '^#SBATCH --nodes=1$' "$3" || { echo "fake sbatch: one node only" >&2; exit 2; }
echo 4242
SLURM_JOB_ID=4242 SLURM_NNODES=1 SLURM_NODEID=0 SLURM_JOB_NODELIST=localhost SLURM_CPUS_ON_NODE=$(nproc) \
  exec bash "$3"
""",
    "srun": """#!/bin/bash
while [[ $1 == -* ]]; do shift; done
exec "$@"
""",
    "scontrol": """#!/bin/bash
[[ "$*" == "show hostnames localhost" ]] && echo localhost
""",
}


@pytest.mark.slow
@pytest.mark.dist
def test_slurm_launch_runs_torchrun_through_pipes(tmp_path, monkeypatch, free_port):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool, text in FAKE_SLURM.items():
        (bin_dir / tool).write_text(text)
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    gem_home = tmp_path / "gem"
    launcher = SlurmTorchrunLauncher(
        gem_home=str(gem_home), workdir=write_probe(tmp_path / "code"), rdzv_port=free_port()
    )

    result = dg.materialize([launched_probe], resources={"launcher": launcher})

    assert result.success
    [batch_file] = (gem_home / "staging" / "slurm").glob("*.sbatch")
    assert materialized_metadata(result) == {
        "world_size": 2,
        "argv": " | ".join(PROBE_ARGS),
        "gem_home": str(gem_home),
        "slurm_job_id": "4242",
        "slurm_log": str(batch_file.with_suffix(".out")),
    }


def install_tools(directory: Path, monkeypatch: pytest.MonkeyPatch, **tools: str) -> None:
    """Bash scripts named after Slurm's tools, first on PATH."""
    directory.mkdir(exist_ok=True)
    for tool, text in tools.items():
        (directory / tool).write_text("#!/bin/bash\n" + text)
        (directory / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{directory}{os.pathsep}{os.environ['PATH']}")


def test_slurm_ranks_share_the_nodes_cpus_unless_env_sets_the_threads():
    script = SlurmTorchrunLauncher(gem_home="/gem", nproc_per_node=4).render("jobs.train", [], 1, RUN_ID)
    [line] = [line for line in script.splitlines() if line.startswith("export OMP_NUM_THREADS=")]
    for cpus, threads in (("16", "4"), ("2", "1"), ("", "1")):
        env = {"PATH": os.environ["PATH"], **({"SLURM_CPUS_ON_NODE": cpus} if cpus else {})}
        out = subprocess.run(["bash", "-c", f"{line}; echo $OMP_NUM_THREADS"], env=env, capture_output=True, text=True)
        assert out.stdout.strip() == threads
    pinned = SlurmTorchrunLauncher(gem_home="/gem", env={"OMP_NUM_THREADS": "8"}).render("jobs.train", [], 4, RUN_ID)
    assert [line for line in pinned.splitlines() if "OMP_NUM_THREADS" in line] == ["export OMP_NUM_THREADS=8"]


def test_slurm_failure_names_the_job_state_sbatch_stderr_and_the_jobs_traceback(tmp_path, monkeypatch):
    install_tools(
        tmp_path / "bin",
        monkeypatch,
        sbatch="""
echo 4243
log=$(sed -n 's/^#SBATCH --output=//p' "$3")
printf '%s\n' 'starting' '[rank0]: Traceback (most recent call last):' '[rank0]:   File "jobs.train", line 9' \
  '[rank0]:     main()' '[rank0]: ValueError: train.batch_size=0 must be >= 1' 'torchrun: exit 1' > "$log"
echo "sbatch: error: job 4243 failed" >&2
exit 7
""",
        scontrol="""[[ "$*" == "show job -o 4243" ]] &&
  echo "JobId=4243 JobState=FAILED Reason=NonZeroExitCode ExitCode=1:0"
""",
    )
    launcher = SlurmTorchrunLauncher(gem_home=str(tmp_path / "gem"), poll_interval_s=0.1)
    with pytest.raises(JobLaunchError) as failed:
        dg.materialize([launched_probe], resources={"launcher": launcher})
    message = str(failed.value)
    assert re.search(
        r"Slurm job 4243 \(gem-probe-.*\) failed: JobState FAILED, ExitCode 1:0, "
        r"Reason NonZeroExitCode; sbatch exit code 7",
        message,
    )
    assert "sbatch: sbatch: error: job 4243 failed" in message
    assert (
        'Traceback (most recent call last):\n  File "jobs.train", line 9\n    main()\n'
        "ValueError: train.batch_size=0 must be >= 1\n"
    ) in message and "torchrun: exit 1" not in message
    assert re.search(r"full log: .*\.out; `sacct -j 4243`", message)


@pytest.mark.parametrize(
    "reason, timeout, expected",
    [
        ("PartitionConfig", None, r"Reason=PartitionConfig: it can never start as submitted"),
        ("Priority", 0.3, r"Reason=Priority: it waited \d+ s > queue_timeout_s=0.3"),
    ],
)
def test_a_slurm_job_that_cannot_start_is_cancelled_with_its_reason(tmp_path, monkeypatch, reason, timeout, expected):
    cancelled = tmp_path / "cancelled"
    install_tools(
        tmp_path / "bin",
        monkeypatch,
        sbatch="echo 4244\nexec sleep 600\n",  # a pending job: sbatch --wait never returns
        squeue=f'echo "PENDING|{reason}"\n',
        scancel=f'echo "$@" >> {cancelled}\n',
    )
    launcher = SlurmTorchrunLauncher(gem_home=str(tmp_path / "gem"), queue_timeout_s=timeout, poll_interval_s=0.1)
    with pytest.raises(JobLaunchError, match=rf"Slurm job 4244 is pending with {expected}; cancelling it"):
        dg.materialize([launched_probe], resources={"launcher": launcher})
    assert cancelled.read_text() == "4244\n"


def test_sbatch_refusing_the_script_is_an_error_with_its_message(tmp_path, monkeypatch):
    install_tools(
        tmp_path / "bin", monkeypatch, sbatch='echo "sbatch: error: invalid partition specified: gpu" >&2\nexit 1\n'
    )
    launcher = SlurmTorchrunLauncher(gem_home=str(tmp_path / "gem"), partition="gpu")
    with pytest.raises(
        JobLaunchError,
        match=r"sbatch refused .*\.sbatch \(exit code 1\): sbatch: error: invalid "
        r"partition specified: gpu",
    ):
        dg.materialize([launched_probe], resources={"launcher": launcher})


class FakeTrainingOperator:
    """The CustomObjectsApi of a cluster with the training-operator. With `run_pods`, creating a
    PyTorchJob runs its master pod's command here (env and $(VAR) expansion as the kubelet does)."""

    def __init__(self, run_pods: bool = True, conditions: list[dict[str, str]] | None = None):
        self.run_pods, self.conditions = run_pods, conditions or []
        self.created: list[dict[str, Any]] = []
        self.deleted: list[str] = []

    def create_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, body: dict[str, Any]
    ) -> None:
        assert (group, version, plural) == ("kubeflow.org", "v1", "pytorchjobs")
        assert namespace == body["metadata"]["namespace"]
        self.created.append(body)
        if self.run_pods:
            code = self.run_master(body)
            self.conditions = [
                {
                    "type": "Succeeded" if code == 0 else "Failed",
                    "status": "True",
                    "message": f"master exited with {code}",
                }
            ]

    @staticmethod
    def run_master(body: dict[str, Any]) -> int:
        [container] = body["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
        env = {
            **{e["name"]: e.get("value", str(os.cpu_count())) for e in container["env"]},  # valueFrom: CPUs
            "MASTER_ADDR": "127.0.0.1",
            "RANK": "0",
        }

        def expand(arg: str) -> str:
            return re.sub(r"\$\$|\$\((\w+)\)", lambda m: "$" if m.group(0) == "$$" else env[m.group(1)], arg)

        command = [expand(a) for a in container["command"]]
        assert command[0] == "torchrun"
        command[:1] = [sys.executable, "-m", "torch.distributed.run"]
        return subprocess.run(command, cwd=container.get("workingDir"), env={**os.environ, **env}).returncode

    def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> dict[str, Any]:
        return {"status": {"conditions": self.conditions}}

    def delete_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str) -> None:
        self.deleted.append(name)


class FakeBatchCluster:
    """CoreV1Api and BatchV1Api of a plain cluster where every indexed Job completes."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def create_namespaced_service(self, namespace: str, body: dict[str, Any]) -> None:
        self.calls.append(("create service", body))

    def create_namespaced_job(self, namespace: str, body: dict[str, Any]) -> None:
        self.calls.append(("create job", body))

    def read_namespaced_job_status(self, name: str, namespace: str) -> types.SimpleNamespace:
        complete = types.SimpleNamespace(type="Complete", status="True", message=None)
        return types.SimpleNamespace(status=types.SimpleNamespace(conditions=[complete]))

    def delete_namespaced_service(self, name: str, namespace: str) -> None:
        self.calls.append(("delete service", name))


def install_fake_kubernetes(
    monkeypatch: pytest.MonkeyPatch, operator: FakeTrainingOperator, cluster: FakeBatchCluster | None = None
) -> None:
    config = types.ModuleType("kubernetes.config")

    class ConfigException(Exception):
        pass

    def load_incluster_config() -> None:
        raise ConfigException("not running in a pod")

    config.ConfigException = ConfigException
    config.load_incluster_config = load_incluster_config
    config.load_kube_config = lambda: None
    client = types.ModuleType("kubernetes.client")
    client.CustomObjectsApi = lambda: operator
    client.CoreV1Api = client.BatchV1Api = lambda: cluster
    package = types.ModuleType("kubernetes")
    package.client, package.config = client, config
    for name, module in (("kubernetes", package), ("kubernetes.client", client), ("kubernetes.config", config)):
        monkeypatch.setitem(sys.modules, name, module)


@pytest.mark.slow
@pytest.mark.dist
def test_kubernetes_launch_submits_the_pytorchjob_and_reads_pipes_messages(tmp_path, monkeypatch, free_port):
    operator = FakeTrainingOperator()
    install_fake_kubernetes(monkeypatch, operator)
    gem_home = tmp_path / "gem"
    launcher = k8s_launcher(
        gem_home=str(gem_home), workdir=write_probe(tmp_path / "code"), rdzv_port=free_port(), poll_interval_s=0.01
    )

    result = dg.materialize([launched_probe], resources={"launcher": launcher})

    assert result.success
    [body] = operator.created
    name = body["metadata"]["name"]
    assert name.startswith(f"gem-probe-{result.run_id[:8]}")
    assert materialized_metadata(result) == {
        "world_size": 2,
        "argv": " | ".join(PROBE_ARGS),
        "gem_home": str(gem_home),
        "kubernetes_job": f"PyTorchJob default/{name}",
    }
    assert operator.deleted == []


def test_kubernetes_launch_raises_on_failure_and_deletes_on_timeout(tmp_path, monkeypatch):
    failed = FakeTrainingOperator(
        run_pods=False,
        conditions=[
            {"type": "Running", "status": "False"},
            {"type": "Failed", "status": "True", "message": "OOMKilled"},
        ],
    )
    install_fake_kubernetes(monkeypatch, failed)
    launcher = k8s_launcher(gem_home=str(tmp_path), namespace="ml", poll_interval_s=0.01)
    with pytest.raises(JobLaunchError, match=r"PyTorchJob ml/gem-probe-.* failed: OOMKilled.*kubectl -n ml describe"):
        dg.materialize([launched_probe], resources={"launcher": launcher})
    assert failed.deleted == []  # failed pods are kept for their logs

    stuck = FakeTrainingOperator(run_pods=False)
    install_fake_kubernetes(monkeypatch, stuck)
    impatient = k8s_launcher(gem_home=str(tmp_path), timeout_s=0.05, poll_interval_s=0.01)
    with pytest.raises(TimeoutError, match=r"timeout_s=0.05"):
        dg.materialize([launched_probe], resources={"launcher": impatient})
    assert stuck.deleted == [stuck.created[0]["metadata"]["name"]]


def test_kubernetes_launch_of_an_indexed_job_creates_service_and_job_then_removes_the_service(tmp_path, monkeypatch):
    cluster = FakeBatchCluster()
    install_fake_kubernetes(monkeypatch, FakeTrainingOperator(run_pods=False), cluster)
    launcher = k8s_launcher(kind="IndexedJob", nnodes=2, gem_home=str(tmp_path), poll_interval_s=0.01)
    result = dg.materialize([launched_probe], resources={"launcher": launcher})

    assert result.success
    [(create_service, service), (create_job, job), (delete_service, deleted)] = cluster.calls
    assert (create_service, create_job, delete_service) == ("create service", "create job", "delete service")
    assert (service["kind"], job["kind"], job["spec"]["completions"]) == ("Service", "Job", 2)
    assert deleted == service["metadata"]["name"] == job["metadata"]["name"]
