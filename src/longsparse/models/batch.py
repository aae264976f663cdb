"""What one forward step needs besides the weights: token layout, positions and where the caches are.

Tokens of all sequences in a step are packed along one axis (``[T]``, FLA's varlen convention): a prefill step holds
each sequence's new tokens back to back, delimited by ``cu_seqlens``; a decode step holds one token per sequence.
The engine builds a :class:`ForwardBatch` once per step; every layer reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ..engine.cache import GDNStates, KVCache

AttentionObserver = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None]
"""``observer(layer, x [T, hidden], q [T, H, D], k [T, Hkv, D])``: what an attention layer saw and computed (see
:attr:`ForwardBatch.attention_observer`)."""


@dataclass
class ForwardBatch:
    """One step over ``N`` sequences.

    Attributes:
        is_decode: one new token per sequence (``T == N``) instead of a prefill of ``q_lens`` tokens each.
        positions: ``[T]`` int64 absolute position of every token.
        cu_seqlens: ``[N + 1]`` int64 offsets of each sequence's tokens in the packed axis (host list in ``offsets``).
        prefix_lens: tokens of each sequence already in the caches before this step.
        slots: the cache slot of each sequence; ``slot_index`` is the same as an int64 tensor, ``token_slots`` ``[T]``
            the slot of every token.
        kv_cache, gdn_states: where attention layers keep keys/values and GDN layers their conv and recurrent
            states; ``None`` for a stateless prefill (nothing kept, ``prefix_lens`` all 0).
        decode_mask: decode only, ``[N, 1, 1, L]`` bool, ``True`` where key position < the sequence's new length
            (``L`` = the longest).
        gdn_keep_ratios: filled during the step by sparse GDN layers (fraction of recurrence events kept).
        scratch: per-step values one layer leaves for a later one (e.g. SparDA's forecast of the next layer's blocks).
        attention_observer: the hook point for reading a model's attention inputs without changing its forward (Forecast
            training, selection-recall diagnostics): every attention layer calls it once per step, before attending,
            with its layer index, its input ``x`` (after the layer's input norm: what ``q_proj`` reads), and its
            ``q``, ``k`` after q/k norm and RoPE — exactly what the attention backend receives. It must not modify
            them.
    """

    is_decode: bool
    positions: torch.Tensor
    cu_seqlens: torch.Tensor
    offsets: list[int]
    prefix_lens: list[int]
    slots: list[int]
    slot_index: torch.Tensor
    token_slots: torch.Tensor
    kv_cache: KVCache | None = None
    gdn_states: GDNStates | None = None
    decode_mask: torch.Tensor | None = None
    gdn_keep_ratios: list[float] = field(default_factory=list)
    scratch: dict[str, Any] = field(default_factory=dict)
    attention_observer: AttentionObserver | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.slots)

    @property
    def context_lens(self) -> list[int]:
        """Length of each sequence after this step (cached prefix + new tokens)."""
        return [p + (e - s) for p, s, e in zip(self.prefix_lens, self.offsets, self.offsets[1:])]

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
    ) -> ForwardBatch:
        """Prefill of ``q_lens[n]`` new tokens per sequence, after ``prefix_lens[n]`` cached ones (default 0)."""
        n = len(q_lens)
        if n == 0 or any(q <= 0 for q in q_lens):
            raise ValueError(f"a prefill needs at least one sequence and one token per sequence, got q_lens={q_lens}")
        prefix_lens = list(prefix_lens) if prefix_lens is not None else [0] * n
        slots = list(slots) if slots is not None else list(range(n))
        if len(prefix_lens) != n or len(slots) != n:
            raise ValueError(
                f"q_lens, prefix_lens and slots must have one entry per sequence, got {n}, "
                f"{len(prefix_lens)}, {len(slots)}"
            )
        if (kv_cache is None and gdn_states is None) and any(prefix_lens):
            raise ValueError("a prefill after cached tokens (prefix_lens > 0) needs the caches")
        offsets = [0]
        for q in q_lens:
            offsets.append(offsets[-1] + q)
        positions = torch.cat([torch.arange(p, p + q) for p, q in zip(prefix_lens, q_lens)])
        token_slots = torch.repeat_interleave(torch.tensor(slots), torch.tensor(q_lens))
        return cls(
            is_decode=False,
            positions=positions.to(device),
            cu_seqlens=torch.tensor(offsets, device=device),
            offsets=offsets,
            prefix_lens=prefix_lens,
            slots=slots,
            slot_index=torch.tensor(slots, device=device),
            token_slots=token_slots.to(device),
            kv_cache=kv_cache,
            gdn_states=gdn_states,
        )

    @classmethod
    def decode(
        cls,
        prefix_lens: list[int],
        device: torch.device | str,
        *,
        slots: list[int],
        kv_cache: KVCache | None,
        gdn_states: GDNStates | None,
    ) -> ForwardBatch:
        """One new token for each sequence, which already has ``prefix_lens[n]`` tokens cached."""
        n = len(prefix_lens)
        if n == 0 or len(slots) != n:
            raise ValueError(f"a decode step needs one slot per sequence, got {n} lengths and {len(slots)} slots")
        if any(p <= 0 for p in prefix_lens):
            raise ValueError(f"a decode step continues cached sequences, got prefix_lens={prefix_lens}")
        lengths = torch.tensor(prefix_lens) + 1
        mask = torch.arange(int(lengths.max()))[None, :] < lengths[:, None]
        slot_index = torch.tensor(slots, device=device)
        return cls(
            is_decode=True,
            positions=torch.tensor(prefix_lens, device=device),
            cu_seqlens=torch.arange(n + 1, device=device),
            offsets=list(range(n + 1)),
            prefix_lens=list(prefix_lens),
            slots=list(slots),
            slot_index=slot_index,
            token_slots=slot_index,
            kv_cache=kv_cache,
            gdn_states=gdn_states,
            decode_mask=mask[:, None, None, :].to(device),
        )
