"""Report assets: the SQL pack (`sql/*.sql`) run over the lake, with each query's result as metadata."""
