"""Intra-chunk stage: the local delta solve of every chunk (SparseGDN (Zhuang et al., arXiv:2610.41420) Sec. 2.3,
Eqs. 5–9, and Sec. 2.5, Eq. 15).

All tensors are packed (``ops/gdn/layout.py``): ``k [HV, NC, 64, K]`` (qk heads already expanded to the value heads),
``v [HV, NC, 64, V]``, ``beta, G [HV, NC, 64]`` with G the chunk-local inclusive cumulative natural-log decay. With
``M = I + A_Δ`` (:func:`naive.delta_system`), the exact solve is ``U = M⁻¹ diag(β) V``, ``W = M⁻¹ diag(β e^G) K``.

The block-adjacent solve splits the 64 positions into four 16-token blocks and keeps only the blocks
``BLOCK_PAIRS = (0,0), (1,1), (2,2), (3,3), (1,0), (2,1), (3,2)`` of C ≈ M⁻¹ (Eq. 7):
``C_ii = M_ii⁻¹`` and ``C_i,i-1 = −C_ii M_i,i-1 C_i-1,i-1``, which are exactly the corresponding blocks of M⁻¹;
the two-blocks-away and farther blocks are dropped. U uses ``C̃_ij = C_ij diag(β_j)`` right away (Eq. 8); W is
deferred: ``C̄_ij = C_ij diag(β_j e^{G_j})`` is kept and turned into W only for selected events (Eq. 15).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import CHUNK
from ..layout import BLOCK, BLOCK_PAIRS, NBLOCKS
from ..naive import delta_system


@dataclass(frozen=True)
class IntraResult:
    """What the intra stage hands to selection and the recurrence.

    Attributes:
        U: ``[HV, NC, 64, V]`` transformed values (C̃ V block-adjacent, or M⁻¹ diag(β) V exactly for ``"full"``).
        score: ``[HV, NC]`` tail score s = ‖U[64 − tail : 64, :]‖_F (Eq. 9), positions of the zero-padded chunk.
        cbar: the weighted coefficients W is built from — ``[HV, NC, 7, 16, 16]`` blocks C̄_ij in ``BLOCK_PAIRS``
            order (``"block_adjacent"``), or the full ``[HV, NC, 64, 64]`` matrix M⁻¹ diag(β e^G) (``"full"``).
        solve: ``"block_adjacent"`` or ``"full"``.
    """

    U: torch.Tensor
    score: torch.Tensor
    cbar: torch.Tensor
    solve: str

    def w(self, k: torch.Tensor, heads: torch.Tensor, chunks: torch.Tensor) -> torch.Tensor:
        """W ``[*heads.shape, 64, K]`` of the (value head, packed chunk) events ``heads`` and ``chunks``
        (broadcastable index tensors), computed only for those events."""
        if self.solve == "full":
            return self.cbar[heads, chunks] @ k[heads, chunks]
        return deferred_w(self.cbar, k, heads, chunks)


def adjacent_inverse_blocks(M: torch.Tensor) -> torch.Tensor:
    """``[..., 64, 64]`` unit lower-triangular M -> the kept blocks of C ≈ M⁻¹, ``[..., 7, 16, 16]`` in
    ``BLOCK_PAIRS`` order (Eq. 7). Exact for these blocks: block-triangular inversion makes C_ii = M_ii⁻¹ and
    C_i,i-1 = −C_ii M_i,i-1 C_i-1,i-1 hold for the true inverse too."""
    blocks = M.unflatten(-2, (NBLOCKS, BLOCK)).unflatten(-1, (NBLOCKS, BLOCK))  # [..., 4, 16, 4, 16]
    diag_M = torch.stack([blocks[..., i, :, i, :] for i in range(NBLOCKS)], dim=-3)  # [..., 4, 16, 16]
    sub_M = torch.stack([blocks[..., i, :, i - 1, :] for i in range(1, NBLOCKS)], dim=-3)  # [..., 3, 16, 16]
    eye = torch.eye(BLOCK, dtype=M.dtype, device=M.device).expand_as(diag_M)
    diag_C = torch.linalg.solve_triangular(diag_M, eye, upper=False, unitriangular=True)
    sub_C = -diag_C[..., 1:, :, :] @ sub_M @ diag_C[..., :-1, :, :]
    return torch.cat([diag_C, sub_C], dim=-3)


def weight_block_columns(blocks: torch.Tensor, col_weight: torch.Tensor) -> torch.Tensor:
    """``C_ij diag(w_j)``: blocks ``[..., 7, 16, 16]`` with each block's columns scaled by the 16 entries of
    ``col_weight [..., 64]`` that belong to its column block j."""
    w = col_weight.unflatten(-1, (NBLOCKS, BLOCK))  # [..., 4, 16]
    col_block = torch.tensor([j for _, j in BLOCK_PAIRS], device=blocks.device)
    return blocks * w[..., col_block, None, :]


def apply_blocks(blocks: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Block-bidiagonal product ``Y_i = B_ii X_i + B_i,i-1 X_i-1`` (``Y_0 = B_00 X_0``): blocks ``[..., 7, 16, 16]``,
    x ``[..., 64, D]`` -> ``[..., 64, D]``. The four row blocks are computed in one batched product each for the
    diagonal and sub-diagonal terms; a kernel does them one tile at a time (Eq. 8), with the same sums."""
    xb = x.unflatten(-2, (NBLOCKS, BLOCK))  # [..., 4, 16, D]
    y = blocks[..., :NBLOCKS, :, :] @ xb
    y[..., 1:, :, :] += blocks[..., NBLOCKS:, :, :] @ xb[..., :-1, :, :]
    return y.flatten(-3, -2)


