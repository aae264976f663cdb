"""Triton kernels of the host <-> GPU block transfers."""
