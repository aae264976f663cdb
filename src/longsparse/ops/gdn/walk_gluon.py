"""The SparseGDN walk in Gluon (``triton.experimental.gluon``, Triton 3.6): the main pass of ``kernels/fused.py`` with
TMA-fed tiles, the state in wgmma accumulators, and part of the event sparsity turned into skipped work. The op's walk
on Hopper (``SparseGDNKernelConfig.walk_kernel="auto"``, :func:`launch.resolve_walk`).

Same operator as ``fused.sparse_gdn_fwd_kernel_fused`` with the K S correction and stored scores (its docstring has
the equations), same segments, entry, initial and final states. Its forms:

* **Warp-specialised** (``SparseGDNKernelConfig.walk_warp_specialised``, ``BV = 64``; the default adds the output
  role below): one CTA per (segment, value head) holds the whole ``[128, 128]`` state as two 64-wide V tiles, one
  warpgroup each (the default partition and a worker, 232 registers per thread); a one-warp producer brings each
  chunk's ``Q_c, K_c``, both V tiles and its tile of ``tiles`` by TMA into a two-stage ring (``ready`` / ``empty``
  mbarriers), once for both tiles and up to two chunks ahead. One CTA per SM (224.5 KiB of shared memory).
* **With an output role** (``SparseGDNKernelConfig.walk_output_role``, the default;
  ``kernels.walk_gluon.sparse_gdn_fwd_kernel_walk_gluon_ws3``): the warp-specialised form with a third warpgroup
  forming each chunk's output (``Q S_read``, ``A U``, the store); each state warpgroup's step keeps only the state's
  chain (``K S``, ``U = Ct W``, the write) and hands ``U`` and the next ``S_read`` over through shared memory, one
  barrier pair each. Registers per thread: state 192, output 88, producer 40 (sm_90a build, Triton 3.6: 8 B of
  spills under grouped output, 60 B per chunk; 230,408 B of shared memory). Unless the scores are asked to be stored
  (``walk_scores="stored"``) the output role also forms each chunk's scores ``A_c`` (:func:`inline_supported`,
  ``launch.gluon_forms_scores``; registers 176 / 120 / 40, 12 B of spills), and intra writes the tiles' ``Ct`` rows
  alone. On the H200 at 128K the op took 3.31 ms without the role, 3.23 with it on stored scores, 3.01 forming
  them. Forming them, the role also stores each whole chunk's output by TMA from a shared-memory tile (the score rows
  it no longer needs a ring of made the room; ``kernels.walk_gluon._store_output``): the walk 2.06 -> 1.65 ms at
  128K, the op 3.07 -> 2.66, bit for bit the same outputs (a product-free walk spent 0.56 of its 1.29 ms in the plain
  stores from the accumulator layout; docs/kernel-log.md).
* **Single warpgroup** (``BV = 32``, or ``walk_warp_specialised`` False): one program per (segment, value head, V
  tile), TMA loads of the same tiles, ``SparseGDNKernelConfig.walk_stages`` stages; two programs per SM at one.

Per chunk ``c`` (``kernels.walk_gluon._chunk_step``, shared by both forms):

* ``tiles [NC, HV, 128, 64]`` (:data:`TILE_ROWS`) holds, per chunk and value head, the stored scores ``A_c`` and
  then the dense ``Ct`` (intra writes both, ``intra_forward(scores=)``), so ``U = Ct W`` takes ``Ct`` from shared
  memory; the chunk's offsets, log-decays and event bit are loaded a chunk ahead by plain loads.
* ``S`` fp32 lives in wgmma accumulator registers as two ``[64, BV]`` key halves; its bf16 copy in shared memory is
  the right operand of ``K S`` and ``Q S``. Selected (``z = 1``): ``KS = K_c S``, ``W = V_c − e^G ⊙ KS``;
  unselected: ``W = V_c`` — no ``K S`` in the single and warp-specialised forms (the Triton walk forms it and
  multiplies by 0); the output role's state warpgroups form it for every chunk as the Triton walk does, outside any
  branch, overlapped with the decays' scan and the V tile's read: more products, less time on the H200 (the walk
  1.623 -> 1.562 ms at 128K and 0.415 -> 0.401 at 32K), outputs bit for bit the same. Then ``U = Ct W`` beside
  ``Q S_read``, ``R = e^γ S + K_cᵀ (U ⊙ e^{γ − G})`` one key half after the other (128 accumulator registers live
  instead of 160) beside ``O = scale · (e^G ⊙ (Q_c S_read) + A_c U)``, ``S ← R`` where selected, else ``e^γ S``.
  ``S_read`` is ``S`` or, for a group's odd chunk under grouped output, the even chunk's ``R``.
* Why ``R`` is formed for every chunk: on sm_90 Triton 3.6 builds wrong values (or illegal addresses) from this loop
  when a branch holds products on both sides, or holds ``Kᵀ U`` or the output's product (a minimal probe kernel
  shows it; the Triton walk met the same with ``tl.dot``); ``K S`` alone on the selected side, waited there, builds
  right.

The products take the same bf16-rounded operands as the Triton walk's (S, W, U, U ⊙ e^{γ − G}, S_read); results
differ by fp32 accumulation order and the exp / scan implementations (1e-5 relative on the bench's inputs).

Why warp-specialised by default: on the H200 its main pass took 2.37 ms at 128K, 0.64 at 32K, against 2.81 / 0.75
for the single form and 3.65 / 0.95 for the Triton walk (docs/kernel-log.md). What it took: the single form spent
23 % of its warp samples waiting on reloads of register spills (mostly the products' descriptor addresses, in Nsight
Compute's per-instruction stalls); the warp-specialised form with ``Ct`` by TMA and ``R`` in halves builds
with 4 B of spills (was 188), and its tiles are fetched once per value head, ahead of the state chains.
"""

