"""The Gluon walk's device code (``ops/gdn/walk_gluon.py`` has the math, the status and the launcher).

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
TILE = gl.constexpr(128)
"""Rows per (chunk, value head) of the walk's tiles (``walk_gluon.TILE_ROWS``): ``A_c``, then ``Ct``."""
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
def _segment(seg_seq, seg_c0, seg_c1, seq_chunk0, seq_nchunks, mask, i_s, i_h, P: gl.constexpr, CMAX: gl.constexpr):
    """``(n_seq, c0, c1, base, n_chunks, m_row)`` of segment ``i_s``: its sequence, first and end chunk, the
    sequence's first packed chunk and chunk count, and the event-mask row of head pair ``i_h`` in that sequence."""
    n_seq = gl.load(seg_seq + i_s)
    c0 = gl.load(seg_c0 + i_s)
    c1 = gl.load(seg_c1 + i_s)
    base = gl.load(seq_chunk0 + n_seq)
    n_chunks = gl.load(seq_nchunks + n_seq)
    return n_seq, c0, c1, base, n_chunks, mask + (n_seq * P + i_h).to(gl.int64) * CMAX


@gluon.jit
def _debug_store(dbg, slot, x, layout: gl.constexpr):
    """Debug builds only: ``x [R, BV]`` fp32 into ``dbg`` at ``slot`` (in units of 64 rows), row-major."""
    R: gl.constexpr = x.shape[0]
    BV: gl.constexpr = x.shape[1]
    rows = gl.arange(0, R, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, BV, layout=gl.SliceLayout(0, layout))
    gl.store(dbg + slot * CHUNK * BV + rows[:, None] * BV + cols[None, :], x)


@gluon.jit
def _half_offsets(row, i_v, h: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, layout: gl.constexpr):
    """``[64, BV]`` offsets (in ``layout``) of key rows ``64 h .. 64 h + 63`` of V tile ``i_v`` of state ``row`` of
    a ``[.., 128, V]`` state array."""
    offs_k = h * CHUNK + gl.arange(0, CHUNK, layout=gl.SliceLayout(1, layout))
    offs_v = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(0, layout))
    return (row.to(gl.int64) * (2 * CHUNK) + offs_k[:, None]) * V + offs_v[None, :]


@gluon.jit
def _initial_state(
    entry, h0, i_s, n_seq, i_hv, i_v,
    HV: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, HAS_H0: gl.constexpr, HAS_ENTRY: gl.constexpr,
    layout: gl.constexpr,
):  # fmt: skip
    """``(S_lo, S_hi)``, the state entering the segment as its two ``[64, BV]`` key halves (fp32, ``layout``): the
    segment's entry state, else the sequence's initial state, else zeros."""
    if HAS_ENTRY:
        lo = gl.load(entry + _half_offsets(i_s * HV + i_hv, i_v, 0, V, BV, layout))
        hi = gl.load(entry + _half_offsets(i_s * HV + i_hv, i_v, 1, V, BV, layout))
    elif HAS_H0:
        lo = gl.load(h0 + _half_offsets(n_seq * HV + i_hv, i_v, 0, V, BV, layout)).to(gl.float32)
        hi = gl.load(h0 + _half_offsets(n_seq * HV + i_hv, i_v, 1, V, BV, layout)).to(gl.float32)
    else:
        lo = gl.zeros([CHUNK, BV], gl.float32, layout)
        hi = gl.zeros([CHUNK, BV], gl.float32, layout)
    return lo, hi


@gluon.jit
def _store_final(ht, S_lo, S_hi, n_seq, i_hv, i_v, HV: gl.constexpr, V: gl.constexpr, BV: gl.constexpr,
                 layout: gl.constexpr):  # fmt: skip
    gl.store(ht + _half_offsets(n_seq * HV + i_hv, i_v, 0, V, BV, layout), S_lo)
    gl.store(ht + _half_offsets(n_seq * HV + i_hv, i_v, 1, V, BV, layout), S_hi)


@gluon.jit
def _store_halves(dst, lo, hi):
    """``dst [128, BV]`` (shared) ← the bf16 rounding of ``[lo; hi]``."""
    dst.slice(0, CHUNK).store(lo.to(dst.dtype))
    dst.slice(CHUNK, CHUNK).store(hi.to(dst.dtype))


@gluon.jit
def _chunk_inputs(g, chunk_bos, chunk_len, m_row, c, cg, i_hv, HV: gl.constexpr):
    """What a chunk step reads from global memory besides its tiles: ``(bos, n_rows, x, selected)`` — chunk ``c``'s
    (packed ``cg``) first token (int64), its valid rows, its log-decays ``x [64]`` fp32 (0 past the end) and its
    event bit. The walk loads them a chunk ahead: chained global loads (the offsets, then the decays at them) would
    otherwise stand at the start of every step."""
    scan: gl.constexpr = gl.BlockedLayout([1], [32], [WARPS], [0])
    o64 = gl.arange(0, CHUNK, layout=scan)
    bos = gl.load(chunk_bos + cg).to(gl.int64)
    n_rows = gl.load(chunk_len + cg)
    x = gl.load(g + (bos + o64) * HV + i_hv, mask=o64 < n_rows, other=0.0).to(gl.float32)
    selected = gl.load(m_row + c) != 0
    return bos, n_rows, x, selected


@gluon.jit
def _chunk_decays(x, layout: gl.constexpr):
    """``(G [64], γ)``: the chunk's cumulative log-decays from ``x`` (:func:`_chunk_inputs`; rows past the chunk's
    end add 0, so they repeat the last valid G), in the row layout of ``layout``, and their total ``γ = G[63]``, as
    ``fused._chunk_tiles``."""
    G = gl.associative_scan(x, 0, _add)
    o64 = gl.arange(0, CHUNK, layout=x.type.layout)
    g_last = gl.sum(gl.where(o64 == CHUNK - 1, G, 0.0), 0)
    return gl.convert_layout(G, gl.SliceLayout(1, layout)), g_last


