"""Block-sparse attention backends: InfLLM-V2 selection (``sparse``) and SparDA's Forecast selection (``sparda``).

Both follow the :class:`~longsparse.models.attention.AttentionBackend` contract and differ only in who chooses the KV
blocks (``longsparse.ops.sparse_attn``; geometry and ``dense_len`` from one :class:`SparseAttentionConfig`):

* ``sparse`` — the layer's own queries against its own compressed keys (``infllmv2_select`` /
  ``infllmv2_select_decode``);
* ``sparda`` — the forecast ``F`` that the previous attention layer computed (:class:`ForecastEmitter`; the first
  attention layer uses its own ``forecast_current``) against this layer's compressed keys (``forecast_select`` /
  ``forecast_select_decode``).

Prefill, per sequence: the compressed keys of the layer's keys go to the cache (:class:`CompressedKeys`); a sequence
shorter than ``dense_len`` (cached prefix included) gets dense causal attention, a longer one its selection followed by
``block_sparse_attention``. A prefill that continues a cached prefix runs the ops over the whole sequence with the
earlier rows' queries (forecasts) set to zero and keeps the new rows — exact, since each row's selection and
attention depend only on that row and the keys, but it recomputes the prefix rows (the ops take no query offset).

Decode, per step: the new token's compressed-key state is advanced in place (``compress_decode_step``), the blocks are
chosen, and ``sparse_decode`` reads them where the KV cache keeps them (:meth:`KVCache.block_slots`: for the resident
:class:`ContiguousKVCache`, views of its own tensors, no copy; for the offloaded
:class:`~longsparse.cache.BlockKVCache`, its GPU block slots once the missing blocks have been copied there). In
``sparda`` mode the blocks of layer ``l'`` are chosen while layer ``l`` runs — against ``l'``'s compressed keys before
``l'`` appends the new token, which changes nothing because that newest window lies in the forced local window
(``window >= block_size`` is required) — and the KV cache hears of them at once (:meth:`KVCache.prefetch`): the
offloaded cache starts their copies there, so they overlap the rest of layer ``l`` (and, in a hybrid model, the GDN
layers up to ``l'``): the decode pipeline of SparDA (Fu et al., arXiv:2606.04511) Algorithm 2. With ``sparse`` the
layer's own queries choose its blocks after it has computed them, so an offloaded cache copies them at the layer,
synchronously.

Kernels: on a CUDA device the ops pick their Triton kernels (their references if Triton is missing); elsewhere the
backends ask for the torch references, also when Triton's CPU interpreter is on (``use_kernel`` overrides).
"""

from __future__ import annotations

from abc import abstractmethod

import torch

from ..ops._triton import resolve_use_kernel
from ..ops.sparse_attn import (
    BlockSelection,
    SelectKernelConfig,
    SparseAttentionConfig,
    block_sparse_attention,
    compress_decode_step,
    compress_keys,
    default_tile_tokens,
    forecast_select,
    forecast_select_decode,
    infllmv2_select,
    infllmv2_select_decode,
    oracle_select,
    oracle_select_decode,
    sparse_decode,
)
from ..ops.sparse_attn.launch import next_pow2
from .attention import AttentionBackend, DenseAttention, causal_sdpa, consecutive_runs
from .batch import ForwardBatch
from .forecast import forecast_states
from .plan import BlockFractions, StepPlan


