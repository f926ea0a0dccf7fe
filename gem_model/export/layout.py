"""The scoring job's output layout, shared by the job that writes it (`jobs/score.py`), the Spark step
that commits it (`gem_lake.export_tables.commit_scored`) and the export assets that name its tables.

A run's output folder holds `<table>/part-<rank>.parquet` for each of `SCORED_TABLES` (committed as
`gold.<table>`) and, once every rank has finished, `SUCCESS_FILE` with the row counts.
"""

SCORED_TABLES: tuple[str, ...] = ("user_embeddings", "ad_embeddings", "teacher_logits")
SUCCESS_FILE = "_SUCCESS.json"
