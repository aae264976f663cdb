"""SparseGDN's Triton kernels against the torch specification.

On the CPU the kernels run in Triton's interpreter (fp32, small shapes); the ``gpu`` tests run them compiled at the
Qwen3.5 GDN geometry in bf16. With the same event mask the outputs must match the specification; the kernels' own
selection must equal the specification's.
"""

import dataclasses
import math

import pytest
import torch

from longsparse.ops._triton import kernels_can_run_on
from longsparse.ops.gdn import (
    SparseGDNConfig,
    SparseGDNKernelConfig,
    naive_chunk_gated_delta_rule,
    sparse_chunk_gated_delta_rule,
)
from longsparse.ops.gdn.intra import BLOCK_ORDER
from tests.helpers import rel_err
from tests.ops.gdn.helpers import (
    BF16_MAIN_PASSES,
    main_pass_config,
    make_gate,
    make_gdn_inputs,
    spec_trace,
    spread_decays,
)

launch = pytest.importorskip("longsparse.ops.gdn.launch", reason="needs triton")

needs_kernels = pytest.mark.skipif(
    not (kernels_can_run_on(torch.device("cpu")) or torch.cuda.is_available()),
    reason="Triton kernels cannot run here (no GPU and no interpreter)",
)
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(lengths, H=2, HV=4, K=16, V=32, dtype=torch.float32, seed=0):
    T = sum(lengths)
    q, k, v, _, beta, h0 = make_gdn_inputs(1, T, H, HV, K, V, with_state=True, n_states=len(lengths), seed=seed)
    g = spread_decays(1, T, HV, seed=seed)
    gate, w = make_gate(1, T, HV, V, seed=seed + 1)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    return q, k, v, g, beta, h0, gate, w, cu


def _to(xs, dtype, device=DEV):
    return [x.to(device=device, dtype=dtype if x.is_floating_point() else x.dtype) for x in xs]


@needs_kernels
@pytest.mark.parametrize("correction, scores", [("w", "inline"), ("ks", "inline"), ("ks", "stored")])
@pytest.mark.parametrize(
    "output, segment_chunks, warmup",
    [("grouped", 2, 12.0), ("grouped", 4, None), ("per_chunk", None, 12.0)],
    ids=["grouped-seg2-tau12", "grouped-seg4-exact", "per_chunk-one-segment"],
)
def test_kernels_match_spec_with_the_same_mask(output, segment_chunks, warmup, correction, scores):
    """varlen (incl. a 7-token and a one-chunk sequence), GVA, initial and final state, both output rules."""
    q, k, v, g, beta, h0, gate, w, cu = _inputs([300, 7, 64, 131])
    spec_cfg = SparseGDNConfig(output=output)
    trace = spec_trace(q, k, v, g, beta, spec_cfg, initial_state=h0, cu_seqlens=cu, gate=gate, weight=w)
    cfg = SparseGDNConfig(output=output, warmup_log_decay=warmup)
    kernel_cfg = SparseGDNKernelConfig(
        backend="triton", segment_chunks=segment_chunks, walk_correction=correction, walk_scores=scores
    )
    qd, kd, vd, gd, bd, hd, zd, wd = _to([q, k, v, g, beta, h0, gate, w], torch.float32)
    o, s, _, _ = launch.run_kernels(
        qd, kd, vd, gd, bd, None, hd, cu.to(DEV), gate=zd, gate_norm_weight=wd, config=cfg, kernel_config=kernel_cfg,
        mask=trace.selection.mask,
    )  # fmt: skip
    assert rel_err(o.cpu(), trace.o) <= 1e-5
    assert rel_err(s.cpu(), trace.recurrence.final_state) <= 1e-5


@needs_kernels
@pytest.mark.parametrize("main_pass", ["walk", "csr"])
@pytest.mark.parametrize("block_v", [16, 64])
def test_every_value_tile_gives_the_spec(block_v, main_pass):
    """``block_v`` 16 (two value tiles of V = 32 per head) and 64 (wider than V: one tile of V) against the spec, with
    several segments, varlen, initial and final states."""
    q, k, v, g, beta, h0, gate, w, cu = _inputs([300, 7, 131])
    trace = spec_trace(q, k, v, g, beta, SparseGDNConfig(), initial_state=h0, cu_seqlens=cu,
                       gate=gate, weight=w)  # fmt: skip
    cfg = SparseGDNKernelConfig(backend="triton", segment_chunks=2, main_pass=main_pass, block_v=block_v)
    qd, kd, vd, gd, bd, hd, zd, wd = _to([q, k, v, g, beta, h0, gate, w], torch.float32)
    o, s, _, _ = launch.run_kernels(
        qd, kd, vd, gd, bd, None, hd, cu.to(DEV), gate=zd, gate_norm_weight=wd, kernel_config=cfg,
        mask=trace.selection.mask,
    )  # fmt: skip
    assert rel_err(o.cpu(), trace.o) <= 1e-5
    assert rel_err(s.cpu(), trace.recurrence.final_state) <= 1e-5


@needs_kernels
@pytest.mark.parametrize("blocks", [True, False], ids=["kept-blocks", "whole-tiles"])
def test_intra_coefficients_and_scores_match_spec(blocks):
    """Both intra kernels (the default on the kept 16×16 blocks, the one on whole 64×64 tiles) give the spec's
    coefficients, decays and tail scores; a short last chunk (200 = 3·64 + 8 tokens) included."""
    from longsparse.ops.gdn.intra import intra_forward
    from longsparse.ops.gdn.layout import BLOCK_PAIRS

    assert tuple(BLOCK_PAIRS) == BLOCK_ORDER
    q, k, v, g, beta, *_, cu = _inputs([200, 64])
    trace = spec_trace(q, k, v, g, beta, SparseGDNConfig(), cu_seqlens=cu)
    layout = trace.layout
    k32, v32, g32, b32 = _to([k[0], v[0], g[0], beta[0]], torch.float32)
    ct, gamma, score = intra_forward(
        k32, v32, g32, b32, layout.token_index[:, 0].int().to(DEV), layout.chunk_len.int().to(DEV), blocks=blocks
    )
    ct, gamma, score = ct.cpu().double(), gamma.cpu().double(), score.cpu().double()
    # the spec keeps Cbar = C diag(β e^G); the kernels keep Ct = C diag(β), so W = Ct diag(e^G) K
    for b, (_, j) in enumerate(BLOCK_ORDER):
        e_Gj = trace.inputs.G[:, :, 16 * j : 16 * j + 16].exp()  # [HV, NC, 16]
        assert rel_err(ct[:, :, b].transpose(0, 1) * e_Gj[..., None, :], trace.intra.cbar[:, :, b]) <= 1e-5
    assert rel_err(gamma.T, trace.inputs.gamma) <= 1e-6
    assert rel_err(score.T, trace.intra.score) <= 1e-5


@needs_kernels
@pytest.mark.parametrize("blocks", [True, False], ids=["kept-blocks", "whole-tiles"])
def test_intra_with_the_refinement_step_matches_spec(blocks):
    """The solve's refinement step (``refine=True``, the default of 16-bit inputs; with the kept blocks also the
    split sub-diagonal product, ``sub_split``) on keys alike enough (cosine ~0.99) that it matters on the H200 keeps
    the spec's coefficients and scores. Run on fp32 inputs, whose products are exact (and the interpreter has no bf16
    products), this checks the algebra and the build; the precision gain is checked on the GPU by
    ``test_bf16_kernels_match_spec_within_dense_bf16_drift[*-correlated]``."""
    from longsparse.ops.gdn.intra import intra_forward

    q, k, v, g, beta, *_, cu = _inputs([200, 64])
    k = _correlated_keys(k, spread=0.1)
    trace = spec_trace(q, k, v, g, beta, SparseGDNConfig(), cu_seqlens=cu)
    layout = trace.layout
    k32, v32, g32, b32 = _to([k[0], v[0], g[0], beta[0]], torch.float32)
    bos, lens = layout.token_index[:, 0].int().to(DEV), layout.chunk_len.int().to(DEV)
    ct, _, score = intra_forward(k32, v32, g32, b32, bos, lens, blocks=blocks, refine=True, sub_split=blocks)
    ct, score = ct.cpu().double(), score.cpu().double()
    for b, (_, j) in enumerate(BLOCK_ORDER):
        e_Gj = trace.inputs.G[:, :, 16 * j : 16 * j + 16].exp()
        assert rel_err(ct[:, :, b].transpose(0, 1) * e_Gj[..., None, :], trace.intra.cbar[:, :, b]) <= 1e-5, b
    assert rel_err(score.T, trace.intra.score) <= 1e-5
    if not blocks:
        with pytest.raises(ValueError, match="sub_split"):
            intra_forward(k32, v32, g32, b32, bos, lens, blocks=False, sub_split=True)


