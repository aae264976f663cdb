"""SparseGDN as an executable specification in PyTorch, one module per stage; the Triton kernels match it stage by
stage. See docs/sparsegdn.md for the equation → function map and the array contracts.

Packing (``ops/gdn/layout.py``, shared with the GPU path) → ``intra`` (block-adjacent solve, tail score, deferred W)
→ ``select`` (tiers and mask) → ``events`` (CSR) → ``recur`` (event-sparse recurrence) → ``output`` (grouped /
per-chunk output); ``pipeline`` chains them.
"""

from .pipeline import SpecTrace, run_spec

__all__ = ["SpecTrace", "run_spec"]
