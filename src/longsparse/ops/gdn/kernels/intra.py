"""SparseGDN intra stage on the GPU, its kernels (launched by ``intra.intra_forward``): the block-adjacent local
solve and the tail-16 score of every chunk.

One program per (chunk, head pair): the pair's value heads share the chunk's keys, so their Gram blocks are formed once.
Per value head, with ``M = I + A_Δ`` (SparseGDN (Zhuang et al., arXiv:2610.41420) Eq. 5) split into its strictly lower
diagonal-block part ``L`` (the four 16×16 blocks on the diagonal) and its sub-diagonal blocks ``E`` (the three blocks
``M_{i,i-1}``), the kept blocks of ``C ≈ M⁻¹`` (Eqs. 7–8) are

    D = (I + L)⁻¹ = (I − L)(I + L²)(I + L⁴)(I + L⁸)      (L¹⁶ = 0: every diagonal block is 16×16 nilpotent)
    C = D − D E D                                      (its diagonal blocks are C_ii, its sub-diagonal ones C_{i,i-1})

on the tensor cores: IEEE fp32 for fp32 inputs, plain tf32 for 16-bit ones. Two kernels compute it:

* :func:`sparse_gdn_fwd_kernel_intra_blocks` (the default) keeps only the blocks that are not zero — ``D`` is
  block-diagonal and ``D E D`` block-subdiagonal — as ``[4, 16, 16]`` batches, so each product is a quarter of a
  64×64 one and so are its registers (sm_90, 4 warps: 182 registers uncapped, 128 without spills under the op's
  cap, ``SparseGDNKernelConfig.intra_registers``). The sub-diagonal block
  ``−D_i E_i D_{i−1}`` takes the previous block's inverse from the lanes that computed it (``tl.gather``).
* :func:`sparse_gdn_fwd_kernel_intra` works on whole 64×64 tiles (six and two 64×64 products; 255 registers and
  1.5 KB of spills at 4 warps).

Measured on the H200 at T = 128K (bf16, Qwen3.5 geometry; log in docs/gdn-kernels.md): whole tiles 2.42 ms, kept
blocks 1.67 ms; earlier, whole tiles in 3-pass tf32 9.8 ms at a coefficient error of 1.48e-3 against the fp32
solve, plain tf32 1.50e-3 — the bf16 storage of ``Ct`` dominates the error either way.

Stored per (chunk, value head): the seven kept blocks of ``Ct = C diag(β)`` in ``intra.BLOCK_ORDER`` (so that
``U = Ct V`` and ``W = Ct diag(e^G) K``), the chunk decay ``γ = G_last`` and the tail score ``s = ‖U[48:64]‖_F``
(Eq. 9). U itself is not stored: the main pass (fused.py) recomputes it where it walks the chunk. Where the walk reads
stored intra-chunk scores, the kept-block kernel stores them too (``A = Q Kᵀ ⊙ e^{G_i − G_j}`` on the causal
triangle, ``[NC, HV, 64, 64]``): its programs hold the chunk's keys already (H200, 128K: 1.73 ms against 1.81 for
intra and a separate scores kernel).
"""

from __future__ import annotations

from ...._optional import require

triton = require("triton", "SparseGDN's GPU kernels")
import triton.language as tl  # noqa: E402


