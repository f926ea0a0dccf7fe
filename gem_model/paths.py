"""Where every output lives: the `$GEM_HOME` contract (docs/tables.md).

One root (default `./lakehouse`, or `$GEM_HOME`) holds Delta tables under `lake/<layer>/<table>`,
models under `models/<model_version>` (`models/LATEST` names the promoted one), FAISS indexes
under `indexes/<name>/<model_version>/<ds>`, distilled students under `students/<student_version>`,
landing journals under `landings/`, lock files under `locks/`, each run's scratch space under
`staging/<kind>/<run id>` and, unless `DAGSTER_HOME` is set, Dagster's instance.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import date
from pathlib import Path

LAYERS: tuple[str, ...] = ("bronze", "silver", "gold")
# A name that can only mean an entry directly inside its folder: no separator, no `..`, not hidden.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def is_plain_name(name: str) -> bool:
    """Whether `name` is a plain file name (letters, digits, `.`, `_`, `-`; no `/`, `\\` or `..`), as every model
    version is (`gem-<preset>-<fingerprint>-d<N>`): a path-like name would point LATEST outside `models/`."""
    return _PLAIN_NAME.fullmatch(name) is not None and ".." not in name


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
            raise ValueError(f"table name {qualified_name!r} must be '<layer>.<table>' with layer in {LAYERS}")
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

    def known_model_versions(self) -> list[str]:
        """Every finished model version (a directory with a manifest; `.partial` ones are still training)."""
        return sorted(
            p.name for p in self.models.glob("*") if (p / "manifest.json").is_file() and not p.name.endswith(".partial")
        )

    def require_model_version(self, version: str) -> str:
        """`version` if it names a finished model under `models/`; a ValueError naming the known versions if not."""
        known = self.known_model_versions()
        if not is_plain_name(version):
            problem = "is not a model version name (a plain name such as gem-tiny-0123456789-d5: no '/' or '..')"
        elif version not in known:
            problem = f"is not a model version under {self.models}"
        else:
            return version
        raise ValueError(
            f"{version!r} {problem}; known versions: {', '.join(known) or 'none (materialise teacher_model first)'}"
        )

    def latest_model_version(self) -> str:
        """The promoted model version, named by `models/LATEST` (set once the promotion rule accepted it)."""
        pointer = self.models / "LATEST"
        if not pointer.is_file():
            raise FileNotFoundError(
                f"no promoted model under {self.models} ({pointer} missing); materialise teacher_model (a model is "
                "promoted when the promotion rule accepts it), or name a model version explicitly"
            )
        version = pointer.read_text().strip()
        if not is_plain_name(version) or not (self.model_dir(version) / "manifest.json").is_file():
            raise FileNotFoundError(
                f"{pointer} names model version {version!r}, which has no manifest under {self.models}; "
                f"known versions: {self.known_model_versions() or 'none'}. Materialise teacher_model again, or "
                f"point LATEST at a known version: gem promote VERSION"
            )
        return version

    def set_latest_model_version(self, version: str) -> None:
        """Point `models/LATEST` at `version` (the promotion rule is `gem_model.train.promotion.promote`'s)."""
        if not is_plain_name(version):  # defence in depth: every caller passes a known version already
            raise ValueError(
                f"set_latest_model_version: version={version!r} is not a plain model version name "
                "(letters, digits, '.', '_', '-'; no '/' or '..'); LATEST is unchanged"
            )
        pointer = self.models / "LATEST"
        tmp = pointer.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(version + "\n")
        tmp.replace(pointer)  # atomic: readers see the old or the new name

    def index_dir(self, name: str, model_version: str, ds: date) -> Path:
        """The index `name` (ads, users) over the embeddings of `model_version` on day `ds`."""
        return self.home / "indexes" / name / model_version / ds.isoformat()

    def index_days(self, name: str, model_version: str) -> list[date]:
        """The days for which index `name` of `model_version` has a published build, oldest first."""
        return sorted(
            date.fromisoformat(p.parent.name) for p in (self.home / "indexes" / name / model_version).glob("*/CURRENT")
        )

    def student_dir(self, student_version: str) -> Path:
        return self.home / "students" / student_version

    @property
    def staging(self) -> Path:
        return self.home / "staging"

    def run_staging(self, kind: str, run_id: str) -> Path:
        """Scratch space of one run (`kind`: score, train, ...): never shared by two runs."""
        return self.staging / kind / run_id

    @property
    def dagster_home(self) -> Path:
        return Path(os.environ.get("DAGSTER_HOME", self.home / "dagster")).resolve()