@gluon.jit
def _load_chunk(
    q_desc, k_desc, v_desc, a_desc, bos, cg, i_h, i_hv, i_v, bar, q_t, k_t, v_t, a_t, pred,
    HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr,
):  # fmt: skip
    """Issue the TMA loads of packed chunk ``cg`` (first token ``bos``) into one stage (``pred`` False: none; ``cg``
    must still be a valid chunk index): ``Q_c, K_c [64, K]``, the V tile ``[64, BV]`` and the stored scores
    ``A_c``; ``bar`` completes when all four have landed.

    A chunk shorter than 64 rows gets the next sequence's rows (or zeros past the tensor). They reach nothing:
    ``Ct``'s rows and columns past the chunk's end are zero (β = 0 there, so ``C diag(β)``'s columns vanish, and
    ``(I + L)⁻¹``'s rows there are unit rows times that β; intra.py), so are ``A``'s (its q and k rows are masked to
    zero in the scores kernel), hence ``U`` is zero there and ``Kᵀ (U ⊙ ·)`` ignores those keys; the output store
    is masked to the valid rows."""
    bos = bos.to(gl.int32)
    nbytes: gl.constexpr = (
        q_desc.block_type.nbytes + k_desc.block_type.nbytes + v_desc.block_type.nbytes + a_desc.block_type.nbytes
    )
    mbarrier.expect(bar, nbytes, pred=pred)
    tma.async_copy_global_to_shared(k_desc, [bos, i_h * K], bar, k_t, pred=pred)
    tma.async_copy_global_to_shared(v_desc, [bos, i_hv * V + i_v * BV], bar, v_t, pred=pred)
    tma.async_copy_global_to_shared(q_desc, [bos, i_h * K], bar, q_t, pred=pred)
    rows: gl.constexpr = a_desc.block_type.shape[0]  # 64: A_c; 128: A_c, then the dense Ct
    tma.async_copy_global_to_shared(a_desc, [(cg * HV + i_hv) * rows, 0], bar, a_t, pred=pred)


@gluon.jit
def _inline_scores(qk, G, n_rows, MMA: gl.constexpr):
    """``A_c = Q_c K_cᵀ ⊙ e^{G_i − G_j}`` on the causal triangle ``j <= i`` (0 above it), fp32, from ``qk = Q_c
    K_cᵀ`` ``[64, 64]`` fp32 (``MMA`` layout) and ``G [64]`` (its row layout) — what intra stores as the chunk's
    scores (``intra._causal_scores``). Rows and columns past a short chunk's end carry the next rows' values; they
    reach nothing (``U``'s rows there are zero, the output's store is masked)."""
    # the row index through the chunk's length (n_rows <= 64, so unchanged): kept in the loop, not hoisted out of it
    # into registers held across the walk
    rows = gl.minimum(gl.arange(0, CHUNK, layout=gl.SliceLayout(1, MMA)), n_rows + CHUNK)
    cols = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, MMA))
    G_col = gl.convert_layout(G, gl.SliceLayout(0, MMA))
    causal = rows[:, None] >= cols[None, :]
    return qk * gl.exp(gl.where(causal, G[:, None] - G_col[None, :], float("-inf")))  # e^{G_i − G_j} <= 1 there


@gluon.jit
def _write_half(k_t, ud_s, decayed, h: gl.constexpr):
    """Key rows ``64 h ..`` of the would-be write ``R = e^γ S + K_cᵀ Ud`` (``decayed``: those rows of e^γ S;
    ``K_cᵀ``'s rows are a transposed view of the K tile's columns)."""
    r = warpgroup_mma(k_t.slice(h * CHUNK, CHUNK, dim=1).permute((1, 0)), ud_s, decayed, is_async=True)
    return warpgroup_mma_wait(0, deps=(r,))