@needs_kernels
def test_intra_f16_solve_keeps_the_coefficients_and_falls_back_outside_fp16s_range():
    """``f16_solve``: the inverse's chain on fp16 operands. On alike unit keys the coefficients stay within fp16
    rounding of the spec's (and differ from the exact fp32 solve: the fp16 path ran); with keys of norm 2 (``|L|``
    up to 4, outside the bound under which fp16 cannot overflow) the chunk takes the default products, exact here."""
    from longsparse.ops.gdn.intra import intra_forward

    q, k, v, g, beta, *_, cu = _inputs([200, 64])
    k = _correlated_keys(k, spread=0.1)
    for scale, low, high in ((1.0, 1e-5, 5e-3), (2.0, 0.0, 1e-5)):
        trace = spec_trace(q, scale * k, v, g, beta, SparseGDNConfig(), cu_seqlens=cu)
        layout = trace.layout
        k32, v32, g32, b32 = _to([scale * k[0], v[0], g[0], beta[0]], torch.float32)
        bos, lens = layout.token_index[:, 0].int().to(DEV), layout.chunk_len.int().to(DEV)
        ct, _, score = intra_forward(k32, v32, g32, b32, bos, lens, refine=True, f16_solve=True)
        ct = ct.cpu().double()
        errors = []
        for blk, (_, j) in enumerate(BLOCK_ORDER):
            e_Gj = trace.inputs.G[:, :, 16 * j : 16 * j + 16].exp()
            errors.append(rel_err(ct[:, :, blk].transpose(0, 1) * e_Gj[..., None, :], trace.intra.cbar[:, :, blk]))
        assert low <= max(errors) <= high, (scale, errors)
        assert rel_err(score.cpu().double().T, trace.intra.score) <= max(high, 1e-5)
        # fp32 inputs take IEEE products by default, not the fp16 chain
        ct_default, _, _ = intra_forward(k32, v32, g32, b32, bos, lens, refine=True)
        ct_tf32, _, _ = intra_forward(k32, v32, g32, b32, bos, lens, refine=True, f16_solve=False)
        assert torch.equal(ct_default, ct_tf32)
    with pytest.raises(ValueError, match="f16_solve"):
        intra_forward(k32, v32, g32, b32, bos, lens, blocks=False, f16_solve=True)
    with pytest.raises(ValueError, match="f16_solve"):
        intra_forward(k32, v32, g32, b32, bos, lens, tf32x3=True, f16_solve=True)


@needs_kernels
@pytest.mark.filterwarnings("ignore:overflow encountered in cast", "ignore:invalid value encountered in matmul")
def test_intra_f16_range_test_takes_beta_by_magnitude_and_f16_unchecked_skips_it():
    """The checked fp16 solve bounds ``|L|`` by ``max |β| · max |k|²``: β = −2 on unit keys is outside it and falls
    back (equal to the fp32 solve). ``f16_unchecked`` takes the fp16 chain for every chunk: bit-equal to the checked
    form inside the bound; outside it, where fp16 does not overflow (random keys of norm 2), fp16-accurate but no
    longer the fallback's exact result; where it overflows (alike keys of norm 2), inf or NaN — not finite wrong
    values."""
    from longsparse.ops.gdn.intra import intra_forward

    q, k, v, g, beta, *_, cu = _inputs([200, 64])
    unit = torch.nn.functional.normalize(k, dim=-1)
    k = _correlated_keys(k, spread=0.1)
    layout = spec_trace(q, k, v, g, beta, SparseGDNConfig(), cu_seqlens=cu).layout
    bos, lens = layout.token_index[:, 0].int().to(DEV), layout.chunk_len.int().to(DEV)

    def run(keys, betas, **kw):
        k32, v32, g32, b32 = _to([keys[0], v[0], g[0], betas[0]], torch.float32)
        return intra_forward(k32, v32, g32, b32, bos, lens, refine=True, **kw)[0]

    exact = run(k, -2 * beta, f16_solve=False)
    assert torch.equal(run(k, -2 * beta, f16_solve=True), exact)  # |β| = 2 > 1: the range test sends it back
    assert not torch.equal(run(k, -2 * beta, f16_solve=True, f16_unchecked=True), exact)
    assert torch.equal(run(k, beta, f16_solve=True, f16_unchecked=True), run(k, beta, f16_solve=True))
    assert torch.equal(run(k, beta, f16_unchecked=True), run(k, beta))  # fp32 inputs: f16_solve off, no effect
    wide = run(2 * unit, beta, f16_solve=True, f16_unchecked=True)  # random directions: |L^p| stays small
    assert 1e-6 < rel_err(wide, run(2 * unit, beta, f16_solve=False)) <= 5e-3
    assert not torch.isfinite(run(2 * k, beta, f16_solve=True, f16_unchecked=True)).all()


@needs_kernels
def test_op_passes_bounded_inputs_to_intra_as_f16_unchecked(monkeypatch):
    """``bounded_inputs`` reaches intra's ``f16_unchecked`` (and only when given); a non-bool is refused."""
    q, k, v, g, beta, *_ = _inputs([130])
    seen = []
    intra = launch.intra_forward

    def spy(*args, **kwargs):
        seen.append(kwargs["f16_unchecked"])
        return intra(*args, **kwargs)

    monkeypatch.setattr(launch, "intra_forward", spy)
    cfg = SparseGDNKernelConfig(backend="triton")
    outs = [sparse_chunk_gated_delta_rule(*_to([q, k, v, g, beta], torch.float32), kernel_config=cfg,
                                          bounded_inputs=b)[0] for b in (False, True)]  # fmt: skip
    assert seen == [False, True]
    assert torch.equal(*outs)  # fp32 inputs: IEEE products either way
    with pytest.raises(ValueError, match="bounded_inputs must be a bool"):
        sparse_chunk_gated_delta_rule(q, k, v, g, beta, kernel_config=cfg, bounded_inputs=1)


@needs_kernels
def test_intra_stores_the_scores_kernels_scores_and_the_same_coefficients():
    """``intra_forward(q=, scores=)`` (the op's path where the walk reads stored scores) writes what
    ``sparse_gdn_fwd_kernel_scores`` writes — zeros past a short chunk's end included — and leaves the coefficients,
    decays and tail scores as they are without it; a 128-row buffer (the Gluon walk's tiles) takes the scores, then
    the dense ``Ct`` of the coefficients returned, or without q the dense ``Ct`` alone (its score rows untouched);
    q and scores that do not fit are refused by name."""
    from longsparse.ops.gdn import walk_gluon
    from longsparse.ops.gdn.intra import intra_forward
    from longsparse.ops.gdn.kernels.fused import sparse_gdn_fwd_kernel_scores

    q, k, v, g, beta, *_, cu = _inputs([200, 64, 7])
    trace = spec_trace(q, k, v, g, beta, SparseGDNConfig(), cu_seqlens=cu)
    layout = trace.layout
    q32, k32, v32, g32, b32 = _to([q[0], k[0], v[0], g[0], beta[0]], torch.float32)
    bos, clen = layout.token_index[:, 0].int().to(DEV), layout.chunk_len.int().to(DEV)
    NC, H, HV, K = layout.NC, q.shape[2], v.shape[2], q.shape[3]
    alone = torch.full((NC, HV, 64, 64), float("nan"), device=DEV)
    fast_exp = k32.is_cuda  # intra's decays by ex2.approx on the GPU (the interpreter has no inline assembly)
    sparse_gdn_fwd_kernel_scores[(NC, H)](
        q32, k32, g32, alone, bos, clen, H=H, HV=HV, K=K, IEEE=True, FAST_EXP=fast_exp
    )
    with_intra = torch.full_like(alone, float("nan"))
    plain = intra_forward(k32, v32, g32, b32, bos, clen)
    both = intra_forward(k32, v32, g32, b32, bos, clen, q=q32, scores=with_intra)
    assert with_intra.isfinite().all() and torch.equal(with_intra, alone)
    assert with_intra[-1, :, 7:].abs().max() == 0 and with_intra[-1, :, :, 7:].abs().max() == 0
    assert all(torch.equal(a, b) for a, b in zip(plain, both))
    tiles = torch.full((NC, HV, walk_gluon.TILE_ROWS, 64), float("nan"), device=DEV)
    with_tiles = intra_forward(k32, v32, g32, b32, bos, clen, q=q32, scores=tiles)
    assert all(torch.equal(a, b) for a, b in zip(plain, with_tiles))
    assert torch.equal(tiles[:, :, :64], alone)
    assert torch.equal(tiles[:, :, 64:], walk_gluon.dense_coefficients(with_tiles[0]))
    only_tiles = torch.full_like(tiles, float("nan"))  # the Gluon path: the tiles hold the only copy of Ct
    ct_none, *rest = intra_forward(k32, v32, g32, b32, bos, clen, q=q32, scores=only_tiles, kept_blocks=False)
    assert ct_none is None and all(torch.equal(a, b) for a, b in zip(plain[1:], rest))
    assert torch.equal(only_tiles, tiles)
    ct_only = torch.full_like(tiles, float("nan"))  # a walk forming its scores itself: the tiles' Ct rows alone
    ct_none, *rest = intra_forward(k32, v32, g32, b32, bos, clen, scores=ct_only, kept_blocks=False)
    assert ct_none is None and all(torch.equal(a, b) for a, b in zip(plain[1:], rest))
    assert torch.equal(ct_only[:, :, 64:], tiles[:, :, 64:]) and ct_only[:, :, :64].isnan().all()
    with pytest.raises(ValueError, match=r"kept_blocks=False needs a \[NC, HV, 128, 64\] scores buffer"):
        intra_forward(k32, v32, g32, b32, bos, clen, q=q32, scores=with_intra, kept_blocks=False)
    with pytest.raises(ValueError, match="kept_blocks=False needs"):
        intra_forward(k32, v32, g32, b32, bos, clen, kept_blocks=False)
    rows128 = torch.full_like(tiles, float("nan"))  # the scores kernel fills the scores' rows of each tile only
    sparse_gdn_fwd_kernel_scores[(NC, H)](
        q32, k32, g32, rows128, bos, clen, H=H, HV=HV, K=K, IEEE=True, ROWS=128, FAST_EXP=fast_exp
    )
    assert torch.equal(rows128[:, :, :64], alone) and rows128[:, :, 64:].isnan().all()
    with pytest.raises(ValueError, match=r"scores \(6, 4, 64, 64\) without q: only \[NC, HV, 128, 64\] tiles"):
        intra_forward(k32, v32, g32, b32, bos, clen, scores=with_intra)
    with pytest.raises(ValueError, match="q is read only to store scores"):
        intra_forward(k32, v32, g32, b32, bos, clen, q=q32)
    with pytest.raises(ValueError, match=r"scores \(1, 4, 64, 64\) torch.float32 must be \[6, 4, 64, 64\]"):
        intra_forward(k32, v32, g32, b32, bos, clen, q=q32, scores=with_intra[:1])
    with pytest.raises(ValueError, match=r"or \[6, 4, 128, 64\]"):
        intra_forward(k32, v32, g32, b32, bos, clen, q=q32, scores=tiles[:, :, :96])
    with pytest.raises(ValueError, match="q .* must match k"):
        intra_forward(k32, v32, g32, b32, bos, clen, q=q32[:-1], scores=with_intra)
    with pytest.raises(ValueError, match="kept-block kernel only"):
        intra_forward(k32, v32, g32, b32, bos, clen, q=q32, scores=with_intra, blocks=False)


