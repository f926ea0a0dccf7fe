"""Launchers run the distributed jobs (jobs/train.py, jobs/score.py) outside the Dagster process.

`JobLauncher` is the interface the training and export assets use; each implementation runs
torchrun through Dagster Pipes, so rank 0's log lines and reported metrics appear in the Dagster
run. `LocalTorchrunLauncher` runs `torchrun --standalone` on this machine (the default).
`KubernetesTorchrunLauncher` renders a Kubeflow `PyTorchJob` (or an indexed batch/v1 Job plus a
headless Service) whose pods run torchrun with c10d rendezvous, submits it with the `kubernetes`
client (`pip install kubernetes`, imported only when launching) and waits for it.
`SlurmTorchrunLauncher` renders an sbatch script that `srun`s torchrun once per node and submits
it with `sbatch --wait`. The cluster launchers inject the Pipes context as environment variables
and read Pipes messages from a file under `$GEM_HOME/staging/pipes`, so `gem_home` must be the
same shared path in the Dagster process and on every node (it is where the jobs read their
inputs and write checkpoints anyway). Their `render(...)` methods are pure, for inspection and
tests. `launcher_from_env` picks one by `GEM_LAUNCHER` (`local`, `kubernetes`, `slurm`) with
fields from the JSON file named by `GEM_LAUNCHER_CONFIG` (docs/ENVIRONMENT.md).
"""

import copy
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import dagster as dg
import pydantic

REPO_ROOT = Path(__file__).resolve().parents[2]

# Kubernetes object names are DNS-1123 labels (<= 63). Jobs stay <= 52 so that indexed pods'
# hostnames `<job>-<index>` and the `job-name` label derived from them remain valid too.
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
MAX_JOB_NAME = 52
RANK_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]:\s?")


