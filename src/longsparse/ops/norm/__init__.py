"""RMS norms in one pass: Qwen3.5's zero-centred norm, Llama's, the GDN layers' gated norm (``w · x̂ · silu(z)``,
Qwen3.5's ``RMSNormGated``), and the GDN q/k L2 normalisation.

On a GPU a Triton kernel reads its inputs once and writes the result once, with the modules' own rounding steps;
elsewhere, or when autograd needs a backward, the torch references of ``naive.py`` run.
"""

from .naive import gated_rms_norm_ref, l2_norm_ref, rms_norm_ref
from .rms import gated_rms_norm, l2_norm, rms_norm

__all__ = ["gated_rms_norm", "gated_rms_norm_ref", "l2_norm", "l2_norm_ref", "rms_norm", "rms_norm_ref"]
