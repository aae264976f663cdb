"""longsparse: sparse long-context LLM inference on one GPU.

Two methods, each usable as a drop-in op or through a loaded model:

* SparseGDN (``longsparse.ops.gdn``): event-sparse prefill for Gated DeltaNet layers.
* SparDA (``longsparse.ops.sparse_attn``): block-sparse attention whose next-layer blocks are
  forecast one layer early, so the KV cache can live in pinned host memory.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("longsparse")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+source"

__all__ = ["LLM", "__version__"]


def __getattr__(name: str):
    # `LLM` pulls in torch and the models; importing it lazily keeps `import longsparse` light
    if name == "LLM":
        from .engine.api import LLM

        return LLM
    raise AttributeError(f"module 'longsparse' has no attribute {name!r}")