@gluon.jit
def _chunk_step(
    S_lo, S_hi, inputs, o, scale, i_hv, i_v, ct_tile,
    q_t, k_t, v_t, a_t, states, read, write_r, w_s, u_s, dbg, record,
    HV: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, MMA: gl.constexpr, DEBUG: gl.constexpr,
):  # fmt: skip
    """Walk the chunk whose :func:`_chunk_inputs` are ``inputs`` and whose tiles have landed in ``q_t .. a_t``;
    ``ct_tile`` is its dense ``Ct [64, 64]`` (shared memory, beside ``A_c``). ``S_lo, S_hi [64, BV]`` fp32
    (``MMA`` layout; key rows 0-63 and 64-127) is the state entering it and ``states [2, K, BV]`` holds its bf16
    copy (slot 0) and the last would-be write (slot 1). Stores the chunk's output, reading slot ``read`` (1: a
    group's odd chunk under grouped output); returns the state after the chunk, with slot 0 updated to it.
    ``write_r``: store the would-be write into slot 1 (a group's even chunk under grouped output).

    ``fused._chunk_step`` with the K S correction, but an unselected chunk skips ``K S``. The products sit outside
    branches but for ``K S``, alone on the selected side and waited there: on sm_90, Triton 3.6 builds wrong results
    (or illegal addresses) from this loop when a branch holds products on both sides, or holds the write ``Kᵀ U``
    or the output's product. So the write is formed for every chunk and kept where selected, as in the Triton
    walk."""
    dt: gl.constexpr = w_s.dtype
    s_s = states.index(0)
    s_read = states.index(read)
    bos, n_rows, x, selected = inputs
    G, g_last = _chunk_decays(x, MMA)
    eG = gl.exp(G)[:, None]
    zero = gl.zeros([CHUNK, BV], gl.float32, MMA)
    # W = V − e^G ⊙ K S (selected) or V, then U = Ct W beside Q S_read.
    if selected:
        ks = warpgroup_mma(k_t, s_s, zero, use_acc=False, is_async=True)
        ks = warpgroup_mma_wait(0, deps=(ks,))
        w = v_t.load(MMA).to(gl.float32) - eG * ks
        if DEBUG:
            if record:
                _debug_store(dbg, 1, ks, MMA)
    else:
        w = v_t.load(MMA).to(gl.float32)
    w_s.store(w.to(dt))
    fence_async_shared()
    gl.thread_barrier()  # every warp's rows of W are in shared memory before the products read them
    qs = warpgroup_mma(q_t, s_read, zero, use_acc=False, is_async=True)
    u = warpgroup_mma(ct_tile, w_s, zero, use_acc=False, is_async=True)
    u, qs = warpgroup_mma_wait(0, deps=(u, qs))
    gl.thread_barrier()  # U = Ct W has retired in every warp: W's buffer takes U ⊙ e^{γ − G}
    u_s.store(u.to(dt))
    w_s.store((u * gl.exp(g_last - G)[:, None]).to(dt))
    fence_async_shared()
    gl.thread_barrier()
    # The write in two key halves, one after the other: the state's halves, one half of R and the output's
    # accumulator are live at once (128 fp32 registers, not 160 with R whole).
    decay = gl.exp(g_last)
    out = warpgroup_mma(a_t, u_s, eG * qs, is_async=True)
    r_lo = _write_half(k_t, w_s, S_lo * decay, 0)
    if write_r:
        states.index(1).slice(0, CHUNK).store(r_lo.to(dt))
    S_lo = gl.where(selected, r_lo, S_lo * decay)
    r_hi = _write_half(k_t, w_s, S_hi * decay, 1)
    out = warpgroup_mma_wait(0, deps=(out,))
    if write_r:
        states.index(1).slice(CHUNK, CHUNK).store(r_hi.to(dt))
    S_hi = gl.where(selected, r_hi, S_hi * decay)
    if DEBUG:  # slots: 0 Q S_read, 1 K S (selected), 2 W, 3 U, 4 O before scale, 5-6 R, 7-8 S after
        if record:
            _debug_store(dbg, 0, qs, MMA)
            _debug_store(dbg, 2, w, MMA)
            _debug_store(dbg, 3, u, MMA)
            _debug_store(dbg, 4, out, MMA)
            _debug_store(dbg, 5, r_lo, MMA)
            _debug_store(dbg, 6, r_hi, MMA)
            _debug_store(dbg, 7, S_lo, MMA)
            _debug_store(dbg, 8, S_hi, MMA)
    gl.thread_barrier()  # every warp's products reading slot 0 have retired before it is overwritten
    _store_halves(s_s, S_lo, S_hi)
    fence_async_shared()
    rows = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, MMA))
    cols = i_v * BV + gl.arange(0, BV, layout=gl.SliceLayout(0, MMA))
    p_o = o + (bos + rows)[:, None] * (HV * V) + i_hv * V + cols[None, :]
    gl.store(p_o, (scale * out).to(o.dtype.element_ty), mask=(rows < n_rows)[:, None])
    return S_lo, S_hi


@gluon.jit
def sparse_gdn_fwd_kernel_walk_gluon(
    q_desc,
    k_desc,
    v_desc,
    a_desc,
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
    GROUPED: gl.constexpr,
    STAGES: gl.constexpr = 1,
    DEBUG: gl.constexpr = False,
):
    """The walk of one (segment, value head, V tile): ``fused.sparse_gdn_fwd_kernel_fused``'s arguments, with the
    chunk tiles as TMA descriptors (``q, k [T, H·K]``, ``v [T, HV·V]`` in ``[64, K]`` / ``[64, BV]`` blocks, and
    the walk's tiles ``[NC·HV·128, 64]`` in ``[128, 64]`` blocks: each chunk's stored scores, then its dense ``Ct``)
    instead of pointers (``ct``'s kept blocks are not read).

    ``STAGES`` 2: the next chunk's tiles load while this one computes (one program per SM at ``BV = 64``); 1: they
    load after it, in half the shared memory, and two programs share an SM instead."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BV, 16])
    dt: gl.constexpr = k_desc.dtype
    i_s, i_hv, i_v = _program(HV, V // BV)
    i_h = i_hv // (HV // H)
    n_seq, c0, c1, base, n_chunks, m_row = _segment(
        seg_seq, seg_c0, seg_c1, seq_chunk0, seq_nchunks, mask, i_s, i_h, P, CMAX
    )

    # STAGES stages of chunk tiles (chunk c0 + i in stage i mod STAGES), one barrier each.
    q_t = gl.allocate_shared_memory(dt, [STAGES, CHUNK, K], q_desc.layout)
    k_t = gl.allocate_shared_memory(dt, [STAGES, CHUNK, K], k_desc.layout)
    v_t = gl.allocate_shared_memory(dt, [STAGES, CHUNK, BV], v_desc.layout)
    a_t = gl.allocate_shared_memory(dt, [STAGES, a_desc.block_type.shape[0], CHUNK], a_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(bars.index(s), count=1)
    # The products' bf16 operands: the state and the would-be write, W (then U ⊙ e^{γ − G}) and U.
    states = gl.allocate_shared_memory(dt, [2, K, BV], gl.NVMMASharedLayout.get_default_for([K, BV], dt))
    tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([CHUNK, BV], dt)
    w_s = gl.allocate_shared_memory(dt, [CHUNK, BV], tile_layout)
    u_s = gl.allocate_shared_memory(dt, [CHUNK, BV], tile_layout)

    S_lo, S_hi = _initial_state(entry, h0, i_s, n_seq, i_hv, i_v, HV, V, BV, HAS_H0, HAS_ENTRY, MMA)
    _store_halves(states.index(0), S_lo, S_hi)
    fence_async_shared()

    nxt = _chunk_inputs(g, chunk_bos, chunk_len, m_row, c0, base + c0, i_hv, HV)
    _load_chunk(
        q_desc, k_desc, v_desc, a_desc, nxt[0], base + c0, i_h, i_hv, i_v, bars.index(0),
        q_t.index(0), k_t.index(0), v_t.index(0), a_t.index(0), c0 < c1, HV, K, V, BV,
    )  # fmt: skip
    for c in range(c0, c1):
        i = c - c0  # c0 is even: i's parity is the chunk's place in its output group
        c_next = gl.minimum(c + 1, c1 - 1)
        cur = nxt
        nxt = _chunk_inputs(g, chunk_bos, chunk_len, m_row, c_next, base + c_next, i_hv, HV)  # during this chunk
        if STAGES == 2:
            stage = i % 2
            gl.thread_barrier()  # the previous chunk, the last reader of the other stage, is done in every warp
            _load_chunk(
                q_desc, k_desc, v_desc, a_desc, nxt[0], base + c_next, i_h, i_hv, i_v, bars.index(1 - stage),
                q_t.index(1 - stage), k_t.index(1 - stage), v_t.index(1 - stage), a_t.index(1 - stage), c + 1 < c1,
                HV, K, V, BV,
            )  # fmt: skip
            mbarrier.wait(bars.index(stage), (i // 2) & 1)  # a stage's barrier completes once per two chunks
        else:
            stage = 0
            mbarrier.wait(bars.index(0), i & 1)
        ct_tile = a_t.index(stage).slice(CHUNK, CHUNK)  # the stage holds A_c, then the dense Ct
        a_tile = a_t.index(stage).slice(0, CHUNK)
        if GROUPED:  # the odd chunk reads the even chunk's would-be write
            read = i % 2
            write_r = i % 2 == 0
        else:
            read = 0
            write_r = False
        S_lo, S_hi = _chunk_step(
            S_lo, S_hi, cur, o, scale, i_hv, i_v, ct_tile,
            q_t.index(stage), k_t.index(stage), v_t.index(stage), a_tile, states, read, write_r,
            w_s, u_s, dbg + i * (9 * CHUNK * BV), (gl.program_id(0) == 0) & (i < 2), HV, V, BV, MMA, DEBUG,
        )  # fmt: skip
        if STAGES == 1:
            gl.thread_barrier()  # every warp is done with the stage before it is refilled
            _load_chunk(
                q_desc, k_desc, v_desc, a_desc, nxt[0], base + c_next, i_h, i_hv, i_v, bars.index(0),
                q_t.index(0), k_t.index(0), v_t.index(0), a_t.index(0), c + 1 < c1, HV, K, V, BV,
            )  # fmt: skip
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(bars.index(s))
    if c1 == n_chunks:  # the segment ends its sequence: the final state
        _store_final(ht, S_lo, S_hi, n_seq, i_hv, i_v, HV, V, BV, MMA)


# The warp-specialised walk: one CTA per (segment, value head) holding the whole [K, V] state as two 64-wide tiles,
# one warpgroup each, fed by a one-warp TMA producer through a two-stage ring (walk_gluon.py, "Warp-specialised").
WS_CONSUMER_REGS = gl.constexpr(232)
"""Registers per thread of each state warpgroup: two at 232 and the producer (padded to a warpgroup) at 40 take
64,512 of the SM's 65,536, so one CTA per SM."""
WS_PRODUCER_REGS = gl.constexpr(40)


