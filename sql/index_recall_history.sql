-- Index recall history: every FAISS index build, oldest first per index, with its recall@k against
-- exact search, speed and size, and the change in recall since the previous build of that index.
-- recall_change is NULL on an index's first build.
-- Tables: gold.index_builds (one row per build: index, model version, day). Parameters: none.
SELECT index_name, model_version, ds, created_at,
       factory, configured_factory, dimension, row_count,
       k, recall_at_k,
       recall_at_k - lag(recall_at_k) OVER (PARTITION BY index_name ORDER BY created_at, ds) AS recall_change,
       queries_per_second, build_seconds, sha256
FROM gold.index_builds
ORDER BY index_name, created_at, ds
