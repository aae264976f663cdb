"""The oracle selector (a diagnostic bound): block masses and selections equal a float64 hand-written rule in prefill
and decode, and no selector keeps more dense attention mass with the same budget."""

import math

import pytest
import torch

from longsparse.ops.sparse_attn import compress_keys, infllmv2_select, oracle_select, oracle_select_decode
from longsparse.ops.sparse_attn import naive as R
from tests.ops.sparse_attn.helpers import SMALL, WIDE, cfg_id, randn


def _mass_by_hand(q, k, t, h, G, blk):
    """Block masses of query row ``t`` (position ``t``), group ``h``: the heads' softmax over keys ``0 … t``."""
    d = q.shape[-1]
    mass = [0.0] * (-(-k.shape[0] // blk))
    for g in range(G):
        logits = [float(q[t, h * G + g] @ k[s, h]) / math.sqrt(d) for s in range(t + 1)]
        top = max(logits)
        weights = [math.exp(x - top) for x in logits]
        total = sum(weights)
        for s, w in enumerate(weights):
            mass[s // blk] += w / total / G
    return mass


def _select_by_hand(mass, pos, cfg):
    qb = pos // cfg.block_size
    forced = {b for b in range(qb + 1) if b < cfg.init_blocks or b >= qb - cfg.local_blocks}
    cand = sorted((b for b in range(qb + 1) if b not in forced), key=lambda b: (-mass[b], b))
    return sorted(forced | set(cand[: max(cfg.budget_blocks - len(forced), 0)]))


@pytest.mark.parametrize("cfg", [SMALL, WIDE], ids=cfg_id)
def test_oracle_prefill_matches_float64_rule(cfg):
    T, Hkv, G, d = 131, 2, 3, 8
    q = randn(1, T, Hkv * G, d, seed=1, dtype=torch.float64, scale=2.0)
    k = randn(1, T, Hkv, d, seed=2, dtype=torch.float64)
    sel = oracle_select(q, k, cfg, chunk=40)
    assert sel.block_idx.shape == (1, T, Hkv, cfg.budget_blocks)
    for t in range(0, T, 5):
        for h in range(Hkv):
            mass = _mass_by_hand(q[0], k[0], t, h, G, cfg.block_size)
            got = R.block_mass_ref(q[:, t : t + 1], k, torch.tensor([[t]]), cfg.block_size, d**-0.5)[0, h, 0]
            torch.testing.assert_close(got, torch.tensor(mass, dtype=torch.float64))
            want = _select_by_hand(mass, t, cfg)
            row = sel.block_idx[0, t, h]
            assert row[: len(want)].tolist() == want and (row[len(want) :] == -1).all(), (t, h)


def test_oracle_decode_matches_float64_rule_and_ignores_unwritten_keys():
    cfg = SMALL
    B, Hkv, G, d, L = 3, 2, 4, 8, 160
    seqlens = torch.tensor([160, 97, 5], dtype=torch.int32)
    k = randn(B, L, Hkv, d, seed=3, dtype=torch.float64)
    for b, n in enumerate(seqlens.tolist()):
        k[b, n:] = 1e4  # filler past each sequence: never attended
    q = randn(B, Hkv * G, d, seed=4, dtype=torch.float64, scale=2.0)
    got = oracle_select_decode(q, k, seqlens, cfg)
    assert got.shape == (B, Hkv, cfg.decode_width())
    for b, n in enumerate(seqlens.tolist()):
        for h in range(Hkv):
            qq = torch.zeros(n, Hkv * G, d, dtype=torch.float64)
            qq[n - 1] = q[b]
            want = _select_by_hand(_mass_by_hand(qq, k[b, :n], n - 1, h, G, cfg.block_size), n - 1, cfg)
            assert got[b, h, : len(want)].tolist() == want and (got[b, h, len(want) :] == -1).all(), (b, h)


def test_oracle_keeps_at_least_the_mass_of_infllmv2():
    cfg = SMALL
    T, Hkv, G, d = 200, 2, 3, 16
    q, k = randn(1, T, Hkv * G, d, seed=5, scale=2.0), randn(1, T, Hkv, d, seed=6)
    k_cmp, _ = compress_keys(k, cfg.kernel_size, cfg.kernel_stride, use_kernel=False)
    mass = R.block_mass_ref(q, k, torch.arange(T)[None], cfg.block_size, d**-0.5)  # [1, Hkv, T, NB]
    kept = {}
    for name, idx in (("oracle", oracle_select(q, k, cfg).block_idx),
                      ("infllmv2", infllmv2_select(q, k_cmp, cfg, use_kernel=False).block_idx)):  # fmt: skip
        hit = torch.zeros(1, T, Hkv, mass.shape[-1] + 1)
        hit.scatter_(-1, torch.where(idx < 0, mass.shape[-1], idx.long()), 1.0)
        kept[name] = (hit[..., :-1].permute(0, 2, 1, 3) * mass).sum(-1)  # [1, Hkv, T]
    assert (kept["oracle"] >= kept["infllmv2"] - 1e-6).all()
    assert (kept["oracle"] > kept["infllmv2"] + 1e-3).any()  # the test can tell them apart


def test_oracle_rejects_bad_shapes():
    q, k = randn(1, 20, 6, 8, seed=1), randn(1, 21, 2, 8, seed=2)
    with pytest.raises(ValueError, match="must agree"):
        oracle_select(q, k, SMALL)
    with pytest.raises(ValueError, match="past the"):
        oracle_select_decode(q[:, 0], k[:, :10], torch.tensor([11], dtype=torch.int32), SMALL)