@gluon.jit
def _ws_producer(
    q_desc, k_desc, v_desc, a_desc, q_t, k_t, v0_t, v1_t, a_t, ready, empty, chunk_bos, base, c0, c1, i_h, i_hv,
    HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr,
):  # fmt: skip
    """One warp: chunk ``c0 + i``'s ``Q, K [64, K]``, its two V tiles and its tile into stage ``i % 2`` of the
    rings once every consumer has released that stage (``empty``); ``ready`` completes when all five landed. The
    tile: where ``a_desc``'s boxes are 128 rows, the stored scores then ``Ct`` into ``a_t [2, 128, 64]``; where they
    are 64 rows (a walk forming its scores), the ``Ct`` rows alone into ``a_t [2, 64, 64]``. The chunk's offset is
    loaded before the wait, so its latency hides behind the consumers' step."""
    nbytes: gl.constexpr = (
        q_desc.block_type.nbytes + k_desc.block_type.nbytes + 2 * v_desc.block_type.nbytes + a_desc.block_type.nbytes
    )
    rows: gl.constexpr = a_desc.block_type.shape[0]
    for c in range(c0, c1):
        i = c - c0
        s = i % 2
        cg = base + c
        bos = gl.load(chunk_bos + cg)
        mbarrier.wait(empty.index(s), ((i // 2) & 1) ^ 1)  # a fresh barrier passes parity 1: the first round
        bar = ready.index(s)
        mbarrier.expect(bar, nbytes)
        tma.async_copy_global_to_shared(k_desc, [bos, i_h * K], bar, k_t.index(s))
        tma.async_copy_global_to_shared(v_desc, [bos, i_hv * V], bar, v0_t.index(s))
        tma.async_copy_global_to_shared(v_desc, [bos, i_hv * V + BV], bar, v1_t.index(s))
        tma.async_copy_global_to_shared(q_desc, [bos, i_h * K], bar, q_t.index(s))
        tma.async_copy_global_to_shared(a_desc, [(cg * HV + i_hv) * TILE + (TILE - rows), 0], bar, a_t.index(s))


@gluon.jit
def _ws_state(
    i_v, q_t, k_t, v_t, a_t, ready, empty, states, w_s, u_s, g, m_row, h0, entry, o, ht, chunk_bos, chunk_len,
    scale, base, c0, c1, i_s, i_hv, n_seq, n_chunks,
    HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, HAS_H0: gl.constexpr,
    HAS_ENTRY: gl.constexpr, GROUPED: gl.constexpr,
):  # fmt: skip
    """One warpgroup: V tile ``i_v`` of the state, walked over the segment's chunks as the single-warpgroup walk
    does (:func:`_chunk_step`), reading the ring's stage ``i % 2`` once ``ready`` and releasing it (``empty``)
    after the step's last product on it has retired in every warp."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BV, 16])
    S_lo, S_hi = _initial_state(entry, h0, i_s, n_seq, i_hv, i_v, HV, V, BV, HAS_H0, HAS_ENTRY, MMA)
    _store_halves(states.index(0), S_lo, S_hi)
    fence_async_shared()
    nxt = _chunk_inputs(g, chunk_bos, chunk_len, m_row, c0, base + c0, i_hv, HV)
    for c in range(c0, c1):
        i = c - c0  # c0 is even: i's parity is the chunk's place in its output group
        stage = i % 2
        c_next = gl.minimum(c + 1, c1 - 1)
        cur = nxt
        nxt = _chunk_inputs(g, chunk_bos, chunk_len, m_row, c_next, base + c_next, i_hv, HV)
        ct_tile = a_t.index(stage).slice(CHUNK, CHUNK)
        a_tile = a_t.index(stage).slice(0, CHUNK)
        if GROUPED:
            read = i % 2
            write_r = i % 2 == 0
        else:
            read = 0
            write_r = False
        mbarrier.wait(ready.index(stage), (i // 2) & 1)
        S_lo, S_hi = _chunk_step(
            S_lo, S_hi, cur, o, scale, i_hv, i_v, ct_tile,
            q_t.index(stage), k_t.index(stage), v_t.index(stage), a_tile, states, read, write_r,
            w_s, u_s, o, False, HV, V, BV, MMA, False,
        )  # fmt: skip
        # _chunk_step's last barrier follows every wait on this stage's products: release it for chunk i + 2.
        mbarrier.arrive(empty.index(stage))
    if c1 == n_chunks:
        _store_final(ht, S_lo, S_hi, n_seq, i_hv, i_v, HV, V, BV, MMA)


@gluon.jit
def sparse_gdn_fwd_kernel_walk_gluon_ws(
    q_desc,
    k_desc,
    v_desc,
    a_desc,
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
    P: gl.constexpr,
    CMAX: gl.constexpr,
    H: gl.constexpr,
    HV: gl.constexpr,
    K: gl.constexpr,
    V: gl.constexpr,
    BV: gl.constexpr,
    HAS_H0: gl.constexpr,
    HAS_ENTRY: gl.constexpr,
    GROUPED: gl.constexpr,
):
    """The walk of one (segment, value head) over the whole ``[K, V]`` state: :func:`sparse_gdn_fwd_kernel_walk_gluon`'s
    arguments (without the debug buffer), ``V = 2 · BV``. Two state warpgroups (the default partition and a worker)
    walk the two V tiles; a one-warp producer brings each chunk's tiles once for both, two chunks ahead at most."""
    gl.static_assert(V == 2 * BV, "the warp-specialised walk holds two V tiles per CTA")
    dt: gl.constexpr = k_desc.dtype
    pid = gl.program_id(0)
    i_s = pid // HV
    i_hv = pid % HV
    i_h = i_hv // (HV // H)
    n_seq, c0, c1, base, n_chunks, m_row = _segment(
        seg_seq, seg_c0, seg_c1, seq_chunk0, seq_nchunks, mask, i_s, i_h, P, CMAX
    )

    q_t = gl.allocate_shared_memory(dt, [2, CHUNK, K], q_desc.layout)
    k_t = gl.allocate_shared_memory(dt, [2, CHUNK, K], k_desc.layout)
    v0_t = gl.allocate_shared_memory(dt, [2, CHUNK, BV], v_desc.layout)
    v1_t = gl.allocate_shared_memory(dt, [2, CHUNK, BV], v_desc.layout)
    a_t = gl.allocate_shared_memory(dt, [2, a_desc.block_type.shape[0], CHUNK], a_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(2):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)  # one arrival per state warpgroup
    state_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([K, BV], dt)
    tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([CHUNK, BV], dt)
    states0 = gl.allocate_shared_memory(dt, [2, K, BV], state_layout)
    states1 = gl.allocate_shared_memory(dt, [2, K, BV], state_layout)
    w0_s = gl.allocate_shared_memory(dt, [CHUNK, BV], tile_layout)
    w1_s = gl.allocate_shared_memory(dt, [CHUNK, BV], tile_layout)
    u0_s = gl.allocate_shared_memory(dt, [CHUNK, BV], tile_layout)
    u1_s = gl.allocate_shared_memory(dt, [CHUNK, BV], tile_layout)
    # (the partitions' argument tuples are spelled out: a tuple built by ``+`` loses its constexprs)
    gl.warp_specialize(
        [
            (
                _ws_state,
                (0, q_t, k_t, v0_t, a_t, ready, empty, states0, w0_s, u0_s, g, m_row, h0, entry, o, ht, chunk_bos,
                 chunk_len, scale, base, c0, c1, i_s, i_hv, n_seq, n_chunks, HV, K, V, BV, HAS_H0, HAS_ENTRY, GROUPED),
            ),
            (
                _ws_state,
                (1, q_t, k_t, v1_t, a_t, ready, empty, states1, w1_s, u1_s, g, m_row, h0, entry, o, ht, chunk_bos,
                 chunk_len, scale, base, c0, c1, i_s, i_hv, n_seq, n_chunks, HV, K, V, BV, HAS_H0, HAS_ENTRY, GROUPED),
            ),
            (
                _ws_producer,
                (q_desc, k_desc, v_desc, a_desc, q_t, k_t, v0_t, v1_t, a_t, ready, empty, chunk_bos, base, c0, c1,
                 i_h, i_hv, HV, K, V, BV),
            ),
        ],
        [WARPS, 1],
        [WS_CONSUMER_REGS, WS_PRODUCER_REGS],
    )  # fmt: skip


# The walk with an output role: the two state warpgroups keep only the state's chain (K S, U = Ct W, the write) and
# a third warpgroup forms each chunk's output (Q S_read, A U, the store) beside them, from the state's and U's bf16
# copies in shared memory (walk_gluon.py, "With an output role"). Registers per thread: state 192 (the default
# partition gets the same remainder), output 88, producer 40: 128 threads × (192 + 192 + 88 + 40) = 65,536 with the
# producer's padding.
# sm_90a builds (Triton 3.6), spills under grouped / per-chunk output: 200 / 72 0 / 164 B, 208 / 56 456 / 124,
# 192 / 88 0 / 52, 184 / 104 8 / 4 (before the output's stores moved into _store_output; since: 8 / 60 at 192 / 88).
WS3_STATE_REGS = gl.constexpr(192)
WS3_OUTPUT_REGS = gl.constexpr(88)
# With the output role forming the scores (Q K^T and its decay before the chunk's outputs): 176 / 120, spills 8 / 4 B
# (184 / 104: 20 / 48, 192 / 88: 40 / 132); with the stores by TMA (_store_output) 12 / 20 B.
WS3_INLINE_STATE_REGS = gl.constexpr(176)
WS3_INLINE_OUTPUT_REGS = gl.constexpr(120)


@gluon.jit
def _ws3_state(
    i_v, k_t, v_t, ct_t, ready, empty, states, w_s, u_s, u_ready, u_done, s_ready, s_read, g, m_row, h0, entry,
    ht, chunk_bos, chunk_len, base, c0, c1, i_s, i_hv, n_seq, n_chunks,
    HV: gl.constexpr, K: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, HAS_H0: gl.constexpr,
    HAS_ENTRY: gl.constexpr, GROUPED: gl.constexpr,
):  # fmt: skip
    """One warpgroup: V tile ``i_v`` of the state over the segment's chunks, :func:`_chunk_step` without the
    output's products, ``Ct`` from the last 64 rows of each stage of the ring ``ct_t`` (``[2, 64 or 128, 64]``).
    Hands the output role, per chunk, ``U`` in ``u_s`` (``u_ready``; rewritten only once the previous chunk's
    ``A U`` has retired, ``u_done``) and the next chunk's ``S_read`` in ``states`` (``s_ready``; rewritten only
    once this chunk's ``Q S_read`` has retired, ``s_read``). The even chunk's would-be write goes to
    slot 1 under grouped output, as in :func:`_chunk_step`. Unlike :func:`_chunk_step`, ``K S`` is formed for every
    chunk, with no branch on the state's chain (``walk_gluon``'s module docstring has the measurement)."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BV, 16])
    dt: gl.constexpr = w_s.dtype
    s_s = states.index(0)
    S_lo, S_hi = _initial_state(entry, h0, i_s, n_seq, i_hv, i_v, HV, V, BV, HAS_H0, HAS_ENTRY, MMA)
    _store_halves(s_s, S_lo, S_hi)
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(s_ready)  # chunk c0's S_read
    nxt = _chunk_inputs(g, chunk_bos, chunk_len, m_row, c0, base + c0, i_hv, HV)
    for c in range(c0, c1):
        i = c - c0  # c0 is even: i's parity is the chunk's place in its output group
        stage = i % 2
        zero = gl.zeros([CHUNK, BV], gl.float32, MMA)  # (per step: not held in registers across the loop)
        c_next = gl.minimum(c + 1, c1 - 1)
        bos, n_rows, x, selected = nxt
        nxt = _chunk_inputs(g, chunk_bos, chunk_len, m_row, c_next, base + c_next, i_hv, HV)
        if GROUPED:
            write_r = i % 2 == 0
        else:
            write_r = False
        mbarrier.wait(ready.index(stage), (i // 2) & 1)
        k_c = k_t.index(stage)
        # K S for every chunk, outside any branch (an unselected chunk's W is V exactly: 0 · K S is 0), issued
        # before the decays' scan and the V tile's read, which overlap it (faster than the branch: docs/kernel-log.md)
        ks = warpgroup_mma(k_c, s_s, zero, use_acc=False, is_async=True)
        G, g_last = _chunk_decays(x, MMA)
        v_c = v_t.index(stage).load(MMA).to(gl.float32)
        ks = warpgroup_mma_wait(0, deps=(ks,))
        w = v_c - gl.where(selected, gl.exp(G), 0.0)[:, None] * ks
        w_s.store(w.to(dt))
        fence_async_shared()
        gl.thread_barrier()
        ct = ct_t.index(stage).slice(ct_t.shape[1] - CHUNK, CHUNK)  # a stage's last 64 rows: Ct
        u = warpgroup_mma(ct, w_s, zero, use_acc=False, is_async=True)
        u = warpgroup_mma_wait(0, deps=(u,))
        mbarrier.wait(u_done, (i & 1) ^ 1)  # the previous chunk's A U has retired (a fresh barrier passes parity 1)
        gl.thread_barrier()  # and U = Ct W in every warp of this one: W's buffer takes U ⊙ e^{γ − G}
        u_s.store(u.to(dt))
        w_s.store((u * gl.exp(g_last - G)[:, None]).to(dt))
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(u_ready)
        decay = gl.exp(g_last)
        r_lo = _write_half(k_c, w_s, S_lo * decay, 0)
        if write_r:
            states.index(1).slice(0, CHUNK).store(r_lo.to(dt))
        S_lo = gl.where(selected, r_lo, S_lo * decay)
        r_hi = _write_half(k_c, w_s, S_hi * decay, 1)
        if write_r:
            states.index(1).slice(CHUNK, CHUNK).store(r_hi.to(dt))
        S_hi = gl.where(selected, r_hi, S_hi * decay)
        gl.thread_barrier()  # this chunk's products on the stage have retired in every warp
        mbarrier.arrive(empty.index(stage))
        mbarrier.wait(s_read, i & 1)  # the output's Q S_read of this chunk has retired: slot 0 is free
        _store_halves(s_s, S_lo, S_hi)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(s_ready)  # the next chunk's S_read (slot 0, or slot 1 written above)
    if c1 == n_chunks:
        _store_final(ht, S_lo, S_hi, n_seq, i_hv, i_v, HV, V, BV, MMA)


@gluon.jit
def _masked_store(o, x, bos, n_rows, col0, HV: gl.constexpr, V: gl.constexpr, MMA: gl.constexpr):
    """``o [T, HV, V]`` at rows ``bos ..`` (the chunk's first ``n_rows``), columns ``col0 ..`` of the flat
    ``HV · V`` ← ``x [64, BV]`` (``MMA`` layout), by plain stores."""
    rows = gl.arange(0, CHUNK, layout=gl.SliceLayout(1, MMA))
    cols = col0 + gl.arange(0, x.shape[1], layout=gl.SliceLayout(0, MMA))
    p_o = o + (bos + rows)[:, None] * (HV * V) + cols[None, :]
    gl.store(p_o, x.to(o.dtype.element_ty), mask=(rows < n_rows)[:, None])


@gluon.jit
def _store_output(o, o_desc, o_s, x, bos, n_rows, col0, HV: gl.constexpr, V: gl.constexpr, MMA: gl.constexpr,
                  TMA_STORE: gl.constexpr):  # fmt: skip
    """Store one output tile ``x [64, BV]`` fp32 (:func:`_masked_store`'s arguments). ``TMA_STORE``: a whole chunk
    goes through ``o_s [64, BV]`` (shared) by one bulk TMA store — full 128-byte lines, asynchronous — once the
    previous store has read the buffer; a short chunk (a sequence's last) by masked stores, since a box would
    write its rows past the chunk's end, which belong to the next sequence. Why TMA: on the H200 the plain stores
    from the accumulator layout took 0.56 of a product-free walk's 1.29 ms at 128K."""
    if TMA_STORE:
        if n_rows == CHUNK:
            tma.store_wait(0)  # the previous tile's store has read o_s (waited by the thread that issued it) ..
            gl.thread_barrier()  # .. before any warp rewrites it
            o_s.store(x.to(o_s.dtype))
            fence_async_shared()
            gl.thread_barrier()
            tma.async_copy_shared_to_global(o_desc, [bos.to(gl.int32), col0], o_s)
        else:
            _masked_store(o, x, bos, n_rows, col0, HV, V, MMA)
    else:
        _masked_store(o, x, bos, n_rows, col0, HV, V, MMA)


@gluon.jit
def _ws3_output(
    q_t, k_t, a_s, ready, empty, states0, states1, u0_s, u1_s, u_ready, u_done, s_ready, s_read, g, m_row, o,
    o_desc, o_s, chunk_bos, chunk_len, scale, base, c0, c1, i_hv,
    HV: gl.constexpr, V: gl.constexpr, BV: gl.constexpr, GROUPED: gl.constexpr, INLINE_SCORES: gl.constexpr,
):  # fmt: skip
    """One warpgroup: each chunk's output ``O = scale · (e^G ⊙ (Q_c S_read) + A_c U)``, one V tile after the
    other, from the ring's ``Q_c`` and the state warpgroups' ``S_read`` / ``U`` (barrier pairs per tile:
    ``s_ready`` / ``s_read``, ``u_ready`` / ``u_done``, index = tile). ``A_c`` is stage ``i % 2`` of the stored
    scores' and Ct's ring ``a_s [2, 128, 64]`` (its first 64 rows), or (``INLINE_SCORES``) formed here
    (:func:`_inline_scores`) into the one buffer ``a_s [1, 64, 64]``; only then are the outputs stored through
    ``o_s`` by TMA (:func:`_store_output`: there is shared memory for its buffer only where the ring holds no
    scores)."""
    MMA: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BV, 16])
    nxt = _chunk_inputs(g, chunk_bos, chunk_len, m_row, c0, base + c0, i_hv, HV)
    for c in range(c0, c1):
        i = c - c0
        stage = i % 2
        zero = gl.zeros([CHUNK, BV], gl.float32, MMA)
        c_next = gl.minimum(c + 1, c1 - 1)
        bos, n_rows, x, _ = nxt
        nxt = _chunk_inputs(g, chunk_bos, chunk_len, m_row, c_next, base + c_next, i_hv, HV)
        if GROUPED:
            read = i % 2
        else:
            read = 0
        G, _ = _chunk_decays(x, MMA)
        eG = gl.exp(G)[:, None]
        mbarrier.wait(ready.index(stage), (i // 2) & 1)
        if INLINE_SCORES:  # the one scores buffer: its last reader, the previous chunk's A U, has retired
            a_tile = a_s.index(0)
            qk = warpgroup_mma(q_t.index(stage), k_t.index(stage).permute((1, 0)), zero, use_acc=False, is_async=True)
            qk = warpgroup_mma_wait(0, deps=(qk,))
            a_tile.store(_inline_scores(qk, G, n_rows, MMA).to(q_t.dtype))
            fence_async_shared()
            gl.thread_barrier()
        else:
            a_tile = a_s.index(stage).slice(0, CHUNK)
        for t in gl.static_range(2):
            if t == 0:
                s_tile = states0.index(read)
                u_tile = u0_s
            else:
                s_tile = states1.index(read)
                u_tile = u1_s
            mbarrier.wait(s_ready.index(t), i & 1)
            qs = warpgroup_mma(q_t.index(stage), s_tile, zero, use_acc=False, is_async=True)
            qs = warpgroup_mma_wait(0, deps=(qs,))
            gl.thread_barrier()
            mbarrier.arrive(s_read.index(t))
            mbarrier.wait(u_ready.index(t), i & 1)
            out = warpgroup_mma(a_tile, u_tile, eG * qs, is_async=True)
            out = warpgroup_mma_wait(0, deps=(out,))
            gl.thread_barrier()
            mbarrier.arrive(u_done.index(t))
            _store_output(o, o_desc, o_s, scale * out, bos, n_rows, i_hv * V + t * BV, HV, V, MMA, INLINE_SCORES)
        gl.thread_barrier()  # both tiles' products on the stage have retired in every warp
        mbarrier.arrive(empty.index(stage))
    if INLINE_SCORES:
        tma.store_wait(0)  # the last store has read o_s before the CTA's shared memory goes


@gluon.jit
def sparse_gdn_fwd_kernel_walk_gluon_ws3(
    q_desc,
    k_desc,
    v_desc,
    a_desc,
    o_desc,
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
    P: gl.constexpr,
    CMAX: gl.constexpr,
    H: gl.constexpr,
    HV: gl.constexpr,
    K: gl.constexpr,
    V: gl.constexpr,
    BV: gl.constexpr,
    HAS_H0: gl.constexpr,
    HAS_ENTRY: gl.constexpr,
    GROUPED: gl.constexpr,
    INLINE_SCORES: gl.constexpr = False,
):
    """:func:`sparse_gdn_fwd_kernel_walk_gluon_ws` with the output's products in a warpgroup of their own
    (:func:`_ws3_output`) beside the two state warpgroups (:func:`_ws3_state`) and the producer; its arguments and
    ``o_desc``, the output ``o`` as ``[T, HV·V]`` in ``[64, BV]`` blocks; the same shared memory (the barriers
    aside), ``V = 2 · BV``. ``INLINE_SCORES``: ``a_desc``'s ``[64, 64]`` boxes bring each tile's ``Ct`` rows alone,
    the output role forms the scores and stores its whole chunks through ``o_desc``."""
    gl.static_assert(V == 2 * BV, "the warp-specialised walk holds two V tiles per CTA")
    dt: gl.constexpr = k_desc.dtype
    pid = gl.program_id(0)
    i_s = pid // HV
    i_hv = pid % HV
    i_h = i_hv // (HV // H)
    n_seq, c0, c1, base, n_chunks, m_row = _segment(
        seg_seq, seg_c0, seg_c1, seq_chunk0, seq_nchunks, mask, i_s, i_h, P, CMAX
    )

    q_t = gl.allocate_shared_memory(dt, [2, CHUNK, K], q_desc.layout)
    k_t = gl.allocate_shared_memory(dt, [2, CHUNK, K], k_desc.layout)
    v0_t = gl.allocate_shared_memory(dt, [2, CHUNK, BV], v_desc.layout)
    v1_t = gl.allocate_shared_memory(dt, [2, CHUNK, BV], v_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    # per V tile: U handed to the output role and taken back, S_read handed over and taken back
    u_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    u_done = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    s_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    s_read = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(2):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=3)  # one arrival per state warpgroup and one by the output role
        mbarrier.init(u_ready.index(s), count=1)
        mbarrier.init(u_done.index(s), count=1)
        mbarrier.init(s_ready.index(s), count=1)
        mbarrier.init(s_read.index(s), count=1)
    state_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([K, BV], dt)
    tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([CHUNK, BV], dt)
    states0 = gl.allocate_shared_memory(dt, [2, K, BV], state_layout)
    states1 = gl.allocate_shared_memory(dt, [2, K, BV], state_layout)
    w0_s = gl.allocate_shared_memory(dt, [CHUNK, BV], tile_layout)
    w1_s = gl.allocate_shared_memory(dt, [CHUNK, BV], tile_layout)
    u0_s = gl.allocate_shared_memory(dt, [CHUNK, BV], tile_layout)
    u1_s = gl.allocate_shared_memory(dt, [CHUNK, BV], tile_layout)
    if INLINE_SCORES:  # a ring of the tiles' Ct rows, the one buffer the output role forms the scores into and
        # the one its stores go through; the same shared memory as the ring of whole tiles
        ring = gl.allocate_shared_memory(dt, [2, CHUNK, CHUNK], a_desc.layout)
        a_s = gl.allocate_shared_memory(dt, [1, CHUNK, CHUNK], a_desc.layout)
        o_s = gl.allocate_shared_memory(dt, [CHUNK, BV], o_desc.layout)
    else:  # a ring of whole tiles: the stored scores, then Ct; the output role's stores are plain
        ring = gl.allocate_shared_memory(dt, [2, TILE, CHUNK], a_desc.layout)
        a_s = ring
        o_s = w0_s  # (not written: a placeholder argument)
    state_regs: gl.constexpr = WS3_INLINE_STATE_REGS if INLINE_SCORES else WS3_STATE_REGS
    output_regs: gl.constexpr = WS3_INLINE_OUTPUT_REGS if INLINE_SCORES else WS3_OUTPUT_REGS
    gl.warp_specialize(
        [
            (
                _ws3_state,
                (0, k_t, v0_t, ring, ready, empty, states0, w0_s, u0_s, u_ready.index(0), u_done.index(0),
                 s_ready.index(0), s_read.index(0), g, m_row, h0, entry, ht, chunk_bos, chunk_len, base, c0, c1, i_s,
                 i_hv, n_seq, n_chunks, HV, K, V, BV, HAS_H0, HAS_ENTRY, GROUPED),
            ),
            (
                _ws3_state,
                (1, k_t, v1_t, ring, ready, empty, states1, w1_s, u1_s, u_ready.index(1), u_done.index(1),
                 s_ready.index(1), s_read.index(1), g, m_row, h0, entry, ht, chunk_bos, chunk_len, base, c0, c1, i_s,
                 i_hv, n_seq, n_chunks, HV, K, V, BV, HAS_H0, HAS_ENTRY, GROUPED),
            ),
            (
                _ws3_output,
                (q_t, k_t, a_s, ready, empty, states0, states1, u0_s, u1_s, u_ready, u_done, s_ready, s_read, g, m_row,
                 o, o_desc, o_s, chunk_bos, chunk_len, scale, base, c0, c1, i_hv, HV, V, BV, GROUPED, INLINE_SCORES),
            ),
            (
                _ws_producer,
                (q_desc, k_desc, v_desc, a_desc, q_t, k_t, v0_t, v1_t, ring, ready, empty, chunk_bos, base, c0, c1,
                 i_h, i_hv, HV, K, V, BV),
            ),
        ],
        [WARPS, WARPS, 1],
        [state_regs, output_regs, WS_PRODUCER_REGS],
    )  # fmt: skip
