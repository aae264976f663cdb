"""The Gluon walk's device code (``walk_gluon.py`` has the math, the status and the launcher).

Imported only by ``walk_gluon``'s launcher and by ``scripts/gluon_walk_report.py``: importing this module imports
``triton.experimental.gluon``, which CPU-only installs and Triton's interpreter never need.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

CHUNK = gl.constexpr(64)
WARPS = gl.constexpr(4)
"""One warpgroup: every ``warpgroup_mma`` below spans the program's four warps."""


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _program(HV: gl.constexpr, NV: gl.constexpr):
    """``(segment, value head, V tile)`` of this program, segment-major as ``fused._segment_program``."""
    pid = gl.program_id(0)
    i_s = pid // (HV * NV)
    rest = pid % (HV * NV)
    return i_s, rest // NV, rest % NV


@gluon.jit
def _debug_store(dbg, slot, x, layout: gl.constexpr):
    """Debug builds only: ``x [R, BV]`` fp32 into ``dbg`` at ``slot`` (in units of 64 rows), row-major."""
    R: gl.constexpr = x.shape[0]
    BV: gl.constexpr = x.shape[1]
    rows = gl.arange(0, R, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BV, layout=gl.SliceLayout(0, layout))
    gl.store(dbg + slot * CHUNK * BV + rows[:, None] * BV + cols[None, :], x)


@gluon.jit
def _state_offsets(row, i_v, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, layout: gl.constexpr):
    """``[K, BV]`` offsets (in ``layout``) of V tile ``i_v`` of state ``row`` of a ``[.., K, V]`` state array."""
    offs_k = gl.arange(0, K, layout=gl.SliceLayout(1, layout))
    offs_v = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(0, layout))
    return (row.to(gl.int64) * K + offs_k[:, None]) * V + offs_v[None, :]


@gluon.jit
def _chunk_decays(g, bos, n_rows, i_hv, HV: gl.constexpr, layout: gl.constexpr):
    """``(G [64], γ)``: the chunk's cumulative log-decays (fp32, in the row layout of ``layout``; rows past the
    chunk's end add 0, so they repeat the last valid G) and their total ``γ = G[63]``, as ``fused._chunk_tiles``."""
    scan: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    o64 = gl.arange(0, CHUNK, layout=scan)
    x = gl.load(g + (bos + o64) * HV + i_hv, mask=o64 < n_rows, other=0.0).to(gl.float32)
    G = gl.associative_scan(x, 0, _add)
    g_last = gl.sum(gl.where(o64 == CHUNK - 1, G, 0.0), 0)
    return gl.convert_layout(G, gl.SliceLayout(1, layout)), g_last


@gluon.jit
def _load_chunk(
    q_desc, k_desc, v_desc, a_desc, ct_desc, chunk_bos, cg, i_h, i_hv, i_v, bar, q_t, k_t, v_t, a_t, ct_t, pred,
    HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr,
):  # fmt: skip
    """Issue the TMA loads of packed chunk ``cg`` into one stage (``pred`` False: none; ``cg`` must still be a
    valid chunk index): ``Q_c, K_c [64, K]``, the V tile ``[64, BV]``, the stored scores ``A_c`` and the dense
    ``Ct [64, 64]``; ``bar`` completes when all five have landed.

    A chunk shorter than 64 rows gets the next sequence's rows (or zeros past the tensor). They reach nothing:
    ``Ct``'s rows and columns past the chunk's end are zero (β = 0 there, so ``C diag(β)``'s columns vanish, and
    ``(I + L)⁻¹``'s rows there are unit rows times that β; intra.py), so are ``A``'s (its q and k rows are masked to
    zero in the scores kernel), hence ``U`` is zero there and ``Kᵀ (U ⊙ ·)`` ignores those keys; the output store
    is masked to the valid rows."""
    bos = gl.load(chunk_bos + cg)
    row = (cg * HV + i_hv) * CHUNK  # of A and Ct, viewed as [NC · HV · 64, 64]
    nbytes: gl.constexpr = (
        q_desc.block_type.nbytes
        + k_desc.block_type.nbytes
        + v_desc.block_type.nbytes
        + a_desc.block_type.nbytes
        + ct_desc.block_type.nbytes
    )
    mbarrier.expect(bar, nbytes, pred=pred)
    tma.async_copy_global_to_shared(k_desc, [bos, i_h * K], bar, k_t, pred=pred)
    tma.async_copy_global_to_shared(v_desc, [bos, i_hv * V + i_v * BV], bar, v_t, pred=pred)
    tma.async_copy_global_to_shared(ct_desc, [row, 0], bar, ct_t, pred=pred)
    tma.async_copy_global_to_shared(q_desc, [bos, i_h * K], bar, q_t, pred=pred)
    tma.async_copy_global_to_shared(a_desc, [row, 0], bar, a_t, pred=pred)


