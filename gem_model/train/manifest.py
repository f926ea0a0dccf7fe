"""Reading a trained model's manifest (`$GEM_HOME/models/<version>/manifest.json`), without torch.

The manifest names everything a model was made from (config, training data version, metrics,
checkpoint checksums: docs/tables.md). Orchestration reads it to pick versions and check them, so
this module stays free of the model code; `gem_model.export.checkpoint` loads the weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gem_model.integrity import read_manifest_file


def retrain_hint(model_dir: Path) -> str:
    return (
        f"the model version cannot be used: materialise teacher_model again to re-train it (its version name "
        f"is derived from the config and data), or delete {model_dir} and use another version"
    )


def read_manifest(model_dir: Path) -> dict[str, Any]:
    """The manifest of the model at `model_dir`; a missing version names the known ones, a corrupt one the fix."""
    manifest_path = model_dir / "manifest.json"
    if not manifest_path.is_file():
        known = sorted(p.name for p in model_dir.parent.glob("*") if (p / "manifest.json").is_file())
        raise FileNotFoundError(
            f"model version {model_dir.name!r} not found under {model_dir.parent} "
            f"(no manifest.json); known versions: {known or 'none — materialise teacher_model first'}"
        )
    return read_manifest_file(manifest_path, retrain_hint(model_dir))