@needs_kernels
def test_entry_states_from_the_tiles_equal_those_from_the_kept_blocks():
    """The entry kernel reads a chunk's Ct from the Gluon walk's tiles (``CT_TILES``; on that path intra stores no
    kept blocks) or from the kept blocks: the same coefficients, so the same entry states bit for bit — varlen with
    a short last chunk, an initial state, 2-chunk segments warmed up from the sequence start and from a truncated
    start (``tau``), every chunk selected or alternate ones."""
    from longsparse.ops.gdn import walk_gluon
    from longsparse.ops.gdn.intra import intra_forward
    from longsparse.ops.gdn.kernels.fused import sparse_gdn_fwd_kernel_entry
    from longsparse.ops.gdn.launch import search_steps

    q, k, v, g, beta, h0, *_, cu = _inputs([64 * 7 + 9, 64 * 4])
    qf, kf, vf, gf, bf, h0 = _to([q[0], k[0], v[0], g[0], beta[0], h0], torch.float32)
    plan = launch.plan_launch(1, q.shape[1], cu.to(DEV), torch.device(DEV))
    layout, bos, clen = plan.layout, plan.chunk_bos, plan.chunk_len
    H, HV, K, V = q.shape[2], v.shape[2], q.shape[3], v.shape[3]
    tiles = torch.empty(layout.NC, HV, walk_gluon.TILE_ROWS, 64, device=DEV)
    ct, gamma, _ = intra_forward(kf, vf, gf, bf, bos, clen, q=qf, scores=tiles)
    prefix = launch.decay_prefix(gamma, layout)
    segs = launch.plan_segments(plan.lengths, HV, 1, DEV, length=2)
    for tau in (math.inf, 1.0):
        for every in (1, 2):
            mask = torch.zeros(layout.N, H, layout.Cmax, dtype=torch.uint8, device=DEV)
            mask[..., ::every] = 1
            states = []
            for coefficients, from_tiles in ((ct, False), (tiles, True)):
                entry = torch.full((segs.count, HV, K, V), float("nan"), device=DEV)
                sparse_gdn_fwd_kernel_entry[(segs.count * HV,)](
                    kf, vf, gf, coefficients, mask, prefix, h0, entry, segs.seq, segs.c0, segs.chunk0, bos, clen,
                    tau, P=H, CMAX=layout.Cmax, H=H, HV=HV, K=K, V=V, BV=V, HAS_H0=True,
                    SEARCH_STEPS=search_steps(layout.Cmax), IEEE=True, KS_CORRECTION=True, CT_TILES=from_tiles,
                )  # fmt: skip
                states.append(entry)
            assert states[0].isfinite().all() and states[0].abs().max() > 0
            assert torch.equal(states[0], states[1])


@needs_kernels
def test_kernel_selection_equals_spec_selection():
    q, k, v, g, beta, h0, gate, w, cu = _inputs([64 * 40 + 5, 64 * 9], H=4, HV=8)
    trace = spec_trace(q, k, v, g, beta, SparseGDNConfig(), cu_seqlens=cu, gate=gate, weight=w)
    qd, kd, vd, gd, bd, zd, wd = _to([q, k, v, g, beta, gate, w], torch.float32)
    _, _, sel, _ = launch.run_kernels(qd, kd, vd, gd, bd, None, None, cu.to(DEV), gate=zd, gate_norm_weight=wd)
    assert torch.equal(sel.tier.cpu(), trace.selection.tier)
    assert torch.equal(sel.mask.cpu(), trace.selection.mask)


@needs_kernels
@pytest.mark.parametrize("main_pass", ["walk", "csr"])
def test_public_op_runs_the_kernels_when_asked(main_pass):
    q, k, v, g, beta, h0, gate, w, cu = _inputs([130])
    args = [x.float() for x in (q, k, v, g, beta)]
    o_k, s_k, st = sparse_chunk_gated_delta_rule(
        *_to(args, torch.float32),
        initial_state=h0.float().to(DEV),
        output_final_state=True,
        kernel_config=SparseGDNKernelConfig(backend="triton", main_pass=main_pass),
        return_stats=True,
    )
    o_t, s_t = sparse_chunk_gated_delta_rule(
        *args, initial_state=h0.float(), output_final_state=True, kernel_config=SparseGDNKernelConfig(backend="torch")
    )
    assert rel_err(o_k.cpu(), o_t) <= 1e-5 and rel_err(s_k.cpu(), s_t) <= 1e-5
    assert st.num_snapshots == (st.num_events if main_pass == "csr" else 0) and 0 < st.keep_ratio <= 1


@needs_kernels
def test_kernels_read_strided_views_as_their_values():
    """A GDN layer's q, k and v are column slices of its conv output: token rows further apart than H·K (HV·V)."""
    q, k, v, g, beta, h0, gate, w, cu = _inputs([130])
    args = _to([q, k, v, g, beta], torch.float32)
    packed = torch.cat([args[0].flatten(2), args[1].flatten(2), args[2].flatten(2)], dim=-1)  # [1, T, C]
    q_view, k_view, v_view = packed.split([q[0, 0].numel(), k[0, 0].numel(), v[0, 0].numel()], dim=-1)
    views = [x.view(*y.shape) for x, y in zip((q_view, k_view, v_view), args[:3])]
    assert not any(x.is_contiguous() for x in views)
    kernel_config = SparseGDNKernelConfig(backend="triton")
    o_view, _ = sparse_chunk_gated_delta_rule(*views, *args[3:], kernel_config=kernel_config)
    o, _ = sparse_chunk_gated_delta_rule(*args, kernel_config=kernel_config)
    assert torch.equal(o_view, o)


@needs_kernels
def test_triton_backend_refuses_what_it_cannot_run():
    q, k, v, g, beta, *_ = make_gdn_inputs(1, 70, 2, 2, 16, 16, device=DEV)  # float64
    with pytest.raises(ValueError, match="backend='triton'"):
        sparse_chunk_gated_delta_rule(q, k, v, g, beta, kernel_config=SparseGDNKernelConfig(backend="triton"))
    q, k, v, g, beta, *_ = make_gdn_inputs(1, 70, 2, 2, 16, 16, dtype=torch.float32, device=DEV)
    with pytest.raises(ValueError, match="solve='full'"):
        sparse_chunk_gated_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            config=SparseGDNConfig(solve="full"),
            kernel_config=SparseGDNKernelConfig(backend="triton"),
        )


@needs_kernels
@pytest.mark.parametrize("main_pass", ["walk", "csr"])
def test_a_launch_plan_serves_every_call_over_the_same_sequences(main_pass):
    """One plan for two layers' calls (other inputs, same sequences) gives exactly what a fresh plan per call gives,
    keeps its derived tables between the calls, and refuses a call over other sequences."""
    cfg = SparseGDNKernelConfig(backend="triton", main_pass=main_pass, segment_chunks=2)
    cu = _inputs([150, 7, 90])[-1].to(DEV)
    plan = launch.plan_launch(1, 247, cu, torch.device(DEV))
    for seed in (0, 1):
        q, k, v, g, beta, h0, gate, w, _ = _inputs([150, 7, 90], seed=seed)
        args = _to([q, k, v, g, beta], torch.float32)
        kw = dict(initial_state=h0.float().to(DEV), output_final_state=True, cu_seqlens=cu, kernel_config=cfg)
        kw.update(gate=gate.float().to(DEV), gate_norm_weight=w.float().to(DEV))
        o_plan, s_plan = sparse_chunk_gated_delta_rule(*args, **kw, plan=plan)
        o_fresh, s_fresh = sparse_chunk_gated_delta_rule(*args, **kw)
        assert torch.equal(o_plan, o_fresh) and torch.equal(s_plan, s_fresh)
        if seed == 0:
            kept = dict(plan._kept)
            assert kept  # segments, tier sizes and tier table
    assert all(plan._kept[key] is value for key, value in kept.items())  # reused, not rebuilt
    with pytest.raises(ValueError, match="the launch plan is for B=1, T=247, 3 sequences"):
        two = torch.tensor([0, 150, 247], device=DEV)  # the same tokens cut into two sequences
        sparse_chunk_gated_delta_rule(*args, **{**kw, "cu_seqlens": two, "initial_state": None}, plan=plan)