@gluon.jit
def _write_and_output(k_t, ud_s, a_t, u_s, decayed, acc):
    """``(R, O)``: the would-be write ``R = e^γ S + K_cᵀ Ud`` (``decayed`` = e^γ S; ``Kᵀ`` is a transposed view
    of the K tile) and the output ``O = acc + A_c U`` (``acc = e^G ⊙ Q S_read``), issued back to back."""
    r = warpgroup_mma(k_t.permute((1, 0)), ud_s, decayed, is_async=True)
    out = warpgroup_mma(a_t, u_s, acc, is_async=True)
    return warpgroup_mma_wait(0, deps=(r, out))


@gluon.jit
def _chunk_step(
    S, c, cg, m_row, g, o, chunk_bos, chunk_len, scale, i_hv, i_v,
    q_t, k_t, v_t, a_t, ct_t, states, read, write_r, w_s, u_s, ud_s, dbg, record,
    HV: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, MMA: gl.constexpr, DEBUG: gl.constexpr,
    VARIANT: gl.constexpr = 0,
):  # fmt: skip
    """Walk chunk ``c`` (sequence-local; ``cg`` packed) whose tiles have landed in ``q_t .. ct_t``; ``S [K, BV]``
    fp32 (``MMA`` layout) is the state entering it and ``states [2, K, BV]`` holds its bf16 copy (slot 0) and the
    last would-be write (slot 1). Stores the chunk's output, reading slot ``read`` (1: a group's odd chunk under
    grouped output); returns the state after the chunk, with slot 0 updated to it. ``write_r``: store the would-be
    write into slot 1 (a group's even chunk under grouped output).

    ``fused._chunk_step`` with the K S correction, with one difference: an unselected chunk skips K S, the W
    correction and, unless ``write_r``, the write ``Kᵀ U`` — it pays ``U = Ct V`` and the output only."""
    dt: gl.constexpr = w_s.dtype
    s_s = states.index(0)
    s_read = states.index(read)
    bos = gl.load(chunk_bos + cg).to(gl.int64)
    n_rows = gl.load(chunk_len + cg)
    G, g_last = _chunk_decays(g, bos, n_rows, i_hv, HV, MMA)
    eG = gl.exp(G)[:, None]
    zero = gl.zeros([CHUNK, BV], gl.float32, MMA)
    selected = gl.load(m_row + c) != 0
    # U = Ct W with W = V − e^G ⊙ K S (selected) or V. Q S_read runs beside the chain: wgmma groups retire in order,
    # so it is issued after K S, and waiting for K S leaves it running.
    P1: gl.constexpr = VARIANT // 10
    P2: gl.constexpr = VARIANT % 10
    if P1 == 2:  # no branch: K S always, multiplied by zero when unselected (the Triton walk's work)
        ks = warpgroup_mma(k_t, s_s, zero, use_acc=False, is_async=True)
        qs = warpgroup_mma(q_t, s_read, zero, use_acc=False, is_async=True)
        ks = warpgroup_mma_wait(1, deps=(ks,))
        w = v_t.load(MMA).to(gl.float32) - selected.to(gl.float32) * eG * ks
        w_s.store(w.to(dt))
        fence_async_shared()
        gl.thread_barrier()
        u = warpgroup_mma(ct_t, w_s, zero, use_acc=False, is_async=True)
        u, qs = warpgroup_mma_wait(0, deps=(u, qs))
    elif P1 == 1:  # products only on the selected side of the branch; W through shared memory either way
        if selected:
            ks = warpgroup_mma(k_t, s_s, zero, use_acc=False, is_async=True)
            ks = warpgroup_mma_wait(0, deps=(ks,))
            w = v_t.load(MMA).to(gl.float32) - eG * ks
        else:
            w = v_t.load(MMA).to(gl.float32)
        w_s.store(w.to(dt))
        fence_async_shared()
        gl.thread_barrier()
        qs = warpgroup_mma(q_t, s_read, zero, use_acc=False, is_async=True)
        u = warpgroup_mma(ct_t, w_s, zero, use_acc=False, is_async=True)
        u, qs = warpgroup_mma_wait(0, deps=(u, qs))
    elif selected:
        ks = warpgroup_mma(k_t, s_s, zero, use_acc=False, is_async=True)
        qs = warpgroup_mma(q_t, s_read, zero, use_acc=False, is_async=True)
        ks = warpgroup_mma_wait(1, deps=(ks,))
        w = v_t.load(MMA).to(gl.float32) - eG * ks
        w_s.store(w.to(dt))
        fence_async_shared()
        gl.thread_barrier()  # every warp's rows of W are in shared memory before the product reads them
        u = warpgroup_mma(ct_t, w_s, zero, use_acc=False, is_async=True)
        u, qs = warpgroup_mma_wait(0, deps=(u, qs))
        if DEBUG:
            if record:
                _debug_store(dbg, 1, ks, MMA)
                _debug_store(dbg, 2, w, MMA)
    else:
        qs = warpgroup_mma(q_t, s_read, zero, use_acc=False, is_async=True)
        u = warpgroup_mma(ct_t, v_t, zero, use_acc=False, is_async=True)
        u, qs = warpgroup_mma_wait(0, deps=(u, qs))
    u_s.store(u.to(dt))
    ud_s.store((u * gl.exp(g_last - G)[:, None]).to(dt))
    fence_async_shared()
    gl.thread_barrier()
    decayed = S * gl.exp(g_last)
    # Slot 1 is read only by the next (odd) chunk's Q S_read, issued after this step: it may be written at once.
    sel_f = selected.to(gl.float32)
    if P2 == 2:  # no branch around the products: R always formed
        r, out = _write_and_output(k_t, ud_s, a_t, u_s, decayed, eG * qs)
        if write_r:
            states.index(1).store(r.to(dt))
        S = decayed + sel_f * (r - decayed)
    elif P2 == 1:  # the output's product before the branch, R alone inside it
        out = warpgroup_mma(a_t, u_s, eG * qs, is_async=True)
        out = warpgroup_mma_wait(0, deps=(out,))
        if selected | write_r:
            r = warpgroup_mma(k_t.permute((1, 0)), ud_s, decayed, is_async=True)
            r = warpgroup_mma_wait(0, deps=(r,))
            if write_r:
                states.index(1).store(r.to(dt))
        else:
            r = decayed
        S = decayed + sel_f * (r - decayed)
    elif selected:
        r, out = _write_and_output(k_t, ud_s, a_t, u_s, decayed, eG * qs)
        if DEBUG:
            if record:
                _debug_store(dbg, 5, r, MMA)
        if write_r:
            states.index(1).store(r.to(dt))
        S = r
    else:
        if write_r:  # the odd chunk after this one reads the write this chunk skips
            r, out = _write_and_output(k_t, ud_s, a_t, u_s, decayed, eG * qs)
            states.index(1).store(r.to(dt))
            if DEBUG:
                if record:
                    _debug_store(dbg, 5, r, MMA)
        else:
            out = warpgroup_mma(a_t, u_s, eG * qs, is_async=True)
            out = warpgroup_mma_wait(0, deps=(out,))
        S = decayed
    if DEBUG:  # slots: 0 Q S_read, 1 K S, 2 W (selected only), 3 U, 4 O before scale, 5-6 R (when formed), 7-8 S after
        if record:
            _debug_store(dbg, 0, qs, MMA)
            _debug_store(dbg, 3, u, MMA)
            _debug_store(dbg, 4, out, MMA)
            _debug_store(dbg, 7, S, MMA)
    gl.thread_barrier()  # every warp's products reading slot 0 have retired before it is overwritten
    s_s.store(S.to(dt))
    fence_async_shared()
    rows = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, MMA))
    cols = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(0, MMA))
    p_o = o + (bos + rows)[:, None] * (HV * V) + i_hv * V + cols[None, :]
    gl.store(p_o, (scale * out).to(o.dtype.element_ty), mask=(rows < n_rows)[:, None])
    return S


