"""Block-sparse prefill kernel (Triton interpreter, float32) equals dense attention under the same block mask:
random masks and real selector masks, GQA, odd lengths, empty lists; the layer entry point with its dense
fallback and packed sequences; clear errors for bad input."""

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from longsparse.ops.sparse_attn import (
    BlockSelection,
    block_sparse_attention,
    build_tile_plan,
    compress_keys,
    forecast_select,
    infllmv2_select,
    sparse_prefill,
)
from longsparse.ops.sparse_attn import naive as R
from tests.helpers import rel_err
from tests.ops.sparse_attn.helpers import SMALL, randn

triton = pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[3]

RANDOM = [
    # B, T, Hkv, G, d, block, S
    (1, 63, 2, 3, 16, 16, 3),
    (2, 130, 1, 8, 32, 16, 5),
    (1, 200, 2, 4, 16, 32, 4),
]


def _qkv(B, T, Hkv, G, d, seed):
    return randn(B, T, Hkv * G, d, seed=seed), randn(B, T, Hkv, d, seed=seed + 1), randn(B, T, Hkv, d, seed=seed + 2)


def _random_lists(B, T, Hkv, S, nb, seed):
    """Random lists with −1 padding, duplicates, blocks after the query's own and past the sequence end."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-1, nb + 2, (B, T, Hkv, S), generator=gen).int()


@pytest.mark.parametrize("case", RANDOM, ids=lambda c: f"B{c[0]}-T{c[1]}-Hkv{c[2]}-G{c[3]}-D{c[4]}-blk{c[5]}-S{c[6]}")
def test_random_masks_equal_masked_dense_attention(case):
    B, T, Hkv, G, d, blk, S = case
    q, k, v = _qkv(B, T, Hkv, G, d, seed=T)
    idx = _random_lists(B, T, Hkv, S, -(-T // blk), seed=T)
    idx[:, 3] = -1  # a token that attends nothing
    got = block_sparse_attention(q, k, v, idx, blk, use_kernel=True)
    want = R.sparse_attention_ref(q.double(), k.double(), v.double(), idx, blk)
    assert got.dtype == torch.float32 and not torch.isnan(got).any()
    assert rel_err(got, want) < 1e-5
    assert (got[:, 3] == 0).all()


@pytest.mark.slow
@pytest.mark.parametrize("selector", ["infllmv2", "forecast"])
def test_real_selector_masks_minicpm_group(selector):
    """G = 16 query heads per KV head as in MiniCPM4 (a 4-token tile makes 64 MMA rows); the selector's own plan."""
    cfg = SMALL
    B, T, Hkv, G, d = 1, 100, 1, 16, 16
    q, k, v = _qkv(B, T, Hkv, G, d, seed=1)
    k_cmp, _ = compress_keys(k, cfg.kernel_size, cfg.kernel_stride, use_kernel=True)
    if selector == "infllmv2":
        sel = infllmv2_select(q, k_cmp, cfg, use_kernel=True)
    else:
        sel = forecast_select(randn(B, T, Hkv, d, seed=2), k_cmp, cfg, use_kernel=True)
    assert sel.plan.tile_tokens == 4
    got = block_sparse_attention(q, k, v, sel, cfg.block_size, use_kernel=True)
    want = R.sparse_attention_ref(q.double(), k.double(), v.double(), sel.block_idx, cfg.block_size)
    assert rel_err(got, want) < 1e-5
    assert (sel.block_idx[:, -1] >= 0).sum() == Hkv * cfg.budget_blocks  # the last tokens really are sparse


def test_plan_tile_size_does_not_change_the_result():
    B, T, Hkv, G, d, blk = 1, 90, 2, 2, 16, 16
    q, k, v = _qkv(B, T, Hkv, G, d, seed=3)
    idx = _random_lists(B, T, Hkv, 3, 6, seed=3)
    outs = [
        block_sparse_attention(q, k, v, BlockSelection(idx, build_tile_plan(idx, tile, 6)), blk, use_kernel=True)
        for tile in (8, 16)
    ]
    assert rel_err(outs[0], outs[1]) < 1e-6


def test_sparse_prefill_below_dense_len_is_dense_causal():
    cfg = dataclasses.replace(SMALL, dense_len=64)
    q, k, v = _qkv(2, 63, 2, 2, 16, seed=4)
    got = sparse_prefill(q, k, v, cfg, use_kernel=True)
    want = R.dense_causal_attention_ref(q.double(), k.double(), v.double())
    assert rel_err(got, want) < 1e-5


