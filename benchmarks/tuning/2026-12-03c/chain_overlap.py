"""Ran on the H200 on 2026-12-03, 17:58 UTC against the kernel module of commit d06ebfd (``chain_overlap.json``
beside it; its patterns match that text, not later ones: ``ks_always`` is the default since): the state warpgroups'
chunk step with less of it between the previous chunk's state and this chunk's ``U``
(the walk's chain), against that module; the same products, so the outputs must equal the base's
bit for bit. Each variant is the module with text replacements (``../2026-12-02e/walk_ledger.variant_module``):

* ``ks_always`` — ``K S`` for every chunk, outside any branch, issued before the chunk's decays are scanned and its
  V tile is read (both overlap the product), then ``W = V − [selected] e^G ⊙ K S``: no branch on the chain (an
  unselected chunk's ``W`` is ``V`` exactly, ``0 · K S`` being 0).
* ``ks_overlap`` — the branch kept, the V tile read while ``K S`` runs.
* ``decay_ahead`` — ``ks_always``, and each chunk's decays scanned during the previous chunk's ``U = Ct W``.
* ``out_decay_ahead`` — ``decay_ahead``, and the output role's decays scanned during the previous chunk's ``Q Kᵀ``.

    timeout 300 python3 benchmarks/tuning/2026-12-03c/chain_overlap.py          # on the H200: $OUT/chain_overlap.json
    PYTHONPATH=<triton 3.6>:src python -P benchmarks/tuning/2026-12-03c/chain_overlap.py --build   # sm_90a builds
"""

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "2026-12-02e"))
from walk_ledger import build_all, variant_module  # noqa: E402

_KS_OLD = """        G, g_last = _chunk_decays(x, MMA)
        if selected:
            ks = warpgroup_mma(k_c, s_s, zero, use_acc=False, is_async=True)
            ks = warpgroup_mma_wait(0, deps=(ks,))
            w = v_t.index(stage).load(MMA).to(gl.float32) - gl.exp(G)[:, None] * ks
        else:
            w = v_t.index(stage).load(MMA).to(gl.float32)
"""
KS_ALWAYS = (
    _KS_OLD,
    """        ks = warpgroup_mma(k_c, s_s, zero, use_acc=False, is_async=True)
        G, g_last = _chunk_decays(x, MMA)
        v_c = v_t.index(stage).load(MMA).to(gl.float32)
        ks = warpgroup_mma_wait(0, deps=(ks,))
        w = v_c - gl.where(selected, gl.exp(G), 0.0)[:, None] * ks
""",
)
KS_OVERLAP = (
    _KS_OLD,
    """        G, g_last = _chunk_decays(x, MMA)
        if selected:
            ks = warpgroup_mma(k_c, s_s, zero, use_acc=False, is_async=True)
            v_c = v_t.index(stage).load(MMA).to(gl.float32)
            ks = warpgroup_mma_wait(0, deps=(ks,))
            w = v_c - gl.exp(G)[:, None] * ks
        else:
            w = v_t.index(stage).load(MMA).to(gl.float32)
""",
)
# decays a chunk ahead in the state warpgroups (on top of KS_ALWAYS)
STATE_AHEAD = [
    (
        """    mbarrier.arrive(s_ready)  # chunk c0's S_read
    nxt = _chunk_inputs(g, chunk_bos, chunk_len, m_row, c0, base + c0, i_hv, HV)
""",
        """    mbarrier.arrive(s_ready)  # chunk c0's S_read
    nxt = _chunk_inputs(g, chunk_bos, chunk_len, m_row, c0, base + c0, i_hv, HV)
    Gn, gn_last = _chunk_decays(nxt[2], MMA)
""",
    ),
    (
        """        G, g_last = _chunk_decays(x, MMA)
        v_c = v_t.index(stage).load(MMA).to(gl.float32)""",
        """        G = Gn
        g_last = gn_last
        v_c = v_t.index(stage).load(MMA).to(gl.float32)""",
    ),
    (
        """        u = warpgroup_mma(ct, w_s, zero, use_acc=False, is_async=True)
        u = warpgroup_mma_wait(0, deps=(u,))""",
        """        u = warpgroup_mma(ct, w_s, zero, use_acc=False, is_async=True)
        Gn, gn_last = _chunk_decays(nxt[2], MMA)  # the next chunk's, while U = Ct W runs
        u = warpgroup_mma_wait(0, deps=(u,))""",
    ),
]
OUTPUT_AHEAD = [
    (
        """    nxt = _chunk_inputs(g, chunk_bos, chunk_len, m_row, c0, base + c0, i_hv, HV)
    for c in range(c0, c1):
        i = c - c0
        stage = i % 2
        zero = gl.zeros([CHUNK, BV], gl.float32, MMA)""",
        """    nxt = _chunk_inputs(g, chunk_bos, chunk_len, m_row, c0, base + c0, i_hv, HV)
    Gn, _ = _chunk_decays(nxt[2], MMA)
    for c in range(c0, c1):
        i = c - c0
        stage = i % 2
        zero = gl.zeros([CHUNK, BV], gl.float32, MMA)""",
    ),
    ("""        G, _ = _chunk_decays(x, MMA)
        eG = gl.exp(G)[:, None]""", """        G = Gn
        eG = gl.exp(G)[:, None]"""),
    (
        """            qk = warpgroup_mma(q_t.index(stage), k_t.index(stage).permute((1, 0)), zero, use_acc=False, is_async=True)
            qk = warpgroup_mma_wait(0, deps=(qk,))""",
        """            qk = warpgroup_mma(q_t.index(stage), k_t.index(stage).permute((1, 0)), zero, use_acc=False, is_async=True)
            Gn, _ = _chunk_decays(nxt[2], MMA)
            qk = warpgroup_mma_wait(0, deps=(qk,))""",
    ),
]
VARIANTS = {
    "base": [],
    "ks_always": [KS_ALWAYS],
    "ks_overlap": [KS_OVERLAP],
    "decay_ahead": [KS_ALWAYS, *STATE_AHEAD],
    "out_decay_ahead": [KS_ALWAYS, *STATE_AHEAD, *OUTPUT_AHEAD],
}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="store_true", help="compile the variants for sm_90a and report them")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        if args.build:
            build_all(folder, VARIANTS)
        else:
            from compare import compare

            compare({n: variant_module(n, folder, r) for n, r in VARIANTS.items()}, "chain_overlap")
