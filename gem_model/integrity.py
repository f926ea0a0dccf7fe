"""Integrity of the artefacts the pipeline serves: manifests that parse, files that match their checksums.

Every artefact directory (a model's checkpoint, a FAISS index build, a student) records the size
and sha256 of its files in its manifest when it is written (`file_digests`), and every loader
verifies them before use (`verify_files`), so a truncated or overwritten file is an error naming
the file and how to rebuild it, never silently wrong scores. Manifests themselves are read with
`read_manifest_file`, which names the file and the fix when it is missing or does not parse.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


class CorruptArtefactError(RuntimeError):
    """An artefact's file is missing, truncated, or differs from what its manifest recorded."""


def file_sha256(path: Path) -> str:
    with path.open("rb") as fh:  # streamed: a 1M-row HNSW index is ~0.4 GB
        return hashlib.file_digest(fh, "sha256").hexdigest()


def file_digests(directory: Path) -> dict[str, dict[str, Any]]:
    """Relative path -> {"bytes", "sha256"} of every file under `directory` (sorted)."""
    return {
        str(p.relative_to(directory)): {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def verify_files(directory: Path, expected: dict[str, dict[str, Any]], fix: str) -> None:
    """Raise `CorruptArtefactError` (saying `fix`) unless every recorded file is there with its size and sha256."""
    for name, digest in expected.items():
        path = directory / name
        if not path.is_file():
            raise CorruptArtefactError(f"{path} is missing (its manifest lists it); {fix}")
        size = path.stat().st_size
        if size != digest["bytes"]:
            raise CorruptArtefactError(
                f"{path} has {size:,} bytes, its manifest recorded {digest['bytes']:,} "
                f"(truncated or overwritten); {fix}"
            )
        actual = file_sha256(path)
        if actual != digest["sha256"]:
            raise CorruptArtefactError(
                f"{path} is corrupt: sha256 {actual} differs from its manifest's {digest['sha256']}; {fix}"
            )


def read_manifest_file(path: Path, fix: str) -> dict[str, Any]:
    """The JSON object in `path`; a missing, truncated or non-object file is an error naming it and `fix`."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; {fix}")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CorruptArtefactError(f"{path} is not valid JSON ({err}; truncated or overwritten?); {fix}") from err
    if not isinstance(manifest, dict):
        raise CorruptArtefactError(f"{path} holds a JSON {type(manifest).__name__}, not an object; {fix}")
    return manifest
