-- Observed label rates per day and surface (and 'all' surfaces) in the landed impressions: what the
-- teacher is trained and evaluated against, and what calibration compares with.
-- cvr_given_click = conversions / clicks, the label rate of the cvr task; NULL on a day without clicks.
-- Tables: bronze.impressions. Parameters: none.
SELECT ds,
       CASE WHEN grouping(surface) = 1 THEN 'all' ELSE surface END AS surface,
       count(*) AS impressions,
       count_if(clicked) AS clicks,
       count_if(converted) AS conversions,
       avg(cast(clicked AS int)) AS ctr,
       avg(cast(converted AS int)) AS conversions_per_impression,
       count_if(converted) / nullif(count_if(clicked), 0) AS cvr_given_click
FROM bronze.impressions
GROUP BY GROUPING SETS ((ds, surface), (ds))
ORDER BY ds, grouping(surface) DESC, surface
