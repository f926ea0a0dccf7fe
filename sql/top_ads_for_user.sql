-- Top ads for one user by embedding inner product (the retrieval score the FAISS ads index uses),
-- by exact search over the exported embeddings: the ground truth gold.user_ad_candidates approximates.
-- One model version and day: by default the newest model version (manifest created_at, meta.models)
-- that has this user's embedding, and its latest day with it.
-- Tables: gold.user_embeddings, gold.ad_embeddings, meta.models.
-- Parameters: for_user_id (default 1), top_k (default 10), for_model_version and for_ds (default NULL:
-- newest), e.g. `gem sql sql/top_ads_for_user.sql --var for_user_id=42 --var top_k=5`.
-- score is computed in DOUBLE from the FLOAT embeddings.
SET VARIABLE for_user_id = 1::BIGINT;
SET VARIABLE top_k = 10::INTEGER;
SET VARIABLE for_model_version = NULL::VARCHAR;
SET VARIABLE for_ds = NULL::DATE;

WITH user_vectors AS (
  SELECT e.model_version, e.ds, e.embedding, m.created_at
  FROM gold.user_embeddings e
  LEFT JOIN meta.models m ON m.model_version = e.model_version
  WHERE e.user_id = getvariable('for_user_id')
    AND (getvariable('for_model_version') IS NULL OR e.model_version = getvariable('for_model_version'))
    AND (getvariable('for_ds') IS NULL OR e.ds = getvariable('for_ds'))
), chosen AS (
  SELECT model_version, ds, embedding FROM user_vectors
  ORDER BY created_at DESC NULLS LAST, model_version DESC, ds DESC
  LIMIT 1
), scored AS (
  SELECT a.model_version, a.ds, a.ad_id,
         list_inner_product(a.embedding::DOUBLE[], u.embedding::DOUBLE[]) AS score
  FROM gold.ad_embeddings a
  JOIN chosen u ON a.model_version = u.model_version AND a.ds = u.ds
)
SELECT * FROM (
  SELECT model_version, ds, getvariable('for_user_id') AS user_id, ad_id, score,
         row_number() OVER (ORDER BY score DESC, ad_id) AS rank
  FROM scored
) WHERE rank <= getvariable('top_k')
ORDER BY rank
