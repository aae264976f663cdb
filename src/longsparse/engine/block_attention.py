"""Block-sparse attention over a :class:`~longsparse.cache.BlockKVCache`: the decode pipeline of sparda-notes
Algorithm 2 behind the :class:`~longsparse.models.attention.AttentionBackend` interface.

Decode, attention layer ``l`` (``mode="sparda"``):

1. the new token's K/V and compressed keys go into the cache (``append``);
2. the first attention layer selects its own blocks with ``F_cur``;
3. ``F_l`` scores the *next* attention layer's compressed keys; its blocks are planned and, when the cache
   prefetches, its missing blocks are issued on the transfer stream now — they copy while ``l`` attends, runs its
   FFN and (in a hybrid model) the GDN layers up to the next attention layer;
4. ``l`` waits for its own blocks (issued one attention layer earlier), attends, and releases them.

``mode="sparse"`` (InfLLM-V2): ``l`` selects with its own queries, plans, copies and waits in place (the
synchronous baseline). Whether blocks are offloaded and whether copies are prefetched is the cache's choice, so the
same backend runs Sparse†, Sparse, SparDA without prefetch, SparDA and SparDA†.

Prefill (fresh sequences only): dense causal attention below ``config.dense_len`` tokens, else the block-sparse
prefill with InfLLM-V2 or Forecast selection (the previous attention layer's ``F``, the first layer's ``F_cur``);
every sequence's K/V and compressed keys are then written to the cache.
"""

from __future__ import annotations

import torch

from ..cache import BlockKVCache, DecodeRows
from ..models.attention import AttentionBackend
from ..models.batch import ForwardBatch
from ..models.forecast_heads import FORECAST_CURRENT, FORECAST_NEXT
from ..ops.sparse_attn import (
    SparseAttentionConfig,
    block_sparse_attention,
    compress_keys,
    dense_causal_attention,
    forecast_select,
    forecast_select_decode,
    infllmv2_select,
    infllmv2_select_decode,
    sparse_decode,
)

BLOCK_MODES = ("sparse", "sparda")
DECODE_ROWS = "block_cache_rows"
"""``batch.scratch`` key of the step's :class:`DecodeRows` (built on first use; a CUDA-graph driver presets it)."""


