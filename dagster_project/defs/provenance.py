"""Owners and code versions of the assets, per asset group, in one place.

An asset's code version hashes the config sections its step reads and the source files it runs, so
the Dagster UI marks a materialisation made under other settings or other code as out of date
("code version" on the asset's page), which a model pipeline needs more than a plain code change
marker: a new `features.max_seq_len` invalidates the features as surely as an edit of their code.
"""

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from gem_model.config import GemConfig

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Provenance:
    owners: tuple[str, ...]
    sections: tuple[str, ...]  # GemConfig sections the group's steps read
    sources: tuple[str, ...]  # files and folders (relative to the repository) its steps run


GROUPS = {
    "features": Provenance(
        ("team:ads-data",),
        ("world", "data", "features"),
        ("gem_lake/features", "gem_lake/sources", "gem_lake/delta.py", "gem_lake/table_contract.py"),
    ),
    "training": Provenance(
        ("team:ads-ranking",),
        ("world", "data", "features", "model", "train", "promotion"),
        ("gem_model", "kernels", "jobs/train.py"),
    ),
    "export": Provenance(
        ("team:ads-serving",), ("export", "index"), ("gem_model/export", "jobs/score.py", "gem_lake/export_tables.py")
    ),
    "student": Provenance(("team:ads-ranking",), ("student",), ("gem_model/distill", "jobs/train_student.py")),
    "reports": Provenance(("team:ads-data",), (), ("sql", "gem_lake/sql/query.py")),
}


def _files(source: str) -> list[Path]:
    path = ROOT / source
    return sorted(p for p in path.rglob("*") if p.suffix in (".py", ".sql")) if path.is_dir() else [path]


def code_version(cfg: GemConfig, provenance: Provenance) -> str:
    digest = hashlib.sha256()
    settings = cfg.to_dict()
    digest.update(json.dumps({s: settings[s] for s in provenance.sections}, sort_keys=True).encode())
    for source in provenance.sources:
        for path in _files(source):
            digest.update(str(path.relative_to(ROOT)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def with_provenance(
    assets: Sequence[dg.AssetsDefinition | dg.AssetSpec], cfg: GemConfig
) -> list[dg.AssetsDefinition | dg.AssetSpec]:
    versions = {group: code_version(cfg, p) for group, p in GROUPS.items()}

    def stamp(spec: dg.AssetSpec) -> dg.AssetSpec:
        if spec.group_name not in GROUPS:
            raise ValueError(
                f"asset {spec.key.to_user_string()} is in group {spec.group_name!r}, which "
                f"dagster_project/defs/provenance.py does not know; add it to GROUPS"
            )
        return spec.replace_attributes(
            owners=list(GROUPS[spec.group_name].owners), code_version=versions[spec.group_name]
        )

    return list(dg.map_asset_specs(stamp, assets))
