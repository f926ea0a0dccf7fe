"""Custom kernels of the GEM model, each a triad as in generative-recommenders: a float32 PyTorch reference
(`reference/pt_<op>.py`), a Triton implementation (`triton/triton_<op>.py`, private `_<op>_fwd/_<op>_bwd`
kernels and an autograd.Function) and one entry point (`<op>.py`) that validates its inputs and dispatches on
`kernel=`; `benchmarks/<op>_bench.py` measures the entry point against the dense PyTorch code it replaces.
The first is `kernels.jagged_attention.jagged_attention`; the package re-exports nothing, so that
`kernels.jagged_attention` names the module. Nothing here imports triton or touches CUDA at import time: the Triton
modules are imported on first use, which also lets TRITON_INTERPRET=1 run them on CPU in tests.
"""
