"""The offloaded KV cache of the block-sparse attention modes (``offload="cpu"``): blocks in pinned host memory behind
a GPU block-slot cache, with SparDA's forecast-driven prefetch (see ``docs/offload.md``), and the capacity model of
every decode mode.

* :mod:`.layout` — rows, placement and bytes; :mod:`.host_store` — the reusable (pinned) host buffer;
  :mod:`.streams` — compute / transfer queues and events; :mod:`.block_cache` — the cache and its transfer protocol;
  :mod:`.capacity` — per-sequence footprints of each decode mode and the largest batch that fits.
"""

from .block_cache import BlockKVCache
from .capacity import (
    DECODE_MODES,
    CapacityError,
    DecodeMode,
    ModeFootprint,
    block_layout,
    check_fits,
    decode_mode,
    footprint,
    max_batch,
    offloaded_layers,
)
from .host_store import HostBuffer
from .layout import BlockLayout
from .streams import CudaStreams, InlineStreams, Streams, streams_for

__all__ = [
    "DECODE_MODES",
    "BlockKVCache",
    "BlockLayout",
    "CapacityError",
    "CudaStreams",
    "DecodeMode",
    "HostBuffer",
    "InlineStreams",
    "ModeFootprint",
    "Streams",
    "block_layout",
    "check_fits",
    "decode_mode",
    "footprint",
    "max_batch",
    "offloaded_layers",
    "streams_for",
]
