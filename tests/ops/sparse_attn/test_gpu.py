"""GPU checks at MiniCPM4.1-8B geometry (32 query heads, 2 KV heads, d = 128, bf16, block 64, 32/16 compression):
the compiled kernels against the float64 references on sampled rows. Skipped without CUDA."""

import pytest
import torch

from longsparse.ops.sparse_attn import (
    MINICPM4,
    SelectKernelConfig,
    compress_decode_step,
    compress_keys,
    decode_topk_counters,
    fill_compress_ring,
    forecast_select,
    forecast_select_decode,
    infllmv2_select,
    infllmv2_select_decode,
    resident_block_table,
    resident_slots,
    sparse_decode,
    sparse_prefill,
)
from longsparse.ops.sparse_attn import naive as R
from longsparse.ops.sparse_attn.prefill import block_sparse_attention
from tests.helpers import rel_err
from tests.ops.sparse_attn.helpers import assert_valid_selection

pytestmark = pytest.mark.gpu
CFG = MINICPM4
HQ, HKV, D = 32, 2, 128


def _bf16(*shape, seed, scale=1.0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(*shape, generator=gen, device="cuda") * scale).bfloat16()


def _rows(T, n, seed):
    """Sampled query positions: the first and last tokens, block edges, and random ones."""
    gen = torch.Generator().manual_seed(seed)
    fixed = torch.tensor([0, 63, 64, 2047, 2111, T // 2, T - 65, T - 64, T - 1])
    return torch.cat([fixed, torch.randint(0, T, (n,), generator=gen)]).clamp(0, T - 1).unique()


def _scores_at(x, k_cmp, rows, forecast):
    """Reference block scores [B, Hkv, R, NB] of the sampled rows."""
    B, T = x.shape[:2]
    pos = rows.to(x.device).expand(B, -1)
    xs = x[:, rows.to(x.device)].double()
    if forecast:
        s = R.forecast_scores_ref(xs, k_cmp.double(), pos, CFG)
    else:
        s = R.infllmv2_scores_ref(xs, k_cmp.double(), pos, CFG, D**-0.5)
    return R.pool_blocks_ref(s, CFG.num_blocks(T), CFG), pos


@pytest.mark.parametrize("T", [8192 + 37, 32768])
def test_compress_bf16(T):
    k = _bf16(2, T, HKV, D, seed=T)
    got, _ = compress_keys(k, 32, 16)
    want, _ = R.compress_keys_ref(k.double(), 32, 16)
    assert got.dtype == torch.bfloat16 and rel_err(got, want) < 8e-3


def test_incremental_compression_bitwise_over_300_steps():
    B, L0 = 4, torch.tensor([8192, 8200, 8207, 9000], dtype=torch.int32, device="cuda")
    k = _bf16(B, 9400, HKV, D, seed=1)
    ring = torch.empty(B, 32, HKV, D, dtype=torch.bfloat16, device="cuda")
    k_cmp = torch.full((B, 600, HKV, D), float("nan"), dtype=torch.bfloat16, device="cuda")
    full, _ = compress_keys(k, 32, 16)
    lengths = L0.clone()
    for b in range(B):
        n = CFG.num_compressed(int(L0[b]))
        k_cmp[b, :n] = full[b, :n]
    fill_compress_ring(k, lengths, ring)
    for _ in range(300):
        compress_decode_step(k[torch.arange(B, device="cuda"), lengths.long()], ring, k_cmp, lengths, 32, 16)
        lengths += 1
    for b in range(B):
        n = CFG.num_compressed(int(lengths[b]))
        assert torch.equal(k_cmp[b, :n], full[b, :n])
        assert torch.isnan(k_cmp[b, n:].float()).all()


@pytest.mark.parametrize("selector", ["infllmv2", "forecast"])
def test_prefill_selectors_bf16(selector):
    B, T = 2, 16384 + 37
    q = _bf16(B, T, HQ, D, seed=2)
    f = _bf16(B, T, HKV, D, seed=3)
    k_cmp, _ = compress_keys(_bf16(B, T, HKV, D, seed=4), 32, 16)
    if selector == "infllmv2":
        sel = infllmv2_select(q, k_cmp, CFG)
        x, tol = q, 2e-6
    else:
        sel = forecast_select(f, k_cmp, CFG)
        x, tol = f, 2e-4
    rows = _rows(T, 48, seed=5)
    scores, pos = _scores_at(x, k_cmp, rows, forecast=selector == "forecast")
    ref = R.select_blocks_ref(scores, pos, CFG)
    assert_valid_selection(sel.block_idx[:, rows.cuda()].cpu(), ref.cpu(), scores.cpu(), pos.cpu(), CFG, tol=tol)
    assert (sel.block_idx[:, -1] >= 0).sum(-1).eq(CFG.budget_blocks).all()


def _attention_rows_ref(q, k, v, block_idx, rows):
    """float64 block-sparse attention of the sampled rows only: [B, R, Hq, d]. A block list is a set: a block
    listed twice is attended once."""
    B = q.shape[0]
    G = HQ // HKV
    out = torch.zeros(B, len(rows), HQ, D, dtype=torch.float64, device=q.device)
    for i, t in enumerate(rows.tolist()):
        for b in range(B):
            for h in range(HKV):
                blocks = block_idx[b, t, h]
                blocks = blocks[blocks >= 0].long().unique()
                keys = (blocks[:, None] * CFG.block_size + torch.arange(CFG.block_size, device=q.device)).flatten()
                keys = keys[keys <= t]
                kk, vv = k[b, keys, h].double(), v[b, keys, h].double()
                qq = q[b, t, h * G : (h + 1) * G].double()
                out[b, i, h * G : (h + 1) * G] = torch.softmax(qq @ kk.T * D**-0.5, dim=-1) @ vv
    return out


@pytest.mark.parametrize("selector", ["infllmv2", "forecast"])
def test_block_sparse_prefill_bf16(selector):
    B, T = 1, 32768 + 21
    q = _bf16(B, T, HQ, D, seed=6)
    k = _bf16(B, T, HKV, D, seed=7)
    v = _bf16(B, T, HKV, D, seed=8)
    k_cmp, _ = compress_keys(k, 32, 16)
    sel = (
        infllmv2_select(q, k_cmp, CFG)
        if selector == "infllmv2"
        else forecast_select(_bf16(B, T, HKV, D, seed=9), k_cmp, CFG)
    )
    o = block_sparse_attention(q, k, v, sel, CFG.block_size)
    assert not torch.isnan(o).any()
    rows = _rows(T, 24, seed=10)
    want = _attention_rows_ref(q, k, v, sel.block_idx, rows)
    assert rel_err(o[:, rows.cuda()], want) < 1e-2


def test_random_block_lists_bf16():
    B, T = 2, 4096 + 3
    q = _bf16(B, T, HQ, D, seed=11)
    k = _bf16(B, T, HKV, D, seed=12)
    v = _bf16(B, T, HKV, D, seed=13)
    gen = torch.Generator(device="cuda").manual_seed(14)
    idx = torch.randint(-1, T // 64 + 2, (B, T, HKV, 40), generator=gen, device="cuda").int()
    o = block_sparse_attention(q, k, v, idx, 64)
    rows = _rows(T, 24, seed=15)
    assert rel_err(o[:, rows.cuda()], _attention_rows_ref(q, k, v, idx, rows)) < 1e-2


def test_sparse_prefill_dense_fallback_is_sdpa():
    B, T = 1, 1000
    q, k, v = _bf16(B, T, HQ, D, seed=16), _bf16(B, T, HKV, D, seed=17), _bf16(B, T, HKV, D, seed=18)
    o = sparse_prefill(q, k, v, CFG)  # T < dense_len
    want = R.dense_causal_attention_ref(q.double(), k.double(), v.double())
    assert rel_err(o, want) < 1e-2


@pytest.mark.parametrize("selector", ["infllmv2", "forecast"])
def test_decode_selection_and_attention_bf16(selector):
    B, T = 4, 65536
    seqlens = torch.tensor([65536, 40001, 8191, 20000], dtype=torch.int32, device="cuda")  # one below dense_len
    k = _bf16(B, HKV, T, D, seed=19)
    v = _bf16(B, HKV, T, D, seed=20)
    k_cmp, _ = compress_keys(k.transpose(1, 2), 32, 16)
    if selector == "infllmv2":
        x = _bf16(B, HQ, D, seed=21)
        ids = infllmv2_select_decode(x, k_cmp, seqlens, CFG, max_seqlen=T)
        ref = R.infllmv2_select_decode_ref(x.double(), k_cmp.double(), seqlens, CFG)
        pos = (seqlens.long() - 1)[:, None]
        s = R.infllmv2_scores_ref(x.double()[:, None], k_cmp.double(), pos, CFG, D**-0.5)
        tol = 2e-6
    else:
        x = _bf16(B, HKV, D, seed=22)
        ids = forecast_select_decode(x, k_cmp, seqlens, CFG, max_seqlen=T)
        ref = R.forecast_select_decode_ref(x.double(), k_cmp.double(), seqlens, CFG)
        pos = (seqlens.long() - 1)[:, None]
        s = R.forecast_scores_ref(x.double()[:, None], k_cmp.double(), pos, CFG)
        tol = 2e-4
    scores = R.pool_blocks_ref(s, CFG.num_blocks(T), CFG)
    assert_valid_selection(
        ids[:, None].cpu(), ref[:, None].cpu(), scores.cpu(), pos.cpu(), CFG, tol=tol, max_mismatch=0.25
    )
    assert (ids[2] >= 0).sum(-1).eq(CFG.num_blocks(8191)).all()  # below dense_len: every block
    q = _bf16(B, HQ, D, seed=23)
    table = resident_block_table(ids, T // CFG.block_size)
    o = sparse_decode(q, resident_slots(k, 64), resident_slots(v, 64), table, ids, seqlens)
    want = R.sparse_decode_ref(q.double(), resident_slots(k, 64), resident_slots(v, 64), table, ids, seqlens)
    assert rel_err(o, want) < 1e-2


@pytest.mark.parametrize("form", ["bitonic", "fused_search", "fused_bitonic"])
def test_top_k_forms_select_what_the_default_selects(form):
    """The bitonic top-k (``SelectKernelConfig.topk_bitonic``) and the decode top-k fused into the scoring kernel
    (``decode_fused_topk``: the programs of a row race to finish, the last selects) choose exactly the default
    search's blocks: in decode over many calls sharing one counter buffer, which they leave zeroed, and (the
    bitonic top-k) in prefill."""
    B, T = 4, 65536
    seqlens = torch.tensor([65536, 40001, 8191, 20000], dtype=torch.int32, device="cuda")
    k_cmp, _ = compress_keys(_bf16(B, T, HKV, D, seed=30), 32, 16)
    q, f = _bf16(B, HQ, D, seed=31), _bf16(B, HKV, D, seed=32)
    Tp = 16384 + 37
    kp_cmp, _ = compress_keys(_bf16(1, Tp, HKV, D, seed=33), 32, 16)
    qp, fp = _bf16(1, Tp, HQ, D, seed=34), _bf16(1, Tp, HKV, D, seed=35)

    def select_all(counters=None, kernel_config=None):
        dec = dict(max_seqlen=T, topk_counters=counters, kernel_config=kernel_config)
        return [
            infllmv2_select_decode(q, k_cmp, seqlens, CFG, **dec),
            forecast_select_decode(f, k_cmp, seqlens, CFG, **dec),
            infllmv2_select(qp, kp_cmp, CFG, kernel_config=kernel_config).block_idx,
            forecast_select(fp, kp_cmp, CFG, kernel_config=kernel_config).block_idx,
        ]

    want = select_all()
    form_config = SelectKernelConfig(topk_bitonic=form.endswith("bitonic"), decode_fused_topk=form.startswith("fused"))
    counters = decode_topk_counters(B, HKV, "cuda")
    for _ in range(20):
        got = select_all(counters, form_config)
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert not counters.any()


def _compiled(kernel) -> int:
    """Builds of a Triton kernel so far, over every device (its per-device caches map a specialisation to a build)."""
    return sum(len(cache[0]) for cache in kernel.device_caches.values())


def test_decode_kernels_do_not_recompile_as_sequences_grow():
    """One build per kernel for a whole decode: the block count, split sizes and compressed-key count change every
    few steps (crossing multiples of 16, which Triton would otherwise specialise on) without a new compile."""
    from longsparse.ops.sparse_attn.launch import load_kernels

    B, T = 2, 8192
    k = _bf16(B, HKV, T, D, seed=31)
    v = _bf16(B, HKV, T, D, seed=32)
    k_cmp, _ = compress_keys(k.transpose(1, 2), 32, 16)
    slots_k, slots_v = resident_slots(k, 64), resident_slots(v, 64)
    select, decode = load_kernels("select"), load_kernels("decode")
    kernels = [select.select_fwd_kernel_decode_scores, select.select_fwd_kernel_decode_lse,
               decode.decode_fwd_kernel_split, decode.decode_fwd_kernel_merge]  # fmt: skip
    builds = None
    for length in range(5000, 5000 + 150, 7):  # 79 -> 81 blocks, 310 -> 320 compressed keys: no power of two crossed
        seqlens = torch.tensor([length, length - 3], dtype=torch.int32, device="cuda")
        q = _bf16(B, HQ, D, seed=length)
        ids = infllmv2_select_decode(q, k_cmp, seqlens, CFG, max_seqlen=length)
        dense_ids = torch.arange(-(-length // 64), device="cuda", dtype=torch.int32).expand(B, HKV, -1).contiguous()
        for block_ids in (ids, dense_ids):  # the sparse list (fixed width) and a dense one (growing width)
            sparse_decode(q, slots_k, slots_v, resident_block_table(block_ids, T // 64), block_ids, seqlens)
        if builds is None:
            builds = [_compiled(kern) for kern in kernels]
    torch.cuda.synchronize()
    assert [_compiled(kern) for kern in kernels] == builds
