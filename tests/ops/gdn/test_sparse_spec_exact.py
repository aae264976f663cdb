"""SparseGDN spec, exact parts: solve="full" + selection="all" is the dense GDN, and the block-adjacent solve keeps
exactly the 7 blocks of M⁻¹ (float64)."""

import pytest
import torch

from longsparse.ops.gdn import SparseGDNConfig, naive_recurrent_gated_delta_rule, sparse_chunk_gated_delta_rule
from longsparse.ops.gdn.naive import delta_system, solve_intra
from longsparse.ops.gdn.spec.intra import (
    BLOCK,
    BLOCK_PAIRS,
    adjacent_inverse_blocks,
    assemble_blocks,
    block_adjacent_solve,
    deferred_w,
    full_solve,
)
from tests.helpers import rel_err
from tests.ops.gdn.helpers import make_gdn_inputs

EXACT_CASES = [
    # B, T, H, HV, K, V, initial state, cu_seqlens
    (1, 1, 1, 1, 8, 8, False, None),
    (1, 63, 2, 2, 16, 8, False, None),
    (2, 130, 2, 4, 16, 16, True, None),
    (1, 200, 1, 3, 8, 12, True, None),
    (1, 331, 3, 6, 8, 8, True, (0, 1, 64, 65, 200, 331)),
    (1, 150, 2, 8, 8, 8, False, (0, 0, 150)),
]


def exact_id(c):
    cu = f"-varlen{len(c[7]) - 1}" if c[7] else ""
    return f"B{c[0]}-T{c[1]}-H{c[2]}-HV{c[3]}-K{c[4]}-V{c[5]}" + ("-h0" if c[6] else "") + cu


@pytest.mark.parametrize("output", ["grouped", "per_chunk"])
@pytest.mark.parametrize("case", EXACT_CASES, ids=exact_id)
def test_full_solve_all_events_is_dense_gdn(case, output):
    B, T, H, HV, K, V, with_state, cu = case
    n_states = len(cu) - 1 if cu else B
    q, k, v, g, beta, h0 = make_gdn_inputs(B, T, H, HV, K, V, with_state=with_state, n_states=n_states)
    cu = None if cu is None else torch.tensor(cu)
    o_ref, s_ref = naive_recurrent_gated_delta_rule(
        q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu
    )
    cfg = SparseGDNConfig(solve="full", selection="all", output=output)
    o, s, stats = sparse_chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu, config=cfg, return_stats=True
    )
    assert o.dtype == s.dtype == torch.float64
    assert rel_err(o, o_ref) <= 1e-10
    assert rel_err(s, s_ref) <= 1e-10
    assert stats.keep_ratio == 1.0


def test_full_solve_all_events_with_qk_l2norm_and_custom_scale():
    q, k, v, g, beta, h0 = make_gdn_inputs(1, 100, 2, 4, 8, 8, with_state=True)
    k = 3.0 * k
    cfg = SparseGDNConfig(solve="full", selection="all")
    ref = naive_recurrent_gated_delta_rule(
        q, k, v, g, beta, scale=0.7, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    out = sparse_chunk_gated_delta_rule(q, k, v, g, beta, 0.7, h0, True, True, config=cfg)  # positional FLA arguments
    assert rel_err(out[0], ref[0]) <= 1e-10 and rel_err(out[1], ref[1]) <= 1e-10


def _packed_chunks(HV=3, NC=5, K=16, V=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    k = torch.nn.functional.normalize(torch.randn(HV, NC, 64, K, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(HV, NC, 64, V, generator=gen, dtype=torch.float64)
    beta = 0.2 + 0.8 * torch.rand(HV, NC, 64, generator=gen, dtype=torch.float64)
    G = torch.nn.functional.logsigmoid(torch.randn(HV, NC, 64, generator=gen, dtype=torch.float64) + 3).cumsum(-1)
    return k, v, beta, G


def test_kept_blocks_equal_exact_inverse_blocks():
    k, v, beta, G = _packed_chunks()
    M = delta_system(k, beta, G) + torch.eye(64, dtype=torch.float64)
    exact = torch.linalg.inv(M)
    blocks = adjacent_inverse_blocks(M)
    assert blocks.shape == (*M.shape[:-2], 7, 16, 16)
    for b, (i, j) in enumerate(BLOCK_PAIRS):
        want = exact[..., i * BLOCK : (i + 1) * BLOCK, j * BLOCK : (j + 1) * BLOCK]
        assert rel_err(blocks[..., b, :, :], want) <= 1e-12, (i, j)
    # what the approximation drops is real: the two-away blocks of M⁻¹ are not zero
    assert exact[..., 32:48, 0:16].abs().max() > 1e-6
    support = assemble_blocks(torch.ones(7, 16, 16)).tril(-1)
    # SparseGDN (Zhuang et al., arXiv:2610.41420) Sec. 2.3: 1,248 of the 2,016 causal off-diagonal entries (61.9 %)
    assert int(support.sum()) == 1248


def test_block_adjacent_solve_is_the_blockwise_product():
    k, v, beta, G = _packed_chunks()
    M = delta_system(k, beta, G) + torch.eye(64, dtype=torch.float64)
    C = assemble_blocks(adjacent_inverse_blocks(M))
    res = block_adjacent_solve(k, v, beta, G)
    assert rel_err(res.U, C @ (beta[..., None] * v)) <= 1e-13
    assert rel_err(assemble_blocks(res.cbar), C * (beta * G.exp())[..., None, :]) <= 1e-13
    assert rel_err(res.score, res.U[..., 48:, :].pow(2).sum((-1, -2)).sqrt()) <= 1e-15
    heads = torch.tensor([[0, 2], [1, 2]])
    chunks = torch.tensor([[4], [0]])
    W = deferred_w(res.cbar, k, heads, chunks)
    want = C[heads, chunks] @ ((beta * G.exp())[..., None] * k)[heads, chunks]
    assert W.shape == (2, 2, 64, 16) and rel_err(W, want) <= 1e-13


def test_full_solve_matches_dense_solve():
    k, v, beta, G = _packed_chunks()
    res = full_solve(k, v, beta, G, tail=8)
    U, W = solve_intra(k, v, beta, G)
    assert rel_err(res.U, U) <= 1e-12
    heads, chunks = torch.arange(3)[:, None], torch.arange(5)[None, :]
    assert rel_err(res.w(k, heads, chunks), W) <= 1e-12
    assert rel_err(res.score, U[..., 56:, :].pow(2).sum((-1, -2)).sqrt()) <= 1e-12
