"""Dagster resources: the lake (paths + config), Spark, and training/scoring launchers."""
