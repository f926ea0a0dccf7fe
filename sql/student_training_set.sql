-- The student's training set for one teacher version: fresh labels (gold.training_examples on the
-- days after the teacher's training window) joined to that version's teacher logits and to the
-- user and ad embeddings it exported for the same day. One row per impression the teacher scored;
-- an embedding is NULL where that day's embeddings were not exported.
-- teacher_p_click = sigmoid(ctr_logit); teacher_p_conversion = P(conversion | impression)
-- = sigmoid(ctr_logit) * sigmoid(cvr_logit).
-- Tables: gold.training_examples, gold.teacher_logits, gold.user_embeddings, gold.ad_embeddings,
-- meta.models (the training window: last_train_day; every day when the manifest is missing).
-- Parameters: for_model_version (default NULL: the newest version in gold.teacher_logits, by manifest
-- created_at then name), e.g. `gem sql sql/student_training_set.sql --var for_model_version=gem-... --format json`.
SET VARIABLE for_model_version = NULL::VARCHAR;

WITH teacher AS (
  SELECT v.model_version, m.last_train_day
  FROM (SELECT DISTINCT model_version FROM gold.teacher_logits) v
  LEFT JOIN meta.models m ON m.model_version = v.model_version
  WHERE getvariable('for_model_version') IS NULL OR v.model_version = getvariable('for_model_version')
  ORDER BY m.created_at DESC NULLS LAST, v.model_version DESC
  LIMIT 1
)
SELECT t.model_version, e.ds, e.impression_id, e.ts, e.user_id, e.ad_id, e.surface,
       e.clicked, e.converted,
       l.ctr_logit, l.cvr_logit,
       1 / (1 + exp(-l.ctr_logit)) AS teacher_p_click,
       1 / (1 + exp(-l.ctr_logit)) * (1 / (1 + exp(-l.cvr_logit))) AS teacher_p_conversion,
       u.embedding AS user_embedding,
       a.embedding AS ad_embedding
FROM teacher t
JOIN gold.teacher_logits l
  ON l.model_version = t.model_version AND (t.last_train_day IS NULL OR l.ds > t.last_train_day)
JOIN gold.training_examples e ON e.impression_id = l.impression_id AND e.ds = l.ds
LEFT JOIN gold.user_embeddings u ON u.model_version = t.model_version AND u.ds = e.ds AND u.user_id = e.user_id
LEFT JOIN gold.ad_embeddings a ON a.model_version = t.model_version AND a.ds = e.ds AND a.ad_id = e.ad_id
ORDER BY e.ds, e.ts, e.impression_id
