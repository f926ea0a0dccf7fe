"""Custom kernels of the GEM model (jagged flash attention, generalized dot-product attention).

Each kernel will be a triad: a PyTorch reference (`reference/pt_<op>.py`), a Triton
implementation (`triton/triton_<op>.py`) and one dispatching entry point (`<op>.py`); see
docs/ARCHITECTURE.md. Nothing here imports triton or touches CUDA at import time. The first
kernels arrive with the model issue; the foundation model uses TorchRec/fbgemm operators only.
"""
