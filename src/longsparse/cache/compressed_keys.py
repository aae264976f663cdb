"""The block-sparse attention layers' compressed keys, kept on the GPU whichever cache holds the keys and values
they summarise (SparDA keeps them there)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..ops.sparse_attn import SparseAttentionConfig, decode_topk_counters, fill_compress_ring
from .kv_cache import CacheBytes


class CompressedKeys:
    """Compressed keys of the block-sparse attention layers, per slot, in the model's dtype on its device (zeros
    before a prefill writes them):

    * ``k_cmp[layer] [slots, Ncap, Hkv, D]`` — ``K̃_j`` = mean of keys ``j·s … j·s + l − 1`` (``l, s`` the config's
      ``kernel_size``, ``kernel_stride``), the full windows of the sequence so far; ``Ncap`` = the windows of
      ``capacity`` tokens;
    * ``ring[layer] [slots, l, Hkv, D]`` — the last ``l`` keys (position ``p`` at ``p % l``), from which a decode step
      completes the next window (:func:`~longsparse.ops.sparse_attn.compress_decode_step`).

    A prefill writes both (:meth:`write_prefill`); each decode step appends in place. ``topk_counters [slots ·
    Hkv]`` (int32, zero) serve every decode selection of every layer as the row counters of a top-k fused into the
    scoring kernel (:func:`~longsparse.ops.sparse_attn.decode_topk_counters`; each selection leaves them zero).
    """

    def __init__(
        self,
        layers: Iterable[int],
        num_slots: int,
        capacity: int,
        num_kv_heads: int,
        head_dim: int,
        config: SparseAttentionConfig,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        if num_slots <= 0 or capacity <= 0:
            raise ValueError(f"num_slots and capacity must be positive, got {num_slots} and {capacity}")
        self.config = config
        self.capacity = max(1, config.num_compressed(capacity))
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        ring = (num_slots, config.kernel_size, num_kv_heads, head_dim)
        cmp = (num_slots, self.capacity, num_kv_heads, head_dim)
        self.k_cmp = {i: torch.zeros(cmp, dtype=dtype, device=device) for i in layers}
        self.ring = {i: torch.zeros(ring, dtype=dtype, device=device) for i in self.k_cmp}
        self.topk_counters = decode_topk_counters(num_slots, num_kv_heads, device)

    @staticmethod
    def slot_bytes(
        config: SparseAttentionConfig, capacity: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """Bytes one slot of one layer takes for sequences of up to ``capacity`` tokens (the capacity model's
        figure for what this class allocates)."""
        return (max(1, config.num_compressed(capacity)) + config.kernel_size) * num_kv_heads * head_dim * dtype.itemsize

    def write_prefill(self, layer: int, slot: int, k_cmp: torch.Tensor, keys: torch.Tensor) -> None:
        """Slot ``slot`` of ``layer`` now holds a sequence whose keys are ``keys [L, Hkv, D]`` and compressed keys
        ``k_cmp [N, Hkv, D]`` (``N = num_compressed(L)``)."""
        n = k_cmp.shape[0]
        if n > self.capacity:
            raise ValueError(f"{n} compressed keys do not fit the cache's {self.capacity} (capacity too small)")
        self.k_cmp[layer][slot, :n] = k_cmp
        lengths = torch.tensor([keys.shape[0]], device=keys.device)
        fill_compress_ring(keys[None], lengths, self.ring[layer][slot : slot + 1])

    def nbytes(self) -> CacheBytes:
        return CacheBytes.of([*self.k_cmp.values(), *self.ring.values()])
