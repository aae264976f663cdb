"""Where one step's tokens go in the caches: which slot each sequence occupies, how many tokens it had cached, and the
slot and position of every token.

Tokens of all sequences in a step are packed along one axis (``[T]``, FLA's varlen convention): a prefill step holds
each sequence's new tokens back to back, delimited by ``cu_seqlens``; a decode step holds one token per sequence.
The caches read a step only through :class:`CacheStep`'s plain tensors and lists; the models' per-step batch
(:class:`~longsparse.models.batch.ForwardBatch`) is one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class CacheStep:
    """One step over ``N`` sequences.

    Attributes:
        is_decode: one new token per sequence (``T == N``) instead of a prefill of ``q_lens`` tokens each.
        positions: ``[T]`` int64 absolute position of every token.
        cu_seqlens: ``[N + 1]`` int64 offsets of each sequence's tokens in the packed axis (host list in ``offsets``).
        prefix_lens: tokens of each sequence already in the caches before this step.
        slots: the cache slot of each sequence; ``slot_index`` is the same as an int64 tensor, ``token_slots`` ``[T]``
            the slot of every token.
        seqlens: decode only, ``[N]`` int32 length of each sequence after the step (``positions + 1``).
    """

    is_decode: bool
    positions: torch.Tensor
    cu_seqlens: torch.Tensor
    offsets: list[int]
    prefix_lens: list[int]
    slots: list[int]
    slot_index: torch.Tensor
    token_slots: torch.Tensor
    seqlens: torch.Tensor | None = None

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
        **fields,
    ):
        """Prefill of ``q_lens[n]`` new tokens per sequence, after ``prefix_lens[n]`` cached ones (default 0), in
        ``slots`` (default ``0 .. N − 1``); ``fields``: a subclass's own."""
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
            **fields,
        )

    @classmethod
    def decode(cls, prefix_lens: list[int], device: torch.device | str, *, slots: list[int], **fields):
        """One new token for each sequence, which already has ``prefix_lens[n]`` tokens cached in slot ``slots[n]``;
        ``fields``: a subclass's own."""
        n = len(prefix_lens)
        if n == 0 or len(slots) != n:
            raise ValueError(f"a decode step needs one slot per sequence, got {n} lengths and {len(slots)} slots")
        if any(p <= 0 for p in prefix_lens):
            raise ValueError(f"a decode step continues cached sequences, got prefix_lens={prefix_lens}")
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
            seqlens=(torch.tensor(prefix_lens) + 1).to(device=device, dtype=torch.int32),
            **fields,
        )
