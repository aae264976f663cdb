"""The Gluon walk with one state hand-off per pair of chunks (a candidate; ``walk_coupling.py`` times it beside the
coupling ledger): replacements on ``walk_gluon_kernel.py`` as it is on 2026-12-04, grouped output only.

Under grouped output the output role reads the state's bf16 copy (slot 0) at even chunks and the even chunk's
would-be write ``R`` (slot 1) at odd ones. Today the state warpgroup stores the state after *every* chunk into slot
0, waiting first for the output's read of that chunk; but after an even chunk nothing but its own next ``K S`` reads
that copy, and that product can read what is already in shared memory: ``R`` itself when the even chunk was
selected (the state after it *is* ``R``, the same bf16 values), else the state before it, the product scaled by the
chunk's decay ``e^γ`` (``K S_{c+1} = e^γ K S_c``; one bf16 rounding of ``S_c`` instead of ``e^γ S_c``). So:

* even chunk: no store of the state and no wait at its end; before it overwrites slot 1 with ``R`` it waits for the
  output's read of slot 1 at the previous (odd) chunk — a whole step earlier, so normally long retired;
* odd chunk: ``K S`` from slot 1, or from slot 0 scaled; at its end, as today, wait for the output's read of slot 0
  (at the even chunk before), store the state into slot 0, hand it over.

``s_ready`` / ``s_read`` become one barrier per V tile *and parity of the chunk* (index ``2 · tile + parity``): each
completes once per pair, and no side gets two phases ahead of the other on any of them (the state hands the even
barrier's next phase over only after waiting for the output's read of its last one, and the odd barrier's likewise),
so the parity waits stay unambiguous. ``u_ready`` / ``u_done`` stay per chunk.

``walk_protocol_model.py`` runs both hand-offs, as barrier operations and tagged buffer reads, under random
interleavings of the four roles: no wrong read and no deadlock in either, while its mutations (a wrong parity, a
missing ``u_done`` wait, the output not waiting for the state) deadlock or read wrong. It also shows that in the
pair hand-off both ``s_read`` waits are implied by the ``u_done`` wait before them (the output reads a tile's state
before its ``U``), so the state warpgroups never wait for the output's read of the chunk they are on.

Outputs differ from the default only by the rounding of the scaled product (``o_rel`` in the ledger's JSON: of the
order of bf16's step, ~1e-3, not bit-equal); a protocol error would show as a large ``o_rel`` or a hang.
"""

_STATE_ARRIVE0 = "    mbarrier.arrive(s_ready)  # chunk c0's S_read\n"
_STATE_KS = "        ks = warpgroup_mma(k_c, s_s, zero, use_acc=False, is_async=True)\n"
_STATE_W = "        w = v_c - gl.where(selected, gl.exp(G), 0.0)[:, None] * ks\n"
_STATE_WRITE = "        decay = gl.exp(g_last)\n        r_lo = _write_half(k_c, w_s, S_lo * decay, 0)\n"
_STATE_TAIL = """        mbarrier.wait(s_read, i & 1)  # the output's Q S_read of this chunk has retired: slot 0 is free
        _store_halves(s_s, S_lo, S_hi)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(s_ready)  # the next chunk's S_read (slot 0, or slot 1 written above)
"""
_OUT_WAIT = "            mbarrier.wait(s_ready.index(t), i & 1)\n"
_OUT_ARRIVE = "            mbarrier.arrive(s_read.index(t))\n"
_ALLOC = """    s_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    s_read = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
"""
_INIT = """        mbarrier.init(s_ready.index(s), count=1)
        mbarrier.init(s_read.index(s), count=1)
"""