class BlockSparseAttention(AttentionBackend):
    """Shared prefill/decode plumbing; subclasses choose the blocks (:meth:`select_prefill`, :meth:`select_decode`).

    ``use_kernel``: passed to the ops (None: see the module docstring); ``kernel_config``: how the selectors' kernels
    run (:class:`SelectKernelConfig`, passed to them; None: its defaults). ``sparse_phases``: the phases that run
    block-sparse, ``"prefill"`` and/or ``"decode"``; the other runs dense (a dense prefill still writes the compressed
    keys that sparse decode steps read) — a diagnostic that places an accuracy loss in one phase.
    """

    def __init__(
        self,
        config: SparseAttentionConfig,
        use_kernel: bool | None = None,
        *,
        sparse_phases: tuple[str, ...] = ("prefill", "decode"),
        kernel_config: SelectKernelConfig | None = None,
    ):
        if not isinstance(config, SparseAttentionConfig):
            raise ValueError(f"config must be a SparseAttentionConfig, got {type(config).__name__}")
        if not set(sparse_phases) <= {"prefill", "decode"}:
            raise ValueError(f"sparse_phases must name 'prefill' and/or 'decode', got {sparse_phases!r}")
        self.config = config
        self.use_kernel = use_kernel
        self.sparse_phases = frozenset(sparse_phases)
        self.kernel_config = kernel_config

    @abstractmethod
    def select_prefill(
        self,
        layer: int,
        q: torch.Tensor,
        k_cmp: torch.Tensor,
        plan: StepPlan,
        rows: slice,
        prefix: int,
        keys: torch.Tensor,
    ) -> BlockSelection:
        """Blocks for ``q [1, L, Hq, D]`` (one sequence: ``prefix`` zero rows, then the packed rows ``rows`` of the
        step) over the sequence's compressed keys ``k_cmp [1, N, Hkv, D]`` (its keys: ``keys [1, L, Hkv, D]``)."""

    @abstractmethod
    def select_decode(self, layer: int, q: torch.Tensor, batch: ForwardBatch, plan: StepPlan) -> torch.Tensor:
        """Blocks ``[N, Hkv, config.decode_width()]`` for the step's queries ``q [N, Hq, D]``; the layer's compressed
        keys already include the new token (``batch.seqlens``: the lengths with it)."""

    def __call__(self, layer, q, k, v, batch, plan=None):
        plan = plan if plan is not None else StepPlan()
        cache = batch.kv_cache
        if cache is not None:
            cache.store(layer, batch, k, v)
        if batch.is_decode:
            return self._decode(layer, q, k, batch, plan)
        outs = [
            self._prefill_sequence(layer, q, k, v, batch, plan, n, start, end)
            for n, (start, end) in enumerate(zip(batch.offsets, batch.offsets[1:]))
        ]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=0)

    def _prefill_sequence(
        self, layer, q, k, v, batch: ForwardBatch, plan: StepPlan, n: int, start: int, end: int
    ) -> torch.Tensor:
        cfg = self.config
        use_kernel = resolve_use_kernel(self.use_kernel, q.device)
        prefix = batch.prefix_lens[n]
        total = prefix + end - start
        if prefix == 0:
            keys, values = k[start:end][None], v[start:end][None]  # [1, L, Hkv, D]
        else:
            cached_k, cached_v = batch.kv_cache.gather(layer, [batch.slots[n]], total)  # [1, Hkv, L, D]
            keys, values = cached_k.transpose(1, 2), cached_v.transpose(1, 2)
        dense = total < cfg.dense_len or "prefill" not in self.sparse_phases
        if batch.compressed_keys is not None or not dense:
            k_cmp, _ = compress_keys(keys, cfg.kernel_size, cfg.kernel_stride, use_kernel=use_kernel)
        if batch.compressed_keys is not None:
            batch.compressed_keys.write_prefill(layer, batch.slots[n], k_cmp[0], keys[0])
        T, Hkv = end - start, k.shape[1]
        if dense:
            plan.stats.block_fractions.add(float(T * Hkv), T * Hkv)
            return causal_sdpa(q[start:end], keys.transpose(1, 2), values.transpose(1, 2), prefix)
        qn = _pad_rows(q[start:end], prefix)
        selection = self.select_prefill(layer, qn, k_cmp, plan, slice(start, end), prefix, keys)
        o = block_sparse_attention(qn, keys, values, selection, cfg.block_size, use_kernel=use_kernel)
        self._count_prefill(selection.block_idx[0, prefix:], prefix, plan.stats.block_fractions)
        return o[0, prefix:]

    def _count_prefill(self, block_idx: torch.Tensor, prefix: int, fractions: BlockFractions) -> None:
        """``block_idx [T, Hkv, S]`` of the rows at positions ``prefix …``: add their attended fractions."""
        T, Hkv = block_idx.shape[:2]
        positions = torch.arange(prefix, prefix + T, device=block_idx.device)
        causal = positions // self.config.block_size + 1
        attended = (block_idx >= 0).sum(-1)
        fractions.add((attended / causal[:, None]).sum(), T * Hkv)

    def _decode(self, layer, q, k, batch: ForwardBatch, plan: StepPlan) -> torch.Tensor:
        cfg = self.config
        use_kernel = resolve_use_kernel(self.use_kernel, q.device)
        cache, ck = batch.kv_cache, batch.compressed_keys
        if cache is None or ck is None or layer not in ck.k_cmp:
            raise ValueError(
                f"a decode step of block-sparse attention layer {layer} needs the KV cache and this layer's "
                "compressed keys (engine.allocate_compressed_keys)"
            )
        cached = batch.positions.to(torch.int32)
        for start, end in consecutive_runs(batch.slots):
            rows = slice(batch.slots[start], batch.slots[start] + end - start)
            compress_decode_step(
                k[start:end], ck.ring[layer][rows], ck.k_cmp[layer][rows], cached[start:end],
                cfg.kernel_size, cfg.kernel_stride, use_kernel=use_kernel,
            )  # fmt: skip
        if "decode" not in self.sparse_phases:
            plan.stats.block_fractions.add(float(q.shape[0] * k.shape[1]), q.shape[0] * k.shape[1])
            return DenseAttention()._decode(layer, q, k.shape[1], cache, batch, plan)
        seqlens = batch.seqlens
        block_ids = self.select_decode(layer, q, batch, plan)
        k_slots, v_slots, table = cache.block_slots(layer, batch, block_ids, cfg.block_size)
        o = sparse_decode(q, k_slots, v_slots, table, block_ids, seqlens, use_kernel=use_kernel)
        cache.release(layer)
        causal = (seqlens + cfg.block_size - 1) // cfg.block_size
        attended = (block_ids >= 0).sum(-1)
        plan.stats.block_fractions.add((attended / causal[:, None]).sum(), attended.numel())
        return o