class BlockSparseAttention(AttentionBackend):
    """``sparse`` or ``sparda`` block-sparse attention of the layers in ``attention_layers`` (module docstring).

    ``use_kernel`` goes to every op (None = Triton where it can run, False = the torch references).
    """

    def __init__(
        self,
        mode: str,
        config: SparseAttentionConfig,
        attention_layers: tuple[int, ...],
        *,
        use_kernel: bool | None = None,
    ):
        if mode not in BLOCK_MODES:
            raise ValueError(f"mode must be one of {BLOCK_MODES}, got {mode!r}")
        if not isinstance(config, SparseAttentionConfig):
            raise ValueError(f"config must be a SparseAttentionConfig, got {type(config).__name__}")
        self.mode = mode
        self.config = config
        self.attention_layers = tuple(attention_layers)
        self.use_kernel = use_kernel

    def __call__(self, layer, q, k, v, batch):
        if batch.is_decode:
            return self._decode(layer, q, k, v, batch)
        return self._prefill(layer, q, k, v, batch)

    def _forecast(self, batch: ForwardBatch, key: str, layer: int) -> torch.Tensor:
        try:
            return batch.scratch[key][layer]
        except KeyError:
            raise ValueError(
                f"attention mode 'sparda' needs the Forecast {key!r} of layer {layer} in batch.scratch: attach "
                "Forecast heads to the model (longsparse.models.forecast_heads.ForecastHeads.attach)"
            ) from None

    def _prefill_forecast(self, layer: int, batch: ForwardBatch) -> torch.Tensor:
        i = self.attention_layers.index(layer)
        if i == 0:
            return self._forecast(batch, FORECAST_CURRENT, layer)
        return self._forecast(batch, FORECAST_NEXT, self.attention_layers[i - 1])

    def _prefill(self, layer, q, k, v, batch):
        cache = batch.kv_cache
        if cache is not None and not isinstance(cache, BlockKVCache):
            raise ValueError(f"attention mode {self.mode!r} needs a BlockKVCache, got {type(cache).__name__}")
        cfg = self.config
        forecast = self._prefill_forecast(layer, batch) if self.mode == "sparda" else None
        outs = []
        for n, (start, end) in enumerate(zip(batch.offsets, batch.offsets[1:])):
            if batch.prefix_lens[n]:
                raise NotImplementedError(
                    "block-sparse attention prefills fresh sequences only (no chunked prefill after cached tokens)"
                )
            qn, kn, vn = q[start:end][None], k[start:end][None], v[start:end][None]
            k_cmp, _ = compress_keys(kn, cfg.kernel_size, cfg.kernel_stride, use_kernel=self.use_kernel)
            if end - start < cfg.dense_len:
                o = dense_causal_attention(qn, kn, vn)
            else:
                if forecast is None:
                    sel = infllmv2_select(qn, k_cmp, cfg, use_kernel=self.use_kernel)
                else:
                    sel = forecast_select(forecast[start:end][None], k_cmp, cfg, use_kernel=self.use_kernel)
                o = block_sparse_attention(qn, kn, vn, sel, cfg.block_size, use_kernel=self.use_kernel)
            if cache is not None:
                cache.write_prefill(layer, batch.slots[n], kn[0], vn[0], k_cmp[0])
            outs.append(o[0])
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)

    def _decode(self, layer, q, k, v, batch):
        cache = batch.kv_cache
        if not isinstance(cache, BlockKVCache):
            raise ValueError(f"a decode step in attention mode {self.mode!r} needs a BlockKVCache, got "
                             f"{type(cache).__name__}")  # fmt: skip
        if cache.config != self.config or cache.layers != self.attention_layers:
            raise ValueError("the BlockKVCache was built for another sparse-attention config or layer list")
        rows = batch.scratch.get(DECODE_ROWS)
        if rows is None:
            rows = batch.scratch[DECODE_ROWS] = DecodeRows.build(batch.slots, batch.prefix_lens, q.device)
        cfg = self.config
        max_len = rows.max_seqlen
        cache.append(layer, rows, k, v)
        if self.mode == "sparse":
            sel = infllmv2_select_decode(
                q, cache.compressed(layer, rows), rows.seqlens, cfg, max_seqlen=max_len, use_kernel=self.use_kernel
            )
            cache.plan(layer, sel, rows)
        else:
            if layer == cache.first_layer:
                f_cur = self._forecast(batch, FORECAST_CURRENT, layer)
                sel = forecast_select_decode(
                    f_cur, cache.compressed(layer, rows), rows.seqlens, cfg, max_seqlen=max_len,
                    use_kernel=self.use_kernel,
                )  # fmt: skip
                cache.plan(layer, sel, rows)
            nxt = cache.next_layer(layer)
            if nxt is not None:
                f = self._forecast(batch, FORECAST_NEXT, layer)
                sel = forecast_select_decode(
                    f, cache.compressed(nxt, rows), rows.seqlens, cfg, max_seqlen=max_len, use_kernel=self.use_kernel
                )
                cache.plan(nxt, sel, rows)
                if cache.prefetch_enabled:
                    cache.prefetch(nxt, rows.num_seqs)
        view = cache.acquire(layer)
        o = sparse_decode(
            q, view.k_slots, view.v_slots, view.table, view.block_ids, rows.seqlens, use_kernel=self.use_kernel
        )
        cache.release(layer)
        return o


def install_attention(model, backend: AttentionBackend) -> None:
    """Make ``backend`` the attention of every attention layer of ``model`` (a :class:`CausalLM`)."""
    from ..models.layers import Attention

    for layer in model.model.layers:
        if isinstance(layer.mixer, Attention):
            layer.mixer.backend = backend
