import os, sys, itertools
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.dirname(__file__))
import torch
import topk_kernels as TK
from longsparse.ops.sparse_attn import SparseAttentionConfig
from longsparse.ops.sparse_attn.select import _launch_topk
from longsparse.ops.sparse_attn.launch import load_kernels, next_pow2
K = load_kernels("select", "longsparse.ops.sparse_attn")
cfg = SparseAttentionConfig(block_size=16, init_blocks=1, window=32, topk=6, kernel_size=8, kernel_stride=4, dense_len=64)
B, HKV, NB = 3, 2, 40
NBP = next_pow2(NB)
g = torch.Generator().manual_seed(0)
bad = 0
for trial in range(12):
    scr = torch.randn(B, HKV, NBP, generator=g)
    if trial % 3 == 1: scr = (scr * 2).round() / 2      # many ties
    if trial % 3 == 2: scr[..., ::5] = float("-inf"); scr[..., 3] = -0.0
    seqlens = torch.tensor([NB * 16, 37 + trial * 40, 60], dtype=torch.int32)
    W = cfg.decode_width()
    ref = torch.empty(B, HKV, W, dtype=torch.int32)
    _launch_topk(K, scr, seqlens, ref, None, 0, 0, 1, 1, cfg, NBP, decode=True)
    for ways in (2, 4, 8):
        got = torch.full_like(ref, 7)
        TK.topk_decode_ways[(B * HKV,)](scr, seqlens, got, scr.stride(0), scr.stride(1), got.stride(0), got.stride(1),
            HKV=HKV, NBP=NBP, S=W, SP=next_pow2(W), BLOCK=16, INIT=cfg.init_blocks, LOCAL=cfg.local_blocks,
            BUDGET=cfg.budget_blocks, DENSE_LEN=cfg.dense_len, WAYS=ways)
        if not torch.equal(got, ref):
            bad += 1; print("MISMATCH", trial, ways, got[0, 0].tolist(), ref[0, 0].tolist())
print("bad", bad)
