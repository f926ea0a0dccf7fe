"""The real datasets' samples at test size: each file cut to its first lines, the run's calendar shortened."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gem_model.config import DATASET_CONFIGS

MAX_LINES = 2_000
SHORT_CALENDAR = {"n_days": 2, "holdout_days": 1}  # one training day, one holdout day


def head_copy(source: Path, target: Path, max_lines: int = MAX_LINES) -> None:
    """`source` copied to `target`, each file cut to its first `max_lines` lines."""
    for path in source.rglob("*"):
        if path.is_file():
            out = target / path.relative_to(source)
            out.parent.mkdir(parents=True, exist_ok=True)
            with path.open("rb") as src, out.open("wb") as dst:
                for number, line in enumerate(src):
                    if number == max_lines:
                        break
                    dst.write(line)


def sample_overrides(source: str, data_dir: Path) -> dict[str, Any]:
    """Config overrides for `source` read from `data_dir` on the short calendar, with the dataset's own model
    config (its fields as features) where it has one."""
    shipped = DATASET_CONFIGS / f"{source}.json"
    own = json.loads(shipped.read_text()) if shipped.is_file() else {}
    return {**own, "world": SHORT_CALENDAR, "data": {**own.get("data", {}), "data_dir": str(data_dir)}}
