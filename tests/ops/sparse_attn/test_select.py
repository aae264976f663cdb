"""Selector kernels (Triton interpreter, float32) against the references: InfLLM-V2 and Forecast, prefill and
decode, GQA, odd lengths, ties, chunked scratch, the tile plan, and clear errors for bad input."""

import dataclasses

import pytest
import torch

from longsparse.ops.sparse_attn import (
    SelectKernelConfig,
    build_tile_plan,
    compress_keys,
    decode_topk_counters,
    forecast_select,
    forecast_select_decode,
    infllmv2_select,
    infllmv2_select_decode,
)
from longsparse.ops.sparse_attn import naive as R
from tests.ops.sparse_attn.helpers import SMALL, WIDE, assert_valid_selection, cfg_id, randint_values, randn

PREFILL = [
    # cfg, B, T, Hkv, G, d, tile
    (SMALL, 1, 63, 2, 3, 16, 8),
    (SMALL, 2, 130, 1, 4, 32, 16),
    (WIDE, 1, 150, 2, 2, 16, 16),
]


def prefill_id(c):
    return f"{cfg_id(c[0])}-B{c[1]}-T{c[2]}-Hkv{c[3]}-G{c[4]}-D{c[5]}-tile{c[6]}"


def _inputs(B, T, Hkv, G, d, cfg, seed, integer=False):
    make = randint_values if integer else randn
    q = make(B, T, Hkv * G, d, seed=seed)
    f = make(B, T, Hkv, d, seed=seed + 1)
    k = make(B, T, Hkv, d, seed=seed + 2)
    k_cmp, _ = compress_keys(k, cfg.kernel_size, cfg.kernel_stride, use_kernel=False)
    return q, f, k_cmp


def _check_plan(sel, cfg, T):
    want = build_tile_plan(sel.block_idx, sel.plan.tile_tokens, cfg.num_blocks(T))
    assert torch.equal(sel.plan.counts, want.counts)
    assert torch.equal(sel.plan.blocks, want.blocks)
    assert torch.equal(sel.plan.token_bits, want.token_bits)


@pytest.mark.parametrize("case", PREFILL, ids=prefill_id)
def test_infllmv2_prefill_kernel_matches_reference(case):
    cfg, B, T, Hkv, G, d, tile = case
    q, _, k_cmp = _inputs(B, T, Hkv, G, d, cfg, seed=T)
    sel = infllmv2_select(q, k_cmp, cfg, tile_tokens=tile, use_kernel=True)
    ref, scores = R.infllmv2_select_ref(q.double(), k_cmp.double(), cfg, return_scores=True)
    pos = torch.arange(T).expand(B, T)
    assert_valid_selection(sel.block_idx, ref, scores, pos, cfg, tol=1e-5)
    _check_plan(sel, cfg, T)


@pytest.mark.parametrize("case", PREFILL, ids=prefill_id)
def test_forecast_prefill_kernel_equals_reference_with_ties(case):
    """Integer inputs: float32 logits are exact and tie often, so the lower-index rule is checked exactly."""
    cfg, B, T, Hkv, G, d, tile = case
    _, f, k_cmp = _inputs(B, T, Hkv, G, d, cfg, seed=2 * T, integer=True)
    sel = forecast_select(f, k_cmp, cfg, tile_tokens=tile, use_kernel=True)
    ref = R.forecast_select_ref(f.double(), k_cmp.double(), cfg)
    assert torch.equal(sel.block_idx, ref)
    _check_plan(sel, cfg, T)


def test_chunked_scratch_gives_the_same_selection():
    cfg = SMALL
    q, f, k_cmp = _inputs(1, 100, 1, 2, 16, cfg, seed=5, integer=True)
    whole = forecast_select(f, k_cmp, cfg, tile_tokens=16, use_kernel=True)
    chunked = forecast_select(f, k_cmp, cfg, tile_tokens=16, scratch_bytes=1, use_kernel=True)  # 16-token chunks
    assert torch.equal(whole.block_idx, chunked.block_idx)
    assert torch.equal(whole.plan.blocks, chunked.plan.blocks)


DENSE = dataclasses.replace(SMALL, dense_len=64)