def _pad_rows(x: torch.Tensor, prefix: int) -> torch.Tensor:
    """``x [T, H, D]`` -> ``[1, prefix + T, H, D]`` with ``prefix`` zero rows first."""
    if prefix == 0:
        return x[None]
    return torch.cat([x.new_zeros(prefix, *x.shape[1:]), x])[None]


def _select_decode_runs(batch: ForwardBatch, k_cmp: torch.Tensor, select) -> torch.Tensor:
    """``select(rows, k_cmp_rows)`` over each run of consecutive cache slots (views of ``k_cmp [slots, Ncap, Hkv, D]``,
    no gathered copies), results concatenated in batch order."""
    parts = []
    for start, end in consecutive_runs(batch.slots):
        first = batch.slots[start]
        parts.append(select(slice(start, end), k_cmp[first : first + end - start]))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)


class SparseAttention(BlockSparseAttention):
    """InfLLM-V2 ("Sparse"): each layer's own queries choose its blocks (training-free)."""

    mode = "sparse"

    def select_prefill(self, layer, q, k_cmp, plan, rows, prefix, keys):
        G = q.shape[2] // k_cmp.shape[2]
        return infllmv2_select(
            q, k_cmp, self.config, tile_tokens=_tile_tokens(self.config, G),
            use_kernel=resolve_use_kernel(self.use_kernel, q.device), kernel_config=self.kernel_config,
        )  # fmt: skip

    def select_decode(self, layer, q, batch, plan):
        use_kernel = resolve_use_kernel(self.use_kernel, q.device)

        def select(rows, k_cmp):
            return infllmv2_select_decode(
                q[rows], k_cmp, batch.seqlens[rows], self.config, max_seqlen=batch.max_seqlen, use_kernel=use_kernel,
                topk_counters=plan.topk_counters, kernel_config=self.kernel_config,
            )  # fmt: skip

        return _select_decode_runs(batch, batch.compressed_keys.k_cmp[layer], select)


def _tile_tokens(config, group: int) -> int:
    """Query tokens per block-sparse prefill tile: ``config.tile_tokens``, else chosen by the group size; a tile
    must hold at least 16 (token, head) rows (the MMA's minimum)."""
    if config.tile_tokens is None:
        return default_tile_tokens(group)
    if config.tile_tokens * next_pow2(group) < 16:
        raise ValueError(
            f"tile_tokens={config.tile_tokens} gives {config.tile_tokens * next_pow2(group)} (token, head) rows for "
            f"{group} query heads per KV head; the prefill kernel needs at least 16"
        )
    return config.tile_tokens


class SpardaAttention(BlockSparseAttention):
    """SparDA: the forecast an earlier layer left in the step's plan (:attr:`StepPlan.forecasts
    <longsparse.models.plan.StepPlan.forecasts>`) chooses this layer's blocks."""

    mode = "sparda"

    def __init__(self, config: SparseAttentionConfig, use_kernel: bool | None = None, **options):
        super().__init__(config, use_kernel, **options)
        if config.window < config.block_size:
            raise ValueError(
                f"sparda needs window >= block_size (got window={config.window}, block_size={config.block_size}): "
                "a decode step chooses a layer's blocks before that layer adds the new token's compressed key, "
                "which must fall in the forced local window"
            )

    def select_prefill(self, layer, q, k_cmp, plan, rows, prefix, keys):
        f = _take(plan.forecasts.states, layer)[rows]
        G = q.shape[2] // k_cmp.shape[2]
        return forecast_select(
            _pad_rows(f, prefix), k_cmp, self.config, tile_tokens=_tile_tokens(self.config, G),
            use_kernel=resolve_use_kernel(self.use_kernel, q.device), kernel_config=self.kernel_config,
        )  # fmt: skip

    def select_decode(self, layer, q, batch, plan):
        return _take(plan.forecasts.blocks, layer)

    def __call__(self, layer, q, k, v, batch, plan=None):
        plan = plan if plan is not None else StepPlan()
        o = super().__call__(layer, q, k, v, batch, plan)
        plan.forecasts.drop(layer)  # the forecast (as large as the layer's keys in a prefill) is spent
        return o


