-- Embedding coverage per model version and day: how many users and ads have a vector.
SELECT model_version, ds, 'user' AS entity, count(*) AS rows FROM gold.user_embeddings GROUP BY model_version, ds
UNION ALL
SELECT model_version, ds, 'ad', count(*) FROM gold.ad_embeddings GROUP BY model_version, ds
ORDER BY model_version, ds, entity
