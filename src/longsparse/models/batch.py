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
    from ..engine.cache import CompressedKeys, GDNStates, KVCache


@dataclass
class BlockFractions:
    """Attended share of the causal KV blocks, summed over rows (one row = a query token × KV head × block-sparse
    layer): ``total`` is the sum of each row's ``attended blocks / causal blocks`` (a device tensor, so that adding
    to it needs no host sync), ``rows`` the row count. A row that falls back to dense attention counts 1."""

    total: torch.Tensor | float = 0.0
    rows: int = 0

    def add(self, total: torch.Tensor | float, rows: int) -> None:
        self.total = self.total + total
        self.rows += rows

    def merge(self, other: BlockFractions) -> None:
        self.add(other.total, other.rows)

    def mean(self) -> float | None:
        """The mean fraction over the rows added so far (reads the device once), None if there were none."""
        return float(self.total) / self.rows if self.rows else None


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
        compressed_keys: the block-sparse attention layers' compressed keys (needed by their decode steps).
        decode_mask: decode only, ``[N, 1, 1, L]`` bool, ``True`` where key position < the sequence's new length
            (``L`` = the longest).
        seqlens: decode only, ``[N]`` int32 length of each sequence after the step (``positions + 1``).
        max_seqlen: decode only, a host-side bound on ``seqlens`` that sizes the block selectors' launches (the
            longest sequence; a CUDA-graph stepper passes the cache capacity, so that every later replay fits).
        gdn_keep_ratios: filled during the step by sparse GDN layers (fraction of recurrence events kept), as 0-dim
            device tensors so that no layer waits for the device; :meth:`keep_ratio_values` reads them once.
        block_fractions: filled during the step by block-sparse attention layers (share of KV blocks attended).
        scratch: per-step values one layer leaves for a later one (SparDA's forecast of the next attention layer).
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
    compressed_keys: CompressedKeys | None = None
    decode_mask: torch.Tensor | None = None
    seqlens: torch.Tensor | None = None
    max_seqlen: int | None = None
    gdn_keep_ratios: list[torch.Tensor | float] = field(default_factory=list)
    block_fractions: BlockFractions = field(default_factory=BlockFractions)
    scratch: dict[str, Any] = field(default_factory=dict)
    attention_observer: AttentionObserver | None = None

    def keep_ratio_values(self) -> list[float]:
        """:attr:`gdn_keep_ratios` as floats, read from the device at once."""
        tensors = [k.double() for k in self.gdn_keep_ratios if isinstance(k, torch.Tensor)]
        read = iter(torch.stack(tensors).tolist() if tensors else ())
        return [next(read) if isinstance(k, torch.Tensor) else float(k) for k in self.gdn_keep_ratios]

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
        compressed_keys: CompressedKeys | None = None,
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
            compressed_keys=compressed_keys,
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
        compressed_keys: CompressedKeys | None = None,
        max_seqlen: int | None = None,
    ) -> ForwardBatch:
        """One new token for each sequence, which already has ``prefix_lens[n]`` tokens cached (``max_seqlen``: see
        the class docstring; default the longest new length)."""
        n = len(prefix_lens)
        if n == 0 or len(slots) != n:
            raise ValueError(f"a decode step needs one slot per sequence, got {n} lengths and {len(slots)} slots")
        if any(p <= 0 for p in prefix_lens):
            raise ValueError(f"a decode step continues cached sequences, got prefix_lens={prefix_lens}")
        lengths = torch.tensor(prefix_lens) + 1
        longest = int(lengths.max())
        if max_seqlen is not None and max_seqlen < longest:
            raise ValueError(f"max_seqlen ({max_seqlen}) is below the longest sequence of the step ({longest})")
        mask = torch.arange(longest)[None, :] < lengths[:, None]
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
            compressed_keys=compressed_keys,
            decode_mask=mask[:, None, None, :].to(device),
            seqlens=lengths.to(device=device, dtype=torch.int32),
            max_seqlen=longest if max_seqlen is None else max_seqlen,
        )
