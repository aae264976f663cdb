"""Prepared for the next device session: how much of the Gluon walk's step is the two roles waiting on each other.

The walk's state warpgroups and its output warpgroup hand each other two buffers per chunk and V tile
(``walk_gluon_kernel._ws3_state`` / ``_ws3_output``): the state warpgroup waits for the output's ``Q S_read`` of the
chunk before it overwrites the state's bf16 copy (``s_read``) and for the previous chunk's ``A U`` before it
overwrites ``U`` (``u_done``); the output waits for both to be ready (``s_ready``, ``u_ready``). The product ledger
(``../2026-12-02f/walk_ledger_tma.json``, 128K) measured the roles' products as nearly additive (state −0.39 ms when
cut, output −0.23, both −0.69), which is what roles that wait on each other every chunk would show. Each variant
below cuts waits (the arrivals stay, so every barrier still runs through its phases; the outputs are wrong, only the
time is read), or a role's whole work, on the default build (output role forming the scores, grouped output):

* ``decoupled``: no role waits on the other at all, so the walk takes the longer of the two chains (each still
  waits on the ring);
* ``state_alone`` / ``out_alone``: ``decoupled`` with the other role's products (and the output's stores) cut — each
  role's chain by itself over the same loads.

No role skips its waits alone: the other role's arrivals would then run ahead of the waits on those barriers, and a
parity wait that finds the barrier two phases on takes the newer phase for the one it waits for; near the end of a
segment no arrival comes to release it (a hang, not a timing). ``walk_protocol_model.py`` shows it for either side (a
segment of four chunks deadlocks with either role's waits cut alone), and shows ``decoupled`` cannot hang.

If ``decoupled`` is well below ``base``, the next change is the hand-off; ``pair_handoff`` is the candidate, timed in
the same run (``walk_pair_handoff.py``: the even chunk's state read from the would-be write it already stores, so that
one hand-off per pair of chunks waits on the other role); if not, the chains themselves. ``pair_handoff_skip`` adds the
odd unselected chunks' write skipped by a 0-or-1-trip loop: a saving, and the probe of whether such a loop builds right
where a branch around products does not; ``pair_handoff_skip_ks`` skips ``K S`` on the unselected chunks too. Same
method and harness as ``../2026-12-02e/walk_ledger.py`` (whole op at the Qwen3.5-4B GDN geometry, B = 1, 128K and 32K;
the walk's device time by torch.profiler).

    timeout 500 python3 benchmarks/tuning/next/walk_coupling.py          # on the H200: $OUT/walk_ledger_coupling.json
    PYTHONPATH=<triton 3.6>:src python -P benchmarks/tuning/next/walk_coupling.py --build   # sm_90a, no GPU
"""

import argparse
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "2026-12-02e"))
sys.path.insert(0, os.path.join(HERE, "..", "2026-12-02f"))
from walk_ledger import OUT_QK, OUT_QS, STATE_WRITE, build_all, measure  # noqa: E402
from walk_ledger_tma import NO_OUTPUT_STORE, OUT_AU, STATE_CTW  # noqa: E402
from walk_pair_handoff import PAIR_HANDOFF, SKIP_KS, SKIP_WRITE  # noqa: E402

# K S as the state warpgroups form it since 2026-12-03 (for every chunk, no branch; the ledgers' pattern names the
# branch it had before)
_KS_STEP = (
    "        ks = warpgroup_mma(k_c, s_s, zero, use_acc=False, is_async=True)\n"
    "        G, g_last = _chunk_decays(x, MMA)\n"
    "        v_c = v_t.index(stage).load(MMA).to(gl.float32)\n"
    "        ks = warpgroup_mma_wait(0, deps=(ks,))\n"
)
STATE_KS = (_KS_STEP, _KS_STEP.replace("warpgroup_mma(k_c, s_s, zero, use_acc=False, is_async=True)", "zero").replace(
    "        ks = warpgroup_mma_wait(0, deps=(ks,))\n", ""))  # fmt: skip
STATE = [STATE_KS, STATE_CTW, *STATE_WRITE]

STATE_SREAD = (
    "        mbarrier.wait(s_read, i & 1)  # the output's Q S_read of this chunk has retired: slot 0 is free\n",
    "",
)
STATE_UDONE = (
    "        mbarrier.wait(u_done, (i & 1) ^ 1)  # the previous chunk's A U has retired (a fresh barrier passes"
    " parity 1)\n",
    "",
)
OUT_SREADY = ("            mbarrier.wait(s_ready.index(t), i & 1)\n", "")
OUT_UREADY = ("            mbarrier.wait(u_ready.index(t), i & 1)\n", "")
DECOUPLED = [STATE_SREAD, STATE_UDONE, OUT_SREADY, OUT_UREADY]
VARIANTS = {
    "base": [],
    "decoupled": DECOUPLED,
    "state_alone": [*DECOUPLED, OUT_QK, OUT_QS, OUT_AU, NO_OUTPUT_STORE],
    "out_alone": [*DECOUPLED, *STATE],
    "pair_handoff": PAIR_HANDOFF,
    "pair_handoff_skip": PAIR_HANDOFF + SKIP_WRITE,
    "pair_handoff_skip_ks": PAIR_HANDOFF + SKIP_WRITE + SKIP_KS,
}

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="store_true", help="compile the variants for sm_90a and report them")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        build_all(folder, VARIANTS) if args.build else measure(folder, VARIANTS, "coupling")
