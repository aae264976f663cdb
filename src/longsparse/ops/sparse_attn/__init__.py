"""SparDA / InfLLM-V2 block-sparse attention ops: compressed keys, block selectors, block-sparse prefill and decode.

Each op has a pure-torch reference in ``naive.py`` (the specification; semantics documented there) and Triton
kernels; the public functions validate their inputs and run the kernels where Triton can (``use_kernel=None``),
else the reference.
"""

from .compress import compress_decode_step, compress_keys, fill_compress_ring
from .config import MINICPM4, TRAINING_FREE, SelectKernelConfig, SparseAttentionConfig
from .decode import resident_block_table, resident_slots, sparse_decode
from .prefill import block_sparse_attention, dense_causal_attention, sparse_prefill
from .select import (
    BlockSelection,
    TilePlan,
    build_tile_plan,
    decode_topk_counters,
    default_tile_tokens,
    forecast_select,
    forecast_select_decode,
    infllmv2_select,
    infllmv2_select_decode,
    oracle_select,
    oracle_select_decode,
)

__all__ = [
    "MINICPM4",
    "BlockSelection",
    "SelectKernelConfig",
    "SparseAttentionConfig",
    "TRAINING_FREE",
    "TilePlan",
    "block_sparse_attention",
    "build_tile_plan",
    "compress_decode_step",
    "compress_keys",
    "decode_topk_counters",
    "default_tile_tokens",
    "dense_causal_attention",
    "fill_compress_ring",
    "forecast_select",
    "forecast_select_decode",
    "infllmv2_select",
    "infllmv2_select_decode",
    "oracle_select",
    "oracle_select_decode",
    "resident_block_table",
    "resident_slots",
    "sparse_decode",
    "sparse_prefill",
]
