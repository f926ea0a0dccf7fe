"""Export assets: batch-scored embeddings and teacher logits, FAISS indexes, and candidates.

Scoring prepares the users' input with Spark, runs `jobs.score` under torchrun through the
launcher (Dagster Pipes, `export.nproc` ranks), and commits each table replacing exactly the
(model_version, ds) partition: several model versions coexist side by side, and a re-run or a
crash and a re-run never duplicates rows. Indexes are published per (model version, day) under
`$GEM_HOME/indexes/<name>/<model_version>/<ds>/`, each build recorded in gold.index_builds;
gold.user_ad_candidates holds every user's top `export.candidates_k` ads from the ads index. Every
asset here is partitioned by (model_version, ds) like the tables, so a run exports one version's day
and the UI shows which pairs exist (`dagster_project/defs/partitions.py`).

Every step holds the (model_version, ds) export lock (`gem_lake.locks.partition_lock`) and works in
its own run's staging directory, so a concurrent duplicate export is refused at once instead of
interleaving with this one, and each commit records the Dagster run that made it (the Delta
commit's `userMetadata`, visible in `meta.table_history`).
"""

import dataclasses
import json
import shutil
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import date

import dagster as dg

from dagster_project.defs.lake_tables import contract_check, key, table_metadata
from dagster_project.defs.partitions import model_day, model_day_key, model_day_partitions
from dagster_project.defs.training.assets import TEACHER_MODEL
from dagster_project.resources.lake import LakeResource
from dagster_project.resources.launchers import JobLauncher
from dagster_project.resources.spark import SparkResource
from gem_lake.locks import partition_lock
from gem_model.config import GemConfig
from gem_model.export.layout import SCORED_TABLES
from gem_model.train.manifest import read_manifest

GROUP = "export"


@dataclass(frozen=True)
class IndexSpec:
    """An index over `table`'s embeddings, with recall measured on queries from `query_table`.

    Its asset is `indexes/<asset_name>`: a last segment no table shares, so the lineage graph's
    labels are unique; its files stay under `$GEM_HOME/indexes/<name>/`.
    """

    asset_name: str
    table: str
    id_column: str
    query_table: str
    query_id_column: str

    @property
    def asset_key(self) -> dg.AssetKey:
        return dg.AssetKey(["indexes", self.asset_name])


INDEXES = {
    "ads": IndexSpec("ad_index", "gold.ad_embeddings", "ad_id", "gold.user_embeddings", "user_id"),
    "users": IndexSpec("user_index", "gold.user_embeddings", "user_id", "gold.ad_embeddings", "ad_id"),
}


CANDIDATES = "gold.user_ad_candidates"
INDEX_BUILDS = "gold.index_builds"


def _repr_dim(lake: LakeResource, version: str) -> int:
    return int(read_manifest(lake.paths.model_dir(version))["config"]["model"]["repr_dim"])


def _export_lock(
    context: dg.AssetExecutionContext, lake: LakeResource, version: str, ds: date
) -> AbstractContextManager[None]:
    return partition_lock(lake.paths, "export", version, ds.isoformat(), holder=f"dagster run {context.run_id}")


def _lineage(context: dg.AssetExecutionContext, version: str, ds: date) -> dict[str, str]:
    return {"dagster_run_id": context.run_id, "model_version": version, "ds": ds.isoformat()}