from __future__ import annotations

import functools

import torch

from ..._optional import require
from .._launch import fast
from .config import SparseGDNKernelConfig

BLOCK_VS = (32, 64)
"""Value tiles the Gluon walk is built and tested for (``SparseGDNKernelConfig.block_v``)."""
BLOCK_V = 64
"""Its value tile where ``SparseGDNKernelConfig.block_v`` is None: the fastest measured (below)."""


def ctas_per_sm(stages: int) -> int:
    """Resident programs per SM of the single-warpgroup walk at ``stages`` chunk-tile stages
    (``SparseGDNKernelConfig.walk_stages``; their shared memory and registers, ``scripts/gluon_walk_report.py``), for
    the segment plan: one stage (107 KB of shared memory at ``BV = 64``, 78 KB at 32, with the dense ``Ct``) lets two
    programs share an SM, two stages hold one. The warp-specialised walk (one CTA per (segment, value head),
    ``kernels.walk_gluon.sparse_gdn_fwd_kernel_walk_gluon_ws``) takes the same segment plan: half the programs per
    segment, half the resident programs per SM."""
    return 2 if stages == 1 else 1


_GL_DTYPES = ("bfloat16", "float16")


def supports(q: torch.Tensor, v: torch.Tensor, block_v: int = BLOCK_V) -> str | None:
    """None if the Gluon walk covers this call, else the reason it does not."""
    K, V = q.shape[-1], v.shape[-1]
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {q.dtype}: the Gluon walk takes bf16 or fp16 (fp32 inputs run the Triton walk in IEEE fp32)"
    if K != 128 or V != 128:
        return f"head dims K={K}, V={V}: the Gluon walk is built for K = V = 128"
    if block_v not in BLOCK_VS:
        return f"block_v={block_v}: the Gluon walk takes value tiles of {BLOCK_VS}"
    if not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] != 9:
        return f"the Gluon walk is built for Hopper (sm_90); this call is on {q.device}"
    return _gluon_missing()


@functools.cache
def _gluon_missing() -> str | None:
    """Why this Triton cannot run Gluon kernels, or None."""
    from .._triton import triton_mode

    if triton_mode() != "compiled":
        return f"Triton runs in mode {triton_mode()!r}: Gluon kernels need the compiler"
    try:
        import triton.experimental.gluon.language.nvidia.hopper  # noqa: F401
    except ImportError as exc:
        return f"this Triton has no Gluon for Hopper ({exc})"
    return None


def kernel_module():
    """The module holding the ``@gluon.jit`` code (imported on first use)."""
    require("triton", "SparseGDN's Gluon walk")
    from .kernels import walk_gluon as kernels

    return kernels


