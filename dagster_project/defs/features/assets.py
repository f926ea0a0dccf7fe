"""Feature assets: the synthetic world lands in bronze, Spark builds silver and gold from it.

Users and ads are dimension tables (unpartitioned, replaced whole); events, impressions,
sequences and training examples are daily partitions, each replaced atomically by its run.
Sequences look back `FeatureSpec.lookback_days` days, so they depend on that window of events.
"""

import dagster as dg

from dagster_project.defs.lake_tables import daily_partitions, key, partition_date, table_metadata
from dagster_project.resources.lake import LakeResource
from dagster_project.resources.spark import SparkResource
from gem_model.config import GemConfig
from jobs.features import tables, world
from jobs.lake import overwrite_table, read_table, replace_partition

GROUP = "features"


def build_feature_assets(cfg: GemConfig) -> list[dg.AssetsDefinition]:
    daily = daily_partitions(cfg)
    event_window = dg.TimeWindowPartitionMapping(
        start_offset=-cfg.features.lookback_days, end_offset=0, allow_nonexistent_upstream_partitions=True
    )

    @dg.asset(key=key("bronze.users"), group_name=GROUP, kinds={"spark", "delta"})
    def bronze_users(spark: SparkResource, lake: LakeResource) -> dg.MaterializeResult:
        """Users of the synthetic world with demographic and device attributes."""
        s = spark.session()
        rows = overwrite_table(world.users(s, lake.config.world), lake.paths.table("bronze.users"))
        return dg.MaterializeResult(metadata=table_metadata(s, lake, "bronze.users", rows))

    @dg.asset(key=key("bronze.ads"), group_name=GROUP, kinds={"spark", "delta"})
    def bronze_ads(spark: SparkResource, lake: LakeResource) -> dg.MaterializeResult:
        """Ads with advertiser, category, creative format and objective."""
        s = spark.session()
        rows = overwrite_table(world.ads(s, lake.config.world), lake.paths.table("bronze.ads"))
        return dg.MaterializeResult(metadata=table_metadata(s, lake, "bronze.ads", rows))

    @dg.asset(key=key("bronze.events"), group_name=GROUP, partitions_def=daily, deps=[key("bronze.users")],
              kinds={"spark", "delta"})
    def bronze_events(context: dg.AssetExecutionContext, spark: SparkResource,
                      lake: LakeResource) -> dg.MaterializeResult:
        """One day of organic behaviour events (user, item, action, surface, ts)."""
        s, ds = spark.session(), partition_date(context)
        users = read_table(s, lake.paths.table("bronze.users"))
        rows = replace_partition(world.events(s, lake.config.world, users, ds), lake.paths.table("bronze.events"),
                                 {"ds": ds})
        return dg.MaterializeResult(metadata=table_metadata(s, lake, "bronze.events", rows))

    @dg.asset(key=key("bronze.impressions"), group_name=GROUP, partitions_def=daily,
              deps=[key("bronze.users"), key("bronze.ads")], kinds={"spark", "delta"})
    def bronze_impressions(context: dg.AssetExecutionContext, spark: SparkResource,
                           lake: LakeResource) -> dg.MaterializeResult:
        """One day of ad impressions with click/conversion labels and their true probabilities."""
        s, ds = spark.session(), partition_date(context)
        users = read_table(s, lake.paths.table("bronze.users"))
        ads = read_table(s, lake.paths.table("bronze.ads"))
        df = world.impressions(s, lake.config.world, users, ads, ds)
        rows = replace_partition(df, lake.paths.table("bronze.impressions"), {"ds": ds})
        return dg.MaterializeResult(metadata=table_metadata(s, lake, "bronze.impressions", rows))

    @dg.asset(key=key("silver.users"), group_name=GROUP, deps=[key("bronze.users")], kinds={"spark", "delta"})
    def silver_users(spark: SparkResource, lake: LakeResource) -> dg.MaterializeResult:
        """Observable user attributes with their embedding rows (`<feature>_idx`)."""
        s = spark.session()
        df = tables.silver_users(read_table(s, lake.paths.table("bronze.users")), lake.config.features)
        rows = overwrite_table(df, lake.paths.table("silver.users"))
        return dg.MaterializeResult(metadata=table_metadata(s, lake, "silver.users", rows))

    @dg.asset(key=key("silver.ads"), group_name=GROUP, deps=[key("bronze.ads")], kinds={"spark", "delta"})
    def silver_ads(spark: SparkResource, lake: LakeResource) -> dg.MaterializeResult:
        """Observable ad attributes with their embedding rows (`<feature>_idx`)."""
        s = spark.session()
        df = tables.silver_ads(read_table(s, lake.paths.table("bronze.ads")), lake.config.features)
        rows = overwrite_table(df, lake.paths.table("silver.ads"))
        return dg.MaterializeResult(metadata=table_metadata(s, lake, "silver.ads", rows))

    @dg.asset(key=key("gold.user_sequences"), group_name=GROUP, partitions_def=daily,
              deps=[dg.AssetDep(key("bronze.events"), partition_mapping=event_window)], kinds={"spark", "delta"})
    def user_sequences(context: dg.AssetExecutionContext, spark: SparkResource,
                       lake: LakeResource) -> dg.MaterializeResult:
        """Each active user's behaviour sequence as of the end of the day, most recent first."""
        s, ds = spark.session(), partition_date(context)
        df = tables.user_sequences(read_table(s, lake.paths.table("bronze.events")), lake.config.features, ds)
        rows = replace_partition(df, lake.paths.table("gold.user_sequences"), {"ds": ds})
        return dg.MaterializeResult(metadata=table_metadata(s, lake, "gold.user_sequences", rows))

    @dg.asset(key=key("gold.training_examples"), group_name=GROUP, partitions_def=daily,
              deps=[key("bronze.impressions"), key("silver.users"), key("silver.ads"),
                    dg.AssetDep(key("bronze.events"), partition_mapping=event_window)],
              kinds={"spark", "delta"})
    def training_examples(context: dg.AssetExecutionContext, spark: SparkResource,
                          lake: LakeResource) -> dg.MaterializeResult:
        """Impressions of the day with user/ad features and the sequence strictly before each one."""
        s, ds = spark.session(), partition_date(context)
        p = lake.paths
        df = tables.training_examples(
            read_table(s, p.table("bronze.impressions")), read_table(s, p.table("bronze.events")),
            read_table(s, p.table("silver.users")), read_table(s, p.table("silver.ads")), lake.config.features, ds,
        )
        rows = replace_partition(df, p.table("gold.training_examples"), {"ds": ds})
        return dg.MaterializeResult(metadata=table_metadata(s, lake, "gold.training_examples", rows))

    return [bronze_users, bronze_ads, bronze_events, bronze_impressions, silver_users, silver_ads,
            user_sequences, training_examples]
