"""LakeResource: where the pipeline writes ($GEM_HOME) and with which GemConfig."""

import json
import os
from pathlib import Path

import dagster as dg

from gem_model.config import GemConfig
from gem_model.paths import GemPaths


class LakeResource(dg.ConfigurableResource):
    """`home` is the $GEM_HOME root; `preset` and optional `config_path` (JSON overrides) pick the config."""

    home: str
    preset: str = "tiny"
    config_path: str | None = None

    @staticmethod
    def from_env() -> "LakeResource":
        return LakeResource(
            home=str(GemPaths.from_env().home),
            preset=os.environ.get("GEM_PRESET", "tiny"),
            config_path=os.environ.get("GEM_CONFIG") or None,
        )

    @property
    def paths(self) -> GemPaths:
        return GemPaths(Path(self.home))

    @property
    def config(self) -> GemConfig:
        cfg = GemConfig.from_preset(self.preset)
        if self.config_path:
            cfg = GemConfig.from_dict(json.loads(Path(self.config_path).read_text()), base=cfg)
        return cfg

    def latest_model_version(self) -> str:
        pointer = self.paths.models / "LATEST"
        if not pointer.is_file():
            raise FileNotFoundError(
                f"no trained model under {self.paths.models}; materialise teacher_model first, "
                "or pass model_version in the run config"
            )
        return pointer.read_text().strip()

    def set_latest_model_version(self, version: str) -> None:
        pointer = self.paths.models / "LATEST"
        tmp = pointer.with_suffix(".tmp")
        tmp.write_text(version + "\n")
        tmp.replace(pointer)
