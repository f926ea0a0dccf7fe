"""LakeResource: where the pipeline writes ($GEM_HOME) and with which GemConfig."""

import dataclasses
from pathlib import Path

import dagster as dg

from gem_model.config import DEFAULT_PRESET, ConfigSources, GemConfig
from gem_model.paths import GemPaths


class LakeResource(dg.ConfigurableResource):
    """`home` is the $GEM_HOME root; `preset`, optional `config_path` (JSON overrides), `data_source`
    (overrides `data.source`) and `source_mapping` (a source mapping file) pick the config, as
    `gem_model.config.ConfigSources` names them."""

    home: str
    preset: str = DEFAULT_PRESET
    config_path: str | None = None
    data_source: str | None = None
    source_mapping: str | None = None

    @staticmethod
    def from_env() -> "LakeResource":
        sources = ConfigSources.from_env()
        return LakeResource(home=str(GemPaths.from_env().home), **dataclasses.asdict(sources))

    @property
    def paths(self) -> GemPaths:
        return GemPaths(Path(self.home))

    @property
    def config(self) -> GemConfig:
        return GemConfig.from_sources(
            ConfigSources(self.preset, self.config_path, self.data_source, self.source_mapping)
        )

    def latest_model_version(self) -> str:
        return self.paths.latest_model_version()

    def set_latest_model_version(self, version: str) -> None:
        self.paths.set_latest_model_version(version)
