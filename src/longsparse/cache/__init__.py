"""Decode-time state below the models: the attention layers' KV cache contract and its stores, the GDN layers'
states, the block-sparse layers' compressed keys, their byte accounting, and the capacity model of every decode mode.
Everything here takes plain tensors (a step's slots, positions and lengths: :class:`CacheStep`), never a model.

* :mod:`.step` — :class:`CacheStep`, where a step's tokens go; :mod:`.kv_cache` — the :class:`KVCache` contract, its
  step lifecycle and the GPU-resident :class:`ContiguousKVCache`; :mod:`.compressed_keys`, :mod:`.gdn_states`;
* the offloaded KV cache of the block-sparse attention modes (``offload="cpu"``): blocks in pinned host memory behind
  a GPU block-slot cache, with SparDA's forecast-driven prefetch (see ``docs/offload.md``) — :mod:`.layout` (rows,
  placement and bytes), :mod:`.host_store` (the reusable pinned host buffer), :mod:`.streams` (compute / transfer
  queues and events), :mod:`.block_cache` (the cache and its transfer protocol);
* :mod:`.capacity` — per-sequence footprints of each decode mode and the largest batch that fits.
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
from .compressed_keys import CompressedKeys
from .gdn_states import GDNStates
from .host_store import HostBuffer
from .kv_cache import CacheBytes, ContiguousKVCache, KVCache
from .layout import BlockLayout
from .step import CacheStep
from .streams import CudaStreams, InlineStreams, Streams, streams_for

__all__ = [
    "DECODE_MODES",
    "BlockKVCache",
    "BlockLayout",
    "CacheBytes",
    "CacheStep",
    "CapacityError",
    "CompressedKeys",
    "ContiguousKVCache",
    "CudaStreams",
    "DecodeMode",
    "GDNStates",
    "HostBuffer",
    "InlineStreams",
    "KVCache",
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
