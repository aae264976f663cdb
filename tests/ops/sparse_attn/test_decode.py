"""Block-sparse decode kernel (Triton interpreter, float32) over a block-slot cache equals the reference: slots in
any order, −1 anywhere, the partly filled tail block, split and unsplit, K/V views of one buffer."""

import pytest
import torch

from longsparse.ops.sparse_attn import naive as R
from longsparse.ops.sparse_attn import resident_block_table, resident_slots, sparse_decode
from longsparse.ops.sparse_attn.decode import PRELOAD_MAX_RUN
from tests.helpers import rel_err
from tests.ops.sparse_attn.helpers import randn


def _slot_cache(B, Hkv, nb, blk, d, seed, spare=3):
    """A shuffled slot pool: slot_of[b, h, n] holds block n of (b, h); a few spare slots hold garbage."""
    n_slots = B * Hkv * nb + spare
    perm = torch.randperm(n_slots, generator=torch.Generator().manual_seed(seed))
    slot_of = perm[: B * Hkv * nb].view(B, Hkv, nb).int()
    kv = randn(n_slots, 2, blk, d, seed=seed)  # one K+V run per slot, as a UVA copy would write it
    return kv[:, 0], kv[:, 1], slot_of


CASES = [
    # B, Hkv, G, d, blk, seqlens, S, splits
    (2, 2, 2, 16, 16, (70, 33), 5, None),
    (3, 1, 16, 32, 16, (1, 64, 129), 6, 1),
    (1, 2, 4, 16, 32, (200,), 7, 3),
    (1, 2, 2, 16, 16, (300,), 19, 1),  # a run longer than PRELOAD_MAX_RUN: table entries loaded in the loop
]