def assemble_blocks(blocks: torch.Tensor) -> torch.Tensor:
    """The dense ``[..., 64, 64]`` matrix holding the 7 blocks ``[..., 7, 16, 16]`` and zeros elsewhere."""
    out = blocks.new_zeros(*blocks.shape[:-3], CHUNK, CHUNK)
    for b, (i, j) in enumerate(BLOCK_PAIRS):
        out[..., i * BLOCK : (i + 1) * BLOCK, j * BLOCK : (j + 1) * BLOCK] = blocks[..., b, :, :]
    return out


def tail_score(U: torch.Tensor, tail: int) -> torch.Tensor:
    """``s [HV, NC] = ‖U[..., 64 − tail : 64, :]‖_F`` (Eq. 9 with tail = 16)."""
    return U[..., CHUNK - tail :, :].pow(2).sum((-2, -1)).sqrt()


def _system(k: torch.Tensor, beta: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    return delta_system(k, beta, G) + torch.eye(CHUNK, dtype=k.dtype, device=k.device)


def block_adjacent_solve(
    k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, G: torch.Tensor, tail: int = 16
) -> IntraResult:
    """Block-adjacent solve of every chunk (Eqs. 5–9): U = C̃ V from the 7 kept blocks, the deferred-W blocks
    C̄ = C diag(β e^G), and the tail score. Shapes as in the module docstring."""
    C = adjacent_inverse_blocks(_system(k, beta, G))
    U = apply_blocks(weight_block_columns(C, beta), v)
    cbar = weight_block_columns(C, beta * G.exp())
    return IntraResult(U=U, score=tail_score(U, tail), cbar=cbar, solve="block_adjacent")


def full_solve(k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, G: torch.Tensor, tail: int = 16) -> IntraResult:
    """Exact solve (the "Full64" ablation): U = M⁻¹ diag(β) V and the full C̄ = M⁻¹ diag(β e^G) for W."""
    M = _system(k, beta, G)
    eye = torch.eye(CHUNK, dtype=k.dtype, device=k.device).expand_as(M)
    C = torch.linalg.solve_triangular(M, eye, upper=False, unitriangular=True)
    U = C @ (beta[..., None] * v)
    cbar = C * (beta * G.exp())[..., None, :]
    return IntraResult(U=U, score=tail_score(U, tail), cbar=cbar, solve="full")


def deferred_w(cbar: torch.Tensor, k: torch.Tensor, heads: torch.Tensor, chunks: torch.Tensor) -> torch.Tensor:
    """Deferred W of selected events only (Eq. 15): ``W_0 = C̄_00 K_0``, ``W_i = C̄_ii K_i + C̄_i,i-1 K_i-1``.

    Args:
        cbar: ``[HV, NC, 7, 16, 16]`` block-adjacent coefficients. k: ``[HV, NC, 64, K]``.
        heads, chunks: broadcastable integer index tensors of the events' value heads and packed chunks, e.g.
            ``[E, group]`` and ``[E, 1]``.

    Returns:
        ``W [*broadcast shape, 64, K]``.
    """
    return apply_blocks(cbar[heads, chunks], k[heads, chunks])
