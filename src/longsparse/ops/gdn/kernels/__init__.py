"""Triton and Gluon kernels of SparseGDN's GPU path; their host launchers are the modules above."""
