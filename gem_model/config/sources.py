"""What a config is loaded from: the environment (`ConfigSources`) and a GEM_CONFIG overrides file.

Everything that loads a config (the CLI, the entry points, the Dagster code location's `LakeResource`)
reads the environment here, in one place: GEM_PRESET (default `tiny`), overridden by GEM_CONFIG (a JSON
file), GEM_DATA_SOURCE and GEM_SOURCE_MAPPING (a source mapping file; the source becomes "mapping"). A
GEM_CONFIG file is read strictly (`gem_model.documents`): UTF-8 JSON of at most 1 MiB and 50 levels, no
key given twice.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gem_model.config.presets import DEFAULT_PRESET
from gem_model.config.validation import ConfigError, kind_of
from gem_model.documents import DocumentError, load_json, read_document


@dataclass(frozen=True)
class ConfigSources:
    """`GemConfig.load`'s arguments (`GemConfig.from_sources` loads them); an empty variable is unset."""

    preset: str = DEFAULT_PRESET
    config_path: str | None = None
    data_source: str | None = None
    source_mapping: str | None = None

    @staticmethod
    def from_env() -> ConfigSources:
        return ConfigSources(
            os.environ.get("GEM_PRESET") or DEFAULT_PRESET,
            os.environ.get("GEM_CONFIG") or None,
            os.environ.get("GEM_DATA_SOURCE") or None,
            os.environ.get("GEM_SOURCE_MAPPING") or None,
        )


_OVERRIDES_EXAMPLE = '{"train": {"epochs": 1}, "world": {"n_days": 10}}'


def read_overrides(path: Path) -> dict[str, Any]:
    """The JSON object in the overrides file `path`; a ConfigError naming the file and the fix otherwise."""
    where = f"config file {path} (GEM_CONFIG or --config)"
    fix = f"write a JSON object of overrides, e.g. {_OVERRIDES_EXAMPLE}"
    try:
        text = read_document(path)
    except FileNotFoundError:
        raise ConfigError(
            f"{where} does not exist; point GEM_CONFIG at an existing file, or unset it to use the preset alone"
        ) from None
    except OSError as e:
        raise ConfigError(f"{where} cannot be read ({e}); point GEM_CONFIG at a readable UTF-8 JSON file") from None
    except DocumentError as e:
        raise ConfigError(f"{where} {e}") from None
    if not text.strip():
        raise ConfigError(f"{where} is empty; {fix}, or unset GEM_CONFIG to use the preset alone")
    try:
        data = load_json(text)
    except DocumentError as e:
        raise ConfigError(f"{where} {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: the top level is {kind_of(data)}, not a JSON object; {fix}")
    return data
