-- Click and conversion rates per day and surface in the bronze impressions.
SELECT ds, surface, count(*) AS impressions,
       avg(cast(clicked AS int)) AS ctr,
       avg(cast(converted AS int)) AS conversions_per_impression,
       sum(cast(converted AS int)) / nullif(sum(cast(clicked AS int)), 0) AS cvr_given_click
FROM bronze.impressions
GROUP BY ds, surface
ORDER BY ds, surface