@contextmanager
def pipes_quietly() -> Iterator[None]:
    """Dagster's Pipes session reads a preview attribute of its own message reader, and warns of it at every
    launch; nothing here uses a preview API."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.PreviewWarning)
        yield


class JobLaunchError(RuntimeError):
    """A cluster job ran and failed (its logs are kept for inspection)."""


class JobLauncher(dg.ConfigurableResource):
    def launch(self, context: dg.AssetExecutionContext, script: str, args: Sequence[str],
               nproc: int) -> dg.PipesClientCompletedInvocation:
        raise NotImplementedError

    def single_process(self) -> "JobLauncher":
        """This launcher for a job that must run exactly once (one node, one process: the students), whatever
        `nnodes` and `nproc_per_node` it is configured with for the distributed jobs."""
        fields = type(self).model_fields
        updates = {k: v for k, v in {"nnodes": 1, "nproc_per_node": None}.items() if k in fields}
        return self.model_copy(update=updates) if updates else self


class LocalTorchrunLauncher(JobLauncher):
    """torchrun with `nproc` worker processes on this host (gloo on CPU, nccl on GPU)."""

    extra_env: dict[str, str] = {}

    def command(self, script: str, args: Sequence[str], nproc: int) -> list[str]:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        return [*torchrun, str(REPO_ROOT / script), *args]

    def environment(self, nproc: int) -> dict[str, str]:
        """The workers' environment: this process's, quiet warnings, the cores split between the ranks."""
        env = {**os.environ, "PYTHONWARNINGS": "ignore::FutureWarning,ignore::UserWarning", **self.extra_env}
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
        return env

    def launch(self, context: dg.AssetExecutionContext, script: str, args: Sequence[str],
               nproc: int) -> dg.PipesClientCompletedInvocation:
        env = self.environment(nproc)
        client = dg.PipesSubprocessClient(cwd=str(REPO_ROOT))
        with pipes_quietly():
            return client.run(context=context, command=self.command(script, args, nproc), env=env)


def dns_label(text: str, max_len: int = 63) -> str:
    """`text` as a DNS-1123 label: lowercase alphanumerics and '-', alphanumeric at both ends."""
    label = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")
    return label[:max_len].rstrip("-") or "gem"


def job_name(script: str, args: Sequence[str], run_id: str) -> str:
    """`gem-<script>-<run id>-<hash of script and args>`: one name per launch within a Dagster run."""
    digest = hashlib.sha1("\0".join([script, *args]).encode()).hexdigest()[:6]
    prefix = dns_label(f"gem-{Path(script).stem}-{run_id}", MAX_JOB_NAME - len(digest) - 1)
    return f"{prefix}-{digest}"


def _check_positive(owner: str, **values: int | None) -> None:
    for name, value in values.items():
        if value is not None and value < 1:
            raise ValueError(f"{owner}.{name}={value}: must be >= 1 (or unset to use the default)")


def _pipes_message_file(gem_home: str, name: str) -> Path:
    path = Path(gem_home) / "staging" / "pipes" / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


class KubernetesTorchrunLauncher(JobLauncher):
    """torchrun on `nnodes` pods, each with `nproc_per_node` ranks (default: the asset's `nproc`).

    `kind="PyTorchJob"` needs the Kubeflow training-operator (it sets MASTER_ADDR and RANK on
    each pod and a Service for the master); `kind="IndexedJob"` needs only batch/v1 and brings
    its own headless Service, with JOB_COMPLETION_INDEX as the node rank. `image` must hold this
    repository at `workdir` with its environment; the claim `gem_home_claim` is mounted at
    `gem_home` (the Dagster process must see the same volume at the same path).
    """

    image: str
    gem_home: str
    gem_home_claim: str
    kind: Literal["PyTorchJob", "IndexedJob"] = "PyTorchJob"
    namespace: str = "default"
    workdir: str = "/app"
    nnodes: int = 1
    nproc_per_node: int | None = None
    cpu: str | None = None
    memory: str | None = None
    gpus: int = 0
    service_account: str | None = None
    env: dict[str, str] = {}
    rdzv_port: int = 29400
    poll_interval_s: float = 10.0
    timeout_s: float | None = None
    ttl_seconds_after_finished: int = 3600

    def render(self, script: str, args: Sequence[str], nproc: int, run_id: str,
               env: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The manifest to submit: a PyTorchJob, or a v1 List of [Service, indexed Job].

        `env` (e.g. a Pipes session's bootstrap variables) is added to every container's env.
        """
        _check_positive("KubernetesTorchrunLauncher", nnodes=self.nnodes, nproc_per_node=self.nproc_per_node,
                        nproc=nproc)
        name = job_name(script, args, run_id)
        labels = {"app.kubernetes.io/name": "gem-pipeline", "app.kubernetes.io/component": dns_label(Path(script).stem),
                  "gem-pipeline/job": name, "dagster/run-id": dns_label(run_id)}
        metadata = {"name": name, "namespace": self.namespace, "labels": labels}
        if self.kind == "PyTorchJob":
            # Kubernetes expands $(VAR) in commands from the container's env; $$ keeps a literal $.
            command = [*self._torchrun(nproc, "$(RANK)", "$(MASTER_ADDR)", name),
                       *(a.replace("$(", "$$(") for a in (script, *args))]
            template = self._pod_template(labels, command, env, "pytorchjob-port", self.nproc_per_node or nproc)
            replicas = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template}}
            if self.nnodes > 1:
                replicas["Worker"] = {"replicas": self.nnodes - 1, "restartPolicy": "Never",
                                      "template": copy.deepcopy(template)}
            # nprocPerNode: the operator derives WORLD_SIZE and PET_NPROC_PER_NODE from it (default 1).
            return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": metadata,
                    "spec": {"runPolicy": {"cleanPodPolicy": "None", "backoffLimit": 0,
                                           "ttlSecondsAfterFinished": self.ttl_seconds_after_finished},
                             "nprocPerNode": str(self.nproc_per_node or nproc),
                             "pytorchReplicaSpecs": replicas}}
        # Indexed pods are named <job>-<index> and, with `subdomain`, resolvable as <job>-<index>.<service>
        # once they have an IP. Pod 0 hosts the rendezvous whether or not its own name resolves yet
        # (is_host); the others wait until it does, since torchrun gives up on a name that does not resolve.
        host = f"{name}-0.{name}"
        torchrun = shlex.join(self._torchrun(nproc, "RANK", host, name)).replace(
            "--node-rank=RANK", '--node-rank="$JOB_COMPLETION_INDEX"')
        shell = ('if [ "$JOB_COMPLETION_INDEX" = 0 ]; then is_host=1; else is_host=0; '
                 f"until getent hosts {host} >/dev/null; do sleep 2; done; fi; "
                 f'exec {torchrun} --rdzv-conf=is_host="$is_host" {shlex.join([script, *args])}')
        command = ["sh", "-c", shell.replace("$(", "$$(")]
        template = self._pod_template(labels, command, env, "rdzv", self.nproc_per_node or nproc)
        template["spec"]["subdomain"] = name
        selector = {"gem-pipeline/job": name}
        service = {"apiVersion": "v1", "kind": "Service", "metadata": dict(metadata),
                   "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": selector,
                            "ports": [{"name": "rdzv", "port": self.rdzv_port}]}}
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": dict(metadata),
               "spec": {"completionMode": "Indexed", "completions": self.nnodes, "parallelism": self.nnodes,
                        "backoffLimit": 0, "ttlSecondsAfterFinished": self.ttl_seconds_after_finished,
                        "template": template}}
        return {"apiVersion": "v1", "kind": "List", "items": [service, job]}

    def _threads(self, ranks: int) -> dict[str, Any]:
        """OMP_NUM_THREADS for each rank: the pod's CPUs shared by its ranks (torchrun alone would give 1).
        One rank takes the pod's CPU limit (the node's CPUs without one); several divide `cpu`, else get 1."""
        if ranks == 1:
            return {"name": "OMP_NUM_THREADS", "valueFrom": {"resourceFieldRef": {
                "containerName": "pytorch", "resource": "limits.cpu", "divisor": "1"}}}
        cores = float(self.cpu[:-1]) / 1000 if self.cpu and self.cpu.endswith("m") else float(self.cpu or 0)
        return {"name": "OMP_NUM_THREADS", "value": str(max(1, int(cores) // ranks))}

    def _torchrun(self, nproc: int, node_rank: str, host: str, rdzv_id: str) -> list[str]:
        """torchrun and its options, up to the script."""
        return ["torchrun", f"--nnodes={self.nnodes}", f"--nproc-per-node={self.nproc_per_node or nproc}",
                f"--node-rank={node_rank}", "--rdzv-backend=c10d", f"--rdzv-endpoint={host}:{self.rdzv_port}",
                f"--rdzv-id={rdzv_id}"]

    def _pod_template(self, labels: Mapping[str, str], command: list[str], env: Mapping[str, str] | None,
                      port_name: str, ranks: int) -> dict[str, Any]:
        resources = {k: v for k, v in (("cpu", self.cpu), ("memory", self.memory)) if v}
        if self.gpus:
            resources["nvidia.com/gpu"] = str(self.gpus)
        container_env = {"GEM_HOME": self.gem_home, **self.env, **(env or {})}
        env_list: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in container_env.items()]
        if "OMP_NUM_THREADS" not in container_env:
            env_list.append(self._threads(ranks))
        container = {
            "name": "pytorch",  # the training-operator looks for this container name
            "image": self.image,
            "workingDir": self.workdir,
            "command": command,
            "env": env_list,
            "ports": [{"name": port_name, "containerPort": self.rdzv_port}],
            "resources": {"requests": dict(resources), "limits": dict(resources)},
            "volumeMounts": [{"name": "gem-home", "mountPath": self.gem_home},
                             {"name": "dshm", "mountPath": "/dev/shm"}],
        }
        spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "containers": [container],
            # The default 64 MiB /dev/shm is too small for NCCL and DataLoader workers.
            "volumes": [{"name": "gem-home", "persistentVolumeClaim": {"claimName": self.gem_home_claim}},
                        {"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        }
        if self.service_account:
            spec["serviceAccountName"] = self.service_account
        return {"metadata": {"labels": dict(labels)}, "spec": spec}

    def launch(self, context: dg.AssetExecutionContext, script: str, args: Sequence[str],
               nproc: int) -> dg.PipesClientCompletedInvocation:
        try:
            from kubernetes import client as k8s
            from kubernetes import config as k8s_config
        except ImportError as e:
            raise ImportError("KubernetesTorchrunLauncher needs the Kubernetes client: `pip install kubernetes` "
                              "(or set GEM_LAUNCHER=local)") from e
        try:
            k8s_config.load_incluster_config()
        except k8s_config.ConfigException:
            k8s_config.load_kube_config()
        name = job_name(script, args, context.run_id)
        reader = dg.PipesFileMessageReader(str(_pipes_message_file(self.gem_home, name)))
        with pipes_quietly(), dg.open_pipes_session(
                context=context, context_injector=dg.PipesEnvContextInjector(), message_reader=reader) as session:
            manifest = self.render(script, args, nproc, context.run_id, env=session.get_bootstrap_env_vars())
            where = f"{self.kind} {self.namespace}/{name}"
            context.log.info(f"submitting {where}: {self.nnodes} node(s) x {self.nproc_per_node or nproc} rank(s)")
            if self.kind == "PyTorchJob":
                self._run_pytorchjob(k8s.CustomObjectsApi(), manifest, name)
            else:
                self._run_indexed_job(k8s.CoreV1Api(), k8s.BatchV1Api(), manifest, name)
        return dg.PipesClientCompletedInvocation(session, metadata={"kubernetes_job": where})

    def _run_pytorchjob(self, api: Any, manifest: dict[str, Any], name: str) -> None:
        crd = {"group": "kubeflow.org", "version": "v1", "namespace": self.namespace, "plural": "pytorchjobs"}
        api.create_namespaced_custom_object(**crd, body=manifest)
        try:
            self._wait(lambda: (api.get_namespaced_custom_object(**crd, name=name).get("status") or {})
                       .get("conditions") or [], name)
        except JobLaunchError:
            raise  # failed pods stay until the TTL, for `kubectl logs`
        except BaseException:  # interrupted or timed out: stop the pods
            api.delete_namespaced_custom_object(**crd, name=name)
            raise

    def _run_indexed_job(self, core: Any, batch: Any, manifest: dict[str, Any], name: str) -> None:
        service, job = manifest["items"]
        core.create_namespaced_service(namespace=self.namespace, body=service)
        try:
            batch.create_namespaced_job(namespace=self.namespace, body=job)

            def conditions() -> list[dict[str, Any]]:
                status = batch.read_namespaced_job_status(name=name, namespace=self.namespace).status
                return [{"type": c.type, "status": c.status, "message": c.message}
                        for c in (status.conditions or [])]

            try:
                self._wait(conditions, name)
            except JobLaunchError:
                raise
            except BaseException:
                batch.delete_namespaced_job(name=name, namespace=self.namespace, propagation_policy="Background")
                raise
        finally:
            core.delete_namespaced_service(name=name, namespace=self.namespace)

    def _wait(self, conditions: Callable[[], list[dict[str, Any]]], name: str) -> None:
        """Poll until a condition Succeeded/Complete (return) or Failed (JobLaunchError) holds."""
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while True:
            holding = {c.get("type"): c.get("message") for c in conditions() if c.get("status") == "True"}
            if "Succeeded" in holding or "Complete" in holding:
                return
            if "Failed" in holding:
                reason = holding["Failed"] or "no reason given"
                resource = "pytorchjob" if self.kind == "PyTorchJob" else "job"
                raise JobLaunchError(f"{self.kind} {self.namespace}/{name} failed: {reason}; "
                                     f"see `kubectl -n {self.namespace} describe {resource} {name}` and "
                                     f"`kubectl -n {self.namespace} logs -l gem-pipeline/job={name}`")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"{self.kind} {self.namespace}/{name} did not finish within "
                                   f"timeout_s={self.timeout_s}; deleting it")
            time.sleep(self.poll_interval_s)


class SlurmTorchrunLauncher(JobLauncher):
    """torchrun on `nnodes` Slurm nodes (one task per node, `nproc_per_node` ranks each; default:
    the asset's `nproc`), submitted with `sbatch --wait` from a host that can reach the scheduler.

    `python` (default: this interpreter) and `workdir` (default: this checkout) must exist on
    the compute nodes, i.e. live on the shared file system, as must `gem_home`. The script and
    its log (`--output`) are written under `$GEM_HOME/staging/slurm/`. Each rank gets
    `OMP_NUM_THREADS` = the node's allocated CPUs / ranks per node (torchrun would set 1), unless
    `env` sets it. A job pending for a reason that needs an administrator (`NEVER_STARTS`) is
    cancelled at once, any other after `queue_timeout_s`; a failed job's error names its id, state,
    exit code, sbatch's stderr and the traceback of the exception it died of (`root_cause`).
    """

    gem_home: str
    nnodes: int = 1
    nproc_per_node: int | None = None
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    time_limit: str | None = None
    partition: str | None = None
    account: str | None = None
    extra_directives: list[str] = []
    python: str | None = None
    workdir: str = str(REPO_ROOT)
    env: dict[str, str] = {}
    rdzv_port: int = 29400
    sbatch: str = "sbatch"
    queue_timeout_s: float | None = 3600.0  # cancel a job still pending after this long (None: wait forever)
    poll_interval_s: float = 10.0

    def render(self, script: str, args: Sequence[str], nproc: int, run_id: str,
               env: Mapping[str, str] | None = None) -> str:
        """The sbatch script; `env` (e.g. a Pipes session's bootstrap variables) is exported in it."""
        _check_positive("SlurmTorchrunLauncher", nnodes=self.nnodes, nproc_per_node=self.nproc_per_node,
                        gpus_per_node=self.gpus_per_node, cpus_per_task=self.cpus_per_task, nproc=nproc)
        name = job_name(script, args, run_id)
        directives = [f"--job-name={name}", f"--nodes={self.nnodes}", "--ntasks-per-node=1",
                      f"--output={self.log_file(name)}", "--export=ALL"]
        optional = {"gpus-per-node": self.gpus_per_node, "cpus-per-task": self.cpus_per_task, "mem": self.mem,
                    "time": self.time_limit, "partition": self.partition, "account": self.account}
        directives += [f"--{k}={v}" for k, v in optional.items() if v is not None]
        directives += [d if d.startswith("-") else f"--{d}" for d in self.extra_directives]
        exports = {"GEM_HOME": self.gem_home, **self.env, **(env or {})}
        ranks = self.nproc_per_node or nproc
        threads = [] if "OMP_NUM_THREADS" in exports else [
            "# Every rank gets its share of the node's CPUs (torchrun alone would give it 1 thread).",
            f'export OMP_NUM_THREADS=$(( ${{SLURM_CPUS_ON_NODE:-{ranks}}} / {ranks} > 0 ? '
            f'${{SLURM_CPUS_ON_NODE:-{ranks}}} / {ranks} : 1 ))']
        torchrun = [shlex.quote(self.python or sys.executable), "-m", "torch.distributed.run",
                    '--nnodes="$SLURM_NNODES"', '--node-rank="$SLURM_NODEID"',
                    f"--nproc-per-node={ranks}", "--rdzv-backend=c10d",
                    f'--rdzv-endpoint="$GEM_RDZV_HOST":{self.rdzv_port}', '--rdzv-id="$SLURM_JOB_ID"',
                    *(shlex.quote(a) for a in (script, *args))]
        lines = [
            "#!/bin/bash",
            *(f"#SBATCH {d}" for d in directives),
            "set -euo pipefail",
            f"cd {shlex.quote(self.workdir)}",
            *(f"export {k}={shlex.quote(v)}" for k, v in exports.items()),
            *threads,
            "# The first node of the allocation hosts the c10d rendezvous.",
            'export GEM_RDZV_HOST="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)"',
            # Single quotes: SLURM_NODEID is expanded by each srun task, on its own node.
            # Since Slurm 22.05 a step does not inherit the job's CPUs per task: give torchrun the node's.
            'srun --ntasks-per-node=1 --cpus-per-task="$SLURM_CPUS_ON_NODE" --kill-on-bad-exit=1 bash -c '
            + shlex.quote("exec " + " ".join(torchrun)),
        ]
        return "\n".join(lines) + "\n"

    def log_file(self, name: str) -> Path:
        return Path(self.gem_home) / "staging" / "slurm" / f"{name}.out"

    def launch(self, context: dg.AssetExecutionContext, script: str, args: Sequence[str],
               nproc: int) -> dg.PipesClientCompletedInvocation:
        sbatch = shutil.which(self.sbatch)
        if sbatch is None:
            raise FileNotFoundError(f"SlurmTorchrunLauncher: {self.sbatch!r} is not on PATH; run Dagster on a "
                                    "host with the Slurm client tools (a login node), set `sbatch` to its path, "
                                    "or set GEM_LAUNCHER=local")
        name = job_name(script, args, context.run_id)
        batch_file = self.log_file(name).with_suffix(".sbatch")
        batch_file.parent.mkdir(parents=True, exist_ok=True)
        reader = dg.PipesFileMessageReader(str(_pipes_message_file(self.gem_home, name)))
        with pipes_quietly(), dg.open_pipes_session(
                context=context, context_injector=dg.PipesEnvContextInjector(), message_reader=reader) as session:
            batch_file.write_text(self.render(script, args, nproc, context.run_id,
                                              env=session.get_bootstrap_env_vars()))
            # --parsable prints the job id at submission; --wait then blocks and exits with the job's code.
            process = subprocess.Popen([sbatch, "--wait", "--parsable", str(batch_file)],
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            assert process.stdout is not None
            job_id = process.stdout.readline().strip().split(";")[0]
            if not job_id:
                _, stderr = process.communicate()
                raise JobLaunchError(f"sbatch refused {batch_file} (exit code {process.returncode}): "
                                     f"{stderr.strip() or 'no message'}")
            context.log.info(f"submitted Slurm job {job_id} ({batch_file}); log: {self.log_file(name)}")
            try:
                self._wait(process, job_id)
            except BaseException:
                subprocess.run(["scancel", job_id], check=False)
                process.send_signal(signal.SIGINT)
                process.wait()
                raise
            _, stderr = process.communicate()
            if process.returncode != 0:
                raise JobLaunchError(self._failure(job_id, name, process.returncode, stderr))
        return dg.PipesClientCompletedInvocation(session, metadata={"slurm_job_id": job_id,
                                                                    "slurm_log": str(self.log_file(name))})


    def _wait(self, process: subprocess.Popen, job_id: str) -> None:
        """Until sbatch exits; JobLaunchError if the job pends for a reason that needs an administrator
        or for longer than `queue_timeout_s` (the caller cancels it)."""
        submitted = time.monotonic()
        while process.poll() is None:
            state, reason = _squeue(job_id)
            if state == "PENDING":
                waited = time.monotonic() - submitted
                if reason in NEVER_STARTS or (self.queue_timeout_s is not None and waited > self.queue_timeout_s):
                    why = ("it can never start as submitted" if reason in NEVER_STARTS
                           else f"it waited {waited:.0f} s > queue_timeout_s={self.queue_timeout_s}")
                    raise JobLaunchError(
                        f"Slurm job {job_id} is pending with Reason={reason}: {why}; cancelling it. Check the "
                        f"launcher's partition/nnodes/gpus_per_node/mem/time_limit against `scontrol show partition` "
                        f"(`scontrol show job {job_id}` explains the reason)")
            try:
                process.wait(timeout=self.poll_interval_s)
            except subprocess.TimeoutExpired:
                pass

    def _failure(self, job_id: str, name: str, code: int, stderr: str) -> str:
        """What a failed job's error says: its id, state, exit code and reason, sbatch's stderr, the job's traceback."""
        job = scontrol_job(job_id)
        state = ", ".join(f"{k} {job[k]}" for k in ("JobState", "ExitCode", "Reason") if k in job)
        log = self.log_file(name)
        cause = root_cause(log.read_text(errors="replace")) if log.is_file() else ""
        return "\n".join(filter(None, [
            f"Slurm job {job_id} ({name}) failed: {state or 'state unknown'}; sbatch exit code {code}",
            f"sbatch: {stderr.strip()}" if stderr.strip() else "",
            f"the job's error:\n{cause}" if cause else "",
            f"full log: {log}; `sacct -j {job_id}` for the accounting record"]))


# Pending reasons that need an administrator or a resubmission (no amount of waiting starts the job).
NEVER_STARTS = frozenset({"PartitionConfig", "PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints",
                          "InvalidAccount", "InvalidQOS", "AccountNotAllowed", "QOSNotAllowed",
                          "DependencyNeverSatisfied"})


def _squeue(job_id: str) -> tuple[str, str]:
    """(state, reason) of a queued job; ("", "") when squeue cannot tell (the job left the queue)."""
    try:
        done = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T|%r"], capture_output=True, text=True,
                              timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return "", ""
    state, _, reason = done.stdout.strip().partition("|")
    return state, reason


def scontrol_job(job_id: str) -> dict[str, str]:
    """`scontrol show job`'s fields of a job Slurm still remembers (MinJobAge), else {}."""
    try:
        done = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return dict(field.split("=", 1) for field in done.stdout.split() if "=" in field)


def root_cause(log: str, max_lines: int = 40) -> str:
    """The last Python traceback in `log` through its exception line (at most `max_lines` lines), passing over
    torchrun's own ChildFailedError, which only reports that a rank failed; `[rankN]:` prefixes dropped."""
    lines = [RANK_PREFIX.sub("", line) for line in log.splitlines()]
    blocks = []
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("Traceback (most recent call last)"):
            continue
        block = [line]
        for following in lines[i + 1:]:
            block.append(following)
            if following[:1].strip() and not following.startswith("Traceback"):
                break  # the exception line: the first one not indented
        blocks.append(block)
    causes = [b for b in blocks if "ChildFailedError" not in b[-1]] or blocks
    return "\n".join(causes[-1][-max_lines:]) if causes else ""


LAUNCHERS: dict[str, type[JobLauncher]] = {
    "local": LocalTorchrunLauncher,
    "kubernetes": KubernetesTorchrunLauncher,
    "slurm": SlurmTorchrunLauncher,
}


def launcher_from_env(gem_home: str) -> JobLauncher:
    """The launcher named by GEM_LAUNCHER (default `local`), with fields from the JSON file named by
    GEM_LAUNCHER_CONFIG; a cluster launcher's `gem_home` defaults to the lake's home."""
    choice = os.environ.get("GEM_LAUNCHER") or "local"
    if choice not in LAUNCHERS:
        raise ValueError(f"GEM_LAUNCHER={choice!r} is not a launcher; choose one of {sorted(LAUNCHERS)} "
                         "(unset means 'local')")
    cls = LAUNCHERS[choice]
    config_path = os.environ.get("GEM_LAUNCHER_CONFIG")
    settings: dict[str, Any] = json.loads(Path(config_path).read_text()) if config_path else {}
    unknown = sorted(set(settings) - set(cls.model_fields))
    if unknown:
        raise ValueError(f"GEM_LAUNCHER_CONFIG={config_path}: unknown {cls.__name__} fields {unknown}; "
                         f"valid fields: {sorted(cls.model_fields)}")
    if "gem_home" in cls.model_fields:
        settings.setdefault("gem_home", gem_home)
    try:
        return cls(**settings)
    except pydantic.ValidationError as e:
        raise ValueError(f"GEM_LAUNCHER={choice} needs settings in the JSON file named by GEM_LAUNCHER_CONFIG "
                         f"(now {config_path!r}): {e}") from e
