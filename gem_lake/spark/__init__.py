"""The Spark side: one session factory (local, standalone or a cluster) and progress reporting."""
