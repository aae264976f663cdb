"""SparseGDN intra stage on the GPU, host side: :func:`intra_forward` checks its buffers and launches the kernels of
``kernels/intra.py`` (the block-adjacent solve, the chunk decays and tail scores, and on request the walk's stored
scores and dense coefficients; the math is in that module's docstring)."""

from __future__ import annotations

import torch

from .._launch import fast
from .kernels.intra import sparse_gdn_fwd_kernel_intra, sparse_gdn_fwd_kernel_intra_blocks
from .layout import BLOCK_PAIRS

BLOCK_ORDER = BLOCK_PAIRS  # the seven kept 16×16 blocks (row block, column block), in the specification's order


def intra_forward(
    k,
    v,
    g,
    beta,
    chunk_bos,
    chunk_len,
    *,
    coef_dtype=None,
    num_warps=4,
    tf32x3=False,
    blocks=True,
    max_registers=None,
    q=None,
    scores=None,
    kept_blocks=True,
    refine=None,
    sub_split=None,
    f16_solve=None,
    f16_unchecked=False,
):
    """Run the intra stage on packed inputs.

    Args:
        k: ``[T, H, K]``, v: ``[T, HV, V]``, g (natural-log decay) and beta: ``[T, HV]`` — sequences laid end to end.
        chunk_bos, chunk_len: ``[NC]`` int32 first token and valid tokens of every chunk.
        coef_dtype: dtype of the stored coefficients (default: k's dtype, float32 for float32 inputs).
        tf32x3: 3-pass tf32 products in the solve of 16-bit inputs (about fp32; H200: 1.35× the kernel's time at
            128K). The default, tf32 products and one refinement step (``_diag_inverse``), is as accurate on the
            scale of the coefficients' bf16 storage at 1.01× the time of the tf32 chain alone.
        refine: the refinement step after the block inverses' product chain (None: with tf32 products, i.e. for
            16-bit inputs without ``tf32x3``; IEEE and 3-pass products need none).
        sub_split: the sub-diagonal coefficient's first product ``D_b E_b`` with ``E_b`` split into two tf32 parts
            (one product more; kept-block kernel only). None: with tf32 products on the kept-block kernel (the
            op's path). Measured on the H200 with alike keys (cosine ~0.99): the sub-diagonal blocks' error
            3.5e-3 -> 2.2e-3 from the fp32 solve, the diagonal ones unchanged (1.6e-3, their bf16 storage); 1.233 ->
            1.253 ms at 128K (+1.7 %).
        f16_solve: the inverse's chain and its refinement step on fp16 operands rounded to nearest, fp32
            accumulation (kept-block kernel only; not with ``tf32x3``; the sub-diagonal products stay tf32): the
            16-bit MMA, whose accumulator is the next product's left operand without the warp shuffles a tf32
            operand takes. None: on wherever the products are tf32 (16-bit inputs on the kept-block kernel, the
            op's path). sm_90a build (Triton 3.6, 4 warps, 128 registers, no spills): 2,856 instructions on that
            path against 3,344 (SHFL 196 / 372, SEL + FSEL 257 / 733). On the H200: 1.243 -> 1.217 ms at 128K,
            0.321 -> 0.311 at 32K; errors from the fp32 solve unchanged at every key spread (alike keys, cosine
            ~0.99: diagonal 1.6e-3, sub-diagonal 2.2e-3 after bf16 storage), as a float64 emulation of the fp16
            chain on the CPU had predicted. A value head's chunk outside
            ``kernels.intra.F16_SOLVE_BOUND`` (keys not L2-normalised, β > 1), where fp16's range could overflow,
            takes the tf32 products.
        f16_unchecked: with ``f16_solve``, the fp16 chain for every chunk without that per-chunk range test (no
            effect where ``f16_solve`` is off). Only for inputs the caller knows to be inside the bound: unit keys
            and ``|β| <= 1`` (the op's ``bounded_inputs``). Outside it an fp16 operand can overflow, and the
            coefficients then hold inf or NaN (never finite wrong values: the chain's leading term is ``I``, so
            fp16's underflow only drops terms far below it). The test, two cross-warp maxima and a branch between
            two copies of the solve, is 8 % of the kernel: on the H200 0.860 -> 0.788 ms at 128K with it folded,
            bit-equal on such inputs.
        blocks: the solve on the kept 16×16 blocks (:func:`sparse_gdn_fwd_kernel_intra_blocks`) rather than on
            whole 64×64 tiles (:func:`sparse_gdn_fwd_kernel_intra`); same coefficients up to rounding.
        max_registers: a cap on the registers per thread (ptxas ``maxnreg``; None: the compiler's choice): fewer
            registers, more resident programs per SM. The op passes ``SparseGDNKernelConfig.intra_registers``.
        q, scores: ``q [T, H, K]`` and a ``[NC, HV, 64, 64]`` buffer in q's dtype: also store the walk's intra-chunk
            scores there (as ``fused.sparse_gdn_fwd_kernel_scores`` does, in the same pass over the keys; only with
            ``blocks``). A ``[NC, HV, 128, 64]`` buffer takes each chunk's scores, then its dense ``Ct`` (the Gluon
            walk's tiles, ``walk_gluon.dense_coefficients``); ``ct`` is returned as well. That buffer without ``q``
            takes the dense ``Ct`` alone (rows 64-127; rows 0-63 are not written): for a Gluon walk that forms its
            scores itself.
        kept_blocks: store the kept blocks ``ct``. False (only with a 128-row ``scores``): the tiles hold the only
            copy of the coefficients (the Gluon walk and the entry kernel read them there), 3.5 KiB less written per
            chunk and value head, and ``ct`` is returned as None.

    Returns:
        ``(ct [NC, HV, 7, 16, 16] or None, gamma [NC, HV] float32, score [NC, HV] float32)``.
    """
    T, H, K = k.shape
    HV, V = v.shape[1], v.shape[2]
    NC = chunk_bos.numel()
    dev = k.device
    if not kept_blocks and (scores is None or scores.shape[2:] != (128, 64)):
        raise ValueError(
            "intra_forward: kept_blocks=False needs a [NC, HV, 128, 64] scores buffer (the tiles then hold the only "
            "copy of the coefficients)"
        )
    ct = torch.empty(NC, HV, 7, 16, 16, dtype=coef_dtype or k.dtype, device=dev) if kept_blocks else None
    gamma = torch.empty(NC, HV, dtype=torch.float32, device=dev)
    score = torch.empty(NC, HV, dtype=torch.float32, device=dev)
    tf32_products = blocks and k.dtype != torch.float32 and not tf32x3
    sub_split = tf32_products if sub_split is None else sub_split
    if sub_split and not blocks:
        raise ValueError("intra_forward: sub_split is an option of the kept-block kernel (blocks=True)")
    f16_solve = tf32_products if f16_solve is None else f16_solve
    if f16_solve and (not blocks or tf32x3):
        raise ValueError("intra_forward: f16_solve is an option of the kept-block kernel (blocks=True), without tf32x3")
    dense = scores is not None and scores.shape[2:] == (128, 64)
    if q is not None and scores is None:
        raise ValueError("intra_forward: q is read only to store scores: pass a scores buffer with it")
    if scores is not None and q is None and not dense:
        raise ValueError(
            f"intra_forward: scores {tuple(scores.shape)} without q: only [NC, HV, 128, 64] tiles take the dense Ct "
            "alone; a scores buffer needs q"
        )
    if scores is not None:
        if not blocks:
            raise ValueError("intra_forward: scores are stored by the kept-block kernel only (blocks=True)")
        if q is not None and (q.shape != k.shape or q.dtype != k.dtype):
            raise ValueError(f"intra_forward: q {tuple(q.shape)} {q.dtype} must match k {tuple(k.shape)} {k.dtype}")
        if scores.shape not in ((NC, HV, 64, 64), (NC, HV, 128, 64)) or scores.dtype != k.dtype:
            raise ValueError(
                f"intra_forward: scores {tuple(scores.shape)} {scores.dtype} must be [{NC}, {HV}, 64, 64] (scores) or "
                f"[{NC}, {HV}, 128, 64] (scores, then the dense coefficients) {k.dtype}"
            )
    if NC:
        ieee = k.dtype == torch.float32
        refine = not (ieee or tf32x3) if refine is None else refine
        geometry = dict(H=H, HV=HV, K=K, V=V, IEEE=ieee, TF32X3=tf32x3, REFINE=refine)
        geometry["num_warps"] = num_warps
        if max_registers is not None:
            geometry["maxnreg"] = max_registers
        # q, scores (without STORE_SCORES) and ct (without STORE_KEPT) are not read: any pointer stands in
        args = (k, v, g, beta, ct if kept_blocks else scores, gamma, score, chunk_bos, chunk_len)
        if blocks:
            stores = q is not None
            fast(sparse_gdn_fwd_kernel_intra_blocks)[(NC, H)](
                *args,
                q if stores else k,
                scores if scores is not None else ct,
                STORE_SCORES=stores,
                SCORE_ROWS=scores.shape[2] if scores is not None else 64,
                STORE_DENSE=dense,
                STORE_KEPT=kept_blocks,
                FAST_EXP=k.is_cuda,  # compiled: the interpreter (CPU tensors) has no inline assembly
                SUB_SPLIT=sub_split,
                F16_SOLVE=f16_solve,
                F16_UNCHECKED=bool(f16_solve and f16_unchecked),
                **geometry,
            )
        else:
            fast(sparse_gdn_fwd_kernel_intra)[(NC, H)](*args, **geometry)
    return ct, gamma, score
