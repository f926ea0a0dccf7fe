"""The table contract: the columns (Spark SQL types) every lake table guarantees, and its keys.

Asset checks verify each materialised table against this; docs/tables.md documents it. Tables
may carry more columns than listed (a dataset's own features, truth columns of the synthetic
world); they never carry fewer, and key columns are never null.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TableContract:
    columns: dict[str, str]
    keys: tuple[str, ...]
    partitioned_by: tuple[str, ...] = ()


_IMPRESSION = {
    "impression_id": "string", "ts": "timestamp", "ds": "date", "user_id": "bigint", "ad_id": "bigint",
    "surface": "string", "clicked": "boolean", "converted": "boolean",
}
_EMBEDDING = {"model_version": "string", "ds": "date", "embedding": "array<float>"}

CONTRACT: dict[str, TableContract] = {
    "bronze.users": TableContract({"user_id": "bigint", "age_bucket": "string", "country": "string",
                                   "device": "string"}, ("user_id",)),
    "bronze.ads": TableContract({"ad_id": "bigint", "advertiser_id": "bigint", "category": "bigint",
                                 "ad_format": "string", "objective": "string"}, ("ad_id",)),
    "bronze.events": TableContract({"user_id": "bigint", "item_id": "bigint", "action": "string",
                                    "surface": "string", "ts": "timestamp", "ds": "date"},
                                   ("user_id", "item_id", "ts"), ("ds",)),
    # p_click / p_convert: the true probabilities; null where the source does not know them (real data).
    "bronze.impressions": TableContract({**_IMPRESSION, "position": "int", "p_click": "double",
                                         "p_convert": "double"}, ("impression_id", "user_id", "ad_id", "ts"),
                                        ("ds",)),
    # raw_line / source_file / source_line: the row's line in the source file; null for rows not read from one.
    "bronze.rejected_rows": TableContract({"source_table": "string", "source_partition": "string",
                                           "reason": "string", "record": "string", "raw_line": "string",
                                           "source_file": "string", "source_line": "bigint"},
                                          ("source_table", "source_partition", "reason"),
                                          ("source_table", "source_partition")),
    "silver.user_features": TableContract({"user_id": "bigint", "user_id_idx": "bigint"}, ("user_id",)),
    "silver.ad_features": TableContract({"ad_id": "bigint", "ad_id_idx": "bigint"}, ("ad_id",)),
    "gold.user_sequences": TableContract({"user_id": "bigint", "ds": "date", "seq_item_ids": "array<bigint>",
                                          "seq_ts": "array<timestamp>", "seq_actions": "array<string>",
                                          "seq_item_idx": "array<bigint>", "seq_action_idx": "array<bigint>",
                                          "seq_age_idx": "array<bigint>"},
                                         ("user_id",), ("ds",)),
    "gold.training_examples": TableContract({**_IMPRESSION, "seq_item_ids": "array<bigint>",
                                             "seq_ts": "array<timestamp>", "seq_actions": "array<string>",
                                             "seq_item_idx": "array<bigint>", "seq_action_idx": "array<bigint>",
                                             "seq_age_idx": "array<bigint>", "user_id_idx": "bigint",
                                             "ad_id_idx": "bigint", "surface_idx": "bigint"},
                                            ("impression_id", "user_id", "ad_id", "ts"), ("ds",)),
    "gold.user_embeddings": TableContract({"user_id": "bigint", **_EMBEDDING}, ("user_id", "model_version"),
                                          ("model_version", "ds")),
    "gold.ad_embeddings": TableContract({"ad_id": "bigint", **_EMBEDDING}, ("ad_id", "model_version"),
                                        ("model_version", "ds")),
    "gold.teacher_logits": TableContract({"impression_id": "string", "user_id": "bigint", "ad_id": "bigint",
                                          "surface": "string", "ds": "date", "model_version": "string",
                                          "ctr_logit": "float", "cvr_logit": "float"},
                                         ("impression_id", "model_version"), ("model_version", "ds")),
    # Top-k ads per user from the ads index: score = inner product of the two exported embeddings.
    "gold.user_ad_candidates": TableContract({"user_id": "bigint", "ad_id": "bigint", "rank": "int",
                                              "score": "float", "model_version": "string", "ds": "date"},
                                             ("user_id", "ad_id", "model_version"), ("model_version", "ds")),
    # One row per index build (the published manifest's numbers), replaced when a build is re-run.
    "gold.index_builds": TableContract({"index_name": "string", "model_version": "string", "ds": "date",
                                        "factory": "string", "configured_factory": "string",
                                        "dimension": "int", "row_count": "bigint", "recall_at_k": "double",
                                        "k": "int", "queries_per_second": "double", "build_seconds": "double",
                                        "sha256": "string", "created_at": "timestamp"},
                                       ("index_name", "model_version", "ds"), ("index_name", "model_version", "ds")),
    # One row per (variant, surface or 'all', task) of a student version's evaluation days; the
    # references `teacher`, `teacher_adapted` and `oracle` are scored on the same rows.
    "gold.student_metrics": TableContract({"student_version": "string", "model_version": "string",
                                           "eval_start": "date", "eval_end": "date", "created_at": "timestamp",
                                           "variant": "string", "surface": "string", "task": "string",
                                           "auc": "double", "ne": "double", "calibration": "double",
                                           "log_loss": "double", "rows": "bigint", "positives": "bigint"},
                                          ("student_version", "variant", "surface", "task"),
                                          ("model_version", "student_version")),
}


def schema_violations(table: str, actual: dict[str, str]) -> list[str]:
    """Human-readable differences between a table's schema (column -> type) and its contract."""
    problems = []
    for column, expected in CONTRACT[table].columns.items():
        if column not in actual:
            problems.append(f"missing column {column} ({expected})")
        elif actual[column] != expected:
            problems.append(f"column {column} is {actual[column]}, contract says {expected}")
    return problems