def dense_coefficients(ct: torch.Tensor) -> torch.Tensor:
    """``ct [NC, HV, 7, 16, 16]`` (the kept blocks, intra.py's order: 4 diagonal, then 3 sub-diagonal) ->
    ``[NC, HV, 64, 64]`` with zeros elsewhere: in torch, the tile the kernel's ``_coef_tile`` gathers (the
    reference of its tests)."""
    NC, HV = ct.shape[:2]
    dense = ct.new_zeros(NC, HV, 4, 16, 4, 16)
    # diagonal(dim1=2, dim2=4) views block (b, b) of each 64×64 tile as [..., 16, 16, b]
    dense.diagonal(dim1=2, dim2=4).copy_(ct[:, :, :4].permute(0, 1, 3, 4, 2))
    dense[:, :, 1:, :, :3, :].diagonal(dim1=2, dim2=4).copy_(ct[:, :, 4:].permute(0, 1, 3, 4, 2))
    return dense.view(NC, HV, 64, 64)


@functools.lru_cache(maxsize=16)
def _shared_layout(block: tuple[int, ...], dtype: str):
    """The NVMMA shared layout of a ``block`` tile of ``dtype`` ("bfloat16" / "float16"): a frozen value, built
    once (~6 µs of host time each, four per walk call)."""
    from triton.experimental.gluon import language as gl

    return gl.NVMMASharedLayout.get_default_for(list(block), getattr(gl, dtype))


