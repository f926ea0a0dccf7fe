"""PyTorch references of the kernels: float32, per-row loops, obviously correct rather than fast."""