@pytest.mark.parametrize("with_forecast", [False, True], ids=["infllmv2", "forecast"])
def test_sparse_prefill_composes_selection_and_attention_varlen(with_forecast):
    """Two packed sequences, one below dense_len (dense) and one above (sparse), against the references."""
    cfg = dataclasses.replace(SMALL, dense_len=40)
    B, Hkv, G, d = 1, 1, 4, 16
    lens = [30, 121]
    T = sum(lens)
    q, k, v = _qkv(B, T, Hkv, G, d, seed=5)
    f = randn(B, T, Hkv, d, seed=6) if with_forecast else None
    cu = torch.tensor([0, lens[0], T], dtype=torch.int32)
    got = sparse_prefill(q, k, v, cfg, f=f, cu_seqlens=cu, use_kernel=True)
    qd, kd, vd = q.double(), k.double(), v.double()
    want_dense = R.dense_causal_attention_ref(qd[:, :30], kd[:, :30], vd[:, :30])
    k_cmp, _ = R.compress_keys_ref(kd[:, 30:], cfg.kernel_size, cfg.kernel_stride)
    if with_forecast:
        idx = R.forecast_select_ref(f.double()[:, 30:], k_cmp, cfg)
    else:
        idx = R.infllmv2_select_ref(qd[:, 30:], k_cmp, cfg)
    want_sparse = R.sparse_attention_ref(qd[:, 30:], kd[:, 30:], vd[:, 30:], idx, cfg.block_size)
    assert rel_err(got[:, :30], want_dense) < 1e-5
    assert rel_err(got[:, 30:], want_sparse) < 1e-5


def test_reference_path_without_kernels():
    q, k, v = _qkv(1, 40, 1, 2, 8, seed=7)
    idx = _random_lists(1, 40, 1, 2, 3, seed=7)
    got = block_sparse_attention(q.double(), k.double(), v.double(), idx, 16)  # float64: the reference runs
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, R.sparse_attention_ref(q.double(), k.double(), v.double(), idx, 16))


def test_bad_inputs_raise():
    q, k, v = _qkv(1, 40, 2, 2, 16, seed=8)
    idx = _random_lists(1, 40, 2, 3, 3, seed=8)
    with pytest.raises(ValueError, match="k and v must have the same shape"):
        block_sparse_attention(q, k, v[:, :, :1], idx, 16)
    with pytest.raises(ValueError, match="must agree in B, T and d"):
        block_sparse_attention(q[:, :30], k, v, idx, 16)
    with pytest.raises(ValueError, match="multiple of k heads"):
        block_sparse_attention(q[:, :, :3], k, v, idx, 16)
    with pytest.raises(ValueError, match="block lists must be"):
        block_sparse_attention(q, k, v, idx[:, :, :1], 16)
    with pytest.raises(ValueError, match="block_idx must be an integer"):
        block_sparse_attention(q, k, v, idx.float(), 16)
    with pytest.raises(ValueError, match="block_size"):
        block_sparse_attention(q, k, v, idx, 24)
    with pytest.raises(ValueError, match="share one dtype"):
        block_sparse_attention(q.double(), k, v, idx, 16)
    with pytest.raises(ValueError, match="cu_seqlens requires batch size 1"):
        sparse_prefill(torch.cat([q, q]), torch.cat([k, k]), torch.cat([v, v]), SMALL, cu_seqlens=torch.tensor([0, 40]))
    with pytest.raises(ValueError, match="f must be"):
        sparse_prefill(q, k, v, SMALL, f=q)


def test_prefill_warps_follow_the_accumulator_size():
    from longsparse.ops.sparse_attn.prefill import prefill_num_warps

    assert prefill_num_warps(64, 128) == 4  # MiniCPM4, 4-token tiles × 16 heads
    assert prefill_num_warps(128, 128) == 8 and prefill_num_warps(64, 256) == 8  # MiniCPM4 8-token tiles; Qwen3.5


@pytest.mark.skipif(
    not (Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump").exists(),
    reason="this Triton build ships no cuobjdump",
)
def test_prefill_kernel_builds_fit_their_registers():
    """Compiled for sm_90 without a GPU (``scripts/compile_check_attn.py``) at the launcher's warps: no build of the
    block-sparse prefill runs out of registers (a stack means spills), at MiniCPM4's and Qwen3.5's geometries."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, do not interpret
    env["PYTHONPATH"] = str(ROOT / "src")
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "compile_check_attn.py"), "--only", "prefill attention"],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    builds = [line for line in done.stdout.splitlines() if line.startswith("prefill attention")]
    assert len(builds) == 3, done.stdout
    for line in builds:
        assert int(re.search(r"stack\s+(\d+)", line).group(1)) == 0, line
