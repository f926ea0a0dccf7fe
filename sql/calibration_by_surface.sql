-- Calibration of the teacher's predictions against observed labels, per model version, day,
-- surface (and 'all' surfaces) and task.
--   ctr:   P(click | impression)              = sigmoid(ctr_logit), over every scored impression
--   cvr:   P(conversion | click)              = sigmoid(cvr_logit), over the clicked impressions
--   ctcvr: P(conversion | impression)         = sigmoid(ctr_logit) * sigmoid(cvr_logit), over every impression
-- calibration = predicted_rate / observed_rate: 1.0 is calibrated, > 1 over-predicts; NULL without positives.
-- Tables: gold.teacher_logits, bronze.impressions (the labels). Parameters: none (every version and day).
WITH scored AS (
  SELECT t.model_version, t.ds, t.surface,
         1 / (1 + exp(-t.ctr_logit)) AS p_click,
         1 / (1 + exp(-t.cvr_logit)) AS p_conversion_given_click,
         i.clicked, i.converted
  FROM gold.teacher_logits t
  JOIN bronze.impressions i ON i.impression_id = t.impression_id AND i.ds = t.ds
), tasks AS (
  SELECT model_version, ds, surface, 'ctr' AS task, p_click AS predicted, clicked AS label FROM scored
  UNION ALL
  SELECT model_version, ds, surface, 'cvr', p_conversion_given_click, converted FROM scored WHERE clicked
  UNION ALL
  SELECT model_version, ds, surface, 'ctcvr', p_click * p_conversion_given_click, converted FROM scored
)
SELECT model_version, ds,
       CASE WHEN grouping(surface) = 1 THEN 'all' ELSE surface END AS surface,
       task,
       count(*) AS examples,
       count_if(label) AS positives,
       avg(predicted) AS predicted_rate,
       avg(cast(label AS int)) AS observed_rate,
       avg(predicted) / nullif(avg(cast(label AS int)), 0) AS calibration
FROM tasks
GROUP BY GROUPING SETS ((model_version, ds, task, surface), (model_version, ds, task))
-- grouping() and not the surface alias: DuckDB would resolve `surface` in ORDER BY to the grouped column
ORDER BY model_version, ds, grouping(surface) DESC, surface, task
