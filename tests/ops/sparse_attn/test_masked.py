"""The torch path of block-sparse prefill and decode (dense SDPA under the block mask) equals the float64
specification: random lists with −1 padding, duplicates and blocks past the query, real selections, odd lengths,
several group sizes, query chunks that split blocks, and decode over a shuffled slot cache."""

import pytest
import torch

from longsparse.ops.sparse_attn import (
    block_sparse_attention,
    compress_keys,
    infllmv2_select,
    resident_block_table,
    resident_slots,
    sparse_decode,
)
from longsparse.ops.sparse_attn import naive as R
from longsparse.ops.sparse_attn.masked import masked_decode, masked_prefill
from tests.helpers import rel_err
from tests.ops.sparse_attn.helpers import SMALL, randn

PREFILL = [
    # B, T, Hkv, G, d, block, S, chunk
    (1, 63, 2, 3, 16, 16, 3, 512),
    (2, 130, 1, 8, 32, 16, 5, 7),
    (1, 200, 3, 1, 16, 32, 4, 64),
    (1, 1000, 3, 3, 8, 64, 6, 100),
]


@pytest.mark.parametrize("case", PREFILL, ids=lambda c: "B{}-T{}-Hkv{}-G{}-D{}-blk{}-S{}-chunk{}".format(*c))
def test_masked_prefill_equals_reference(case):
    B, T, Hkv, G, d, blk, S, chunk = case
    q, k, v = randn(B, T, Hkv * G, d, seed=T), randn(B, T, Hkv, d, seed=T + 1), randn(B, T, Hkv, d, seed=T + 2)
    nb = -(-T // blk)
    gen = torch.Generator().manual_seed(T)
    idx = torch.randint(-1, nb + 2, (B, T, Hkv, S), generator=gen).int()
    idx[..., 0] = (torch.arange(T) // blk)[None, :, None]  # most rows see their own block ...
    idx[:, 5] = -1  # ... one sees nothing
    got = masked_prefill(q, k, v, idx, blk, d**-0.5, chunk=chunk)
    want = R.sparse_attention_ref(q.double(), k.double(), v.double(), idx, blk)
    assert got.shape == q.shape and got.dtype == q.dtype
    assert rel_err(got, want) < 1e-5
    assert (got[:, 5] == 0).all()


def test_block_sparse_attention_torch_path_on_a_real_selection():
    """``use_kernel=False`` runs the masked path; with the lists of a real selection it is the reference."""
    cfg = SMALL
    B, T, Hkv, G, d = 1, 171, 2, 3, 16
    q, k, v = randn(B, T, Hkv * G, d, seed=1), randn(B, T, Hkv, d, seed=2), randn(B, T, Hkv, d, seed=3)
    k_cmp, _ = compress_keys(k, cfg.kernel_size, cfg.kernel_stride, use_kernel=False)
    sel = infllmv2_select(q, k_cmp, cfg, use_kernel=False)
    assert (sel.block_idx[:, -1] >= 0).sum() == Hkv * cfg.budget_blocks  # the last rows are sparse
    got = block_sparse_attention(q, k, v, sel, cfg.block_size, use_kernel=False)
    want = R.sparse_attention_ref(q.double(), k.double(), v.double(), sel.block_idx, cfg.block_size)
    assert rel_err(got, want) < 1e-5


DECODE = [
    # B, Hkv, G, d, blk, seqlens, S
    (2, 2, 2, 16, 16, (70, 33), 5),
    (3, 1, 9, 32, 16, (1, 64, 129), 6),
    (1, 3, 3, 64, 64, (1001,), 9),
]


@pytest.mark.parametrize("case", DECODE, ids=lambda c: "B{}-Hkv{}-G{}-D{}-blk{}-len{}-S{}".format(*c))
def test_masked_decode_equals_reference(case):
    B, Hkv, G, d, blk, lens, S = case
    seqlens = torch.tensor(lens, dtype=torch.int32)
    nb = -(-max(lens) // blk)
    n_slots = B * Hkv * nb + 2
    slot_of = torch.randperm(n_slots, generator=torch.Generator().manual_seed(S))[: B * Hkv * nb].view(B, Hkv, nb)
    kv = randn(n_slots, 2, blk, d, seed=S)
    gen = torch.Generator().manual_seed(S + 1)
    ids = torch.randint(-1, nb, (B, Hkv, S), generator=gen).int()
    ids[..., 0] = ((seqlens.long() - 1) // blk)[:, None]  # the partly filled tail block
    ids[0, 0, 1:] = -1  # a row with one block
    table = torch.where(ids >= 0, slot_of.gather(2, ids.clamp_min(0).long()), -1).int()
    q = randn(B, Hkv * G, d, seed=S + 2)
    got = masked_decode(q, kv[:, 0], kv[:, 1], table, ids, seqlens, d**-0.5)
    want = R.sparse_decode_ref(q.double(), kv[:, 0].double(), kv[:, 1].double(), table, ids, seqlens)
    assert got.shape == q.shape and rel_err(got, want) < 1e-5


def test_sparse_decode_torch_path_over_a_resident_cache():
    B, Hkv, G, d, blk, T = 2, 3, 3, 16, 16, 80
    k, v = randn(B, Hkv, T, d, seed=4), randn(B, Hkv, T, d, seed=5)
    seqlens = torch.tensor([80, 37], dtype=torch.int32)
    ids = torch.tensor([[0, 2, 4], [-1, 1, 2]], dtype=torch.int32)[:, None].expand(B, Hkv, 3).contiguous()
    table = resident_block_table(ids, T // blk)
    q = randn(B, Hkv * G, d, seed=6)
    got = sparse_decode(q, resident_slots(k, blk), resident_slots(v, blk), table, ids, seqlens, use_kernel=False)
    want = R.sparse_decode_ref(q.double(), resident_slots(k, blk).double(), resident_slots(v, blk).double(), table,
                               ids, seqlens)  # fmt: skip
    assert rel_err(got, want) < 1e-5