@needs_kernels
def test_calls_without_a_plan_share_the_kept_plan_of_their_batch_shape():
    """Batch rows: the plan is built once per (B, T, device) and reused (a one-off call's host work is the plan).
    Results equal a fresh plan's."""
    cfg = SparseGDNKernelConfig(backend="triton")
    q, k, v, g, beta, *_ = make_gdn_inputs(2, 130, 2, 4, 16, 16, dtype=torch.float32, device=DEV)
    dev = torch.device(DEV)
    assert launch.plan_for(2, 130, None, dev) is launch.plan_for(2, 130, None, dev) is launch.batch_plan(2, 130, dev)
    assert launch.plan_for(2, 131, None, dev) is not launch.batch_plan(2, 130, dev)
    o_kept, s_kept = sparse_chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, kernel_config=cfg)
    fresh = launch.plan_launch(2, 130, None, dev)
    o_new, s_new = sparse_chunk_gated_delta_rule(
        q, k, v, g, beta, output_final_state=True, kernel_config=cfg, plan=fresh
    )
    assert torch.equal(o_kept, o_new) and torch.equal(s_kept, s_new)


def test_varlen_plans_are_kept_by_the_offsets_values():
    """Calls over equal offsets (any tensor holding them) share one kept plan — its layout, index and the tables it
    derives — through views that carry the call's own tensor; other offsets, or another T, get another plan; the
    kept plan holds no caller's tensor."""
    dev = torch.device("cpu")
    cu = torch.tensor([0, 100, 130])
    a, b = launch.plan_for(1, 130, cu, dev), launch.plan_for(1, 130, cu.clone(), dev)
    assert a.layout is b.layout and a.index is b.index and a._kept is b._kept
    assert a.offsets_of(cu) == [0, 100, 130] and b.offsets_of(cu) is None  # each view knows its own tensor
    kept = launch.varlen_plan(1, 130, (0, 100, 130), dev)
    assert kept.layout is a.layout and kept.cu_seqlens is None
    assert launch.plan_for(1, 130, cu, dev, offsets=[0, 100, 130]).layout is a.layout  # the caller's host copy
    other = launch.plan_for(1, 130, torch.tensor([0, 60, 130]), dev)
    assert other.layout is not a.layout and other.lengths == [60, 70]
    assert launch.plan_for(1, 131, torch.tensor([0, 100, 131]), dev).layout is not a.layout
    for n in range(launch.VARLEN_PLANS_KEPT + 1):  # bounded: the least recently used plan goes
        launch.plan_for(1, 200 + n, torch.tensor([0, 200 + n]), dev)
    assert launch.varlen_plan.cache_info().currsize == launch.VARLEN_PLANS_KEPT
    assert launch.plan_for(1, 130, cu, dev).layout is not a.layout


@needs_kernels
@pytest.mark.parametrize("main_pass", ["walk", "csr"])
def test_varlen_calls_without_a_plan_reuse_the_kept_plan(main_pass, monkeypatch):
    """Two calls over equal offsets (different tensors) build one plan, reading each tensor to the host once (in
    the checks); their results equal a fresh plan's; other offsets get their own plan and their own results."""
    cfg = SparseGDNKernelConfig(backend="triton", main_pass=main_pass, segment_chunks=2)
    q, k, v, g, beta, h0, gate, w, cu = _inputs([150, 7, 90])
    args = _to([q, k, v, g, beta], torch.float32)
    kw = dict(initial_state=h0.float().to(DEV), output_final_state=True, kernel_config=cfg)
    kw.update(gate=gate.float().to(DEV), gate_norm_weight=w.float().to(DEV))
    launch.varlen_plan.cache_clear()
    offsets, cu1, cu2 = cu.tolist(), cu.to(DEV), cu.clone().to(DEV)
    built, reads = [], []
    real_plan, real_tolist = launch._plan_of, torch.Tensor.tolist
    monkeypatch.setattr(launch, "_plan_of", lambda *a, **k: built.append(a[2]) or real_plan(*a, **k))
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: reads.append(t) or real_tolist(t))
    first = sparse_chunk_gated_delta_rule(*args, **kw, cu_seqlens=cu1)
    second = sparse_chunk_gated_delta_rule(*args, **kw, cu_seqlens=cu2)
    monkeypatch.undo()
    assert built == [offsets]  # one plan for both calls
    assert [sum(r is x for r in reads) for x in (cu1, cu2)] == [1, 1]  # each tensor read once, by the checks
    fresh = sparse_chunk_gated_delta_rule(*args, **kw, cu_seqlens=cu.to(DEV), plan=launch.plan_launch(1, 247, cu, DEV))
    for got in (first, second):
        assert all(torch.equal(x, y) for x, y in zip(got, fresh))
    cut = torch.tensor([0, 150, 157, 200, 247])  # the same tokens in four sequences
    kw["initial_state"] = torch.cat([kw["initial_state"], kw["initial_state"][:1]])
    o_cut, s_cut = sparse_chunk_gated_delta_rule(*args, **kw, cu_seqlens=cut.to(DEV))
    assert launch.varlen_plan.cache_info().currsize == 2
    ref = sparse_chunk_gated_delta_rule(*args, **kw, cu_seqlens=cut.to(DEV), plan=launch.plan_launch(1, 247, cut, DEV))
    assert torch.equal(o_cut, ref[0]) and torch.equal(s_cut, ref[1])
    assert not torch.equal(o_cut, fresh[0])


def test_a_plan_checks_the_offsets_it_was_built_from_without_reading_them_again():
    """Calls over a plan's own ``cu_seqlens`` tensor validate the plan's host copy (a model's layers: no device read
    per layer); another tensor, even with equal values, is read and checked as before."""
    from longsparse.ops.gdn.checks import check_gdn_inputs

    cu = torch.tensor([0, 100, 130])
    plan = launch.plan_launch(1, 130, cu, torch.device("cpu"))
    assert plan.offsets_of(cu) == [0, 100, 130] and plan.offsets_of(cu.clone()) is None
    assert launch.plan_launch(2, 64, None, torch.device("cpu")).offsets_of(None) is None
    q, k, v, g, beta, _ = make_gdn_inputs(1, 130, 2, 2, 16, 16)
    assert check_gdn_inputs(q, k, v, g, beta, cu_seqlens=cu, offsets=plan.offsets_of(cu)).N == 2
    with pytest.raises(ValueError, match="end at T=130"):
        check_gdn_inputs(q, k, v, g, beta, cu_seqlens=cu, offsets=[0, 100, 129])


def test_segment_plan_covers_every_chunk_once():
    plan = launch.plan_segments([64 * 37 + 1, 0, 64 * 4], parallel_width=8, slots=264, device="cpu", length=6)
    covered = {}
    for n, a, b in zip(plan.seq.tolist(), plan.c0.tolist(), plan.c1.tolist()):
        assert a % 2 == 0 and a < b
        for c in range(a, b):
            covered[(n, c)] = covered.get((n, c), 0) + 1
    assert covered == {(n, c): 1 for n, C in ((0, 38), (2, 4)) for c in range(C)}


def test_segments_are_planned_longest_first():
    # the kernels take their segment from the launch order and the GPU starts programs in that order
    plan = launch.plan_segments([64 * 100, 64 * 7, 64 * 40], parallel_width=128, slots=264, device="cpu", length=32)
    assert (plan.c1 - plan.c0).tolist() == [32, 32, 32, 32, 8, 7, 4]
    assert plan.seq.tolist() == [0, 0, 0, 2, 2, 1, 0]  # equal lengths keep sequence order
    assert plan.c0.tolist() == [0, 32, 64, 0, 32, 0, 96]


def test_default_segments_fill_the_resident_programs_once():
    # 128K at 64-wide tiles on 132 SMs x 2 resident: 4 segments of 512 chunks, 256 programs (one wave of 264 slots)
    assert launch.resident_programs(4) == 2 and launch.resident_programs(8) == 1
    assert launch.segment_length([2048], 32 * 2, 264) == 512
    assert launch.segment_length([2048], 32 * 4, 264) == 1024  # 32-wide tiles: twice the programs per segment
    assert launch.segment_length([64], 32 * 2, 264) == 16
    assert launch.segment_length([16], 32 * 2, 264) == 16  # cut in two, it would pay more in warm-ups than it saves
    assert launch.segment_length([512] * 4, 32 * 2, 264) == 512  # four sequences fill the wave: one segment each
    assert launch.segment_length([2047], 32 * 2, 264) % 2 == 0


