"""Small InfLLM-V2 geometries, seeded inputs, and a tie-aware check of a selection against reference scores."""

from __future__ import annotations

import torch

from longsparse.ops.sparse_attn import SparseAttentionConfig
from longsparse.ops.sparse_attn.naive import forced_blocks

# MiniCPM4's geometry scaled down by 4: block 16, window 2 blocks, compression 8/4 (pool kernel 5, stride 4, pad 1).
SMALL = SparseAttentionConfig(block_size=16, init_blocks=1, window=32, topk=4, kernel_size=8, kernel_stride=4,
                              dense_len=0)  # fmt: skip
# Compression windows as long as a block (pool overlap 3) and two init blocks.
WIDE = SparseAttentionConfig(block_size=16, init_blocks=2, window=16, topk=5, kernel_size=16, kernel_stride=4,
                             dense_len=0)  # fmt: skip


def cfg_id(cfg: SparseAttentionConfig) -> str:
    return f"blk{cfg.block_size}-w{cfg.window}-k{cfg.topk}-c{cfg.kernel_size}x{cfg.kernel_stride}-i{cfg.init_blocks}"


def randn(*shape, seed: int, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def randint_values(*shape, seed: int, dtype=torch.float32, high: int = 3) -> torch.Tensor:
    """Small integers: float32 products and sums are exact, and many scores tie."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-high, high + 1, shape, generator=gen).to(dtype)


def assert_valid_selection(idx, ref_idx, scores, positions, cfg, tol: float, max_mismatch: float = 0.02):
    """``idx`` equals ``ref_idx`` except in rows where a near-tie (within ``tol`` of the reference's k-th best
    score) may resolve either way; such rows must still be a correct selection under the reference scores.

    ``idx, ref_idx [B, Tq, Hkv, S]``; ``scores [B, Hkv, Tq, NB]`` reference block scores; ``positions [B, Tq]``.
    """
    assert idx.shape == ref_idx.shape and idx.dtype == torch.int32
    differ = (idx != ref_idx).any(-1)  # [B, Tq, Hkv]
    assert differ.float().mean().item() <= max_mismatch, f"{differ.float().mean().item():.3%} of rows differ"
    NB = scores.shape[-1]
    forced = forced_blocks(positions, NB, cfg)  # [B, Tq, NB]
    for b, t, h in differ.nonzero().tolist():
        got = idx[b, t, h]
        want = ref_idx[b, t, h]
        got_set = set(got[got >= 0].tolist())
        want_set = set(want[want >= 0].tolist())
        assert len(got_set) == len(want_set) == int((got >= 0).sum()), (b, t, h, got, want)
        assert torch.equal(got[: len(got_set)], torch.sort(got[: len(got_set)]).values)
        assert set(forced[b, t].nonzero().flatten().tolist()) <= got_set
        row = scores[b, h, t]
        kth = min(row[list(want_set - got_set)].min().item(), float("inf")) if want_set - got_set else None
        for blk in got_set - want_set:
            assert kth is not None and row[blk].item() >= kth - tol, (b, t, h, blk, row[blk].item(), kth)
