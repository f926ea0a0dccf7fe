"""Benchmarks of the kernels against the dense PyTorch code they replace; each script's docstring gives its command."""
