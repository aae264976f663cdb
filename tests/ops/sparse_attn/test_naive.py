"""The torch references against direct, loop-by-loop definitions (float64) and against each other."""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from longsparse.ops.sparse_attn import naive as R
from tests.helpers import rel_err
from tests.ops.sparse_attn.helpers import SMALL, WIDE, cfg_id, randint_values, randn

CFGS = [SMALL, WIDE]


@pytest.mark.parametrize("T", [7, 8, 63, 130])
def test_compressed_keys_are_window_means(T):
    k = randn(2, T, 3, 5, seed=T, dtype=torch.float64)
    got, cu = R.compress_keys_ref(k, 8, 4)
    n = 0 if T < 8 else (T - 8) // 4 + 1
    assert cu is None and got.shape == (2, n, 3, 5)
    for j in range(n):
        torch.testing.assert_close(got[:, j], k[:, 4 * j : 4 * j + 8].mean(dim=1))


def test_compressed_keys_varlen_compress_each_sequence():
    k = randn(1, 70, 2, 4, seed=1, dtype=torch.float64)
    cu = torch.tensor([0, 5, 37, 70])
    got, cu_c = R.compress_keys_ref(k, 8, 4, cu)
    parts = [R.compress_keys_ref(k[:, s:e], 8, 4)[0] for s, e in [(0, 5), (5, 37), (37, 70)]]
    assert cu_c.tolist() == [0, 0, 7, 14]
    torch.testing.assert_close(got, torch.cat(parts, dim=1))


