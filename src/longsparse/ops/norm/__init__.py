"""The GDN layers' gated RMS norm, ``w · x̂ · silu(z)`` per head (Qwen3.5's ``RMSNormGated``), as one pass.

* :func:`gated_rms_norm` — on a GPU a Triton kernel reads ``x`` and ``z`` once and writes the result once, with the
  module's rounding steps (``x̂`` and ``w · x̂`` rounded to the input dtype, the gate in float32); elsewhere, or when
  autograd needs a backward, the torch reference of ``naive.py``.
"""

from .gated import gated_rms_norm
from .naive import gated_rms_norm_ref

__all__ = ["gated_rms_norm", "gated_rms_norm_ref"]
