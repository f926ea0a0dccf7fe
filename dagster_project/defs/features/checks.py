"""Whole-table asset checks on the feature tables: each one's schema against the table contract.

The per-partition checks (row conservation, point-in-time correctness, label rates) run inside
the assets themselves (`dagster_project.defs.features.assets`).
"""

import dagster as dg

from dagster_project.defs.lake_tables import contract_check

FEATURE_TABLES = ("bronze.users", "bronze.ads", "bronze.events", "bronze.impressions", "silver.user_features",
                  "silver.ad_features", "gold.user_sequences", "gold.training_examples")


def build_feature_checks() -> list[dg.AssetChecksDefinition]:
    return [contract_check(t) for t in FEATURE_TABLES]