def test_visibility_is_infllmv2_stage1_causal_rule():
    """InfLLM-V2's stage-1 causal reference lets query i see (i + 1) // 16 − 1 keys of the 32/16 grid."""
    pos = torch.arange(0, 300)
    n = R.visible_compressed(pos, R.SparseAttentionConfig())
    assert torch.equal(n, ((pos + 1) // 16 - 1).clamp_min(0))
    for i in (31, 32, 47, 48, 299):  # window j ends at 16 j + 31: visible iff that is <= i
        assert int(n[i]) == sum(1 for j in range(100) if 16 * j + 31 <= i)


@pytest.mark.parametrize("cfg", CFGS, ids=cfg_id)
def test_pooling_takes_every_window_overlapping_the_block(cfg):
    scores = randn(2, 3, 41, seed=2, dtype=torch.float64)
    scores[0, 0, 5] = float("-inf")
    nb = 12
    got = R.pool_blocks_ref(scores, nb, cfg)
    for b in range(nb):
        lo, hi = b * cfg.block_size, (b + 1) * cfg.block_size  # tokens of block b
        js = [j for j in range(41) if j * cfg.kernel_stride < hi and j * cfg.kernel_stride + cfg.kernel_size > lo]
        want = scores[..., js].amax(-1) if js else torch.full(scores.shape[:-1], float("-inf"), dtype=torch.float64)
        torch.testing.assert_close(got[..., b], want)


def test_pooling_matches_infllmv2_max_pooling_1d():
    """MiniCPM4 geometry: kernel P + 1 = 5, stride P = 4, padding 1 (infllm_v2/max_pooling_1d.py)."""
    cfg = R.SparseAttentionConfig()
    scores = randn(3, 4 * 20, seed=3, dtype=torch.float64)
    got = R.pool_blocks_ref(scores, 20, cfg)
    want = F.max_pool1d(scores[:, None], kernel_size=5, stride=4, padding=1)[:, 0, :20]
    torch.testing.assert_close(got, want)


def _select_by_hand(scores, pos, cfg, dense=False):
    """One row, written out: forced blocks, then the best candidates, ties to the lower index."""
    qb = pos // cfg.block_size
    forced = {b for b in range(qb + 1) if b < cfg.init_blocks or b >= qb - cfg.local_blocks}
    if dense:
        return list(range(qb + 1))
    cand = [b for b in range(qb + 1) if b not in forced and math.isfinite(scores[b])]
    cand.sort(key=lambda b: (-scores[b], b))
    k = max(cfg.budget_blocks - len(forced), 0)
    return sorted(forced | set(cand[:k]))


@pytest.mark.parametrize("cfg", CFGS, ids=cfg_id)
def test_selection_matches_hand_written_rule_with_ties(cfg):
    T, NB = 300, 19
    scores = randint_values(2, 3, T, NB, seed=4, dtype=torch.float64, high=2)  # many ties
    scores[0, 1, 200, 3] = float("-inf")
    pos = torch.arange(T).expand(2, T)
    got = R.select_blocks_ref(scores, pos, cfg)
    assert got.shape == (2, T, 3, cfg.budget_blocks) and got.dtype == torch.int32
    for b in range(2):
        for h in range(3):
            for t in range(0, T, 7):
                want = _select_by_hand(scores[b, h, t].tolist(), t, cfg)
                row = got[b, t, h]
                assert row[: len(want)].tolist() == want and (row[len(want) :] == -1).all(), (b, h, t)


def test_first_tokens_attend_every_causal_block():
    cfg = SMALL
    T = cfg.block_size * (cfg.budget_blocks + 3)
    pos = torch.arange(T)[None]
    scores = randn(1, 1, T, cfg.num_blocks(T), seed=5, dtype=torch.float64)
    idx = R.select_blocks_ref(scores, pos, cfg)[0, :, 0]
    for t in range(cfg.block_size * cfg.budget_blocks):
        qb = t // cfg.block_size
        assert idx[t, : qb + 1].tolist() == list(range(qb + 1)), t
    assert (idx[-1] >= 0).sum() == cfg.budget_blocks


def test_dense_rows_attend_every_causal_block():
    cfg = SMALL
    scores = randn(1, 2, 1, 30, seed=6, dtype=torch.float64)
    pos = torch.tensor([[29 * 16 + 3]])
    idx = R.select_blocks_ref(scores, pos, cfg, dense_rows=torch.tensor([[True]]), width=32)
    assert idx[0, 0, 0, :30].tolist() == list(range(30)) and (idx[0, 0, :, 30:] == -1).all()


def test_forecast_logits_give_the_softmax_selection_for_one_head():
    """SparDA skips the softmax: for G = 1 softmax is monotone per query, and so is max-pooling."""
    cfg = SMALL
    B, T, H, d = 2, 200, 2, 8
    q = randn(B, T, H, d, seed=7, dtype=torch.float64)
    k_cmp, _ = R.compress_keys_ref(randn(B, T, H, d, seed=8, dtype=torch.float64), 8, 4)
    with_softmax = R.infllmv2_select_ref(q, k_cmp, cfg, scale=0.3)  # G = 1: one query head per KV head
    raw_logits = R.forecast_select_ref(q, k_cmp, cfg)
    assert torch.equal(with_softmax, raw_logits)
    assert (with_softmax[:, 150:] >= 0).sum(-1).min() == cfg.budget_blocks


def test_infllmv2_scores_are_group_sums_of_per_head_softmax():
    cfg = SMALL
    B, T, Hkv, G, d = 1, 40, 2, 3, 4
    q = randn(B, T, Hkv * G, d, seed=9, dtype=torch.float64)
    k_cmp = randn(B, 8, Hkv, d, seed=10, dtype=torch.float64)
    pos = torch.arange(T)[None]
    got = R.infllmv2_scores_ref(q, k_cmp, pos, cfg, scale=0.5)
    for t in (7, 8, 20, 39):
        n = max(0, (t + 1 - 8) // 4 + 1)
        for h in range(Hkv):
            want = sum(torch.softmax(0.5 * q[0, t, h * G + g] @ k_cmp[0, :n, h].T, -1) for g in range(G)) if n else None
            if n:
                torch.testing.assert_close(got[0, h, t, :n], want)
            assert torch.isinf(got[0, h, t, n:]).all()


def test_group_max_takes_the_largest_head_softmax():
    cfg = dataclasses.replace(SMALL, group_reduce="max")
    B, T, Hkv, G, d = 1, 40, 2, 3, 4
    q = randn(B, T, Hkv * G, d, seed=9, dtype=torch.float64)
    k_cmp = randn(B, 8, Hkv, d, seed=10, dtype=torch.float64)
    got = R.infllmv2_scores_ref(q, k_cmp, torch.arange(T)[None], cfg, scale=0.5)
    for t in (8, 20, 39):
        n = (t + 1 - 8) // 4 + 1
        for h in range(Hkv):
            per_head = [torch.softmax(0.5 * q[0, t, h * G + g] @ k_cmp[0, :n, h].T, -1) for g in range(G)]
            torch.testing.assert_close(got[0, h, t, :n], torch.stack(per_head).amax(0))
    summed = R.infllmv2_scores_ref(q, k_cmp, torch.arange(T)[None], SMALL, scale=0.5)
    assert not torch.allclose(got[torch.isfinite(got)], summed[torch.isfinite(summed)])


@pytest.mark.parametrize("neighbours", [1, 2])
@pytest.mark.parametrize("cfg", CFGS, ids=cfg_id)
def test_neighbour_blocks_pool_the_windows_of_the_blocks_before(cfg, neighbours):
    """Block b scores the max over every window overlapping blocks b − n … b: a block right after a high-scoring one
    ranks with it."""
    wide = dataclasses.replace(cfg, neighbour_blocks=neighbours)
    scores = randn(2, 3, 41, seed=2, dtype=torch.float64)
    nb = 12
    got = R.pool_blocks_ref(scores, nb, wide)
    for b in range(nb):
        lo, hi = (b - neighbours) * cfg.block_size, (b + 1) * cfg.block_size  # tokens of blocks b - n ... b
        js = [j for j in range(41) if j * cfg.kernel_stride < hi and j * cfg.kernel_stride + cfg.kernel_size > lo]
        want = scores[..., js].amax(-1) if js else torch.full(scores.shape[:-1], float("-inf"), dtype=torch.float64)
        torch.testing.assert_close(got[..., b], want)
    own = R.pool_blocks_ref(scores, nb, cfg)
    for b in range(neighbours, nb):
        torch.testing.assert_close(got[..., b], own[..., b - neighbours : b + 1].amax(-1))


@pytest.mark.parametrize("T", [16, 63, 130])
def test_key_bounds_are_window_minima_and_maxima(T):
    k = randn(2, T, 3, 5, seed=T, dtype=torch.float64)
    got, _ = R.compress_keys_ref(k, 16, 16, summary="bounds")
    n = (T - 16) // 16 + 1
    assert got.shape == (2, n, 3, 10)
    for j in range(n):
        window = k[:, 16 * j : 16 * j + 16]
        torch.testing.assert_close(got[:, j], torch.cat([window.amin(dim=1), window.amax(dim=1)], dim=-1))


def test_bounds_score_a_window_by_the_upper_bound_of_its_dot_products():
    """Σ_c max(q_c·min_c, q_c·max_c), channel by channel; it bounds every key's q·k and is reached by a window of one
    key (where bounds and means score alike)."""
    cfg = dataclasses.replace(SMALL, kernel_size=16, kernel_stride=16, key_summary="bounds")
    B, T, Hkv, G, d = 1, 64, 2, 3, 4
    q = randn(B, T, Hkv * G, d, seed=3, dtype=torch.float64)
    k = randn(B, T, Hkv, d, seed=4, dtype=torch.float64)
    k_cmp, _ = R.compress_keys_ref(k, 16, 16, summary="bounds")
    logits = R.window_logits(q.view(B, T, Hkv, G, d), k_cmp, cfg)  # [B, Hkv, G, T, N]
    for t, h, g, j in ((5, 0, 0, 0), (40, 1, 2, 2), (63, 0, 1, 3)):
        x = q[0, t, h * G + g]
        lo, hi = k_cmp[0, j, h, :d], k_cmp[0, j, h, d:]
        want = sum(max(float(x[c] * lo[c]), float(x[c] * hi[c])) for c in range(d))
        assert float(logits[0, h, g, t, j]) == pytest.approx(want, rel=1e-12)
        assert want >= float((k[0, 16 * j : 16 * j + 16, h] @ x).max()) - 1e-12
    one = dataclasses.replace(SMALL, kernel_size=1, kernel_stride=1)
    pos = torch.arange(T)[None]
    bounds = R.infllmv2_scores_ref(q, R.compress_keys_ref(k, 1, 1, summary="bounds")[0], pos,
                                   dataclasses.replace(one, key_summary="bounds"), scale=0.5)  # fmt: skip
    torch.testing.assert_close(bounds, R.infllmv2_scores_ref(q, R.compress_keys_ref(k, 1, 1)[0], pos, one, scale=0.5))
    with pytest.raises(ValueError, match="2·d"):
        R.window_logits(q.view(B, T, Hkv, G, d), R.compress_keys_ref(k, 16, 16)[0], cfg)


@pytest.mark.parametrize("cfg", CFGS, ids=cfg_id)
def test_sum_pooling_adds_the_scores_of_the_windows_overlapping_a_block(cfg):
    wide = dataclasses.replace(cfg, pool_reduce="sum")
    scores = randn(2, 3, 41, seed=5, dtype=torch.float64)
    scores[..., 30:] = float("-inf")  # windows a query does not see yet
    nb = 12
    got = R.pool_blocks_ref(scores, nb, wide)
    for b in range(nb):
        lo, hi = b * cfg.block_size, (b + 1) * cfg.block_size
        js = [j for j in range(30) if j * cfg.kernel_stride < hi and j * cfg.kernel_stride + cfg.kernel_size > lo]
        want = scores[..., js].sum(-1) if js else torch.full(scores.shape[:-1], float("-inf"), dtype=torch.float64)
        torch.testing.assert_close(got[..., b], want)


def test_sum_pooling_of_uncompressed_keys_selects_as_the_oracle():
    """With windows of one key, per-head softmaxes summed over the group and over a block are G times the block's
    dense mass: InfLLM-V2's scores become the oracle's, and so does its selection."""
    cfg = dataclasses.replace(SMALL, kernel_size=1, kernel_stride=1, pool_reduce="sum")
    B, T, Hkv, G, d = 2, 130, 2, 3, 8
    q = randn(B, T, Hkv * G, d, seed=6, dtype=torch.float64)
    k = randn(B, T, Hkv, d, seed=7, dtype=torch.float64)
    idx, scores = R.infllmv2_select_ref(q, R.compress_keys_ref(k, 1, 1)[0], cfg, return_scores=True)
    mass = R.block_mass_ref(q, k, torch.arange(T).expand(B, T), cfg.block_size, d**-0.5)
    visible = torch.isfinite(scores)
    torch.testing.assert_close(scores[visible], G * mass[visible])
    assert torch.equal(idx, R.oracle_select_ref(q, k, SMALL))


def test_forecast_sum_pooling_pools_window_probabilities():
    cfg = dataclasses.replace(SMALL, pool_reduce="sum")
    f = randn(1, 40, 2, 4, seed=8, dtype=torch.float64)
    k_cmp = randn(1, 8, 2, 4, seed=9, dtype=torch.float64)
    got = R.forecast_scores_ref(f, k_cmp, torch.arange(40)[None], cfg)
    raw = R.forecast_scores_ref(f, k_cmp, torch.arange(40)[None], SMALL)
    for t in (8, 39):
        n = (t + 1 - 8) // 4 + 1
        torch.testing.assert_close(got[0, :, t, :n], torch.softmax(raw[0, :, t, :n], -1))
        assert torch.isinf(got[0, :, t, n:]).all()


def _attention_by_hand(q, k, v, allowed, scale):
    """One query row: softmax over the allowed key positions."""
    if not allowed:
        return torch.zeros_like(q)
    kk = k[allowed]
    p = torch.softmax(scale * kk @ q, dim=0)
    return p @ v[allowed]


def test_sparse_attention_ref_is_masked_softmax():
    B, T, Hkv, G, d, blk = 1, 45, 2, 2, 4, 16
    q = randn(B, T, Hkv * G, d, seed=11, dtype=torch.float64)
    k = randn(B, T, Hkv, d, seed=12, dtype=torch.float64)
    v = randn(B, T, Hkv, d, seed=13, dtype=torch.float64)
    idx = torch.randint(-1, 4, (B, T, Hkv, 3), generator=torch.Generator().manual_seed(0)).int()
    idx[0, 5, 1] = -1  # attends nothing: zeros
    got = R.sparse_attention_ref(q, k, v, idx, blk, scale=0.7)
    for t in range(T):
        for hq in range(Hkv * G):
            h = hq // G
            blocks = set(idx[0, t, h][idx[0, t, h] >= 0].tolist())
            allowed = [p for p in range(t + 1) if p // blk in blocks]
            torch.testing.assert_close(
                got[0, t, hq], _attention_by_hand(q[0, t, hq], k[0, :, h], v[0, :, h], allowed, 0.7)
            )
    assert (got[0, 5, 2:4] == 0).all()


def test_all_blocks_selected_is_dense_causal_attention_varlen():
    T, blk = 50, 16
    q = randn(1, T, 4, 8, seed=14, dtype=torch.float64)
    k = randn(1, T, 2, 8, seed=15, dtype=torch.float64)
    v = randn(1, T, 2, 8, seed=16, dtype=torch.float64)
    cu = torch.tensor([0, 17, 50])
    every = torch.arange(4).expand(1, T, 2, 4).int()
    got = R.sparse_attention_ref(q, k, v, every, blk, cu_seqlens=cu)
    want = R.dense_causal_attention_ref(q, k, v, cu_seqlens=cu)
    spans = [(0, 17), (17, 50)]
    bhtd = [(q[:, s:e].transpose(1, 2), k[:, s:e].transpose(1, 2), v[:, s:e].transpose(1, 2)) for s, e in spans]
    sdpa = torch.cat(
        [F.scaled_dot_product_attention(*x, is_causal=True, enable_gqa=True).transpose(1, 2) for x in bhtd], dim=1
    )
    assert rel_err(got, want) < 1e-12 and rel_err(want, sdpa) < 1e-12


@pytest.mark.parametrize("cfg", CFGS, ids=cfg_id)
def test_decode_selection_is_the_prefill_selection_of_the_last_token(cfg):
    B, T, Hkv, G, d = 1, 230, 2, 2, 8
    q = randn(B, T, Hkv * G, d, seed=17, dtype=torch.float64)
    f = randn(B, T, Hkv, d, seed=18, dtype=torch.float64)
    k_cmp, _ = R.compress_keys_ref(
        randn(B, T, Hkv, d, seed=19, dtype=torch.float64), cfg.kernel_size, cfg.kernel_stride
    )
    pre_q = R.infllmv2_select_ref(q, k_cmp, cfg)
    pre_f = R.forecast_select_ref(f, k_cmp, cfg)
    for L in (1, 40, 161, 230):
        seqlens = torch.tensor([L])
        dq = R.infllmv2_select_decode_ref(q[:, L - 1], k_cmp, seqlens, cfg)
        df = R.forecast_select_decode_ref(f[:, L - 1], k_cmp, seqlens, cfg)
        S = cfg.budget_blocks
        assert torch.equal(dq[..., :S], pre_q[:, L - 1]) and (dq[..., S:] == -1).all()
        assert torch.equal(df[..., :S], pre_f[:, L - 1])


def test_sparse_decode_ref_is_the_last_row_of_prefill():
    B, T, Hkv, G, d, blk = 2, 70, 2, 3, 8, 16
    q = randn(B, T, Hkv * G, d, seed=20, dtype=torch.float64)
    k = randn(B, 80, Hkv, d, seed=21, dtype=torch.float64)
    v = randn(B, 80, Hkv, d, seed=22, dtype=torch.float64)
    idx = torch.tensor([0, 2, 4, -1]).expand(B, T, Hkv, 4).int()
    pre = R.sparse_attention_ref(q, k[:, :T], v[:, :T], idx, blk)
    slots_k = k.permute(0, 2, 1, 3).reshape(B * Hkv * 5, blk, d)
    slots_v = v.permute(0, 2, 1, 3).reshape(B * Hkv * 5, blk, d)
    ids = idx[:, -1]
    table = torch.where(ids >= 0, ids + 5 * torch.arange(B * Hkv).view(B, Hkv, 1), -1)
    got = R.sparse_decode_ref(q[:, -1], slots_k, slots_v, table, ids, torch.tensor([T, T]))
    torch.testing.assert_close(got, pre[:, -1])


def test_incremental_compression_ref_equals_recompute():
    k = randn(2, 60, 2, 4, seed=23, dtype=torch.float64)
    ring = torch.zeros(2, 8, 2, 4, dtype=torch.float64)
    k_cmp = torch.full((2, 20, 2, 4), float("nan"), dtype=torch.float64)
    for p in range(60):
        R.compress_decode_step_ref(k[:, p], ring, k_cmp, torch.tensor([p, p]), 8, 4)
        full, _ = R.compress_keys_ref(k[:, : p + 1], 8, 4)
        torch.testing.assert_close(k_cmp[:, : full.shape[1]], full)
