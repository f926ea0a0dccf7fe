"""The launcher a deployment asks for: `GEM_LAUNCHER` names the backend, `GEM_LAUNCHER_CONFIG` a JSON file
of its fields (docs/ENVIRONMENT.md)."""

import json
import os
from pathlib import Path
from typing import Any

import pydantic

from dagster_project.resources.launchers.base import JobLauncher
from dagster_project.resources.launchers.k8s import KubernetesTorchrunLauncher
from dagster_project.resources.launchers.local import LocalTorchrunLauncher
from dagster_project.resources.launchers.slurm import SlurmTorchrunLauncher

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
        raise ValueError(
            f"GEM_LAUNCHER={choice!r} is not a launcher; choose one of {sorted(LAUNCHERS)} (unset means 'local')"
        )
    cls = LAUNCHERS[choice]
    config_path = os.environ.get("GEM_LAUNCHER_CONFIG")
    settings: dict[str, Any] = json.loads(Path(config_path).read_text()) if config_path else {}
    unknown = sorted(set(settings) - set(cls.model_fields))
    if unknown:
        raise ValueError(
            f"GEM_LAUNCHER_CONFIG={config_path}: unknown {cls.__name__} fields {unknown}; "
            f"valid fields: {sorted(cls.model_fields)}"
        )
    if "gem_home" in cls.model_fields:
        settings.setdefault("gem_home", gem_home)
    try:
        return cls(**settings)
    except pydantic.ValidationError as e:
        raise ValueError(
            f"GEM_LAUNCHER={choice} needs settings in the JSON file named by GEM_LAUNCHER_CONFIG "
            f"(now {config_path!r}): {e}"
        ) from e
