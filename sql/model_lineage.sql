-- Model lineage: which data version trained which model. Each model manifest pins the Delta
-- version of its training table; meta.table_history says when that version was committed and by
-- which operation (operation_parameters holds e.g. the replaced partition's predicate).
--   newer_data_versions = commits to the training table since (0: trained on the current data);
--   data_committed_at is NULL when that commit has left the Delta log (log retention).
-- Tables: meta.models (the manifests), meta.table_history (the Delta log). Parameters: none.
WITH data AS (
  SELECT table_name, max(version) AS current_version FROM meta.table_history GROUP BY table_name
)
SELECT m.model_version, m.created_at, m.is_latest, m.preset, m.architecture, m.data_source,
       m.training_table, m.training_delta_version,
       h.committed_at AS data_committed_at, h.operation AS data_operation,
       h.operation_parameters AS data_operation_parameters,
       d.current_version - m.training_delta_version AS newer_data_versions,
       m.first_train_day, m.last_train_day, m.holdout_days, m.world_size,
       m.ctr_auc, m.ctr_ne, m.cvr_auc, m.cvr_ne
FROM meta.models m
LEFT JOIN meta.table_history h ON h.table_name = m.training_table AND h.version = m.training_delta_version
LEFT JOIN data d ON d.table_name = m.training_table
ORDER BY m.created_at DESC, m.model_version
