"""Where every output lives: the `$GEM_HOME` contract (docs/tables.md).

One root (default `./lakehouse`, or `$GEM_HOME`) holds Delta tables under `lake/<layer>/<table>`,
models under `models/<model_version>`, FAISS indexes under `indexes/<name>/<model_version>`,
distilled students under `students/<student_version>`,
scratch space for jobs under `staging/` and, unless `DAGSTER_HOME` is set, Dagster's instance.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

LAYERS: tuple[str, ...] = ("bronze", "silver", "gold")


@dataclass(frozen=True)
class GemPaths:
    home: Path

    @staticmethod
    def from_env() -> GemPaths:
        return GemPaths(Path(os.environ.get("GEM_HOME", "lakehouse")).resolve())

    @property
    def lake(self) -> Path:
        return self.home / "lake"

    def table(self, qualified_name: str) -> Path:
        """Path of a Delta table given as `<layer>.<table>`, e.g. `gold.user_embeddings`."""
        layer, _, name = qualified_name.partition(".")
        if layer not in LAYERS or not name:
            raise ValueError(
                f"table name {qualified_name!r} must be '<layer>.<table>' with layer in {LAYERS}"
            )
        return self.lake / layer / name

    def claim_source(self, source: str) -> None:
        """Bind the lake to one data source (`lake/SOURCE`), so two sources never mix in its tables."""
        marker = self.lake / "SOURCE"
        if marker.is_file():
            owner = marker.read_text().strip()
            if owner != source:
                raise ValueError(
                    f"the lake at {self.lake} holds data.source={owner!r}, not {source!r}; "
                    f"set GEM_HOME to another folder for {source!r} (or delete {self.lake} to rebuild it)"
                )
            return
        self.lake.mkdir(parents=True, exist_ok=True)
        marker.write_text(source + "\n")

    def model_dir(self, model_version: str) -> Path:
        return self.home / "models" / model_version

    @property
    def models(self) -> Path:
        return self.home / "models"

    def latest_model_version(self) -> str:
        """The newest trained model version, named by `models/LATEST`."""
        pointer = self.models / "LATEST"
        if not pointer.is_file():
            raise FileNotFoundError(
                f"no trained model under {self.models}; materialise teacher_model first, "
                "or name a model version explicitly"
            )
        return pointer.read_text().strip()

    def set_latest_model_version(self, version: str) -> None:
        pointer = self.models / "LATEST"
        tmp = pointer.with_suffix(".tmp")
        tmp.write_text(version + "\n")
        tmp.replace(pointer)  # atomic: readers see the old or the new name

    def index_dir(self, name: str, model_version: str) -> Path:
        return self.home / "indexes" / name / model_version

    def student_dir(self, student_version: str) -> Path:
        return self.home / "students" / student_version

    @property
    def staging(self) -> Path:
        return self.home / "staging"

    @property
    def dagster_home(self) -> Path:
        return Path(os.environ.get("DAGSTER_HOME", self.home / "dagster")).resolve()