def descriptors(q, k, v, scores, block_v: int, inline_scores: bool = False, o=None):
    """TMA descriptors of the walk's tiles: ``q, k [T, H, K]`` and ``v [T, HV, V]`` as 2-D row-major views in
    ``[64, K]`` / ``[64, block_v]`` blocks, ``scores [NC, HV, 64, 64]`` as ``[NC·HV·64, 64]`` in ``[64, 64]``
    blocks — or ``[NC, HV, 128, 64]``, each chunk's scores followed by its dense ``Ct``, in ``[128, 64]`` blocks
    (``inline_scores``: in ``[64, 64]`` blocks, of which the walk loads each tile's ``Ct`` rows alone); and, where
    ``o [T, HV, V]`` is given (the output role's stores), ``o`` as ``v``. Works on CPU tensors too
    (``scripts/gluon_walk_report.py`` takes the kernel's signature from them)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    dt = _GL_DTYPES[(torch.bfloat16, torch.float16).index(q.dtype)]
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]

    def desc(x, block):
        return TensorDescriptor.from_tensor(x, block, _shared_layout(tuple(block), dt))

    descs = (
        desc(q.view(T, H * K), [64, K]),
        desc(k.view(T, H * K), [64, K]),
        desc(v.view(T, HV * V), [64, block_v]),
        desc(scores.view(-1, 64), [64 if inline_scores else scores.shape[-2], 64]),
    )
    return descs if o is None else (*descs, desc(o.view(T, HV * V), [64, block_v]))


TILE_ROWS = 128
"""Rows of each (chunk, value head) tile the Gluon walk reads by TMA (``run_walk``'s ``tiles``): the stored scores
``A_c`` (rows 0-63), then the dense ``Ct`` (64-127), both written by intra (``intra_forward(scores=)``). Where the
walk forms its scores itself, intra writes the ``Ct`` rows alone and the walk reads only those."""


def output_role_supported(block_v: int, warp_specialised: bool) -> str | None:
    """None if the Gluon walk has its output role (module docstring) at this value tile and form
    (``SparseGDNKernelConfig.walk_warp_specialised``), else why not."""
    if not (warp_specialised and block_v == 64):
        return (
            f"walk_output_role needs the warp-specialised Gluon walk at block_v=64 (here block_v={block_v}, "
            f"walk_warp_specialised={warp_specialised})"
        )
    return None


def inline_supported(block_v: int, output_role: bool, warp_specialised: bool) -> str | None:
    """None if the Gluon walk can form its intra-chunk scores itself (``walk_scores="inline"``), else why not: only
    its output role does (``output_role``, 64-wide tiles), where ``Q Kᵀ`` is off the state's chain. In the
    state warpgroups it was measured slower on the H200 (intra 1.22 -> 0.86 ms but the walk 1.95 -> 2.61-2.74 at
    128K; docs/kernel-log.md)."""
    if not output_role:
        return "walk_scores='inline' needs the Gluon walk's output role (SparseGDNKernelConfig.walk_output_role)"
    return output_role_supported(block_v, warp_specialised)


def run_walk(
    q, k, v, g, mask, h0, entry, o, tiles, ht, segs, chunk_bos, chunk_len, scale, *,
    P: int, CMAX: int, block_v: int, has_h0: bool, has_entry: bool, grouped: bool, output_role: bool = False,
    inline_scores: bool = False, debug: torch.Tensor | None = None,
    kernel_config: SparseGDNKernelConfig | None = None,
) -> None:  # fmt: skip
    """Launch the walk on packed inputs, with ``fused.sparse_gdn_fwd_kernel_fused``'s arguments: ``q, k [T, H, K]``,
    ``v, o [T, HV, V]``, ``g [T, HV]``, ``mask [N, P, CMAX]`` uint8, ``h0 [N, HV, K, V]`` and
    ``entry [NS, HV, K, V]`` fp32 (read where ``has_h0`` / ``has_entry``), ``tiles [NC, HV, 128, 64]`` (per chunk and
    value head the stored scores, then the dense ``Ct``: :data:`TILE_ROWS`), ``ht [N, HV, K, V]`` fp32 (written
    where a segment ends its sequence), ``segs`` a ``launch.SegmentPlan``. ``debug``: a ``[2, 9, 64, block_v]``
    fp32 buffer that program 0 fills with the intermediate products of its first two chunks (the single-warpgroup
    walk; ``kernels.walk_gluon._chunk_step`` lists the slots); for debugging only. ``output_role``: the form with
    the output's products in their own warpgroup (module docstring). ``inline_scores``: that role forms
    each chunk's scores from its ``Q, K`` tiles, and the tiles' ``Ct`` rows alone are read (rows 0-63
    need not be written; :func:`inline_supported`). ``kernel_config``: its ``walk_warp_specialised`` and
    ``walk_stages`` choose the form (None: the default config's)."""
    kernel_config = kernel_config or SparseGDNKernelConfig()
    warp_specialised = kernel_config.walk_warp_specialised
    T, H, K = q.shape
    HV, V = v.shape[1], v.shape[2]
    if tiles.shape[2:] != (TILE_ROWS, 64):
        raise ValueError(f"run_walk: tiles {tuple(tiles.shape)} must be [NC, HV, {TILE_ROWS}, 64] (scores, then Ct)")
    for wanted, reason in ((output_role, output_role_supported(block_v, warp_specialised)),
                           (inline_scores, inline_supported(block_v, output_role, warp_specialised))):  # fmt: skip
        if wanted and (reason is not None or debug is not None or V != 2 * block_v):
            raise ValueError(f"run_walk: {reason or f'the output role needs V = 2 * block_v, no debug (V={V})'}")
    kern = kernel_module()
    descs = descriptors(q, k, v, tiles, block_v, inline_scores, o if output_role else None)
    if warp_specialised and debug is None and V == 2 * block_v == 128:
        fn = kern.sparse_gdn_fwd_kernel_walk_gluon_ws3 if output_role else kern.sparse_gdn_fwd_kernel_walk_gluon_ws
        fast(fn)[(segs.count * HV,)](
            *descs, g, mask, h0, entry, o, ht, segs.seq, segs.c0, segs.c1, segs.chunk0, segs.nchunks, chunk_bos,
            chunk_len, float(scale), P=P, CMAX=CMAX, H=H, HV=HV, K=K, V=V, BV=block_v, HAS_H0=has_h0,
            HAS_ENTRY=has_entry, GROUPED=grouped, num_warps=kern.WARPS.value,
            **({"INLINE_SCORES": True} if inline_scores else {}),
        )  # fmt: skip
        return
    fast(kern.sparse_gdn_fwd_kernel_walk_gluon)[(segs.count * HV * (V // block_v),)](
        *descs, g, mask, h0, entry, o, ht, segs.seq, segs.c0, segs.c1, segs.chunk0, segs.nchunks, chunk_bos,
        chunk_len, float(scale), o if debug is None else debug, P=P, CMAX=CMAX, H=H, HV=HV, K=K, V=V, BV=block_v,
        HAS_H0=has_h0, HAS_ENTRY=has_entry, GROUPED=grouped, DEBUG=debug is not None,
        STAGES=kernel_config.walk_stages,
        num_warps=kern.WARPS.value,
    )  # fmt: skip
