"""Kernel tests: the device they run on (GEM_KERNEL_DEVICE=cpu|cuda, default cpu) and Triton's CPU interpreter."""

import os

import pytest
import torch


@pytest.fixture(autouse=True)
def triton_interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    """TRITON_INTERPRET for the kernel tests alone, not the pytest process, whose torchrun workers would inherit
    it. On CPU the Triton kernels run in the interpreter; GEM_KERNEL_DEVICE=cuda (bench/perf/gpu_check.sh) runs them
    compiled. triton reads it when it decorates the kernels, at the first import of `kernels.triton.*`, which the
    entry points defer to their first triton call (inside a test); the entry points check it at every call."""
    default = "0" if os.environ.get("GEM_KERNEL_DEVICE") == "cuda" else "1"
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", default))


@pytest.fixture(scope="session")
def device() -> torch.device:
    name = os.environ.get("GEM_KERNEL_DEVICE", "cpu")
    if name not in ("cpu", "cuda"):
        raise ValueError(f"GEM_KERNEL_DEVICE={name!r} is not 'cpu' or 'cuda'")
    if name == "cuda" and not torch.cuda.is_available():
        pytest.skip("GEM_KERNEL_DEVICE=cuda but CUDA is not available")
    return torch.device(name)
