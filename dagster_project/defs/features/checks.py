"""Contract checks on the feature tables: schema against the table contract, per partition of the
daily tables.

The other checks (row conservation, point-in-time correctness, label rates) run inside the assets
themselves (`dagster_project.defs.features.assets`).
"""

import dagster as dg

from dagster_project.defs.lake_tables import contract_check
from dagster_project.defs.partitions import daily_partitions
from gem_model.config import GemConfig

DIMENSION_TABLES = ("bronze.users", "bronze.ads", "silver.user_features", "silver.ad_features")
DAILY_TABLES = (
    "bronze.events",
    "bronze.impressions",
    "gold.user_sequences",
    "gold.training_examples",
    "gold.user_timelines",
)


def build_feature_checks(cfg: GemConfig) -> list[dg.AssetChecksDefinition]:
    daily = daily_partitions(cfg)
    return [*(contract_check(t) for t in DIMENSION_TABLES), *(contract_check(t, daily) for t in DAILY_TABLES)]
