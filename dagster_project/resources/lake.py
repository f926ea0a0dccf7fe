"""LakeResource: where the pipeline writes ($GEM_HOME) and with which GemConfig."""

import os
from pathlib import Path

import dagster as dg

from gem_model.config import GemConfig
from gem_model.paths import GemPaths


class LakeResource(dg.ConfigurableResource):
    """`home` is the $GEM_HOME root; `preset`, optional `config_path` (JSON overrides) and
    `data_source` (overrides `data.source`) pick the config."""

    home: str
    preset: str = "tiny"
    config_path: str | None = None
    data_source: str | None = None

    @staticmethod
    def from_env() -> "LakeResource":
        return LakeResource(
            home=str(GemPaths.from_env().home),
            preset=os.environ.get("GEM_PRESET", "tiny"),
            config_path=os.environ.get("GEM_CONFIG") or None,
            data_source=os.environ.get("GEM_DATA_SOURCE") or None,
        )

    @property
    def paths(self) -> GemPaths:
        return GemPaths(Path(self.home))

    @property
    def config(self) -> GemConfig:
        return GemConfig.load(self.preset, self.config_path, self.data_source)

    def latest_model_version(self) -> str:
        return self.paths.latest_model_version()

    def set_latest_model_version(self, version: str) -> None:
        self.paths.set_latest_model_version(version)
