"""Export assets: batch-scored embeddings and teacher logits, and FAISS indexes over them.

Scoring runs `jobs/score.py` in a separate process through the launcher (Dagster Pipes), which
stages Parquet; each staged table is then committed to its Delta table replacing exactly the
(model_version, ds) partition. Several model versions coexist side by side in each table.
Indexes are published per model version under `$GEM_HOME/indexes/<name>/<model_version>/`.
"""

import shutil
from dataclasses import dataclass

import dagster as dg

from dagster_project.defs.lake_tables import (
    contract_check,
    daily_partitions,
    key,
    partition_date,
    table_metadata,
)
from dagster_project.defs.training.assets import TEACHER_MODEL
from dagster_project.resources.lake import LakeResource
from dagster_project.resources.launchers import JobLauncher
from dagster_project.resources.spark import SparkResource
from gem_model.config import GemConfig
from gem_model.export.index import publish_index
from gem_model.export.scoring import read_embeddings
from jobs.lake import replace_partition
from jobs.score import SCORED_TABLES

GROUP = "export"


@dataclass(frozen=True)
class IndexSpec:
    """An index over `table`'s embeddings, with recall measured on queries from `query_table`."""

    table: str
    id_column: str
    query_table: str
    query_id_column: str


INDEXES = {"ads": IndexSpec("gold.ad_embeddings", "ad_id", "gold.user_embeddings", "user_id"),
           "users": IndexSpec("gold.user_embeddings", "user_id", "gold.ad_embeddings", "ad_id")}


class ExportConfig(dg.Config):
    model_version: str | None = None  # default: the latest trained teacher ($GEM_HOME/models/LATEST)


def _model_version(config: ExportConfig, lake: LakeResource) -> str:
    return config.model_version or lake.latest_model_version()


def build_export_assets(cfg: GemConfig) -> list[dg.AssetsDefinition]:
    daily = daily_partitions(cfg)

    @dg.multi_asset(
        specs=[dg.AssetSpec(key(f"gold.{name}"), group_name=GROUP, kinds={"pytorch", "delta"},
                            deps=[TEACHER_MODEL, key("gold.training_examples"), key("gold.user_sequences"),
                                  key("silver.users"), key("silver.ads")])
               for name in SCORED_TABLES],
        partitions_def=daily,
    )
    def scored_tables(context: dg.AssetExecutionContext, config: ExportConfig, spark: SparkResource,
                      lake: LakeResource, launcher: JobLauncher):
        """User/ad embeddings and per-task teacher logits of one day, for one model version."""
        ds, version = partition_date(context), _model_version(config, lake)
        staging = lake.paths.staging / "score" / version / ds.isoformat()
        shutil.rmtree(staging, ignore_errors=True)
        launcher.launch(context, "jobs/score.py",
                        ["--model-version", version, "--ds", ds.isoformat(), "--out", str(staging)], nproc=1)
        s = spark.session()
        for name in SCORED_TABLES:
            table = f"gold.{name}"
            df = s.read.parquet(str(staging / f"{name}.parquet"))
            rows = replace_partition(df, lake.paths.table(table), {"model_version": version, "ds": ds})
            yield dg.MaterializeResult(asset_key=key(table),
                                       metadata={"model_version": version, **table_metadata(s, lake, table, rows)})
        shutil.rmtree(staging)

    def index_asset(name: str, spec: IndexSpec) -> dg.AssetsDefinition:
        asset_key = dg.AssetKey(["indexes", name])
        recall_check = dg.AssetCheckSpec("recall_floor", asset=asset_key, blocking=True,
                                         description=f"recall@{cfg.index.recall_k} >= {cfg.index.min_recall}")

        @dg.asset(key=asset_key, group_name=GROUP, partitions_def=daily, deps=[key(spec.table), key(spec.query_table)],
                  kinds={"faiss"}, check_specs=[recall_check],
                  description=f"FAISS index over {spec.table} (inner product) with recall@k against exact search.")
        def _index(context: dg.AssetExecutionContext, config: ExportConfig,
                   lake: LakeResource) -> dg.MaterializeResult:
            ds, version = partition_date(context), _model_version(config, lake)
            ids, vectors = read_embeddings(lake.paths, spec.table, spec.id_column, version, ds)
            _, queries = read_embeddings(lake.paths, spec.query_table, spec.query_id_column, version, ds)
            directory = lake.paths.index_dir(name, version)
            index_cfg = lake.config.index
            manifest = publish_index(vectors, ids, queries, directory, index_cfg, version, ds, spec.table)
            recall = manifest[f"recall_at_{index_cfg.recall_k}"]
            return dg.MaterializeResult(
                metadata={"model_version": version, "path": dg.MetadataValue.path(str(directory)),
                          "row_count": manifest["row_count"], f"recall_at_{index_cfg.recall_k}": recall,
                          "queries_per_second": manifest["queries_per_second"], "factory": manifest["factory"]},
                check_results=[dg.AssetCheckResult(check_name="recall_floor", passed=recall >= index_cfg.min_recall,
                                                   metadata={"recall": recall, "floor": index_cfg.min_recall})],
            )

        return _index

    return [scored_tables, *(index_asset(name, spec) for name, spec in INDEXES.items())]


def build_export_checks() -> list[dg.AssetChecksDefinition]:
    return [contract_check(f"gold.{name}") for name in SCORED_TABLES]
