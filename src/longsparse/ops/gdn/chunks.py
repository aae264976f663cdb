"""The chunk table shared by the SparseGDN kernels: every sequence cut into 64-token chunks, packed in order."""

from __future__ import annotations

from dataclasses import dataclass

import torch

CHUNK = 64


@dataclass(frozen=True)
class ChunkTable:
    """Chunks of ``N`` sequences packed along one token axis (batch rows are laid end to end).

    ``bos [NC]`` first token of each chunk in the packed axis; ``length [NC]`` valid tokens (64 except a sequence's
    last chunk); ``pos [NC]`` index of the chunk within its sequence; ``seq [NC]`` its sequence;
    ``seq_offsets [N + 1]`` first chunk of each sequence (host list and device tensor). All int32 on ``device``.
    """

    bos: torch.Tensor
    length: torch.Tensor
    pos: torch.Tensor
    seq: torch.Tensor
    seq_offsets: torch.Tensor
    seq_offsets_host: tuple[int, ...]
    seq_lengths_host: tuple[int, ...]

    @property
    def num_chunks(self) -> int:
        return self.seq_offsets_host[-1]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lengths_host)

    @property
    def max_chunks(self) -> int:
        return max((b - a for a, b in zip(self.seq_offsets_host, self.seq_offsets_host[1:])), default=0)

    @classmethod
    def from_lengths(cls, lengths: list[int], device: torch.device | str) -> ChunkTable:
        """Build the table for sequences of ``lengths`` tokens, laid end to end (a sequence of 0 tokens has no chunk)."""
        bos, length, pos, seq, offsets = [], [], [], [], [0]
        start = 0
        for n, T in enumerate(lengths):
            C = -(-T // CHUNK)
            for c in range(C):
                bos.append(start + c * CHUNK)
                length.append(min(CHUNK, T - c * CHUNK))
                pos.append(c)
                seq.append(n)
            offsets.append(offsets[-1] + C)
            start += T

        def t(x):
            return torch.tensor(x, dtype=torch.int32, device=device)

        return cls(t(bos), t(length), t(pos), t(seq), t(offsets), tuple(offsets), tuple(int(x) for x in lengths))