def test_short_sequences_fill_the_slots_the_long_ones_leave():
    # a 128K and a 1K sequence at 32-wide tiles: the long one still gets two segments (its programs end at 1024
    # steps; the short one's 128 programs run on the 8 idle slots meanwhile), not one segment each (2048 steps)
    assert launch.segment_length([2048, 16], 32 * 4, 264) == 1024
    warm = launch.WARMUP_STEPS
    assert launch.walk_makespan([2048, 16], 1024, 32 * 4, 264) == 1024 + warm
    assert launch.walk_makespan([2048, 16], 2048, 32 * 4, 264) == 2048


def test_walk_makespan_counts_waves_of_equal_programs_and_warm_ups():
    warm = launch.WARMUP_STEPS
    # the earlier rule's 128K plan: 512 programs of 228 steps and 64 of 224 on 264 slots — a third wave; 512
    # programs warm up (two waves of them)
    assert launch.walk_makespan([2048], 228, 64, 264) == 2 * 228 + 224 + 2 * warm
    assert launch.walk_makespan([2048], 512, 64, 264) == 512 + warm
    assert launch.walk_makespan([2048], 684, 128, 264) == 684 + 680 + warm  # 680-step tails wait for a full wave
    # eight 32K sequences: more segments would not shorten the walk's four waves but add warm-ups
    assert launch.segment_length([512] * 8, 32 * 4, 264) == 512


def test_sequences_of_unequal_lengths_get_segments_by_their_makespan():
    # a 128K and a 1K sequence at 32-wide tiles: two segments for the long one (one segment each: 2048 chunks per
    # program; the earlier rule's three: 684 per program, and a second wave of 680-chunk programs)
    plan = launch.plan_segments([131072, 1024], parallel_width=128, slots=264, device="cpu")
    assert (plan.c1 - plan.c0).max().item() == 1024
    equal = launch.plan_segments([131072, 131072], parallel_width=128, slots=264, device="cpu")
    assert (equal.c1 - equal.c0).max().item() == 2048  # equal lengths: one wave of 256 programs


def test_auto_walk_scores_are_stored_from_the_threshold_up():
    from longsparse.ops.gdn.config import STORED_SCORES_MIN_CHUNKS as n

    auto = SparseGDNKernelConfig()
    assert auto.walk_scores == "auto"
    assert not launch.stores_scores(auto, n - 1) and launch.stores_scores(auto, n)
    for chunks in (1, n, 4 * n):  # the explicit choices hold at every size
        assert launch.stores_scores(SparseGDNKernelConfig(walk_scores="stored"), chunks)
        assert not launch.stores_scores(SparseGDNKernelConfig(walk_scores="inline"), chunks)


# ---- compiled on a GPU, Qwen3.5 geometry, bf16 -------------------------------------------------------------------


def _qwen_inputs(lengths, dtype=torch.bfloat16, seed=0):
    T, H, HV, D = sum(lengths), 16, 32, 128
    q, k, v, _, beta, h0 = make_gdn_inputs(
        1, T, H, HV, D, D, dtype=torch.float32, with_state=True, n_states=len(lengths), seed=seed
    )
    g = spread_decays(1, T, HV, dtype=torch.float32, seed=seed)
    gate, w = make_gate(1, T, HV, D, dtype=torch.float32, seed=seed + 1)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device="cuda")
    xs = [x.cuda() for x in (q, k, v, g, beta, h0, gate, w)]
    return [x.to(dtype) if i in (0, 1, 2, 6) else x for i, x in enumerate(xs)], cu


def _correlated_keys(k: torch.Tensor, spread: float, seed: int = 0) -> torch.Tensor:
    """Unit keys gathered around one direction per head, ``normalize(base + spread · noise)``, in ``k``'s shape,
    dtype and device: trained models' keys are often this alike (``|L|`` near 1 in intra's solve, where its tf32
    products lose most: ``benchmarks/tuning/2026-12-02/bf16_inverse_precision.py``), random unit keys never."""
    gen = torch.Generator().manual_seed(seed)
    B, T, H, D = k.shape
    base = torch.randn(1, 1, H, D, generator=gen)
    keys = torch.nn.functional.normalize(base + spread * torch.randn(B, T, H, D, generator=gen), dim=-1)
    return keys.to(device=k.device, dtype=k.dtype)


FLA_BF16_ERROR_CORRELATED = (7.9e-3, 6.8e-3)
"""FLA 0.6.0's own bf16 error (output, final state) against the float64 dense rule on the inputs of
``test_bf16_kernels_match_spec_within_dense_bf16_drift`` with correlated keys (spread 0.1), measured on the H200
(``benchmarks/tuning/2026-12-02/intra_precision/corr_diag.json``). The input-rounding drift of the naive path (2.4e-3)
understates what a bf16 kernel loses on such keys, where the chunk inverse's alternating terms cancel."""


@pytest.mark.gpu
@pytest.mark.parametrize("keys", ["random", "correlated"])
@pytest.mark.parametrize("main_pass", BF16_MAIN_PASSES)
def test_bf16_kernels_match_spec_within_dense_bf16_drift(main_pass, keys):
    """The kernels in bf16 against the specification in fp32 on the same mask: on random unit keys within twice the
    dense path's own bf16 drift; on keys correlated around one direction per head (``_correlated_keys``) within twice
    FLA's bf16 error on the same inputs (H200, 2026-12-02: walk 1.12e-2 gated, 9.5e-3 ungated; 6.6e-2 before the
    solve's refinement step)."""
    (q, k, v, g, beta, h0, gate, w), cu = _qwen_inputs([3000, 77, 64 * 70, 1])
    if keys == "correlated":
        k = _correlated_keys(k, spread=0.1)
    cfg_t = SparseGDNConfig()
    trace = spec_trace(
        q.float(), k.float(), v.float(), g, beta, cfg_t, initial_state=h0, cu_seqlens=cu, gate=gate.float(), weight=w
    )
    o, s, _, _ = launch.run_kernels(
        q,
        k,
        v,
        g,
        beta,
        None,
        h0,
        cu,
        gate=gate,
        gate_norm_weight=w,
        kernel_config=main_pass_config(main_pass),
        mask=trace.selection.mask,
    )
    if keys == "random":  # the yardstick: how far the plain dense path drifts when its inputs are bf16
        ref32, _ = naive_chunk_gated_delta_rule(
            q.float(), k.float(), v.float(), g, beta, initial_state=h0, cu_seqlens=cu
        )
        ref16, _ = naive_chunk_gated_delta_rule(q, k, v, g.bfloat16(), beta.bfloat16(), initial_state=h0, cu_seqlens=cu)
        tol_o = tol_s = max(2 * rel_err(ref16, ref32), 1e-2)
    else:
        tol_o, tol_s = (2 * e for e in FLA_BF16_ERROR_CORRELATED)
    assert rel_err(o, trace.o) <= tol_o, (rel_err(o, trace.o), tol_o)
    assert rel_err(s, trace.recurrence.final_state) <= tol_s, (rel_err(s, trace.recurrence.final_state), tol_s)
    assert o.isfinite().all()


def _coefficient_errors(ct, trace):
    """Relative error of each kept block of ``ct [NC, HV, 7, 16, 16]`` against the specification's trace."""
    errors = []
    for blk, (_, j) in enumerate(BLOCK_ORDER):
        e_Gj = trace.inputs.G[:, :, 16 * j : 16 * j + 16].exp()
        got = ct[:, :, blk].double().cpu().transpose(0, 1) * e_Gj.cpu()[..., None, :]
        errors.append(rel_err(got, trace.intra.cbar[:, :, blk].cpu()))
    return errors


@pytest.mark.gpu
def test_intra_f16_solve_is_as_accurate_as_tf32_on_alike_keys():
    """``intra_forward(f16_solve=True)`` in bf16 at the Qwen3.5 geometry: on keys at cosine ~0.99 its coefficients
    are as close to the fp32 specification as the default tf32 products' (the CPU emulation: both 1.6e-3 diagonal,
    2.2e-3 sub-diagonal); keys of norm 2 fall back to the default products."""
    from longsparse.ops.gdn.intra import intra_forward

    (q, k, v, g, beta, *_), _ = _qwen_inputs([64 * 40 + 7])
    for scale in (1.0, 2.0):
        keys = scale * _correlated_keys(k, spread=0.1)
        trace = spec_trace(q.float(), keys.float(), v.float(), g, beta, SparseGDNConfig())
        layout = trace.layout
        bos, lens = layout.token_index[:, 0].int().cuda(), layout.chunk_len.int().cuda()
        args = (keys[0].contiguous(), v[0].contiguous(), g[0].contiguous(), beta[0].contiguous(), bos, lens)
        ct_tf32, _, score_tf32 = intra_forward(*args, f16_solve=False)
        ct_f16, _, score_f16 = intra_forward(*args, f16_solve=True)
        ct_default, _, _ = intra_forward(*args)  # 16-bit inputs: the fp16 chain is the default
        assert torch.equal(ct_default, ct_f16)
        if scale == 1.0:
            for e16, e32 in zip(_coefficient_errors(ct_f16, trace), _coefficient_errors(ct_tf32, trace)):
                assert e16 <= 1.25 * e32 + 1e-4, (e16, e32)
            assert rel_err(score_f16, score_tf32) <= 1e-2
        else:
            assert rel_err(ct_f16.float(), ct_tf32.float()) <= 1e-6
            assert rel_err(score_f16, score_tf32) <= 1e-6


