-- Embedding coverage and freshness per model version: how many of the known users and ads
-- (silver.user_features, silver.ad_features) have a vector on the version's latest exported day, and how far that
-- day lags behind the newest day of training data.
--   covered / known = coverage; embedded counts every id with a vector (ids outside silver included);
--   days_behind = newest_data_ds - latest_ds (0: exported up to the newest data).
-- Tables: gold.user_embeddings, gold.ad_embeddings, silver.user_features, silver.ad_features, gold.training_examples,
-- meta.models. Parameters: none (every model version).
WITH embeddings AS (
  SELECT 'user' AS entity, model_version, ds, user_id AS id FROM gold.user_embeddings
  UNION ALL
  SELECT 'ad', model_version, ds, ad_id FROM gold.ad_embeddings
), known AS (
  SELECT 'user' AS entity, user_id AS id FROM silver.user_features
  UNION ALL
  SELECT 'ad', ad_id FROM silver.ad_features
), days AS (
  SELECT entity, model_version, count(DISTINCT ds) AS days_exported, min(ds) AS first_ds, max(ds) AS latest_ds
  FROM embeddings GROUP BY entity, model_version
), latest AS (
  SELECT d.entity, d.model_version, d.days_exported, d.first_ds, d.latest_ds,
         count(DISTINCT e.id) AS embedded,
         count(DISTINCT k.id) AS covered
  FROM days d
  JOIN embeddings e ON e.entity = d.entity AND e.model_version = d.model_version AND e.ds = d.latest_ds
  LEFT JOIN known k ON k.entity = e.entity AND k.id = e.id
  GROUP BY d.entity, d.model_version, d.days_exported, d.first_ds, d.latest_ds
), known_counts AS (
  SELECT entity, count(*) AS known FROM known GROUP BY entity
)
SELECT l.model_version, m.created_at AS model_created_at, l.entity,
       l.days_exported, l.first_ds, l.latest_ds,
       l.embedded, l.covered, c.known,
       l.covered / nullif(c.known, 0) AS coverage,
       n.newest_data_ds,
       datediff('day', l.latest_ds, n.newest_data_ds) AS days_behind
FROM latest l
LEFT JOIN known_counts c ON c.entity = l.entity
LEFT JOIN meta.models m ON m.model_version = l.model_version
CROSS JOIN (SELECT max(ds) AS newest_data_ds FROM gold.training_examples) n
ORDER BY m.created_at DESC NULLS LAST, l.model_version, l.entity DESC
