"""Every benchmark script imports: a bench that no test runs must still not rot on a moved name."""

import importlib
import pkgutil

import pytest

import bench
import kernels.benchmarks

MODULES = [
    info.name
    for package in (bench, kernels.benchmarks)
    for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}.")
    if not info.ispkg
]


@pytest.mark.parametrize("name", MODULES)
def test_the_bench_module_imports(name):
    importlib.import_module(name)
