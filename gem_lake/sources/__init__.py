"""Raw inputs of the bronze layer: the synthetic world or one real public dataset.

`data.source` chooses the source. Every source produces the same raw tables, with the bronze
contract's columns (`gem_lake.table_contract`) and the dataset's own features as extra columns:
users and ads (dimensions, whole), events and impressions (one day at a time). A source never
filters or repairs rows: malformed ones pass through to `gem_lake.quarantine`, which
splits them into the bronze table and `bronze.rejected_rows` with a reason. Real datasets are
read strictly, line by line (`gem_lake.sources.lines`): a line that does not parse reaches the
quarantine with its own reason and raw line, and nothing else is derived from it.
"""

from __future__ import annotations

import importlib
import os
from datetime import date
from pathlib import Path
from typing import Protocol

from pyspark.sql import DataFrame, SparkSession

from gem_model.config import GemConfig

# data.source -> module under gem_lake.sources defining `Source(spark, cfg, data_dir)`.
MODULES = {
    "synthetic": "gem_lake.sources.world",
    "taobao": "gem_lake.sources.taobao",
    "ali_ccp": "gem_lake.sources.mapped",  # gem_lake/sources/mappings/ali_ccp.yaml
    "aliexpress": "gem_lake.sources.mapped",  # gem_lake/sources/mappings/aliexpress.yaml
    "criteo": "gem_lake.sources.criteo",
    "open_bandit": "gem_lake.sources.open_bandit",
    "frappe": "gem_lake.sources.mapped",  # gem_lake/sources/mappings/frappe.yaml
    "movielens": "gem_lake.sources.mapped",  # gem_lake/sources/mappings/movielens.yaml
    "mapping": "gem_lake.sources.mapped",  # the user's own mapping file (data.mapping)
}


class Source(Protocol):
    """Raw bronze rows; `events(ds)` and `impressions(ds)` return the rows delivered for day `ds`."""

    def users(self) -> DataFrame: ...

    def ads(self) -> DataFrame: ...

    def events(self, ds: date) -> DataFrame: ...

    def impressions(self, ds: date) -> DataFrame: ...


def data_dir(cfg: GemConfig) -> Path:
    """Root of the real datasets: `data.data_dir`, else $GEM_DATA_DIR, else ../shared/data beside the repo."""
    configured = cfg.data.data_dir or os.environ.get("GEM_DATA_DIR", "")
    root = Path(configured) if configured else Path(__file__).resolve().parents[2].parent / "shared" / "data"
    if not root.is_dir():
        raise FileNotFoundError(
            f"real datasets not found at {root}; set data.data_dir or GEM_DATA_DIR to the folder holding "
            f"{cfg.data.source}/ (or use data.source='synthetic')"
        )
    return root


def dataset_folder(source: str) -> str:
    """The folder, under the datasets root, of a built-in real source: its adapter's or its mapping's."""
    if MODULES[source] == "gem_lake.sources.mapped":
        from gem_lake.sources.mapped import BUILT_IN
        from gem_lake.sources.mapping import load_mapping

        return load_mapping(BUILT_IN / f"{source}.yaml").folder
    return importlib.import_module(MODULES[source]).FOLDER


def build_source(spark: SparkSession, cfg: GemConfig) -> Source:
    module = importlib.import_module(MODULES[cfg.data.source])
    root = None if cfg.data.source in ("synthetic", "mapping") else data_dir(cfg)
    return module.Source(spark, cfg, root)
