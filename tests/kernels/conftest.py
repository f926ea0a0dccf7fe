"""Kernel tests: the device they run on (GEM_KERNEL_DEVICE=cpu|cuda, default cpu) and Triton's CPU interpreter."""

import os

import pytest
import torch

# Set before any test imports kernels.triton.*: triton decides at decoration time whether a kernel is
# compiled or interpreted. On CPU the Triton kernels run in the interpreter; GEM_KERNEL_DEVICE=cuda
# (bench/perf/gpu_check.sh) runs them compiled.
os.environ.setdefault("TRITON_INTERPRET", "0" if os.environ.get("GEM_KERNEL_DEVICE") == "cuda" else "1")


@pytest.fixture(scope="session")
def device() -> torch.device:
    name = os.environ.get("GEM_KERNEL_DEVICE", "cpu")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"GEM_KERNEL_DEVICE={name!r} is not 'cpu' or 'cuda'")
    if name == "cuda" and not torch.cuda.is_available():
        pytest.skip("GEM_KERNEL_DEVICE=cuda but CUDA is not available")
    return torch.device(name)