@gluon.jit
def sparse_gdn_walk_gluon(
    q_desc,
    k_desc,
    v_desc,
    a_desc,
    ct_desc,
    g,
    mask,
    h0,
    entry,
    o,
    ht,
    seg_seq,
    seg_c0,
    seg_c1,
    seq_chunk0,
    seq_nchunks,
    chunk_bos,
    chunk_len,
    scale,
    dbg,
    P: gl.constexpr,
    CMAX: gl.constexpr,
    H: gl.constexpr,
    HV: gl.constexpr,
    K: gl.constexpr,
    V: gl.constexpr,
    BV: gl.constexpr,
    HAS_H0: gl.constexpr,
    HAS_ENTRY: gl.constexpr,
    STORE_FINAL: gl.constexpr,
    GROUPED: gl.constexpr,
    DEBUG: gl.constexpr = False,
    VARIANT: gl.constexpr = 0,
):
    """The walk of one (segment, value head, V tile): ``fused.sparse_gdn_fwd_kernel_fused``'s arguments, with the
    chunk tiles as TMA descriptors (``q, k [T, H·K]``, ``v [T, HV·V]`` in ``[64, K]`` / ``[64, BV]`` blocks, the
    stored scores and dense ``Ct`` as ``[NC·HV·64, 64]`` in ``[64, 64]`` blocks) instead of pointers."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BV, 16])
    dt: gl.constexpr = k_desc.dtype
    i_s, i_hv, i_v = _program(HV, V // BV)
    i_h = i_hv // (HV // H)
    n_seq = gl.load(seg_seq + i_s)
    c0 = gl.load(seg_c0 + i_s)
    c1 = gl.load(seg_c1 + i_s)
    base = gl.load(seq_chunk0 + n_seq)
    n_chunks = gl.load(seq_nchunks + n_seq)
    m_row = mask + (n_seq * P + i_h).to(gl.int64) * CMAX

    # Two stages of chunk tiles (chunk c0 + i in stage i mod 2), one barrier each.
    q_t = gl.allocate_shared_memory(dt, [2, CHUNK, K], q_desc.layout)
    k_t = gl.allocate_shared_memory(dt, [2, CHUNK, K], k_desc.layout)
    v_t = gl.allocate_shared_memory(dt, [2, CHUNK, BV], v_desc.layout)
    a_t = gl.allocate_shared_memory(dt, [2, CHUNK, CHUNK], a_desc.layout)
    ct_t = gl.allocate_shared_memory(dt, [2, CHUNK, CHUNK], ct_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bars.index(0), count=1)
    mbarrier.init(bars.index(1), count=1)
    # The products' bf16 right-hand operands: the state and the would-be write, W, U and U ⊙ e^{γ − G}.
    states = gl.allocate_shared_memory(dt, [2, K, BV], gl.NVMMASharedLayout.get_default_for([K, BV], dt))
    tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([CHUNK, BV], dt)
    w_s = gl.allocate_shared_memory(dt, [CHUNK, BV], tile_layout)
    u_s = gl.allocate_shared_memory(dt, [CHUNK, BV], tile_layout)
    ud_s = gl.allocate_shared_memory(dt, [CHUNK, BV], tile_layout)

    if HAS_ENTRY:
        S = gl.load(entry + _state_offsets(i_s * HV + i_hv, i_v, K, V, BV, MMA))
    elif HAS_H0:
        S = gl.load(h0 + _state_offsets(n_seq * HV + i_hv, i_v, K, V, BV, MMA)).to(gl.float32)
    else:
        S = gl.zeros([K, BV], gl.float32, MMA)
    states.index(0).store(S.to(dt))
    fence_async_shared()

    _load_chunk(
        q_desc, k_desc, v_desc, a_desc, ct_desc, chunk_bos, base + c0, i_h, i_hv, i_v, bars.index(0),
        q_t.index(0), k_t.index(0), v_t.index(0), a_t.index(0), ct_t.index(0), c0 < c1, HV, K, V, BV,
    )  # fmt: skip
    for c in range(c0, c1):
        i = c - c0  # c0 is even: i's parity is the chunk's place in its output group
        stage = i % 2
        nxt = 1 - stage
        gl.thread_barrier()  # the previous chunk, the last reader of stage nxt, is done in every warp
        _load_chunk(
            q_desc, k_desc, v_desc, a_desc, ct_desc, chunk_bos, base + gl.minimum(c + 1, c1 - 1), i_h, i_hv, i_v,
            bars.index(nxt), q_t.index(nxt), k_t.index(nxt), v_t.index(nxt), a_t.index(nxt), ct_t.index(nxt),
            c + 1 < c1, HV, K, V, BV,
        )  # fmt: skip
        mbarrier.wait(bars.index(stage), (i // 2) & 1)  # a stage's barrier completes once per two chunks
        if GROUPED:  # the odd chunk reads the even chunk's would-be write
            read = stage
            write_r = stage == 0
        else:
            read = 0
            write_r = False
        S = _chunk_step(
            S, c, base + c, m_row, g, o, chunk_bos, chunk_len, scale, i_hv, i_v,
            q_t.index(stage), k_t.index(stage), v_t.index(stage), a_t.index(stage), ct_t.index(stage),
            states, read, write_r, w_s, u_s, ud_s, dbg + i * (9 * CHUNK * BV), (gl.program_id(0) == 0) & (i < 2),
            HV, V, BV, MMA, DEBUG, VARIANT,
        )  # fmt: skip
    mbarrier.invalidate(bars.index(0))
    mbarrier.invalidate(bars.index(1))
    if STORE_FINAL:
        if c1 == n_chunks:
            gl.store(ht + _state_offsets(n_seq * HV + i_hv, i_v, K, V, BV, MMA), S)
