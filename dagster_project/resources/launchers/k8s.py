"""torchrun on Kubernetes: a Kubeflow `PyTorchJob`, or an indexed batch/v1 Job plus a headless Service,
whose pods run torchrun with c10d rendezvous; submitted with the `kubernetes` client (imported only
when launching) and waited for. The Pipes context travels in the pods' environment and rank 0 writes
its messages to a file under `$GEM_HOME/staging/pipes`, which the Dagster process reads.
"""

import copy
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import dagster as dg

from dagster_project.resources.launchers.base import (
    JobLauncher,
    JobLaunchError,
    c10d_args,
    check_positive,
    dns_label,
    job_label,
    job_name,
    module_args,
    pipes_message_file,
    pipes_quietly,
)


class KubernetesTorchrunLauncher(JobLauncher):
    """torchrun on `nnodes` pods, each with `nproc_per_node` ranks (default: the asset's `nproc`).

    `kind="PyTorchJob"` needs the Kubeflow training-operator (it sets MASTER_ADDR and RANK on
    each pod and a Service for the master); `kind="IndexedJob"` needs only batch/v1 and brings
    its own headless Service, with JOB_COMPLETION_INDEX as the node rank. `image` must have the
    project installed in the environment of its `torchrun` (pods start the job module with `-m`;
    `workdir`, default the image's WORKDIR, is their working directory); the claim `gem_home_claim`
    is mounted at `gem_home` (the Dagster process must see the same volume at the same path).
    """

    image: str
    gem_home: str
    gem_home_claim: str
    kind: Literal["PyTorchJob", "IndexedJob"] = "PyTorchJob"
    namespace: str = "default"
    workdir: str | None = None
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

    def render(
        self, module: str, args: Sequence[str], nproc: int, run_id: str, env: Mapping[str, str] | None = None
    ) -> dict[str, Any]:
        """The manifest to submit: a PyTorchJob, or a v1 List of [Service, indexed Job].

        `env` (e.g. a Pipes session's bootstrap variables) is added to every container's env.
        """
        check_positive(
            "KubernetesTorchrunLauncher", nnodes=self.nnodes, nproc_per_node=self.nproc_per_node, nproc=nproc
        )
        name = job_name(module, args, run_id)
        labels = {
            "app.kubernetes.io/name": "gem-pipeline",
            "app.kubernetes.io/component": job_label(module),
            "gem-pipeline/job": name,
            "dagster/run-id": dns_label(run_id),
        }
        metadata = {"name": name, "namespace": self.namespace, "labels": labels}
        if self.kind == "PyTorchJob":
            # Kubernetes expands $(VAR) in commands from the container's env; $$ keeps a literal $.
            command = [
                *self._torchrun(nproc, "$(RANK)", "$(MASTER_ADDR)", name),
                *(a.replace("$(", "$$(") for a in module_args(module, args)),
            ]
            template = self._pod_template(labels, command, env, "pytorchjob-port", self.nproc_per_node or nproc)
            replicas = {"Master": {"replicas": 1, "restartPolicy": "Never", "template": template}}
            if self.nnodes > 1:
                replicas["Worker"] = {
                    "replicas": self.nnodes - 1,
                    "restartPolicy": "Never",
                    "template": copy.deepcopy(template),
                }
            # nprocPerNode: the operator derives WORLD_SIZE and PET_NPROC_PER_NODE from it (default 1).
            return {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "metadata": metadata,
                "spec": {
                    "runPolicy": {
                        "cleanPodPolicy": "None",
                        "backoffLimit": 0,
                        "ttlSecondsAfterFinished": self.ttl_seconds_after_finished,
                    },
                    "nprocPerNode": str(self.nproc_per_node or nproc),
                    "pytorchReplicaSpecs": replicas,
                },
            }
        # Indexed pods are named <job>-<index> and, with `subdomain`, resolvable as <job>-<index>.<service>
        # once they have an IP. Pod 0 hosts the rendezvous whether or not its own name resolves yet
        # (is_host); the others wait until it does, since torchrun gives up on a name that does not resolve.
        host = f"{name}-0.{name}"
        torchrun = shlex.join(self._torchrun(nproc, "RANK", host, name)).replace(
            "--node-rank=RANK", '--node-rank="$JOB_COMPLETION_INDEX"'
        )
        shell = (
            'if [ "$JOB_COMPLETION_INDEX" = 0 ]; then is_host=1; else is_host=0; '
            f"until getent hosts {host} >/dev/null; do sleep 2; done; fi; "
            f'exec {torchrun} --rdzv-conf=is_host="$is_host" {shlex.join(module_args(module, args))}'
        )
        command = ["sh", "-c", shell.replace("$(", "$$(")]
        template = self._pod_template(labels, command, env, "rdzv", self.nproc_per_node or nproc)
        template["spec"]["subdomain"] = name
        selector = {"gem-pipeline/job": name}
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": dict(metadata),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": selector,
                "ports": [{"name": "rdzv", "port": self.rdzv_port}],
            },
        }
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": dict(metadata),
            "spec": {
                "completionMode": "Indexed",
                "completions": self.nnodes,
                "parallelism": self.nnodes,
                "backoffLimit": 0,
                "ttlSecondsAfterFinished": self.ttl_seconds_after_finished,
                "template": template,
            },
        }
        return {"apiVersion": "v1", "kind": "List", "items": [service, job]}

    def _threads(self, ranks: int) -> dict[str, Any]:
        """OMP_NUM_THREADS for each rank: the pod's CPUs shared by its ranks (torchrun alone would give 1).
        One rank takes the pod's CPU limit (the node's CPUs without one); several divide `cpu`, else get 1."""
        if ranks == 1:
            return {
                "name": "OMP_NUM_THREADS",
                "valueFrom": {
                    "resourceFieldRef": {"containerName": "pytorch", "resource": "limits.cpu", "divisor": "1"}
                },
            }
        cores = float(self.cpu[:-1]) / 1000 if self.cpu and self.cpu.endswith("m") else float(self.cpu or 0)
        return {"name": "OMP_NUM_THREADS", "value": str(max(1, int(cores) // ranks))}

    def _torchrun(self, nproc: int, node_rank: str, host: str, rdzv_id: str) -> list[str]:
        """torchrun and its options, up to the module."""
        return [
            "torchrun",
            *c10d_args(self.nnodes, node_rank, self.nproc_per_node or nproc, f"{host}:{self.rdzv_port}", rdzv_id),
        ]

    def _pod_template(
        self, labels: Mapping[str, str], command: list[str], env: Mapping[str, str] | None, port_name: str, ranks: int
    ) -> dict[str, Any]:
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
            "command": command,
            "env": env_list,
            "ports": [{"name": port_name, "containerPort": self.rdzv_port}],
            "resources": {"requests": dict(resources), "limits": dict(resources)},
            "volumeMounts": [
                {"name": "gem-home", "mountPath": self.gem_home},
                {"name": "dshm", "mountPath": "/dev/shm"},
            ],
        }
        if self.workdir:
            container["workingDir"] = self.workdir
        spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "containers": [container],
            # The default 64 MiB /dev/shm is too small for NCCL and DataLoader workers.
            "volumes": [
                {"name": "gem-home", "persistentVolumeClaim": {"claimName": self.gem_home_claim}},
                {"name": "dshm", "emptyDir": {"medium": "Memory"}},
            ],
        }
        if self.service_account:
            spec["serviceAccountName"] = self.service_account
        return {"metadata": {"labels": dict(labels)}, "spec": spec}

    def launch(
        self, context: dg.AssetExecutionContext, module: str, args: Sequence[str], nproc: int
    ) -> dg.PipesClientCompletedInvocation:
        try:
            from kubernetes import client as k8s
            from kubernetes import config as k8s_config
        except ImportError as e:
            raise ImportError(
                "KubernetesTorchrunLauncher needs the Kubernetes client: `pip install kubernetes` "
                "(or set GEM_LAUNCHER=local)"
            ) from e
        try:
            k8s_config.load_incluster_config()
        except k8s_config.ConfigException:
            k8s_config.load_kube_config()
        name = job_name(module, args, context.run_id)
        reader = dg.PipesFileMessageReader(str(pipes_message_file(self.gem_home, name)))
        with (
            pipes_quietly(),
            dg.open_pipes_session(
                context=context, context_injector=dg.PipesEnvContextInjector(), message_reader=reader
            ) as session,
        ):
            manifest = self.render(module, args, nproc, context.run_id, env=session.get_bootstrap_env_vars())
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
            self._wait(
                lambda: (
                    (api.get_namespaced_custom_object(**crd, name=name).get("status") or {}).get("conditions") or []
                ),
                name,
            )
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
                return [{"type": c.type, "status": c.status, "message": c.message} for c in (status.conditions or [])]

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
                raise JobLaunchError(
                    f"{self.kind} {self.namespace}/{name} failed: {reason}; "
                    f"see `kubectl -n {self.namespace} describe {resource} {name}` and "
                    f"`kubectl -n {self.namespace} logs -l gem-pipeline/job={name}`"
                )
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.kind} {self.namespace}/{name} did not finish within timeout_s={self.timeout_s}; deleting it"
                )
            time.sleep(self.poll_interval_s)
