"""The Kubernetes launcher's manifests validate against the published schemas, strictly (no unknown field).

Core objects (the IndexedJob's Service and Job, the PyTorchJob's pod templates and metadata) are
checked with kubernetes-validate's JSON schemas of the Kubernetes API, oldest and newest version
we support. The PyTorchJob itself is walked through the Kubeflow training SDK's models of the
`kubeflow.org/v1` CRD (kubeflow-training 1.9, the training-operator v1.9 API): every key must be a
field of its model, every value of its type. No cluster runs here; these are the objects it would
be sent.
"""

from typing import Any

import kubeflow.training.models as kubeflow
import kubernetes_validate
import pytest
from kubernetes_validate.utils import ValidationError

from dagster_project.resources.launchers import KubernetesTorchrunLauncher

K8S_VERSIONS = ("1.30.0", "1.37.0")
PRIMITIVES = {"str": str, "int": int, "bool": bool, "object": object}
VARIANTS = {
    "one node": {},
    "three GPU nodes": {
        "nnodes": 3,
        "gpus": 8,
        "cpu": "32",
        "memory": "256Gi",
        "service_account": "trainer",
        "env": {"NCCL_DEBUG": "WARN"},
    },
    "one rank a node": {"nnodes": 2, "nproc_per_node": 1},
}


class SchemaError(ValueError):
    """A manifest that its API's schema refuses."""


def launcher(kind: str, **fields: Any) -> KubernetesTorchrunLauncher:
    return KubernetesTorchrunLauncher(
        image="registry.example/gem:1", gem_home="/gem", gem_home_claim="gem-home", kind=kind, **fields
    )


def validate_core(obj: dict[str, Any]) -> None:
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except ValidationError as error:
            raise SchemaError(f"{obj['kind']} (Kubernetes {version}): {error}") from error


def validate_model(data: Any, type_name: str, where: str = "PyTorchJob") -> None:
    """`data` against the Kubeflow SDK model `type_name`; Kubernetes types through their JSON schemas."""
    if type_name in PRIMITIVES:
        assert isinstance(data, PRIMITIVES[type_name]), f"{where}: {data!r} is not {type_name}"
    elif type_name.startswith("dict(str, "):
        for key, value in data.items():
            validate_model(value, type_name.removeprefix("dict(str, ")[:-1], f"{where}.{key}")
    elif type_name.startswith("list["):
        for i, value in enumerate(data):
            validate_model(value, type_name.removeprefix("list[")[:-1], f"{where}[{i}]")
    elif type_name == "V1PodTemplateSpec":
        validate_core({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "probe"}, "template": data})
    elif type_name == "V1ObjectMeta":
        validate_core({"apiVersion": "v1", "kind": "ConfigMap", "metadata": data})
    else:
        model = getattr(kubeflow, type_name)
        fields = {json_key: model.openapi_types[attr] for attr, json_key in model.attribute_map.items()}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise SchemaError(f"{where}: unknown fields {unknown} for {type_name}; known: {sorted(fields)}")
        for key, value in data.items():
            validate_model(value, fields[key], f"{where}.{key}")


@pytest.mark.parametrize("variant", VARIANTS)
def test_pytorchjobs_validate_against_the_training_operators_models(variant):
    job = launcher("PyTorchJob", **VARIANTS[variant]).render(
        "jobs.train", ["--config", "c.json"], nproc=2, run_id="run-1"
    )
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    validate_model(job, "KubeflowOrgV1PyTorchJob")


@pytest.mark.parametrize("variant", VARIANTS)
def test_indexed_jobs_and_their_services_validate_against_the_kubernetes_api(variant):
    manifest = launcher("IndexedJob", **VARIANTS[variant]).render(
        "jobs.score", ["--ds", "2026-11-05"], nproc=1, run_id="run-1"
    )
    assert (manifest["apiVersion"], manifest["kind"]) == ("v1", "List")  # kubectl's list, not an API object
    for item in manifest["items"]:
        validate_core(item)


def test_the_validators_reject_a_field_the_api_does_not_have():
    job = launcher("PyTorchJob").render("jobs.train", [], nproc=1, run_id="run-1")
    job["spec"]["nprocsPerNode"] = job["spec"].pop("nprocPerNode")
    with pytest.raises(SchemaError, match="nprocsPerNode"):
        validate_model(job, "KubeflowOrgV1PyTorchJob")
    job = launcher("PyTorchJob").render("jobs.train", [], nproc=1, run_id="run-1")
    job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["workdir"] = "/app"
    with pytest.raises(SchemaError, match="workdir"):
        validate_model(job, "KubeflowOrgV1PyTorchJob")
    service, indexed = launcher("IndexedJob").render("jobs.train", [], nproc=1, run_id="run-1")["items"]
    indexed["spec"]["completions"] = "two"
    with pytest.raises(SchemaError, match="'two' is not of type 'integer'"):
        validate_core(indexed)