def build_export_assets(cfg: GemConfig) -> list[dg.AssetsDefinition]:
    partitions = model_day_partitions(cfg)

    @dg.multi_asset(
        specs=[
            dg.AssetSpec(
                key(f"gold.{name}"),
                group_name=GROUP,
                kinds={"pytorch", "delta"},
                deps=[
                    TEACHER_MODEL,
                    key("gold.user_timelines"),
                    key("gold.user_sequences"),
                    key("silver.user_features"),
                    key("silver.ad_features"),
                ],
            )
            for name in SCORED_TABLES
        ],
        partitions_def=partitions,
    )
    def scored_tables(
        context: dg.AssetExecutionContext, spark: SparkResource, lake: LakeResource, launcher: JobLauncher
    ):
        """User/ad embeddings and per-task teacher logits of one day, for one model version."""
        from gem_lake.export_tables import commit_scored, write_user_input

        version, ds = model_day(context)
        read_manifest(lake.paths.model_dir(version))  # a missing version fails here, naming the known ones
        s, export = spark.session(), lake.config.export
        with _export_lock(context, lake, version, ds):
            staging = lake.paths.run_staging("score", context.run_id)
            try:
                users = write_user_input(
                    s, lake.paths, lake.config.features, ds, staging / "input" / "users", export.user_input_files
                )
                context.log.info(f"users' scoring input: {users} rows")
                args = [
                    "--model-version",
                    version,
                    "--ds",
                    ds.isoformat(),
                    "--users",
                    str(staging / "input" / "users"),
                    "--out",
                    str(staging / "output"),
                    "--export-config",
                    json.dumps(dataclasses.asdict(export)),
                ]
                launcher.launch(context, "jobs.score", args, nproc=export.nproc)
                rows = commit_scored(s, lake.paths, staging / "output", version, ds, _lineage(context, version, ds))
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        for table, n in rows.items():
            yield dg.MaterializeResult(asset_key=key(table), metadata=table_metadata(lake, table, n))

    def index_asset(name: str, spec: IndexSpec) -> dg.AssetsDefinition:
        asset_key = spec.asset_key
        recall_check = dg.AssetCheckSpec(
            "recall_floor",
            asset=asset_key,
            blocking=True,
            partitions_def=partitions,
            description=f"recall@{cfg.index.recall_k} >= {cfg.index.min_recall}",
        )

        @dg.asset(
            key=asset_key,
            group_name=GROUP,
            partitions_def=partitions,
            deps=[key(spec.table), key(spec.query_table)],
            kinds={"faiss"},
            check_specs=[recall_check],
            description=f"FAISS index over {spec.table} (inner product) with recall@k against exact search.",
        )
        def _index(context: dg.AssetExecutionContext, spark: SparkResource, lake: LakeResource) -> dg.MaterializeResult:
            from gem_lake.export_tables import record_index_build
            from gem_model.export.index import publish_index
            from gem_model.export.scoring import read_embeddings

            version, ds = model_day(context)
            dim = _repr_dim(lake, version)
            directory = lake.paths.index_dir(name, version, ds)
            index_cfg = lake.config.index
            with _export_lock(context, lake, version, ds):
                ids, vectors = read_embeddings(lake.paths, spec.table, spec.id_column, version, ds, dim)
                _, queries = read_embeddings(lake.paths, spec.query_table, spec.query_id_column, version, ds, dim)
                manifest = publish_index(vectors, ids, queries, directory, index_cfg, version, ds, spec.table)
                record_index_build(
                    spark.session(), lake.paths, manifest, index_cfg.recall_k, _lineage(context, version, ds)
                )
            context.log_event(
                dg.AssetMaterialization(
                    asset_key=key(INDEX_BUILDS),
                    metadata={
                        "index": name,
                        "model_version": version,
                        "ds": ds.isoformat(),
                        **table_metadata(lake, INDEX_BUILDS, 1),
                    },
                )
            )
            recall = manifest[f"recall_at_{index_cfg.recall_k}"]
            return dg.MaterializeResult(
                metadata={
                    "path": dg.MetadataValue.path(str(directory)),
                    "row_count": manifest["row_count"],
                    f"recall_at_{index_cfg.recall_k}": recall,
                    "queries_per_second": manifest["queries_per_second"],
                    "factory": manifest["factory"],
                },
                check_results=[
                    dg.AssetCheckResult(
                        check_name="recall_floor",
                        passed=recall >= index_cfg.min_recall,
                        metadata={"recall": recall, "floor": index_cfg.min_recall},
                    )
                ],
            )

        return _index

    @dg.asset(
        key=key(CANDIDATES),
        group_name=GROUP,
        partitions_def=partitions,
        kinds={"faiss", "delta"},
        deps=[INDEXES["ads"].asset_key, key("gold.user_embeddings")],
    )
    def user_ad_candidates(
        context: dg.AssetExecutionContext, spark: SparkResource, lake: LakeResource
    ) -> dg.MaterializeResult:
        """Every user's top `export.candidates_k` ads from the ads index; score = embedding inner product."""
        from gem_lake.export_tables import write_candidates
        from gem_model.export.index import read_index
        from gem_model.export.scoring import read_embeddings

        version, ds = model_day(context)
        s = spark.session()
        with _export_lock(context, lake, version, ds):
            index, manifest = read_index(lake.paths.index_dir("ads", version, ds))
            ad_ids, _ = read_embeddings(lake.paths, "gold.ad_embeddings", "ad_id", version, ds)
            if (manifest["model_version"], manifest["ds"], manifest["row_count"]) != (
                version,
                ds.isoformat(),
                len(ad_ids),
            ):
                raise ValueError(
                    f"the ads index at {lake.paths.index_dir('ads', version, ds)} holds "
                    f"{manifest['row_count']} ads of {manifest['model_version']} on {manifest['ds']}, "
                    f"but gold.ad_embeddings has {len(ad_ids)} of {version} on {ds}; rebuild the index: "
                    f"materialise indexes/ad_index for partition {model_day_key(version, ds)}"
                )
            user_ids, vectors = read_embeddings(
                lake.paths, "gold.user_embeddings", "user_id", version, ds, _repr_dim(lake, version)
            )
            rows = write_candidates(
                s,
                lake.paths,
                index,
                user_ids,
                vectors,
                lake.config.export.candidates_k,
                version,
                ds,
                lake.paths.run_staging("candidates", context.run_id),
                _lineage(context, version, ds),
            )
        return dg.MaterializeResult(metadata={"users": len(user_ids), **table_metadata(lake, CANDIDATES, rows)})

    index_builds = dg.AssetSpec(
        key(INDEX_BUILDS),
        group_name=GROUP,
        kinds={"delta"},
        deps=[spec.asset_key for spec in INDEXES.values()],
        description="One row per (index, model version, day) build: factory, size, recall@k, queries/s, sha256. "
        "Written by each index build, which reports a materialisation here.",
    )
    return [
        scored_tables,
        *(index_asset(name, spec) for name, spec in INDEXES.items()),
        index_builds,
        user_ad_candidates,
    ]


def build_export_checks(cfg: GemConfig) -> list[dg.AssetChecksDefinition]:
    partitions = model_day_partitions(cfg)
    return [contract_check(table, partitions) for table in (*(f"gold.{name}" for name in SCORED_TABLES), CANDIDATES)]
