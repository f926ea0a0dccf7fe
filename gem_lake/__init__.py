"""The Spark/Delta library: sources, the bronze/silver/gold feature jobs, Delta table IO and locks,
the table contract, the Spark session, and SQL over the lake.

It sits between the model (`gem_model`, which it may import) and the orchestration
(`dagster_project`, which imports it); the entry points in `jobs/` run it.
"""
