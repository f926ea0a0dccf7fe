"""Triton implementations of the kernels; import these modules lazily, from the dispatching entry points only."""