@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"B{c[0]}-Hkv{c[1]}-G{c[2]}-D{c[3]}-blk{c[4]}-S{c[6]}-split{c[7]}"
)
def test_decode_kernel_matches_reference(case):
    B, Hkv, G, d, blk, lens, S, splits = case
    seqlens = torch.tensor(lens, dtype=torch.int32)
    nb = -(-max(lens) // blk)
    k_slots, v_slots, slot_of = _slot_cache(B, Hkv, nb, blk, d, seed=S)
    gen = torch.Generator().manual_seed(S)
    ids = torch.full((B, Hkv, S), -1, dtype=torch.int32)
    for b in range(B):
        own = (int(seqlens[b]) - 1) // blk  # the tail block, partly filled
        for h in range(Hkv):
            pick = torch.randperm(own + 1, generator=gen)[: S - 1].tolist()
            pick = [own] + [p for p in pick if p != own]
            pos = torch.randperm(S, generator=gen)[: len(pick)]  # any order, -1 anywhere
            ids[b, h, pos] = torch.tensor(pick, dtype=torch.int32)
    table = torch.where(ids >= 0, slot_of.gather(2, ids.clamp_min(0).long()), -1).int()
    table[0, 0, (ids[0, 0] < 0).nonzero()[:1].flatten()] = 0  # a slot with no block id is padding as well
    q = randn(B, Hkv * G, d, seed=S + 1)
    got = sparse_decode(q, k_slots, v_slots, table, ids, seqlens, num_splits=splits, use_kernel=True)
    want = R.sparse_decode_ref(q.double(), k_slots.double(), v_slots.double(), table, ids, seqlens)
    assert got.shape == q.shape and not torch.isnan(got).any()
    assert rel_err(got, want) < 1e-5


def test_cases_cover_both_table_paths():
    runs = [S // splits for *_, S, splits in CASES if splits is not None]
    assert min(runs) <= PRELOAD_MAX_RUN < max(runs)


def test_resident_cache_is_dense_decode_when_every_block_is_listed():
    B, Hkv, G, d, blk, T = 2, 2, 3, 16, 16, 48
    seqlens = torch.tensor([48, 20], dtype=torch.int32)
    k = randn(B, Hkv, T, d, seed=1)
    v = randn(B, Hkv, T, d, seed=2)
    q = randn(B, Hkv * G, d, seed=3)
    ids = torch.arange(3, dtype=torch.int32).expand(B, Hkv, 3).contiguous()
    ids[1, :, 2] = -1
    table = resident_block_table(ids, 3)
    got = sparse_decode(q, resident_slots(k, blk), resident_slots(v, blk), table, ids, seqlens, use_kernel=True)
    for b in range(B):
        L = int(seqlens[b])
        qq = q[b].double().view(Hkv, G, d)
        p = torch.softmax(qq @ k[b, :, :L].double().transpose(1, 2) * d**-0.5, dim=-1)
        want = (p @ v[b, :, :L].double()).reshape(Hkv * G, d)
        assert rel_err(got[b], want) < 1e-5


def test_empty_lists_give_zeros():
    k_slots, v_slots, _ = _slot_cache(1, 1, 2, 16, 16, seed=4)
    q = randn(1, 2, 16, seed=5)
    none = torch.full((1, 1, 4), -1, dtype=torch.int32)
    got = sparse_decode(q, k_slots, v_slots, none, none, torch.tensor([20], dtype=torch.int32), use_kernel=True)
    assert (got == 0).all()


def test_bad_inputs_raise():
    k_slots, v_slots, _ = _slot_cache(1, 2, 2, 16, 16, seed=6)
    q = randn(1, 4, 16, seed=7)
    ids = torch.zeros(1, 2, 3, dtype=torch.int32)
    lens = torch.tensor([20], dtype=torch.int32)
    with pytest.raises(ValueError, match="k_slots and v_slots must have one shape"):
        sparse_decode(q, k_slots, v_slots[:, :8], ids, ids, lens)
    with pytest.raises(ValueError, match="slots must hold d=8"):
        sparse_decode(q[..., :8], k_slots, v_slots, ids, ids, lens)
    with pytest.raises(ValueError, match="block_table and block_ids"):
        sparse_decode(q, k_slots, v_slots, ids, ids[..., :2], lens)
    with pytest.raises(ValueError, match="multiple of block_table heads"):
        sparse_decode(q[:, :3], k_slots, v_slots, ids, ids, lens)
    with pytest.raises(ValueError, match="seqlens must be \\[B\\]"):
        sparse_decode(q, k_slots, v_slots, ids, ids, torch.tensor([20, 3]))
    with pytest.raises(ValueError, match="num_splits"):
        sparse_decode(q, k_slots, v_slots, ids, ids, lens, num_splits=0, use_kernel=True)
    with pytest.raises(ValueError, match="power of two"):
        sparse_decode(q, k_slots[:, :12], v_slots[:, :12], ids, ids, lens)


def test_resident_block_table_reads_the_given_cache_rows():
    """Batch rows reading cache rows 3 and 1 of a 4-row resident cache: the decode equals the one over a cache that
    holds just those two rows, in that order."""
    Hkv, G, d, blk, T = 2, 2, 16, 16, 48
    k = randn(4, Hkv, T, d, seed=8)
    v = randn(4, Hkv, T, d, seed=9)
    q = randn(2, Hkv * G, d, seed=10)
    seqlens = torch.tensor([40, 17], dtype=torch.int32)
    ids = torch.tensor([[[0, 2], [1, 2]], [[1, -1], [0, 1]]], dtype=torch.int32)
    rows = torch.tensor([3, 1])
    table = resident_block_table(ids, 3, rows=rows)
    assert table[1, 0, 1] == -1 and table[0, 1, 0] == (3 * Hkv + 1) * 3 + 1
    got = sparse_decode(q, resident_slots(k, blk), resident_slots(v, blk), table, ids, seqlens, use_kernel=False)
    picked_k, picked_v = k[rows].contiguous(), v[rows].contiguous()
    want = sparse_decode(q, resident_slots(picked_k, blk), resident_slots(picked_v, blk), resident_block_table(ids, 3),
                         ids, seqlens, use_kernel=False)  # fmt: skip
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="rows must be \\[B\\] = \\[2\\]"):
        resident_block_table(ids, 3, rows=torch.tensor([0]))
