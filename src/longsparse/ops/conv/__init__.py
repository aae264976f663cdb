"""The short causal convolution of GDN layers (depthwise, a few taps, SiLU) over packed variable-length sequences.

* :func:`causal_conv1d` — ``y[t, c] = silu(Σ_j w[c, j] · x[t − W + 1 + j, c])`` within each sequence, the taps before
  a sequence's first token read from its conv state (the last ``W − 1`` inputs of an earlier call, or zeros); also
  returns each sequence's new conv state. On a GPU a Triton kernel reads the ``[T, C]`` activations in place (no
  transposes, one pass); elsewhere the torch reference of ``naive.py`` runs.
"""

from .naive import causal_conv1d_ref
from .short_conv import causal_conv1d

__all__ = ["causal_conv1d", "causal_conv1d_ref"]