@pytest.mark.gpu
@pytest.mark.parametrize("alike", [False, True], ids=["random-keys", "alike-keys"])
def test_bounded_inputs_is_bit_equal_on_unit_keys_and_sigmoid_beta(alike):
    """The op as the model's layers call it, with ``bounded_inputs`` (intra's fp16 solve with no range test), at the
    Qwen3.5 geometry in bf16, varlen with an initial state: on keys it normalises and β in [0, 1] every chunk passes
    the test anyway, so the outputs, final states and selections equal the tested form's bit for bit."""
    (q, k, v, g, beta, h0, gate, w), cu = _qwen_inputs([64 * 40 + 7, 64 * 9])
    if alike:
        k = _correlated_keys(k, spread=0.1)
    assert float(beta.min()) >= 0 and float(beta.max()) <= 1
    runs = [
        sparse_chunk_gated_delta_rule(
            q, k, v, g, beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
            cu_seqlens=cu, gate=gate, gate_norm_weight=w, return_stats=True, bounded_inputs=bounded,
        )
        for bounded in (False, True)
    ]  # fmt: skip
    (o0, s0, st0), (o1, s1, st1) = runs
    assert torch.isfinite(o1).all()
    assert torch.equal(o0, o1) and torch.equal(s0, s1) and torch.equal(st0.mask, st1.mask)


@pytest.mark.gpu
def test_gpu_selection_equals_spec_in_fp32():
    (q, k, v, g, beta, h0, gate, w), cu = _qwen_inputs([64 * 100 + 3, 64 * 64], dtype=torch.float32)
    trace = spec_trace(q, k, v, g, beta, SparseGDNConfig(), cu_seqlens=cu, gate=gate, weight=w)
    _, _, sel, _ = launch.run_kernels(q, k, v, g, beta, None, None, cu, gate=gate, gate_norm_weight=w)
    assert torch.equal(sel.tier, trace.selection.tier)
    agree = (sel.mask == trace.selection.mask).float().mean().item()
    assert agree == 1.0, agree


@pytest.mark.gpu
@pytest.mark.parametrize(
    "dtype, tol, main_pass",
    [
        pytest.param(torch.float32, 1e-5, "walk", id="walk-fp32"),
        pytest.param(torch.bfloat16, 2**-8, "walk", id="walk-bf16"),
        pytest.param(torch.float32, 1e-5, "csr", id="csr-fp32"),
        pytest.param(torch.bfloat16, 2**-8, "csr", id="csr-bf16"),
    ],
)
def test_segment_warmup_truncation_is_below_bf16_resolution(dtype, tol, main_pass):
    """Entry states warmed up from e^-12 back (the default) against from the sequence start: in fp32 the outputs
    move by about e^-12; in bf16 by less than one bf16 step (the state's last bits flip some bf16 roundings)."""
    (q, k, v, g, beta, h0, gate, w), cu = _qwen_inputs([32768 + 5], dtype=dtype)
    exact = SparseGDNConfig(warmup_log_decay=None)
    kernel_cfg = SparseGDNKernelConfig(main_pass=main_pass)
    o_x, s_x = sparse_chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu, config=exact,
        kernel_config=kernel_cfg,
    )  # fmt: skip
    o_t, s_t = sparse_chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu, kernel_config=kernel_cfg
    )
    assert rel_err(o_t, o_x) <= tol
    assert rel_err(s_t, s_x) <= tol


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 3])
@pytest.mark.parametrize("main_pass", BF16_MAIN_PASSES)
def test_batch_rows_equal_varlen(B, main_pass):
    (q, k, v, g, beta, h0, gate, w), _ = _qwen_inputs([4096 * B])
    T = 4096
    rows = [x.reshape(B, T, *x.shape[2:]) for x in (q, k, v, g, beta, gate)]
    h0 = h0[:1].expand(B, -1, -1, -1).contiguous()
    cfg = main_pass_config(main_pass)
    o_b, s_b = sparse_chunk_gated_delta_rule(
        *rows[:5], initial_state=h0, output_final_state=True, gate=rows[5], gate_norm_weight=w, kernel_config=cfg
    )
    cu = torch.arange(B + 1, device="cuda") * T
    o_v, s_v = sparse_chunk_gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        initial_state=h0,
        output_final_state=True,
        cu_seqlens=cu,
        gate=gate,
        gate_norm_weight=w,
        kernel_config=cfg,
    )
    assert torch.equal(o_b.reshape(o_v.shape), o_v) and torch.equal(s_b, s_v)
    assert not math.isnan(float(o_v.float().abs().max()))


def _spec_stages_bf16(lengths, seed=0):
    (q, k, v, g, beta, h0, gate, w), cu = _qwen_inputs(lengths, seed=seed)
    trace = spec_trace(
        q.float(),
        k.float(),
        v.float(),
        g,
        beta,
        SparseGDNConfig(),
        cu_seqlens=cu,
        gate=gate.float(),
        weight=w,
    )
    return (q, k, v, g, beta, h0, gate, w), cu, trace


@pytest.mark.gpu
def test_bf16_intra_stage_matches_spec():
    """Stage 1 alone in bf16: coefficients, chunk decays and tail scores against the specification (fp32)."""
    from longsparse.ops.gdn.intra import intra_forward

    (q, k, v, g, beta, *_), cu, trace = _spec_stages_bf16([64 * 40 + 7])
    layout = trace.layout
    ct, gamma, score = intra_forward(k[0], v[0], g[0], beta[0], layout.token_index[:, 0].int(), layout.chunk_len.int())
    for b, (_, j) in enumerate(BLOCK_ORDER):
        e_Gj = trace.inputs.G[:, :, 16 * j : 16 * j + 16].exp()
        got = ct[:, :, b].float().transpose(0, 1) * e_Gj[..., None, :]
        assert rel_err(got, trace.intra.cbar[:, :, b]) <= 1e-2, b
    assert rel_err(gamma.T, trace.inputs.gamma) <= 1e-5
    assert rel_err(score.T, trace.intra.score) <= 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("segment_chunks", [None, 100000], ids=["segments", "one-segment"])
@pytest.mark.parametrize("main_pass", BF16_MAIN_PASSES)
def test_bf16_main_pass_on_spec_coefficients_matches_spec(segment_chunks, main_pass):
    """Stage 3 alone in bf16, fed the specification's own coefficients, decays and mask."""
    (q, k, v, g, beta, *_), cu, trace = _spec_stages_bf16([64 * 40 + 7])
    layout = trace.layout
    G = trace.inputs.G  # [HV, NC, 64]
    blocks = []
    for b, (_, j) in enumerate(BLOCK_ORDER):
        blocks.append(trace.intra.cbar[:, :, b] * (-G[:, :, 16 * j : 16 * j + 16]).exp()[..., None, :])
    ct = torch.stack(blocks, dim=2).transpose(0, 1).contiguous().to(torch.bfloat16)  # [NC, HV, 7, 16, 16]
    gamma = trace.inputs.gamma.T.contiguous().float()
    T = q.shape[1]
    o, _ = launch._main_pass(
        q[0],
        k[0],
        v[0],
        g[0].float(),
        ct,
        gamma,
        trace.selection,
        layout,
        [T],
        layout.token_index[:, 0].int(),
        layout.chunk_len.int(),
        None,
        q.shape[-1] ** -0.5,
        SparseGDNConfig(),
        main_pass_config(main_pass, segment_chunks=segment_chunks),
    )
    assert rel_err(o.view(1, T, *o.shape[1:]), trace.o) <= 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize(
    "lengths", [[4096 + 5, 64 * 190 + 33, 1, 16384], [33000]], ids=["varlen-4K-12K-1-16K", "T33000"]
)
def test_bf16_csr_pass_equals_walk_pass_with_the_gpu_selector(lengths):
    """Both main passes behind the public op, the GPU selector's own masks (so the csr pass's event buffers are
    sized by the tier table's bound): the outputs differ only by the bf16 rounding of the csr pass's stored states
    and U' (within 2^-8, bf16's relative spacing; measured 2.9e-3 on the varlen case, where the dense path's own
    bf16 drift is 2.4e-3); the final states (kept in fp32 registers by both) agree closely. The walk forms its
    correction as the csr pass does (``walk_correction="w"``); the other form rounds other intermediates to bf16
    (4.4e-3 from the csr pass on the varlen case, where both are within 3.5e-3 of the specification at 4K)."""
    (q, k, v, g, beta, h0, gate, w), cu = _qwen_inputs(lengths)
    args = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu, gate=gate, gate_norm_weight=w)
    walk = SparseGDNKernelConfig(main_pass="walk", walk_correction="w")
    o_w, s_w = sparse_chunk_gated_delta_rule(q, k, v, g, beta, **args, kernel_config=walk)
    o_c, s_c, st = sparse_chunk_gated_delta_rule(
        q, k, v, g, beta, **args, kernel_config=SparseGDNKernelConfig(main_pass="csr"), return_stats=True
    )
    assert rel_err(o_c, o_w) <= 2**-8
    assert rel_err(s_c, s_w) <= 2**-8
    assert o_c.isfinite().all() and st.num_snapshots == st.num_events > 0


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["warp-specialised", "output-role", "output-role-inline", "single", "tile32"])
@pytest.mark.parametrize("segment_chunks", [None, 2, 100000], ids=["default", "seg2", "one-segment"])
@pytest.mark.parametrize("output", ["grouped", "per_chunk"])
def test_bf16_gluon_walk_equals_triton_walk(output, segment_chunks, form):
    """The Gluon walk against the Triton walk (K S correction, stored scores) through the public op: varlen with a
    partial chunk, a one-token and a one-chunk sequence, initial and final states, several segments per sequence
    and one. Both round the same intermediates to bf16 (S, W, U, U ⊙ e^{γ − G}, S_read) and keep the state in fp32;
    they differ in the products' fp32 accumulation order and the exp / scan code, which moves a rounded
    intermediate by at most one bf16 step (2^-8 relative) now and then — and the walk's transitions contract, so
    such steps do not pile up. Hence 2^-8, bf16's relative spacing, as between the other walk forms. Forms: the
    warp-specialised walk (64-wide tiles, the default), the same with the output's products in their own warpgroup
    (``SparseGDNKernelConfig.walk_output_role``), that form forming the scores itself (``walk_scores="inline"``: intra
    writes the tiles' Ct rows alone), its single-warpgroup form at 64 and at 32 (which it runs)."""
    role = form in ("output-role", "output-role-inline")
    warp_specialised = role or form == "warp-specialised"
    block_v = 32 if form == "tile32" else 64
    (q, k, v, g, beta, h0, gate, w), cu = _qwen_inputs([4096 + 5, 64 * 30 + 33, 1, 64])
    args = dict(initial_state=h0, output_final_state=True, cu_seqlens=cu, gate=gate, gate_norm_weight=w)
    args.update(config=SparseGDNConfig(output=output))
    base = SparseGDNKernelConfig(
        walk_scores="stored", segment_chunks=segment_chunks, block_v=block_v, walk_kernel="triton"
    )
    o_t, s_t = sparse_chunk_gated_delta_rule(q, k, v, g, beta, **args, kernel_config=base)
    scores = "inline" if form == "output-role-inline" else "stored"
    gluon = dataclasses.replace(
        base, walk_kernel="gluon", walk_scores=scores, walk_output_role=role, walk_warp_specialised=warp_specialised
    )
    o_g, s_g = sparse_chunk_gated_delta_rule(q, k, v, g, beta, **args, kernel_config=gluon)
    assert o_g.isfinite().all() and s_g.isfinite().all()
    assert rel_err(o_g, o_t) <= 2**-8, rel_err(o_g, o_t)
    assert rel_err(s_g, s_t) <= 2**-8, rel_err(s_g, s_t)


