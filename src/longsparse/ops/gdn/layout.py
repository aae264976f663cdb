"""Packing of the sequences of one call (batch rows or ``cu_seqlens`` spans) into one list of 64-token chunks, and
the 16-token blocks of a chunk that the block-adjacent solve keeps: the layout the specification (``spec/``) and the
GPU path (``launch.py``, ``kernels/``) share.

Every stage of the specification works on packed tensors ``[HV, NC, 64, D]``: NC is the total number of chunks
of all sequences, and each sequence is zero-padded to a multiple of 64 on its own (k = v = β = g = 0 in the padding,
so the chunk's total log decay G_last of a partial chunk is the sum over its valid tokens and padded rows of U are 0).
A sequence of T_n tokens owns ``C_n = ceil(T_n / 64)`` chunks (0 for an empty sequence); its chunks are contiguous and
in time order.

Per-sequence views use a grid ``[..., N, Cmax]`` (Cmax = the largest C_n) with a fill value past each sequence's end.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import CHUNK

BLOCK = 16
NBLOCKS = CHUNK // BLOCK
BLOCK_PAIRS = ((0, 0), (1, 1), (2, 2), (3, 3), (1, 0), (2, 1), (3, 2))
"""The 16×16 blocks (row block, column block) of a chunk's coefficients that the block-adjacent solve keeps, in the
order they are stored: the four diagonal blocks, then the three sub-diagonal ones (``spec.intra``; Eq. 7 of
SparseGDN, Zhuang et al., arXiv:2610.41420)."""


@dataclass(frozen=True)
class ChunkLayout:
    """Where every packed chunk comes from, and how to go back.

    Attributes (int64 tensors on the inputs' device):
        B, T: the input's batch and length; N sequences; NC packed chunks; Cmax the longest sequence in chunks.
        seq_lengths: ``[N]`` tokens of each sequence.
        seq_chunk_offsets: ``[N + 1]`` first packed chunk of each sequence (``C_n`` = consecutive differences).
        chunk_seq: ``[NC]`` the sequence of each packed chunk.
        chunk_pos: ``[NC]`` its index within its sequence (0 = first chunk).
        chunk_len: ``[NC]`` its valid tokens (64 except a sequence's partial last chunk).
        token_index: ``[NC, 64]`` row of the flattened input ``[B * T]`` feeding each chunk position, -1 in padding.
        grid_chunk: ``[N, Cmax]`` packed chunk id of (sequence, position), -1 past the sequence's end.
    """

    B: int
    T: int
    N: int
    NC: int
    Cmax: int
    seq_lengths: torch.Tensor
    seq_chunk_offsets: torch.Tensor
    chunk_seq: torch.Tensor
    chunk_pos: torch.Tensor
    chunk_len: torch.Tensor
    token_index: torch.Tensor
    grid_chunk: torch.Tensor

    @property
    def chunks_per_seq(self) -> torch.Tensor:
        """``[N]`` C_n, the chunks of each sequence."""
        return self.seq_chunk_offsets[1:] - self.seq_chunk_offsets[:-1]

    @property
    def grid_valid(self) -> torch.Tensor:
        """``[N, Cmax]`` bool, True where the sequence has that chunk."""
        return self.grid_chunk >= 0

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, T, HV, *D] -> [HV, NC, 64, *D]``, zeros in the padding."""
        flat = x.reshape(self.B * self.T, *x.shape[2:])
        valid = self.token_index >= 0
        packed = flat[self.token_index.clamp(min=0)]  # [NC, 64, HV, *D]
        packed = packed * valid.view(*valid.shape, *([1] * (packed.dim() - 2))).to(packed.dtype)
        return packed.movedim(2, 0)

    def unpack(self, y: torch.Tensor) -> torch.Tensor:
        """``[HV, NC, 64, *D] -> [B, T, HV, *D]``, dropping the padding (every token is written exactly once)."""
        y = y.movedim(0, 2)  # [NC, 64, HV, *D]
        out = y.new_empty(self.B * self.T, *y.shape[2:])
        valid = self.token_index >= 0
        out[self.token_index[valid]] = y[valid]
        return out.view(self.B, self.T, *y.shape[2:])

    def to_grid(self, x: torch.Tensor, fill: float | bool = 0) -> torch.Tensor:
        """``[..., NC] -> [..., N, Cmax]``, ``fill`` past each sequence's end."""
        out = x[..., self.grid_chunk.clamp(min=0)]
        return torch.where(self.grid_valid, out, torch.full_like(out, fill))

    def from_grid(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., N, Cmax] -> [..., NC]``: the entries of the chunks that exist."""
        return x[..., self.chunk_seq, self.chunk_pos]


def build_layout(B: int, T: int, cu_seqlens: torch.Tensor | None, device: torch.device) -> ChunkLayout:
    """The layout of batch rows (``cu_seqlens`` None: N = B sequences of T tokens) or of the packed spans of
    ``cu_seqlens`` (B == 1)."""
    if cu_seqlens is None:
        starts = torch.arange(B, dtype=torch.int64) * T
        lengths = torch.full((B,), T, dtype=torch.int64)
    else:
        offsets = cu_seqlens.detach().to("cpu", torch.int64)
        starts, lengths = offsets[:-1], offsets[1:] - offsets[:-1]
    N = lengths.numel()
    chunks = (lengths + CHUNK - 1) // CHUNK
    seq_chunk_offsets = torch.zeros(N + 1, dtype=torch.int64)
    seq_chunk_offsets[1:] = chunks.cumsum(0)
    NC = int(seq_chunk_offsets[-1])
    Cmax = int(chunks.max()) if N else 0
    chunk_seq = torch.repeat_interleave(torch.arange(N), chunks)
    chunk_pos = torch.arange(NC) - seq_chunk_offsets[chunk_seq]
    chunk_len = (lengths[chunk_seq] - CHUNK * chunk_pos).clamp(max=CHUNK)
    offset_in_chunk = torch.arange(CHUNK)
    token_index = starts[chunk_seq, None] + CHUNK * chunk_pos[:, None] + offset_in_chunk
    token_index = torch.where(offset_in_chunk < chunk_len[:, None], token_index, -1)
    position = torch.arange(Cmax)
    grid_chunk = torch.where(position < chunks[:, None], seq_chunk_offsets[:-1, None] + position, -1)
    to = lambda x: x.to(device)  # noqa: E731
    return ChunkLayout(
        B=B,
        T=T,
        N=N,
        NC=NC,
        Cmax=Cmax,
        seq_lengths=to(lengths),
        seq_chunk_offsets=to(seq_chunk_offsets),
        chunk_seq=to(chunk_seq),
        chunk_pos=to(chunk_pos),
        chunk_len=to(chunk_len),
        token_index=to(token_index),
        grid_chunk=to(grid_chunk),
    )
