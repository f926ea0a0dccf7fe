-- Teacher calibration per model version, day and surface: mean predicted CTR vs observed CTR.
-- ctr_logit is logit P(click | impression); a ratio near 1.0 means calibrated.
SELECT t.model_version, t.ds, t.surface,
       count(*) AS impressions,
       avg(1 / (1 + exp(-t.ctr_logit))) AS predicted_ctr,
       avg(cast(i.clicked AS int)) AS observed_ctr,
       avg(1 / (1 + exp(-t.ctr_logit))) / nullif(avg(cast(i.clicked AS int)), 0) AS calibration
FROM gold.teacher_logits t
JOIN bronze.impressions i ON i.impression_id = t.impression_id AND i.ds = t.ds
GROUP BY t.model_version, t.ds, t.surface
ORDER BY t.model_version, t.ds, t.surface
