-- Row counts of the main lake tables (bronze -> gold), to see at a glance what has landed.
-- Tables: bronze.impressions, bronze.events, gold.training_examples, gold.user_embeddings,
-- gold.ad_embeddings, gold.teacher_logits. Parameters: none.
SELECT 'bronze.impressions' AS table_name, count(*) AS row_count FROM bronze.impressions
UNION ALL SELECT 'bronze.events', count(*) FROM bronze.events
UNION ALL SELECT 'gold.training_examples', count(*) FROM gold.training_examples
UNION ALL SELECT 'gold.user_embeddings', count(*) FROM gold.user_embeddings
UNION ALL SELECT 'gold.ad_embeddings', count(*) FROM gold.ad_embeddings
UNION ALL SELECT 'gold.teacher_logits', count(*) FROM gold.teacher_logits
