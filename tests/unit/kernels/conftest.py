"""Kernel tests: the device they run on (GEM_KERNEL_DEVICE=cpu|cuda, default cpu, read by tests/conftest.py)
and Triton's CPU interpreter."""

import pytest
import torch

from tests.conftest import KERNEL_DEVICE


@pytest.fixture(autouse=True)
def triton_interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    """TRITON_INTERPRET=1 on CPU for the kernel tests alone, not the pytest process, whose torchrun workers would
    inherit it: the kernels' entry points check it at every call. Triton itself was imported under it by
    tests/conftest.py; with GEM_KERNEL_DEVICE=cuda the kernels run compiled."""
    monkeypatch.setenv("TRITON_INTERPRET", "0" if KERNEL_DEVICE == "cuda" else "1")


@pytest.fixture(scope="session")
def device() -> torch.device:
    if KERNEL_DEVICE not in ("cpu", "cuda"):
        raise ValueError(f"GEM_KERNEL_DEVICE={KERNEL_DEVICE!r} is not 'cpu' or 'cuda'")
    if KERNEL_DEVICE == "cuda" and not torch.cuda.is_available():
        pytest.skip("GEM_KERNEL_DEVICE=cuda but CUDA is not available")
    return torch.device(KERNEL_DEVICE)
