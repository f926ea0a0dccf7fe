-- Distribution shift of the teacher's logits between two model versions, on the impressions both
-- scored, per surface (and 'all' surfaces) and logit (ctr_logit, cvr_logit):
--   mean / stddev (sample) / p05 / p50 / p95 of each version (quantiles exact: quantile_disc, a value of
--   the data at rank floor((n - 1) * q)),
--   mean_diff = mean(b - a), mean_abs_diff = mean(|b - a|), correlation = corr(a, b)
--   (NULL where either version's logit is constant).
-- Version a is the baseline, b the candidate. By default b is the newest version in gold.teacher_logits
-- and a the one before it (by manifest created_at in meta.models, then name); with only one version,
-- a = b: the version is compared with itself (mean_abs_diff 0, correlation 1 or NULL if constant), and
-- the columns of a are its distribution.
-- Tables: gold.teacher_logits, meta.models.
-- Parameters: baseline_version, candidate_version (default NULL: as above), e.g.
-- `gem sql sql/teacher_logit_shift.sql --var baseline_version=gem-tiny-...-d3 --var candidate_version=...`.
SET VARIABLE baseline_version = NULL::VARCHAR;
SET VARIABLE candidate_version = NULL::VARCHAR;

WITH versions AS (
  SELECT v.model_version,
         row_number() OVER (ORDER BY m.created_at DESC NULLS LAST, v.model_version DESC) AS recency
  FROM (SELECT DISTINCT model_version FROM gold.teacher_logits) v
  LEFT JOIN meta.models m ON m.model_version = v.model_version
), pair AS (
  SELECT coalesce(getvariable('baseline_version'),
                  (SELECT max_by(model_version, recency) FROM versions WHERE recency <= 2)) AS version_a,
         coalesce(getvariable('candidate_version'),
                  (SELECT model_version FROM versions WHERE recency = 1)) AS version_b
), logits AS (
  SELECT p.version_a, p.version_b, ta.surface, unnest([
           {'logit': 'ctr_logit', 'a': cast(ta.ctr_logit AS double), 'b': cast(tb.ctr_logit AS double)},
           {'logit': 'cvr_logit', 'a': cast(ta.cvr_logit AS double), 'b': cast(tb.cvr_logit AS double)}],
         recursive := true)
  FROM pair p
  JOIN gold.teacher_logits ta ON ta.model_version = p.version_a
  JOIN gold.teacher_logits tb
    ON tb.model_version = p.version_b AND tb.impression_id = ta.impression_id AND tb.ds = ta.ds
)
SELECT version_a, version_b,
       CASE WHEN grouping(surface) = 1 THEN 'all' ELSE surface END AS surface,
       logit,
       count(*) AS impressions,
       avg(a) AS mean_a, avg(b) AS mean_b,
       stddev(a) AS stddev_a, stddev(b) AS stddev_b,
       quantile_disc(a, 0.05) AS p05_a, quantile_disc(a, 0.5) AS p50_a, quantile_disc(a, 0.95) AS p95_a,
       quantile_disc(b, 0.05) AS p05_b, quantile_disc(b, 0.5) AS p50_b, quantile_disc(b, 0.95) AS p95_b,
       avg(b - a) AS mean_diff,
       avg(abs(b - a)) AS mean_abs_diff,
       -- corr(a, b), written out so that a constant version gives NULL (corr would give NaN)
       covar_pop(a, b) / nullif(stddev_pop(a) * stddev_pop(b), 0) AS correlation
FROM logits
GROUP BY GROUPING SETS ((version_a, version_b, logit, surface), (version_a, version_b, logit))
ORDER BY grouping(surface) DESC, surface, logit