def test_gluon_walk_names_what_it_cannot_run():
    """``walk_gluon.supports`` says why (without importing Gluon: this runs under Triton's interpreter too)."""
    from longsparse.ops.gdn import walk_gluon

    q, v = torch.zeros(1, 64, 2, 128), torch.zeros(1, 64, 4, 128)
    assert "dtype" in walk_gluon.supports(q, v)
    assert "head dims" in walk_gluon.supports(q[..., :64].bfloat16(), v.bfloat16())
    assert "block_v" in walk_gluon.supports(q.bfloat16(), v.bfloat16(), block_v=16)
    if not torch.cuda.is_available():
        assert "Hopper" in walk_gluon.supports(q.bfloat16(), v.bfloat16())
    elif torch.cuda.get_device_capability()[0] == 9:
        assert walk_gluon.supports(q.bfloat16().cuda(), v.bfloat16().cuda()) is None


def test_gluon_walk_descriptors_describe_its_tiles_with_one_layout_per_block():
    """The walk's TMA descriptors (built on CPU tensors too): ``[64, K]`` blocks of q and k, ``[64, block_v]`` of v,
    one tile of scores and Ct per chunk and value head, and o as v where given; their shared layouts are built once
    per block shape."""
    pytest.importorskip("triton.experimental.gluon.nvidia.hopper", reason="needs Gluon")
    from longsparse.ops.gdn import walk_gluon

    T, H, HV = 256, 2, 4
    q, v = torch.zeros(T, H, 128, dtype=torch.bfloat16), torch.zeros(T, HV, 128, dtype=torch.bfloat16)
    tiles = torch.zeros(T // 64, HV, walk_gluon.TILE_ROWS, 64, dtype=torch.bfloat16)
    first, again = (walk_gluon.descriptors(q, q, v, tiles, 64) for _ in range(2))
    assert [d.block_shape for d in first] == [[64, 128], [64, 128], [64, 64], [walk_gluon.TILE_ROWS, 64]]
    assert [list(d.shape) for d in first] == [[T, H * 128], [T, H * 128], [T, HV * 128], [T // 64 * HV * 128, 64]]
    assert all(a.layout is b.layout for a, b in zip(first, again))
    assert first[0].layout is first[1].layout and first[2].layout is not first[0].layout
    # the output role's stores: o described as v is, in the same blocks and layout
    *same, o_desc = walk_gluon.descriptors(q, q, v, tiles, 64, o=torch.zeros_like(v))
    assert [d.block_shape for d in same] == [d.block_shape for d in first]
    assert o_desc.block_shape == [64, 64] and list(o_desc.shape) == [T, HV * 128] and o_desc.layout is first[2].layout


def test_walk_kernel_auto_takes_the_gluon_walk_only_where_it_runs():
    """``launch.resolve_walk``: "auto" is the Triton walk wherever the Gluon walk cannot run the call (CPU, fp32,
    other head dims, the "w" correction, inline scores, the csr pass), with the Triton walk's tile (32, at most V);
    "gluon" there is an error naming why; an explicit ``block_v`` is kept."""
    from longsparse.ops.gdn.launch import resolve_walk

    q, v = torch.zeros(64, 2, 128, dtype=torch.bfloat16), torch.zeros(64, 4, 128, dtype=torch.bfloat16)
    assert resolve_walk(SparseGDNKernelConfig(), q.float(), v.float()) == ("triton", 32)
    assert resolve_walk(SparseGDNKernelConfig(block_v=64), q.float(), v.float()) == ("triton", 64)
    assert resolve_walk(SparseGDNKernelConfig(), q[..., :16].float(), v[..., :16].float()) == ("triton", 16)
    assert resolve_walk(SparseGDNKernelConfig(main_pass="csr"), q, v) == ("triton", 32)
    with pytest.raises(ValueError, match="walk_kernel='gluon' cannot run this call: dtype"):
        resolve_walk(SparseGDNKernelConfig(walk_kernel="gluon"), q.float(), v.float())
    on_hopper = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9
    if on_hopper and walk_gluon_runs():
        q, v = q.cuda(), v.cuda()
        assert resolve_walk(SparseGDNKernelConfig(), q, v) == ("gluon", 64)
        assert resolve_walk(SparseGDNKernelConfig(block_v=32), q, v) == ("triton", 32)  # the output role needs 64
        assert resolve_walk(SparseGDNKernelConfig(block_v=32, walk_output_role=False), q, v) == ("gluon", 32)
        assert resolve_walk(SparseGDNKernelConfig(walk_correction="w"), q, v) == ("triton", 32)
        assert resolve_walk(SparseGDNKernelConfig(walk_scores="inline"), q, v) == (
            "gluon",
            64,
        )  # the output role forms them
        assert resolve_walk(SparseGDNKernelConfig(walk_scores="inline", walk_output_role=False), q, v) == ("triton", 32)
        with pytest.raises(ValueError, match="K S correction"):
            resolve_walk(SparseGDNKernelConfig(walk_kernel="gluon", walk_correction="w"), q, v)
    else:
        assert resolve_walk(SparseGDNKernelConfig(), q, v) == ("triton", 32)


def test_walk_kernel_auto_takes_the_triton_walk_for_short_batches(monkeypatch):
    """Where the Gluon walk could run (its ``supports`` patched to say so, as on a Hopper GPU), "auto" still takes
    the Triton walk below ``GLUON_MIN_CHUNKS`` chunks in the batch, and the Gluon walk from there up or when the
    chunk count is not given; an explicit "gluon" is honoured at any length."""
    from longsparse.ops.gdn import launch, walk_gluon

    monkeypatch.setattr(walk_gluon, "supports", lambda q, v, block_v=64: None)
    q, v = torch.zeros(64, 2, 128, dtype=torch.bfloat16), torch.zeros(64, 4, 128, dtype=torch.bfloat16)
    n = launch.GLUON_MIN_CHUNKS
    assert launch.resolve_walk(SparseGDNKernelConfig(), q, v, n - 1) == ("triton", 32)
    assert launch.resolve_walk(SparseGDNKernelConfig(), q, v, n) == ("gluon", 64)
    assert launch.resolve_walk(SparseGDNKernelConfig(), q, v) == ("gluon", 64)
    assert launch.resolve_walk(SparseGDNKernelConfig(walk_kernel="gluon"), q, v, 1) == ("gluon", 64)
    assert launch.resolve_walk(SparseGDNKernelConfig(walk_kernel="triton"), q, v, n) == ("triton", 32)
    # the output role: the warp-specialised walk at 64-wide tiles; scores formed by the walk only with it
    role = SparseGDNKernelConfig(walk_output_role=True)
    assert launch.resolve_walk(role, q, v, n) == ("gluon", 64)
    assert launch.resolve_walk(dataclasses.replace(role, block_v=32), q, v, n) == ("triton", 32)
    with pytest.raises(ValueError, match="walk_output_role needs the warp-specialised Gluon walk at block_v=64"):
        launch.resolve_walk(dataclasses.replace(role, block_v=32, walk_kernel="gluon"), q, v, n)
    inline = SparseGDNKernelConfig(walk_scores="inline", walk_output_role=False)
    assert launch.resolve_walk(inline, q, v, n) == ("triton", 32)
    with pytest.raises(ValueError, match="needs the Gluon walk's output role"):
        launch.resolve_walk(dataclasses.replace(inline, walk_kernel="gluon"), q, v, n)
    assert launch.resolve_walk(dataclasses.replace(inline, walk_output_role=True), q, v, n) == ("gluon", 64)
    assert launch.resolve_walk(dataclasses.replace(role, walk_warp_specialised=False), q, v, n) == ("triton", 32)
    # by default the output role forms the scores (intra then writes the tiles' Ct rows alone), unless asked to
    # read them stored
    assert SparseGDNKernelConfig().walk_output_role and launch.gluon_forms_scores(SparseGDNKernelConfig())
    assert launch.gluon_forms_scores(SparseGDNKernelConfig(walk_scores="inline"))
    assert not launch.gluon_forms_scores(SparseGDNKernelConfig(walk_scores="stored"))
    assert not launch.gluon_forms_scores(SparseGDNKernelConfig(walk_output_role=False))


@needs_kernels
def test_intra_keeps_no_blocks_where_the_gluon_walk_reads_the_tiles():
    """``launch.run_intra``: for the Gluon walk on stored scores intra writes the 128-row tiles (scores, then the
    dense Ct) and no kept blocks (``ct`` None), the tiles equal to those written beside the kept blocks, γ and tail
    scores unchanged; where the walk forms the scores (the default), the same Ct rows alone; for
    the Triton walk it keeps the blocks. A main pass without ``ct`` and without the Gluon walk's tiles is refused by
    name."""
    from longsparse.ops.gdn import walk_gluon
    from longsparse.ops.gdn.intra import intra_forward

    q, k, v, g, beta, *_, cu = _inputs([200, 64])
    qf, kf, vf, gf, bf = _to([q[0], k[0], v[0], g[0], beta[0]], torch.float32)
    plan = launch.plan_launch(1, q.shape[1], cu.to(DEV), torch.device(DEV))
    bos, clen, NC, HV = plan.chunk_bos, plan.chunk_len, plan.layout.NC, v.shape[2]
    config = SparseGDNKernelConfig(walk_scores="stored")  # the Gluon walk reads stored scores
    ct, gamma, score, tiles = launch.run_intra(config, ("gluon", 64), qf, kf, vf, gf, bf, bos, clen)
    assert ct is None and tiles.shape == (NC, HV, walk_gluon.TILE_ROWS, 64)
    beside = torch.empty_like(tiles)
    kept = intra_forward(kf, vf, gf, bf, bos, clen, q=qf, scores=beside, max_registers=config.intra_registers)
    assert torch.equal(tiles, beside) and torch.equal(gamma, kept[1]) and torch.equal(score, kept[2])
    inline = SparseGDNKernelConfig()  # by default its output role forms the scores: intra writes the Ct rows alone
    ct_i, gamma_i, score_i, tiles_i = launch.run_intra(inline, ("gluon", 64), qf, kf, vf, gf, bf, bos, clen)
    assert ct_i is None and torch.equal(tiles_i[:, :, 64:], tiles[:, :, 64:])
    assert torch.equal(gamma_i, gamma) and torch.equal(score_i, score)
    ct_t, _, _, scores_t = launch.run_intra(inline, ("triton", 32), qf, kf, vf, gf, bf, bos, clen)
    assert torch.equal(ct_t, kept[0]) and scores_t is None  # 5 chunks: below STORED_SCORES_MIN_CHUNKS
    method = SparseGDNConfig()
    selection, _ = launch.run_selection(plan, score, gamma, q.shape[2], method, details=False, kernel_config=config)
    with pytest.raises(ValueError, match="ct .* is needed unless the Gluon walk runs"):
        launch._main_pass(
            qf, kf, vf, gf, None, gamma, selection, plan.layout, plan.lengths, bos, clen, None, 1.0, method, config,
            plan=plan, walk=("triton", 32),
        )  # fmt: skip


def test_scores_buffer_follows_the_walk(monkeypatch):
    """``launch.scores_buffer``: the Gluon walk's tiles hold each chunk's scores, then its dense Ct ([NC, HV, 128,
    64]); the Triton walk's stored scores are [NC, HV, 64, 64]; a walk forming its scores inline, the csr pass and an
    empty batch get none. ``walk_gluon.run_walk`` refuses tiles without the Ct rows, and the output role or the scores
    it forms where they cannot run, by name, before any launch."""
    from longsparse.ops.gdn import launch, walk_gluon

    monkeypatch.setattr(walk_gluon, "supports", lambda q, v, block_v=64: None)  # as on a Hopper GPU
    q, v = torch.zeros(64, 2, 128, dtype=torch.bfloat16), torch.zeros(64, 4, 128, dtype=torch.bfloat16)
    n = launch.GLUON_MIN_CHUNKS
    tiles = launch.scores_buffer(SparseGDNKernelConfig(), q, v, n)
    assert tiles.shape == (n, 4, walk_gluon.TILE_ROWS, 64) and tiles.dtype == q.dtype
    stored = launch.scores_buffer(SparseGDNKernelConfig(walk_kernel="triton", walk_scores="stored"), q, v, n)
    assert stored.shape == (n, 4, 64, 64)
    assert launch.scores_buffer(SparseGDNKernelConfig(walk_kernel="triton", walk_scores="inline"), q, v, n) is None
    assert launch.scores_buffer(SparseGDNKernelConfig(main_pass="csr"), q, v, n) is None
    assert launch.scores_buffer(SparseGDNKernelConfig(), q, v, 0) is None
    with pytest.raises(ValueError, match=r"tiles \(256, 4, 64, 64\) must be \[NC, HV, 128, 64\]"):
        walk_gluon.run_walk(
            q, q, v, None, None, None, None, None, stored, None, None, None, None, 1.0,
            P=2, CMAX=n, block_v=64, has_h0=False, has_entry=False, grouped=True,
        )  # fmt: skip
    # the output role and the scores it forms: refused by name where they cannot run, before any launch
    for block_v, role, inline, why in ((32, True, False, "walk_output_role needs"), (64, False, True, "output role")):
        with pytest.raises(ValueError, match=why):
            walk_gluon.run_walk(
                q, q, v, None, None, None, None, None, tiles, None, None, None, None, 1.0,
                P=2, CMAX=n, block_v=block_v, has_h0=False, has_entry=False, grouped=True, output_role=role,
                inline_scores=inline,
            )  # fmt: skip


def walk_gluon_runs() -> bool:
    """This Triton builds Gluon kernels (compiled mode, Gluon for Hopper importable)."""
    from longsparse.ops.gdn import walk_gluon

    return walk_gluon._gluon_missing() is None


def test_dense_coefficients_place_the_kept_blocks():
    """The dense ``Ct`` the Gluon walk fetches by TMA holds the 7 kept blocks where ``fused._coef_tile`` puts them
    (intra.py's order: blocks (b, b), then (b, b − 1)) and zeros elsewhere."""
    from longsparse.ops.gdn import walk_gluon

    ct = torch.randn(3, 2, 7, 16, 16)
    dense = walk_gluon.dense_coefficients(ct).view(3, 2, 4, 16, 4, 16)
    for bi in range(4):
        for bj in range(4):
            want = ct[:, :, bi] if bi == bj else ct[:, :, bi + 3] if bi == bj + 1 else torch.zeros(3, 2, 16, 16)
            assert torch.equal(dense[:, :, bi, :, bj, :], want), (bi, bj)
    assert [BLOCK_ORDER[b] for b in range(7)] == [(0, 0), (1, 1), (2, 2), (3, 3), (1, 0), (2, 1), (3, 2)]


@pytest.mark.gpu
def test_intra_register_caps_change_no_result():
    """Capping the intra kernel's registers (``intra_registers``: more programs per SM, maybe spills) changes where
    values live, not the arithmetic: bit-equal outputs and final states of the whole op."""
    (q, k, v, g, beta, h0, gate, w), cu = _qwen_inputs([64 * 300 + 5, 64 * 90])
    outs = []
    for cap in (None, 168, 128):
        outs.append(
            sparse_chunk_gated_delta_rule(
                q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu, gate=gate,
                gate_norm_weight=w, kernel_config=SparseGDNKernelConfig(intra_registers=cap),
            )
        )  # fmt: skip
    for o, s in outs[1:]:
        assert torch.equal(o, outs[0][0]) and torch.equal(s, outs[0][1])


def test_intra_register_cap_is_checked():
    assert (
        SparseGDNKernelConfig().intra_registers == 128
        and SparseGDNKernelConfig(intra_registers=None).intra_registers is None
    )
    for bad in (100, 16, 256, True, 168.0):
        with pytest.raises(ValueError, match="intra_registers"):
            SparseGDNKernelConfig(intra_registers=bad)