@triton.jit
def _mm(a, b, IEEE: tl.constexpr):
    """Product with fp32 accumulation; operands in the input dtype (fp32 inputs: full-precision products)."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _mm32(a, b, IEEE: tl.constexpr, TF32X3: tl.constexpr, F16: tl.constexpr = False):
    """fp32 × fp32 product of the solve: IEEE for fp32 inputs, else 3-pass tf32 (about fp32) or plain tf32; ``F16``:
    operands rounded to fp16 (to nearest, where tf32 truncates; same 10-bit mantissa), fp32 accumulation — the
    16-bit MMA, whose accumulator feeds the next product's left operand without the warp shuffles a tf32 operand
    needs."""
    if F16:
        return tl.dot(a.to(tl.float16), b.to(tl.float16))
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    if TF32X3:
        return tl.dot(a, b, input_precision="tf32x3")
    return tl.dot(a, b, input_precision="tf32")


@triton.jit
def _block_coords():
    """Row/column indices of a 64×64 tile and their 16-row block indices."""
    i = tl.arange(0, 64)[:, None]
    j = tl.arange(0, 64)[None, :]
    return i, j, i // 16, j // 16


@triton.jit
def _kept_offsets(i, j, bi, bj):
    """Offset of each kept element inside the 7 stored 16×16 blocks, and the kept mask (diagonal + sub-diagonal)."""
    kept = (bj == bi) | (bj == bi - 1)
    blk = tl.where(bj == bi, bi, bi + 3)
    return blk * 256 + (i % 16) * 16 + (j % 16), kept


@triton.jit
def _diag_inverse(
    L, eye, IEEE: tl.constexpr, TF32X3: tl.constexpr, REFINE: tl.constexpr = False, F16: tl.constexpr = False
):
    """``(I + L)⁻¹ = (I − L)(I + L²)(I + L⁴)(I + L⁸)`` for ``L`` nilpotent of order ≤ 16: the four strictly lower
    16×16 blocks ``[4, 16, 16]``, or the 64×64 tile holding them on its diagonal.

    ``REFINE``: one Newton step ``D + D (I − (I + L) D)`` after the chain, two more products. The chain's tf32
    products truncate their operands to 10 mantissa bits, and when keys are alike (``|L|`` near 1) the alternating
    terms of the inverse cancel: measured on the H200 with keys at cosine ~0.99, the diagonal blocks' error rose to
    8e-3 and the sub-diagonal blocks' (``D_b E_b D_{b−1}``, tiny beside its factors) to 7.7e-2. With the step: 1.6e-3
    and 3.6e-3, the bf16 storage alone being 1.5e-3 (docs/kernel-log.md, accuracy on alike keys).
    ``F16``: every product on fp16 operands (:func:`_mm32`)."""
    L2 = _mm32(L, L, IEEE, TF32X3, F16)
    L4 = _mm32(L2, L2, IEEE, TF32X3, F16)
    L8 = _mm32(L4, L4, IEEE, TF32X3, F16)
    D = _mm32(eye - L, eye + L2, IEEE, TF32X3, F16)
    D = _mm32(D, eye + L4, IEEE, TF32X3, F16)
    D = _mm32(D, eye + L8, IEEE, TF32X3, F16)
    if REFINE:
        D += _mm32(D, eye - _mm32(eye + L, D, IEEE, TF32X3, F16), IEEE, TF32X3, F16)
    return D


@triton.jit
def _split_tf32(x):
    """``x = hi + lo`` in fp32, ``hi`` being what a tf32 product reads of ``x`` (its 13 low mantissa bits cleared:
    the tensor cores truncate fp32 operands) and ``lo`` the rest, itself read by a tf32 product to 2^-22 of ``x``."""
    hi = (x.to(tl.int32, bitcast=True) & -8192).to(tl.float32, bitcast=True)
    return hi, x - hi


@triton.jit
def _block_coefficients(
    gram, gram_sub, b, G2, prev_rows, strict, has_sub, eye, prev_blocks,
    IEEE: tl.constexpr, TF32X3: tl.constexpr, REFINE: tl.constexpr, SUB_SPLIT: tl.constexpr, FAST: tl.constexpr,
    F16: tl.constexpr,
):  # fmt: skip
    """``(Ct_diag, Ct_sub)``, each ``[4, 16, 16]``: block ``b``'s ``D_b diag(β_b)`` and ``C_{b,b−1} diag(β_{b−1}) =
    −D_b E_b (D_{b−1} diag(β_{b−1}))``, from the Gram blocks ``K_b K_bᵀ`` and ``K_b K_{b−1}ᵀ``, β and the base-2
    log-decays ``G2``: the strictly lower diagonal blocks ``L`` and the sub-diagonal blocks ``E`` (block 0's zero);
    block ``b − 1``'s log-decays and factor come from the lanes holding block ``b − 1`` (``tl.gather`` along the
    block axis with ``prev_rows`` / ``prev_blocks``). ``L`` and ``E`` are formed here, each just before its products
    (registers: a caller solving twice keeps only their inputs live)."""
    L = _decayed(gram, b, G2, G2, strict, FAST)
    D = _diag_inverse(L, eye, IEEE, TF32X3, REFINE, F16)
    Ct_diag = D * b[:, None, :]
    # every entry of E is causal: row block b > column block b − 1
    E = _decayed(gram_sub, b, G2, tl.gather(G2, prev_rows, 0), has_sub, FAST)
    if SUB_SPLIT:  # E in two tf32 parts: its truncation is most of what remains of Ct_sub's error on alike keys
        E_hi, E_lo = _split_tf32(E)
        DE = _mm32(D, E_hi, IEEE, TF32X3) + _mm32(D, E_lo, IEEE, TF32X3)
    else:
        DE = _mm32(D, E, IEEE, TF32X3)
    Ct_sub = -_mm32(DE, tl.gather(Ct_diag, prev_blocks, 0), IEEE, TF32X3)
    return Ct_diag, Ct_sub


F16_SOLVE_BOUND = tl.constexpr(1.03125)
"""``F16_SOLVE`` takes fp16 products for a value head's chunk where ``max |β| · max |k|² <= F16_SOLVE_BOUND``, hence
``|L_ij| <= ρ = 1.03125``: every term of the inverse's chain is then a partial sum of ``Σ_p (−L)^p`` with
``|(L^p)_ij| <= ρ^p C(i − j − 1, p − 1)``, at most ``ρ (1 + ρ)^14 < 2.1e4`` — inside fp16's 65504. L2-normalised
keys (bf16: ``|k|²`` within ~1e-2 of 1) and ``|β| <= 1`` always pass. (The decays ``e^{G_i − G_j}``, ``i >= j``,
are at most 1 for GDN's gates ``g <= 0``.)"""


LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _exp2(x, FAST: tl.constexpr):
    """``2^x`` in fp32: with ``FAST`` one ``ex2.approx.ftz`` (results below 2^-126 flush to 0), the instruction
    ``tl.exp`` also ends in, without the four instructions that keep its subnormal results; else ``tl.exp2`` (the
    interpreter has no inline assembly)."""
    if FAST:
        return tl.inline_asm_elementwise(
            "ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    return tl.exp2(x)


@triton.jit
def _decayed(gram, b, G_row, G_col, keep, FAST: tl.constexpr):
    """``[4, 16, 16]`` blocks of ``diag(β) K Kᵀ ⊙ e^{G_r − G_c}`` where ``keep`` (zero elsewhere, where the exponent
    could overflow), with the log-decays ``G`` given in base 2 (``G · log2 e``)."""
    return tl.where(
        keep, b[:, :, None] * gram * _exp2(tl.where(keep, G_row[:, :, None] - G_col[:, None, :], 0.0), FAST), 0.0
    )


@triton.jit
def _load_blocks(ptr, bos, n, shift, row_stride, col, C: tl.constexpr):
    """``[4, 16, C]`` rows ``16·b + r − shift`` of a chunk (zero outside ``[0, n)``): shift 16 gives every block the
    rows of the block before it."""
    row = 16 * tl.arange(0, 4)[:, None] + tl.arange(0, 16)[None, :] - shift
    ok = (row >= 0) & (row < n)
    offs = (bos + row).to(tl.int64)[:, :, None] * row_stride + col + tl.arange(0, C)[None, None, :]
    return tl.load(ptr + offs, mask=ok[:, :, None], other=0.0)


@triton.jit
def _load_gates(g, beta, bos, n, shift, HV: tl.constexpr, i_hv):
    """``(G, b)``, each ``[4, 16]`` float32: the cumulative log decay and β of rows ``16·b + r − shift``."""
    o64 = tl.arange(0, 64) - shift
    ok = (o64 >= 0) & (o64 < n)
    G = tl.cumsum(tl.load(g + (bos + o64) * HV + i_hv, mask=ok, other=0.0).to(tl.float32), 0)
    b = tl.load(beta + (bos + o64) * HV + i_hv, mask=ok, other=0.0).to(tl.float32)
    return tl.reshape(G, [4, 16]), tl.reshape(b, [4, 16])


@triton.jit
def _causal_scores(qk, G, FAST: tl.constexpr = False):
    """``Q Kᵀ ⊙ e^{G_i − G_j}`` on the causal triangle (``j ≤ i``), 0 above it: a chunk's intra-chunk scores ``A``
    from its ``[64, 64]`` product ``qk`` and cumulative log-decays ``G [64]`` (``FAST``: :func:`_exp2`'s)."""
    o64 = tl.arange(0, 64)
    causal = o64[:, None] >= o64[None, :]
    if FAST:
        G2 = G * LOG2E
        return qk * _exp2(tl.where(causal, G2[:, None] - G2[None, :], float("-inf")), True)
    return qk * tl.exp(tl.where(causal, G[:, None] - G[None, :], float("-inf")))


@triton.jit
def _scores_tile(scores, cg, i_hv, HV: tl.constexpr, ROWS: tl.constexpr):
    """Pointers of the ``[64, 64]`` stored scores ``A`` of packed chunk ``cg`` and value head ``i_hv`` in
    ``scores [NC, HV, ROWS, 64]``: rows 0-63 of its tile (ROWS 64: the scores alone; 128: then the dense ``Ct``,
    :func:`_store_dense_coefficients`)."""
    o64 = tl.arange(0, 64)
    return scores + (cg.to(tl.int64) * HV + i_hv) * (ROWS * 64) + o64[:, None] * 64 + o64[None, :]


@triton.jit
def _store_dense_coefficients(tiles, i_c, i_hv, Ct_diag, Ct_sub, blk, r, c, HV: tl.constexpr):
    """Chunk ``i_c``'s ``Ct`` (value head ``i_hv``) as a dense ``[64, 64]`` tile in rows 64-127 of its tile of
    ``tiles [NC, HV, 128, 64]``, after the scores: block ``(b, b)`` from ``Ct_diag``, ``(b, b − 1)`` from ``Ct_sub``
    (``[4, 16, 16]``, indexed by ``blk, r, c``), zeros elsewhere — the tile ``walk_gluon.dense_coefficients`` builds,
    rounded as the kept blocks are, so that the Gluon walk fetches ``Ct`` by TMA with the scores."""
    dt = tiles.dtype.element_ty
    row = (tiles + (i_c.to(tl.int64) * HV + i_hv) * (128 * 64) + 64 * 64) + (16 * blk + r) * 64 + c
    tl.store(row + 16 * blk, Ct_diag.to(dt))
    tl.store(row + 16 * ((blk + 3) % 4), tl.where(blk >= 1, Ct_sub, 0.0).to(dt))  # block (0, 3) is zero
    zero = tl.zeros([4, 16, 16], dtype=dt)
    tl.store(row + 16 * ((blk + 1) % 4), zero)
    tl.store(row + 16 * ((blk + 2) % 4), zero)


@triton.jit
def _store_chunk_scores(q, k, g, scores, i_c, i_h, bos, n, H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                        IEEE: tl.constexpr, ROWS: tl.constexpr, FAST_EXP: tl.constexpr = False):  # fmt: skip
    """Store the walk's intra-chunk scores ``A_c = Q_c K_cᵀ ⊙ e^{G_i − G_j} ⊙ causal`` of chunk ``i_c`` (first token
    ``bos``, ``n`` valid rows) for the value heads of head pair ``i_h`` into rows 0-63 of ``scores [NC, HV, ROWS,
    64]`` (input dtype; rows and columns past the chunk's end are zero): ``Q Kᵀ`` formed once for the pair."""
    GS: tl.constexpr = HV // H
    o64 = tl.arange(0, 64)
    rows = o64 < n
    offs_k = tl.arange(0, K)
    qc = tl.load(q + (bos + o64)[:, None] * (H * K) + i_h * K + offs_k[None, :], mask=rows[:, None], other=0.0)
    kc = tl.load(k + (bos + o64)[:, None] * (H * K) + i_h * K + offs_k[None, :], mask=rows[:, None], other=0.0)
    qk = _mm(qc, tl.trans(kc), IEEE)
    for jj in tl.static_range(GS):
        i_hv = i_h * GS + jj
        G = tl.cumsum(tl.load(g + (bos + o64) * HV + i_hv, mask=rows, other=0.0).to(tl.float32), 0)
        tl.store(_scores_tile(scores, i_c, i_hv, HV, ROWS), _causal_scores(qk, G, FAST_EXP).to(scores.dtype.element_ty))


@triton.jit
def sparse_gdn_fwd_kernel_intra(
    k,
    v,
    g,
    beta,
    ct,
    gamma,
    score,
    chunk_bos,
    chunk_len,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    IEEE: tl.constexpr,
    TF32X3: tl.constexpr,
    REFINE: tl.constexpr = False,
):
    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
    GS: tl.constexpr = HV // H
    bos = tl.load(chunk_bos + i_c).to(tl.int64)
    n = tl.load(chunk_len + i_c)
    o64 = tl.arange(0, 64)
    rows = o64 < n
    offs_k = tl.arange(0, K)
    offs_v = tl.arange(0, V)
    kc = tl.load(k + (bos + o64)[:, None] * (H * K) + i_h * K + offs_k[None, :], mask=rows[:, None], other=0.0)
    gram = _mm(kc, tl.trans(kc), IEEE)  # [64, 64], shared by the pair's value heads
    i, j, bi, bj = _block_coords()
    eye = (i == j).to(tl.float32)
    in_diag = (bi == bj) & (i > j)
    in_sub = bi == bj + 1
    offs, kept = _kept_offsets(i, j, bi, bj)
    for jj in tl.static_range(GS):
        i_hv = i_h * GS + jj
        G = tl.cumsum(tl.load(g + (bos + o64) * HV + i_hv, mask=rows, other=0.0).to(tl.float32), 0)
        b = tl.load(beta + (bos + o64) * HV + i_hv, mask=rows, other=0.0).to(tl.float32)
        causal = in_diag | in_sub
        m = b[:, None] * gram * tl.exp(tl.where(causal, G[:, None] - G[None, :], float("-inf")))
        L = tl.where(in_diag, m, 0.0)
        E = tl.where(in_sub, m, 0.0)
        D = _diag_inverse(L, eye, IEEE, TF32X3, REFINE)
        C = D - _mm32(_mm32(D, E, IEEE, TF32X3), D, IEEE, TF32X3)
        Ct = C * b[None, :]
        p_ct = ct + (i_c.to(tl.int64) * HV + i_hv) * (7 * 256)
        tl.store(p_ct + offs, Ct.to(ct.dtype.element_ty), mask=kept)
        tl.store(gamma + i_c.to(tl.int64) * HV + i_hv, tl.sum(tl.where(o64 == 63, G, 0.0), 0))
        # Tail score from the coefficients as stored (the main pass computes U from the same numbers).
        vc = tl.load(v + (bos + o64)[:, None] * (HV * V) + i_hv * V + offs_v[None, :], mask=rows[:, None], other=0.0)
        ct_used = tl.where(kept, Ct, 0.0).to(ct.dtype.element_ty).to(vc.dtype)
        u = _mm(ct_used, vc, IEEE)
        tail = tl.where((o64 >= 48)[:, None], u * u, 0.0)
        tl.store(score + i_c.to(tl.int64) * HV + i_hv, tl.sqrt(tl.sum(tl.sum(tail, 1), 0)))


@triton.jit
def sparse_gdn_fwd_kernel_intra_blocks(
    k,
    v,
    g,
    beta,
    ct,
    gamma,
    score,
    chunk_bos,
    chunk_len,
    q,
    scores,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    IEEE: tl.constexpr,
    TF32X3: tl.constexpr,
    STORE_SCORES: tl.constexpr = False,
    SCORE_ROWS: tl.constexpr = 64,
    STORE_DENSE: tl.constexpr = False,
    STORE_KEPT: tl.constexpr = True,
    FAST_EXP: tl.constexpr = False,
    REFINE: tl.constexpr = False,
    SUB_SPLIT: tl.constexpr = False,
    F16_SOLVE: tl.constexpr = False,
    F16_UNCHECKED: tl.constexpr = False,
):
    """The intra stage on the kept blocks only: ``D`` is block-diagonal and ``D E D`` block-subdiagonal, so every
    product is a batch of four 16×16 blocks (a quarter of the 64×64 tiles' work, a quarter of their registers).

    Block ``b``'s sub-diagonal coefficient ``C_{b,b−1} = −D_b E_b D_{b−1}`` needs the previous block's inverse, which
    the lanes holding block ``b − 1`` have computed: ``tl.gather`` along the block axis takes it (scaled by its β,
    as ``Ct_diag``) and block ``b − 1``'s log-decays from there. Only ``K_b K_{b−1}ᵀ`` needs the keys one block back
    (``shift`` 16). Measured on the H200 against the previous block's inverse recomputed from inputs loaded one
    block back: 1.748 → 1.509 ms at 128K, 0.444 → 0.388 at 32K.

    ``STORE_SCORES``: also store the walk's intra-chunk scores of the pair's value heads into ``scores [NC, HV,
    SCORE_ROWS, 64]`` (what ``fused.sparse_gdn_fwd_kernel_scores`` stores, from ``q [T, H, K]``), while this
    program's keys are in cache. ``STORE_DENSE`` (``SCORE_ROWS`` 128): each tile's rows 64-127 take the dense
    ``Ct`` (after the scores, or alone where the walk forms its scores itself).
    ``STORE_KEPT`` False: ``ct`` is not written (the tiles then hold the only copy of the coefficients).
    ``F16_SOLVE``: the inverse's chain on fp16 operands (:func:`_mm32`) for every value head of a chunk within
    :data:`F16_SOLVE_BOUND`, the default products for the others. ``F16_UNCHECKED`` (with ``F16_SOLVE``): the fp16
    chain for every chunk with no test, for inputs the caller guarantees inside the bound."""
    i_c = tl.program_id(0)
    i_h = tl.program_id(1)
    GS: tl.constexpr = HV // H
    bos = tl.load(chunk_bos + i_c).to(tl.int64)
    n = tl.load(chunk_len + i_c)
    kb = _load_blocks(k, bos, n, 0, H * K, i_h * K, K)  # [4, 16, K]: block b's keys
    kp = _load_blocks(k, bos, n, 16, H * K, i_h * K, K)  # block b − 1's keys (zeros for b = 0)
    gram = _mm(kb, tl.permute(kb, (0, 2, 1)), IEEE)  # [4, 16, 16]: K_b K_bᵀ
    gram_sub = _mm(kb, tl.permute(kp, (0, 2, 1)), IEEE)  # K_b K_{b−1}ᵀ
    r = tl.arange(0, 16)[None, :, None]
    c = tl.arange(0, 16)[None, None, :]
    blk = tl.arange(0, 4)[:, None, None]
    strict = r > c
    eye = (r == c).to(tl.float32) + tl.zeros([4, 16, 16], dtype=tl.float32)
    offs = blk * 256 + r * 16 + c  # diagonal block b in slot b, sub-diagonal block (b, b − 1) in slot b + 3
    every = (blk < 4) & (r < 16) & (c < 16)  # [4, 16, 16] all true
    has_sub = every & (blk >= 1)  # block 0 has no sub-diagonal coefficient
    o16 = tl.arange(0, 16)
    last = (tl.arange(0, 4)[:, None] == 3) & (o16[None, :] == 15)  # row 63 of the [4, 16] gate tiles
    prev_blocks = tl.maximum(blk - 1, 0) + tl.zeros([4, 16, 16], dtype=tl.int32)  # block b − 1 (block 0: 0)
    prev_rows = tl.maximum(tl.arange(0, 4)[:, None] - 1, 0) + tl.zeros([4, 16], dtype=tl.int32)
    if F16_SOLVE and not F16_UNCHECKED:  # the largest squared key norm of the chunk: |L_ij| <= max |β| · key_norm2
        key_norm2 = tl.max(tl.max(tl.sum(tl.where(r == c, gram, 0.0), 2), 1), 0)
    for jj in tl.static_range(GS):
        i_hv = i_h * GS + jj
        G, b = _load_gates(g, beta, bos, n, 0, HV, i_hv)
        G2 = G * LOG2E
        if F16_UNCHECKED:  # no test: the per-chunk branch costs 8 % of the kernel (docs/gdn-kernels.md)
            Ct_diag, Ct_sub = _block_coefficients(gram, gram_sub, b, G2, prev_rows, strict, has_sub, eye, prev_blocks,
                                                  IEEE, TF32X3, REFINE, SUB_SPLIT, FAST_EXP, True)  # fmt: skip
        elif F16_SOLVE and (tl.max(tl.max(tl.abs(b), 1), 0) * key_norm2 <= F16_SOLVE_BOUND):
            Ct_diag, Ct_sub = _block_coefficients(gram, gram_sub, b, G2, prev_rows, strict, has_sub, eye, prev_blocks,
                                                  IEEE, TF32X3, REFINE, SUB_SPLIT, FAST_EXP, True)  # fmt: skip
        else:  # (with F16_SOLVE: inputs outside fp16's range, e.g. keys not normalised)
            Ct_diag, Ct_sub = _block_coefficients(gram, gram_sub, b, G2, prev_rows, strict, has_sub, eye, prev_blocks,
                                                  IEEE, TF32X3, REFINE, SUB_SPLIT, FAST_EXP, False)  # fmt: skip
        if STORE_KEPT:
            p_ct = ct + (i_c.to(tl.int64) * HV + i_hv) * (7 * 256)
            tl.store(p_ct + offs, Ct_diag.to(ct.dtype.element_ty))
            tl.store(p_ct + 3 * 256 + offs, Ct_sub.to(ct.dtype.element_ty), mask=has_sub)
        if STORE_DENSE:
            _store_dense_coefficients(scores, i_c, i_hv, Ct_diag, Ct_sub, blk, r, c, HV)
        G_last = tl.sum(tl.sum(tl.where(last, G, 0.0), 1), 0)
        tl.store(gamma + i_c.to(tl.int64) * HV + i_hv, G_last)
        # Tail score: rows 48-63 of U = Ct V from the coefficients as stored, i.e. Ct_33 V_3 + Ct_32 V_2.
        v3 = tl.load(v + (bos + 48 + o16)[:, None] * (HV * V) + i_hv * V + tl.arange(0, V)[None, :],
                     mask=(48 + o16 < n)[:, None], other=0.0)  # fmt: skip
        v2 = tl.load(v + (bos + 32 + o16)[:, None] * (HV * V) + i_hv * V + tl.arange(0, V)[None, :],
                     mask=(32 + o16 < n)[:, None], other=0.0)  # fmt: skip
        # block 3's coefficients read back as stored (by the other warps: a barrier first) rather than extracted
        # from the batched blocks by two cross-warp reductions (H200: 1.507 -> 1.237 ms at 128K)
        tl.debug_barrier()
        if STORE_KEPT:
            p_kept = ct + (i_c.to(tl.int64) * HV + i_hv) * (7 * 256) + o16[:, None] * 16 + o16[None, :]
            c33 = tl.load(p_kept + 3 * 256).to(v3.dtype)
            c32 = tl.load(p_kept + 6 * 256).to(v3.dtype)
        else:  # the tiles' rows 64-127 hold the dense Ct: block 3 is rows 112-127, block (3, 2) columns 32-47
            p_row = scores + (i_c.to(tl.int64) * HV + i_hv) * (128 * 64) + (64 + 48 + o16[:, None]) * 64 + o16[None, :]
            c33 = tl.load(p_row + 48).to(v3.dtype)
            c32 = tl.load(p_row + 32).to(v3.dtype)
        u = _mm(c33, v3, IEEE) + _mm(c32, v2, IEEE)
        tl.store(score + i_c.to(tl.int64) * HV + i_hv, tl.sqrt(tl.sum(tl.sum(u * u, 1), 0)))
    if STORE_SCORES:
        _store_chunk_scores(q, k, g, scores, i_c, i_h, bos, n, H, HV, K, IEEE, SCORE_ROWS, FAST_EXP)
