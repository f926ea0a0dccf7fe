"""SQL over the lake: DuckDB reading the Delta tables, bounded in time, memory and spill."""