@pytest.mark.parametrize("cfg", [DENSE, WIDE], ids=cfg_id)
def test_decode_selectors_match_reference(cfg):
    """The Forecast keys are small integers, so ties are many and broken by the lower block number, as the
    reference does."""
    B, Hkv, G, d, Ncap = 4, 2, 3, 16, 70
    lengths = torch.tensor([1, 40, 150, 287], dtype=torch.int32)  # 1 and 40 are below dense_len=64 for DENSE
    k_cmp = randint_values(B, Ncap, Hkv, d, seed=6)
    q = randn(B, Hkv * G, d, seed=7)
    f = randint_values(B, Hkv, d, seed=8)
    got_f = forecast_select_decode(f, k_cmp, lengths, cfg, use_kernel=True)
    want_f = R.forecast_select_decode_ref(f.double(), k_cmp.double(), lengths, cfg)
    assert got_f.shape == (B, Hkv, cfg.decode_width()) and torch.equal(got_f, want_f)
    got_q = infllmv2_select_decode(q, k_cmp, lengths, cfg, use_kernel=True)
    want_q = R.infllmv2_select_decode_ref(q.double(), k_cmp.double(), lengths, cfg)
    pos = (lengths.long() - 1)[:, None]
    nb = cfg.num_blocks(int(lengths.max()))
    scores = R.pool_blocks_ref(R.infllmv2_scores_ref(q.double()[:, None], k_cmp.double(), pos, cfg, d**-0.5), nb, cfg)
    assert_valid_selection(got_q[:, None], want_q[:, None], scores, pos, cfg, tol=1e-5, max_mismatch=0.25)
    if cfg.dense_len:
        assert got_q[0, :, 0].tolist() == [0, 0] and (got_q[0, :, 1:] == -1).all()
        assert torch.equal(got_q[1, :, :3], torch.arange(3, dtype=torch.int32).expand(Hkv, 3))


@pytest.mark.parametrize("form", ["search", "bitonic"])
def test_decode_top_k_fused_into_the_scoring_kernel_gives_the_same_lists(form):
    """``SelectKernelConfig.decode_fused_topk``: the last scoring program of each row selects the row's blocks. Both
    selectors, rows below ``dense_len`` and rows scored by several programs, give the separate top-k's lists; the
    caller's counters are left zeroed, so calls that share them keep selecting right, and a call without them counts
    in its own."""
    cfg = DENSE
    B, Hkv, G, d = 4, 2, 3, 16
    lengths = torch.tensor([1, 40, 150, 16 * 70 + 5], dtype=torch.int32)  # the last: 71 blocks, three programs
    N = cfg.num_compressed(int(lengths.max()))
    # Two input sets, called in turn, whose long rows' Forecast choices come from the last scoring program's blocks
    # (64-70; keys of the first program's blocks zeroed, the last's scaled up): a top-k that ran before its row was
    # scored would find the other set's scores or none there.
    inputs = []
    for s in (0, 10):
        k = randint_values(B, N, Hkv, d, seed=6 + s)
        k[:, : 32 * cfg.pool_stride] = 0
        k[:, 64 * cfg.pool_stride :] *= 8
        inputs.append((randn(B, Hkv * G, d, seed=7 + s), randint_values(B, Hkv, d, seed=8 + s), k))
    want = [
        (infllmv2_select_decode(q, k, lengths, cfg, use_kernel=True),
         forecast_select_decode(f, k, lengths, cfg, use_kernel=True))
        for q, f, k in inputs
    ]  # fmt: skip
    assert all(((w[1][3] >= 64) & (w[1][3] < 68)).any() for w in want) and not torch.equal(want[0][1], want[1][1])
    fused = dict(
        use_kernel=True, kernel_config=SelectKernelConfig(topk_bitonic=form == "bitonic", decode_fused_topk=True)
    )
    counters = decode_topk_counters(B, Hkv, "cpu")
    for (q, f, k), (want_q, want_f) in zip(inputs * 2, want * 2):
        got_f = forecast_select_decode(f, k, lengths, cfg, **fused, topk_counters=counters)
        got_q = infllmv2_select_decode(q, k, lengths, cfg, **fused, topk_counters=counters)
        assert torch.equal(got_f, want_f) and torch.equal(got_q, want_q)
        assert not counters.any()
    (q, f, k_cmp), (_, want_f) = inputs[0], want[0]
    assert torch.equal(forecast_select_decode(f, k_cmp, lengths, cfg, **fused), want_f)
    with pytest.raises(ValueError, match="topk_counters must be int32"):
        forecast_select_decode(f, k_cmp, lengths, cfg, **fused, topk_counters=counters[:3])
    with pytest.raises(ValueError, match="topk_counters must be int32"):
        forecast_select_decode(f, k_cmp, lengths, cfg, **fused, topk_counters=counters.long())
    unfused = SelectKernelConfig(topk_bitonic=form == "bitonic")  # checked by the unfused build too
    with pytest.raises(ValueError, match="topk_counters must be int32"):
        infllmv2_select_decode(
            q, k_cmp, lengths, cfg, use_kernel=True, topk_counters=counters[:3], kernel_config=unfused
        )