def _take(forecasts: dict[int, torch.Tensor], layer: int) -> torch.Tensor:
    if layer not in forecasts:
        raise ValueError(
            f"sparda attention layer {layer} found no forecast for this step: the layer that forecasts it (the "
            "previous attention layer, or the layer itself with forecast_current) did not run a ForecastEmitter"
        )
    return forecasts[layer]


class ForecastEmitter:
    """Run by attention layer ``l`` on its input: the forecast of ``target`` (the next attention layer, or ``l``
    itself with the current-layer projection). Prefill: hands ``F [T, Hkv, D]`` to the target's selection through the
    step's plan. Decode: chooses the target's blocks at once against its compressed keys (the target has not appended
    the new token yet; see the module docstring), hands them on through the plan and tells the KV cache
    (:meth:`KVCache.prefetch`: where an offloaded cache issues the target's copies, one attention layer early).

    ``weight [Hkv·D, hidden]``; ``config`` is the target's geometry; ``use_kernel`` and ``kernel_config`` as for the
    backends.
    """

    def __init__(
        self,
        target: int,
        weight: torch.Tensor,
        num_kv_heads: int,
        config: SparseAttentionConfig,
        use_kernel: bool | None = None,
        kernel_config: SelectKernelConfig | None = None,
    ):
        self.target = target
        self.weight = weight
        self.num_kv_heads = num_kv_heads
        self.config = config
        self.use_kernel = use_kernel
        self.kernel_config = kernel_config

    def __call__(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch, plan: StepPlan
    ) -> None:
        f = forecast_states(self.weight, x, cos, sin, self.num_kv_heads)
        if not batch.is_decode:
            plan.forecasts.states[self.target] = f
            return
        ck = batch.compressed_keys
        if ck is None or self.target not in ck.k_cmp:
            raise ValueError(
                f"a decode step of sparda attention layer {self.target} needs its compressed keys "
                "(engine.allocate_compressed_keys)"
            )
        use_kernel = resolve_use_kernel(self.use_kernel, x.device)

        def select(rows, k_cmp):
            return forecast_select_decode(
                f[rows], k_cmp, batch.seqlens[rows], self.config, max_seqlen=batch.max_seqlen, use_kernel=use_kernel,
                topk_counters=plan.topk_counters, kernel_config=self.kernel_config,
            )  # fmt: skip

        block_ids = _select_decode_runs(batch, ck.k_cmp[self.target], select)
        plan.forecasts.blocks[self.target] = block_ids
        if batch.kv_cache is not None:
            batch.kv_cache.prefetch(self.target, batch, block_ids)


class OracleAttention(BlockSparseAttention):
    """A diagnostic, not a product mode: each query's dynamic blocks are those of largest dense attention mass for its
    GQA group (``oracle_select`` / ``oracle_select_decode``), same geometry and budget — the bound on what any selector
    can reach. It computes the dense attention to choose, so it saves nothing."""

    mode = "oracle"

    def select_prefill(self, layer, q, k_cmp, plan, rows, prefix, keys):
        return oracle_select(q, keys, self.config, tile_tokens=_tile_tokens(self.config, q.shape[2] // keys.shape[2]))

    def select_decode(self, layer, q, batch, plan):
        keys, _ = batch.kv_cache.gather(layer, batch.slots, max(batch.context_lens))  # [N, Hkv, L, D]
        return oracle_select_decode(q, keys.transpose(1, 2), batch.seqlens, self.config)


def make_attention_backend(mode: str, config: SparseAttentionConfig | None = None) -> AttentionBackend:
    """The backend for ``mode`` (``config``: the geometry of the block-sparse modes)."""
    if mode == "dense":
        return DenseAttention()
    if mode in ("sparse", "sparda") and config is None:
        raise ValueError(f"attention mode {mode!r} needs a SparseAttentionConfig")
    if mode == "sparse":
        return SparseAttention(config)
    if mode == "sparda":
        return SpardaAttention(config)
    raise ValueError(f"attention mode must be one of dense, sparse, sparda, got {mode!r}")
