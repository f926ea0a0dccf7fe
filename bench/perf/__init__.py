"""Speed and memory benchmarks: each prints its figures and the command that reproduces them."""
