-- Top 10 ads for user 1 by embedding inner product (the retrieval score the FAISS index uses),
-- exact search over the exported tables, for the latest day of each model version.
WITH u AS (
  SELECT model_version, ds, embedding FROM gold.user_embeddings WHERE user_id = 1
), scored AS (
  SELECT a.model_version, a.ds, a.ad_id,
         aggregate(zip_with(a.embedding, u.embedding, (x, y) -> x * y), 0D, (acc, v) -> acc + v) AS score
  FROM gold.ad_embeddings a JOIN u ON a.model_version = u.model_version AND a.ds = u.ds
)
SELECT * FROM (
  SELECT model_version, ds, ad_id, score,
         row_number() OVER (PARTITION BY model_version, ds ORDER BY score DESC) AS rank
  FROM scored
) WHERE rank <= 10
ORDER BY model_version, ds, rank