def test_decode_selector_with_one_split_of_many_chunks():
    """A sequence long enough that the decode scoring runs in several chunks (the pooling carry crosses them)."""
    cfg = SMALL
    B, Hkv, d = 1, 1, 16
    L = 16 * 70 + 5  # 71 blocks: three chunks of 32 blocks
    k_cmp = randint_values(B, cfg.num_compressed(L), Hkv, d, seed=9)
    f = randint_values(B, Hkv, d, seed=10)
    seqlens = torch.tensor([L], dtype=torch.int32)
    got = forecast_select_decode(f, k_cmp, seqlens, cfg, use_kernel=True)
    assert torch.equal(got, R.forecast_select_decode_ref(f.double(), k_cmp.double(), seqlens, cfg))


def test_bad_inputs_raise():
    cfg = SMALL
    q, f, k_cmp = _inputs(1, 40, 2, 2, 16, cfg, seed=11)
    with pytest.raises(ValueError, match="multiple of k_cmp heads"):
        infllmv2_select(q[:, :, :3], k_cmp, cfg)
    with pytest.raises(ValueError, match="one head per KV head"):
        forecast_select(q, k_cmp, cfg)
    with pytest.raises(ValueError, match="fewer than the"):
        forecast_select(f, k_cmp[:, :3], cfg)
    with pytest.raises(ValueError, match="k_cmp dtype"):
        forecast_select(f, k_cmp.double(), cfg)
    with pytest.raises(ValueError, match="tile_tokens"):
        forecast_select(f, k_cmp, cfg, tile_tokens=3)
    with pytest.raises(ValueError, match="SparseAttentionConfig"):
        forecast_select(f, k_cmp, {"block_size": 16})
    with pytest.raises(ValueError, match="seqlens must be \\[B\\]"):
        forecast_select_decode(f[:, 0], k_cmp, torch.tensor([3, 4]), cfg)
    with pytest.raises(ValueError, match="seqlens must be an integer"):
        forecast_select_decode(f[:, 0], k_cmp, torch.tensor([3.0]), cfg)
    with pytest.raises(ValueError, match="max_seqlen"):
        infllmv2_select_decode(q[:, 0], k_cmp, torch.tensor([3]), cfg, max_seqlen=0)
    with pytest.raises(ValueError, match="use_kernel=True"):
        forecast_select(f.double(), k_cmp.double(), cfg, use_kernel=True)


def test_topk_searching_several_rows_at_once_gives_the_same_selection():
    """Rows searched together stop at different passes (an exact count ends a row early, ties run it to the end):
    the finished rows must keep their threshold while the others go on."""
    cfg = SMALL
    T = 300
    _, f, k_cmp = _inputs(1, T, 2, 1, 16, cfg, seed=12, integer=True)
    f[:, ::3] = f[:, ::3] + 0.25 * torch.randn_like(f[:, ::3])  # every third row without ties
    rows = SelectKernelConfig(topk_rows=4)
    sel = forecast_select(f, k_cmp, cfg, tile_tokens=16, use_kernel=True, kernel_config=rows)
    assert torch.equal(sel.block_idx, R.forecast_select_ref(f.double(), k_cmp.double(), cfg))


