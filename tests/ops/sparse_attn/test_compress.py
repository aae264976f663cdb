"""Compressed-key kernels (Triton interpreter on CPU, float32) against the reference; the incremental decode
step equals a recomputation from scratch at every step."""

import pytest
import torch

from longsparse.ops.sparse_attn import compress_decode_step, compress_keys, fill_compress_ring
from longsparse.ops.sparse_attn.naive import compress_keys_ref
from tests.helpers import rel_err
from tests.ops.sparse_attn.helpers import randn

CASES = [(1, 7, 2, 16, 8, 4), (2, 63, 2, 32, 8, 4), (1, 130, 3, 24, 32, 16), (2, 300, 1, 16, 16, 4)]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}-T{c[1]}-H{c[2]}-D{c[3]}-c{c[4]}x{c[5]}")
def test_compress_kernel_matches_reference(case):
    B, T, H, D, ks, st = case
    k = randn(B, T, H, D, seed=T)
    got, cu = compress_keys(k, ks, st, use_kernel=True)
    want, _ = compress_keys_ref(k.double(), ks, st)
    assert cu is None and got.shape == want.shape and got.dtype == torch.float32
    if want.numel():
        assert rel_err(got, want) < 1e-6


def test_compress_kernel_varlen_and_strided_input():
    k = randn(1, 90, 4, 16, seed=1)[:, :, ::2]  # head stride 32, not contiguous over heads
    cu = torch.tensor([0, 30, 31, 90], dtype=torch.int32)
    got, cu_c = compress_keys(k, 8, 4, cu, use_kernel=True)
    want, cu_w = compress_keys_ref(k.double(), 8, 4, cu)
    assert cu_c.tolist() == cu_w.tolist() == [0, 6, 6, 19]
    assert rel_err(got, want) < 1e-6


def test_incremental_compression_equals_recompute_at_every_step():
    """Two sequences of different lengths, decoded 45 steps; after every step the kernel state is bit-identical to
    the prefill kernel run from scratch (windows of a prefix do not depend on what follows it)."""
    B, H, D, ks, st = 2, 2, 16, 8, 4
    k = randn(B, 100, H, D, seed=2)
    lengths = torch.tensor([5, 21], dtype=torch.int32)
    ring = torch.full((B, ks, H, D), float("nan"))
    k_cmp = torch.full((B, 30, H, D), float("nan"))
    for b in range(B):
        pre, _ = compress_keys(k[b : b + 1, : int(lengths[b])], ks, st, use_kernel=True)
        k_cmp[b, : pre.shape[1]] = pre[0]
    fill_compress_ring(k, lengths, ring)
    for _ in range(45):
        k_new = k[torch.arange(B), lengths.long()]
        compress_decode_step(k_new, ring, k_cmp, lengths, ks, st, use_kernel=True)
        lengths = lengths + 1
        full, _ = compress_keys(k[:, : int(lengths.max())], ks, st, use_kernel=True)
        for b in range(B):
            n = (int(lengths[b]) - ks) // st + 1 if lengths[b] >= ks else 0
            assert torch.equal(k_cmp[b, :n], full[b, :n])
            assert torch.isnan(k_cmp[b, n:]).all()  # nothing written ahead


def test_incremental_reference_path_matches_kernel():
    B, H, D = 1, 1, 8
    k = randn(B, 20, H, D, seed=3)
    states = []
    for use_kernel in (True, False):
        ring = torch.zeros(B, 8, H, D)
        k_cmp = torch.zeros(B, 10, H, D)
        for p in range(20):
            compress_decode_step(
                k[:, p], ring, k_cmp, torch.tensor([p], dtype=torch.int32), 8, 4, use_kernel=use_kernel
            )
        states.append(k_cmp)
    torch.testing.assert_close(states[0], states[1])


def test_bad_inputs_raise():
    k = randn(1, 20, 2, 8, seed=4)
    with pytest.raises(ValueError, match="k must be 4-D"):
        compress_keys(k[0])
    with pytest.raises(ValueError, match="multiple of kernel_stride"):
        compress_keys(k, 10, 4)
    with pytest.raises(ValueError, match="floating-point"):
        compress_keys(k.int())
    with pytest.raises(ValueError, match="cu_seqlens must run from 0"):
        compress_keys(k, 8, 4, torch.tensor([0, 7]), use_kernel=True)
    ring, k_cmp = torch.zeros(1, 8, 2, 8), torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match="ring must be"):
        compress_decode_step(k[:, 0], ring[:, :4], k_cmp, torch.tensor([3]), 8, 4)
    with pytest.raises(ValueError, match="cache_seqlens must be an integer"):
        compress_decode_step(k[:, 0], ring, k_cmp, torch.tensor([3.0]), 8, 4)
    with pytest.raises(ValueError, match="k_cmp must be"):
        compress_decode_step(k[:, 0], ring, k_cmp[:, :, :1], torch.tensor([3]), 8, 4)
