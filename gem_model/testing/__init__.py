"""Test helpers shared by the test suite and benchmarks (never used by the pipeline)."""