PAIR_HANDOFF = [
    (
        _STATE_ARRIVE0,
        "    gl.static_assert(GROUPED, 'one hand-off per pair of chunks is for grouped output')\n"
        "    mbarrier.arrive(s_ready.index(2 * i_v))  # chunk c0's S_read (slot 0; even)\n"
        "    src = 0  # the slot the next K S reads, and the scale of its product\n"
        "    src_scale = 1.0\n",
    ),
    (_STATE_KS, _STATE_KS.replace("s_s,", "states.index(src),")),
    (_STATE_W, _STATE_W.replace("gl.exp(G)", "gl.exp(G) * src_scale")),
    (
        _STATE_WRITE,
        "        decay = gl.exp(g_last)\n"
        "        if write_r:  # the output's read of slot 1 at the previous (odd) chunk has retired\n"
        "            mbarrier.wait(s_read.index(2 * i_v + 1), ((i // 2) & 1) ^ 1)\n"
        "        r_lo = _write_half(k_c, w_s, S_lo * decay, 0)\n",
    ),
    (
        _STATE_TAIL,
        """        if write_r:  # even: R in slot 1 is the odd chunk's S_read; its K S reads R, or slot 0 scaled
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(s_ready.index(2 * i_v + 1))
        else:  # odd: the even chunk's read of slot 0 has retired; slot 0 takes the state for the next pair
            mbarrier.wait(s_read.index(2 * i_v), (i // 2) & 1)
            _store_halves(s_s, S_lo, S_hi)
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(s_ready.index(2 * i_v))
        src = gl.where(write_r & selected, 1, 0)
        src_scale = gl.where(write_r & (selected == 0), decay, 1.0)
""",
    ),
    (_OUT_WAIT, "            mbarrier.wait(s_ready.index(2 * t + read), (i // 2) & 1)\n"),
    (_OUT_ARRIVE, "            mbarrier.arrive(s_read.index(2 * t + read))\n"),
    (_ALLOC, _ALLOC.replace("[2, 1]", "[4, 1]")),
    (
        _INIT,
        "        for p in gl.static_range(2):  # per V tile and parity of the chunk\n"
        "            mbarrier.init(s_ready.index(2 * s + p), count=1)\n"
        "            mbarrier.init(s_read.index(2 * s + p), count=1)\n",
    ),
    ("                 s_ready.index(0), s_read.index(0), g,", "                 s_ready, s_read, g,"),
    ("                 s_ready.index(1), s_read.index(1), g,", "                 s_ready, s_read, g,"),
]
"""(old, new) replacements: each old text occurs once in the kernel module."""


_WRITE = """        r_lo = _write_half(k_c, w_s, S_lo * decay, 0)
        if write_r:
            states.index(1).slice(0, CHUNK).store(r_lo.to(dt))
        S_lo = gl.where(selected, r_lo, S_lo * decay)
        r_hi = _write_half(k_c, w_s, S_hi * decay, 1)
        if write_r:
            states.index(1).slice(CHUNK, CHUNK).store(r_hi.to(dt))
        S_hi = gl.where(selected, r_hi, S_hi * decay)
"""
SKIP_WRITE = [
    (
        _WRITE,
        """        S_lo = S_lo * decay
        S_hi = S_hi * decay
        # an odd chunk's write is read by nothing when it is not selected: a loop of 0 or 1 trips, not a branch
        # (Triton 3.6 builds a branch holding the write wrong; whether a loop holding it builds right is what this
        # variant's outputs say)
        for _ in range((write_r | selected).to(gl.int32)):
            r_lo = _write_half(k_c, w_s, S_lo, 0)
            if write_r:
                states.index(1).slice(0, CHUNK).store(r_lo.to(dt))
            S_lo = gl.where(selected, r_lo, S_lo)
            r_hi = _write_half(k_c, w_s, S_hi, 1)
            if write_r:
                states.index(1).slice(CHUNK, CHUNK).store(r_hi.to(dt))
            S_hi = gl.where(selected, r_hi, S_hi)
""",
    )
]
"""With :data:`PAIR_HANDOFF`: the state warpgroups skip the write of an odd chunk that is not selected (35 % of the
chunks at the bench's keep ratio; the write is 8 of a chunk's 20 state products). Also a probe of the compiler: a
0-or-1-trip loop in place of the branch that Triton 3.6 builds wrong around products
(``benchmarks/tuning/2026-12-01/walk_gluon_probe.py``) — if its ``o_rel`` matches ``pair_handoff``'s, state
warpgroups can skip products per chunk this way, which is what walking only the selected chunks needs."""

_KS = """        ks = warpgroup_mma(k_c, states.index(src), zero, use_acc=False, is_async=True)
        G, g_last = _chunk_decays(x, MMA)
        v_c = v_t.index(stage).load(MMA).to(gl.float32)
        ks = warpgroup_mma_wait(0, deps=(ks,))
"""
SKIP_KS = [
    (
        _KS,
        """        ks = zero  # K S for the selected chunks alone (W = V for the others), by a loop of 0 or 1 trips
        for _ in range(selected.to(gl.int32)):
            ks = warpgroup_mma(k_c, states.index(src), zero, use_acc=False, is_async=True)
            ks = warpgroup_mma_wait(0, deps=(ks,))
        G, g_last = _chunk_decays(x, MMA)
        v_c = v_t.index(stage).load(MMA).to(gl.float32)
""",
    )
]
"""With :data:`PAIR_HANDOFF` and :data:`SKIP_WRITE`: ``K S`` only where the chunk is selected (70 % of the chunks
skip it), at the price of its overlap with the decays' scan and the V tile's read (formed for every chunk since
2026-12-03 because the branch form cost more than the products it skipped: ``../2026-12-03c/chain_overlap.json``)."""