@pytest.mark.parametrize("form", ["search2", "search16", "bitonic"])
@pytest.mark.parametrize("rows", [1, 4])
def test_topk_forms_give_the_reference_selection(form, rows):
    """The threshold search at ``topk_arity`` thresholds per pass (the other tests run the default, 4 ways) ends in
    the same threshold (or an exact count) whatever the width, and the bitonic top-k (``topk_bitonic``) ranks the
    same keys with ties broken the same way (lowest block first): prefill on tied and untied rows (searched one or
    four at a time) and decode select exactly the reference's blocks."""
    arity = dict(topk_arity=int(form.removeprefix("search"))) if form.startswith("search") else {}
    kernel_config = SelectKernelConfig(topk_bitonic=form == "bitonic", topk_rows=rows, **arity)
    cfg = WIDE
    _, f, k_cmp = _inputs(2, 150, 2, 2, 16, cfg, seed=21, integer=True)
    f[:, ::3] = f[:, ::3] + 0.25 * torch.randn_like(f[:, ::3])  # every third row without ties
    sel = forecast_select(f, k_cmp, cfg, tile_tokens=16, use_kernel=True, kernel_config=kernel_config)
    assert torch.equal(sel.block_idx, R.forecast_select_ref(f.double(), k_cmp.double(), cfg))
    _check_plan(sel, cfg, 150)
    lengths = torch.tensor([1, 40, 150, 287], dtype=torch.int32)
    k_dec = randint_values(4, 70, 2, 16, seed=6)
    f_dec = randint_values(4, 2, 16, seed=8)
    got = forecast_select_decode(f_dec, k_dec, lengths, cfg, use_kernel=True, kernel_config=kernel_config)
    assert torch.equal(got, R.forecast_select_decode_ref(f_dec.double(), k_dec.double(), lengths, cfg))


@pytest.mark.parametrize(
    "begin,end,block,nb", [(0, 4096, 16, 256), (48, 3000, 16, 200), (0, 100, 64, 2), (128, 130, 64, 3)]
)
def test_topk_row_pieces_cover_the_tokens_with_rows_wide_enough(begin, end, block, nb):
    import longsparse.ops.sparse_attn.select as select_module

    pieces = select_module.topk_row_pieces(begin, end, block, nb)
    assert pieces[0][0] == begin and pieces[-1][1] == end
    full = 1 << (nb - 1).bit_length()
    for (b0, e0, w), nxt in zip(pieces, pieces[1:] + [None]):
        assert b0 < e0 and w & (w - 1) == 0 and SelectKernelConfig().min_topk_width <= w <= full or w == full
        assert (e0 - 1) // block + 1 <= w  # the piece's last token sees at most w blocks
        if nxt is not None:
            assert nxt[0] == e0 and e0 % block == 0 and nxt[2] > w


def test_prefill_selection_searched_in_pieces_of_growing_width():
    """Rows searched 2, 4, 8 and 16 blocks wide along one sequence give the reference's selection and plan, across
    16-token scratch chunks (Forecast) and in one chunk (InfLLM-V2)."""
    import longsparse.ops.sparse_attn.select as select_module

    narrow = SelectKernelConfig(min_topk_width=2)
    cfg = SMALL
    T = 150
    assert len(select_module.topk_row_pieces(0, T, cfg.block_size, cfg.num_blocks(T), narrow.min_topk_width)) == 4
    q, f, k_cmp = _inputs(1, T, 2, 2, 16, cfg, seed=13, integer=True)
    sel = forecast_select(f, k_cmp, cfg, tile_tokens=8, scratch_bytes=1, use_kernel=True, kernel_config=narrow)
    assert torch.equal(sel.block_idx, R.forecast_select_ref(f.double(), k_cmp.double(), cfg))
    _check_plan(sel, cfg, T)
    sel = infllmv2_select(q, k_cmp, cfg, tile_tokens=8, use_kernel=True, kernel_config=narrow)
    ref, scores = R.infllmv2_select_ref(q.double(), k_cmp.double(), cfg, return_scores=True)
    assert_valid_selection(sel.block_idx, ref, scores, torch.arange(T).expand(1, T), cfg, tol=1e-5)
    _check_plan(sel, cfg, T)


def test_kernels_refuse_rules_they_do_not_implement():
    q, f, k_cmp = _inputs(1, 40, 2, 3, 16, SMALL, seed=3)
    lens = torch.tensor([40], dtype=torch.int32)
    for cfg, grouped_only in ((dataclasses.replace(SMALL, group_reduce="max"), True),
                              (dataclasses.replace(SMALL, neighbour_blocks=1), False)):  # fmt: skip
        with pytest.raises(ValueError, match="do not implement"):
            infllmv2_select(q, k_cmp, cfg, use_kernel=True)
        with pytest.raises(ValueError, match="do not implement"):
            infllmv2_select_decode(q[:, -1], k_cmp, lens, cfg, use_kernel=True)
        if not grouped_only:
            with pytest.raises(ValueError, match="do not implement"):
                forecast_select_decode(f[:, -1], k_cmp, lens, cfg, use_kernel=True)
        infllmv2_select(q, k_cmp, cfg, use_kernel=False)  # the reference implements every rule
