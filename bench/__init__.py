"""Benchmarks (`bench.perf`: speed and memory) and research experiments (`bench.research`: model quality).

Run from the repository root as modules, e.g. `python -m bench.perf.train_throughput`; `bench.common` holds
what they share. Results and the commands that reproduce them: docs/BENCHMARKS.md and docs/MODEL.md.
"""
