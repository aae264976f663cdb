"""Triton kernels of the sparse-attention ops; imported only when a kernel runs (triton is optional)."""
