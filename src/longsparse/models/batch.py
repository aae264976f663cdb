"""What one forward step needs besides the weights: token layout, positions and where the caches are.

Tokens of all sequences in a step are packed along one axis (``[T]``, FLA's varlen convention; see
:class:`~longsparse.cache.step.CacheStep`, the part of the step the caches read). The engine builds a
:class:`ForwardBatch` once per step; every layer reads it and no layer writes to it (what layers prepare, hand on and
report lives in the step's :class:`~longsparse.models.plan.StepPlan`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..cache import CacheStep, CompressedKeys, GDNStates, KVCache

AttentionObserver = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None]
"""``observer(layer, x [T, hidden], q [T, H, D], k [T, Hkv, D])``: what an attention layer saw and computed (see
:attr:`ForwardBatch.attention_observer`)."""


@dataclass
class ForwardBatch(CacheStep):
    """One step over ``N`` sequences: the :class:`~longsparse.cache.step.CacheStep` (positions, ``cu_seqlens`` and
    ``offsets``, ``prefix_lens``, ``slots`` / ``slot_index`` / ``token_slots``, decode ``seqlens``) and what the layers
    need besides.

    Attributes:
        kv_cache, gdn_states: where attention layers keep keys/values and GDN layers their conv and recurrent
            states; ``None`` for a stateless prefill (nothing kept, ``prefix_lens`` all 0).
        compressed_keys: the block-sparse attention layers' compressed keys (needed by their decode steps).
        decode_mask: decode only, ``[N, 1, 1, L]`` bool, ``True`` where key position < the sequence's new length
            (``L`` = the longest).
        max_seqlen: decode only, a host-side bound on ``seqlens`` that sizes the block selectors' launches (the
            longest sequence; a CUDA-graph stepper passes the cache capacity, so that every later replay fits).
        attention_observer: the hook point for reading a model's attention inputs without changing its forward (Forecast
            training, selection-recall diagnostics): every attention layer calls it once per step, before attending,
            with its layer index, its input ``x`` (after the layer's input norm: what ``q_proj`` reads), and its
            ``q``, ``k`` after q/k norm and RoPE — exactly what the attention backend receives. It must not modify
            them.
    """

    kv_cache: KVCache | None = None
    gdn_states: GDNStates | None = None
    compressed_keys: CompressedKeys | None = None
    decode_mask: torch.Tensor | None = None
    max_seqlen: int | None = None
    attention_observer: AttentionObserver | None = None

    @classmethod
    def prefill(
        cls,
        q_lens: list[int],
        device: torch.device | str,
        *,
        prefix_lens: list[int] | None = None,
        slots: list[int] | None = None,
        kv_cache: KVCache | None = None,
        gdn_states: GDNStates | None = None,
        compressed_keys: CompressedKeys | None = None,
    ) -> ForwardBatch:
        """Prefill of ``q_lens[n]`` new tokens per sequence, after ``prefix_lens[n]`` cached ones (default 0)."""
        batch = super().prefill(
            q_lens,
            device,
            prefix_lens=prefix_lens,
            slots=slots,
            kv_cache=kv_cache,
            gdn_states=gdn_states,
            compressed_keys=compressed_keys,
        )
        if (kv_cache is None and gdn_states is None) and any(batch.prefix_lens):
            raise ValueError("a prefill after cached tokens (prefix_lens > 0) needs the caches")
        return batch

    @classmethod
    def decode(
        cls,
        prefix_lens: list[int],
        device: torch.device | str,
        *,
        slots: list[int],
        kv_cache: KVCache | None,
        gdn_states: GDNStates | None,
        compressed_keys: CompressedKeys | None = None,
        max_seqlen: int | None = None,
    ) -> ForwardBatch:
        """One new token for each sequence, which already has ``prefix_lens[n]`` tokens cached (``max_seqlen``: see
        the class docstring; default the longest new length)."""
        batch = super().decode(
            prefix_lens, device, slots=slots, kv_cache=kv_cache, gdn_states=gdn_states, compressed_keys=compressed_keys
        )
        lengths = torch.tensor(batch.prefix_lens) + 1
        longest = int(lengths.max())
        if max_seqlen is not None and max_seqlen < longest:
            raise ValueError(f"max_seqlen ({max_seqlen}) is below the longest sequence of the step ({longest})")
        mask = torch.arange(longest)[None, :] < lengths[:, None]
        batch.decode_mask = mask[:, None, None, :].to(device)
        batch.max_seqlen = longest if max_seqlen is None else max_seqlen
        return batch
