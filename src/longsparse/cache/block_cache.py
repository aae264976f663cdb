"""The block KV cache: attention layers' keys and values in 64-token blocks, resident on the GPU or offloaded to
(pinned) host memory behind a GPU block-slot cache, with the transfer protocol of SparDA's decode pipeline.

Layout: :mod:`longsparse.cache.layout`. :class:`BlockKVCache` implements the :class:`~longsparse.cache.kv_cache.KVCache`
interface the block-sparse attention backends (:mod:`longsparse.models.sparse_attention`) call. Per decode step, the
one who runs the step calls :meth:`~BlockKVCache.begin_step` — the compute queue waits for event ``written`` (the
previous step's write-back) — then per attention layer ``l`` the layers do, in this order:

1. :meth:`~BlockKVCache.prefetch` (``l'``, selection) — SparDA only, from the layer that forecasts ``l'`` (one attention
   layer before it; the first attention layer's own forecast for itself): on the compute queue, the copy planner
   diffs the selection against ``l'``'s resident dynamic slots and writes ``l'``'s block table and copy tasks (event
   ``planned:l'``); with ``prefetch=True`` the persistent copy kernel then moves the missing blocks from host rows
   into their slots on the transfer queue, after ``planned:l'`` and ``read:l'`` (event ``copied:l'``).
2. :meth:`~BlockKVCache.store` — the new token's K/V into its tail slot.
3. :meth:`~BlockKVCache.block_slots` (``l``, selection) — plans ``l`` now if no prefetch announced this selection
   (InfLLM-V2 selects at the layer itself), issues ``l``'s copy if nobody did (after event ``asked:l`` on the compute
   queue, so that the copy cannot start before its layer), makes the compute queue wait for ``copied:l`` and hands
   out the slots and the table for the decode kernel.
4. :meth:`~BlockKVCache.release` (``l``) — event ``read:l`` after the attention that read the slots.

and after the last layer :meth:`~BlockKVCache.end_step` advances the lengths and writes every block the step filled
back to host memory on the transfer queue (after event ``appended``; event ``written``).

Slot-reuse protocol (why no stale block is ever read): a slot of layer ``l`` is written only by ``l``'s copy, which
waits for ``read:l`` — the last attention that read the previous contents — and for ``planned:l``; the attention
reads only after ``copied:l``. The plan buffers of ``l`` are rewritten only after the compute queue has waited for
``copied:l`` of the previous plan (each plan waits for it), so a copy never reads tasks of a later plan. Write-backs
read ring slots on the transfer queue after event ``appended``; the compute queue waits for ``written`` (at the next
step's begin) before it next writes a ring slot. ``tests/cache/test_stream_protocol.py`` runs this protocol under
adversarial schedules.

Compressed keys are not kept here: :class:`~longsparse.cache.compressed_keys.CompressedKeys` holds them on the GPU for
every block-sparse layer, whichever cache holds the keys and values.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ..ops._triton import resolve_use_kernel
from ..ops.transfer import STAT_FIELDS, CopyPlan, copy_rows, default_cta_quota, plan_slot_copies
from .host_store import HostBuffer, host_rows
from .kv_cache import CacheBytes, KVCache
from .layout import BlockLayout
from .step import CacheStep
from .streams import COMPUTE, TRANSFER, Streams, streams_for


def _to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """int64 tensor of ``values`` on ``device``; through pinned memory on a GPU so the copy does not block."""
    t = torch.tensor(values, dtype=torch.int64)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t


class BlockKVCache(KVCache):
    """Block KV cache of :class:`BlockLayout` on ``device`` (protocol in the module docstring).

    ``prefetch``: :meth:`prefetch` issues the announced layer's copy at once, one attention layer early (SparDA);
    otherwise copies are issued when the layer asks for its blocks (:meth:`block_slots`). ``streams``: default CUDA
    streams on a GPU, inline work elsewhere. ``host_buffer``: a :class:`HostBuffer` to take the host store from (reused
    across caches; default: a new one). ``num_ctas``: programs of the copy kernel (default
    :func:`~longsparse.ops.transfer.default_cta_quota` of the step's batch). ``use_kernel``: passed to the planner
    and the copy kernel (None: the Triton kernels on CUDA, the torch references elsewhere, as the attention backends
    do). A CUDA graph captures the layers' calls of a decode step under :meth:`graph_capture`; its stepper calls
    :meth:`begin_step` and :meth:`end_step` around each replay (the captured Python does not run again).
    """

    def __init__(
        self,
        layout: BlockLayout,
        device: torch.device | str,
        *,
        prefetch: bool = False,
        streams: Streams | None = None,
        host_buffer: HostBuffer | None = None,
        num_ctas: int | None = None,
        use_kernel: bool | None = None,
    ):
        if num_ctas is not None and (not isinstance(num_ctas, int) or num_ctas <= 0):
            raise ValueError(f"num_ctas must be a positive int or None, got {num_ctas!r}")
        self.layout = layout
        self.config = layout.config
        self.device = torch.device(device)
        self.prefetch_enabled = bool(prefetch)
        self.streams = streams if streams is not None else streams_for(self.device, overlap=True)
        self.num_ctas = num_ctas
        self.use_kernel = resolve_use_kernel(use_kernel, self.device)
        S, H, d = layout.num_seqs, layout.num_kv_heads, layout.head_dim
        blk, dt, dev = layout.block_size, layout.dtype, self.device
        n_res, n_off = len(layout.resident), len(layout.offloaded)
        # zero filler: masked key positions must be finite (softmax weight 0 times NaN is NaN)
        self._resident = torch.zeros(n_res, layout.resident_rows_per_layer, 2, blk, d, dtype=dt, device=dev)
        self._slots = torch.zeros(layout.slot_rows, 2, blk, d, dtype=dt, device=dev)
        self._dynamic = torch.full((n_off, S * H, layout.dynamic_slots), -1, dtype=torch.int32, device=dev)
        self._stats = torch.zeros(n_off, len(STAT_FIELDS), dtype=torch.int64, device=dev)
        self._plans = {
            layer: CopyPlan.allocate(S * H, self.config.decode_width(), layout.dynamic_slots, dev)
            for layer in layout.offloaded
        }
        self._resident_tables = {
            layer: torch.full((S * H * self.config.decode_width(),), -1, dtype=torch.int32, device=dev)
            for layer in layout.resident
        }
        buffer = (host_buffer or HostBuffer(pin=dev.type == "cuda")).view(layout.host_bytes())
        self._host = host_rows(buffer, layout.host_rows, layout.row_elems, dt)
        self._maps = {layer: layout.slot_map(layer) for layer in layout.offloaded}
        self.lengths = [0] * S
        self._table: dict[int, torch.Tensor] = {}
        self._announced: dict[int, torch.Tensor] = {}
        self._unissued: set[int] = set()

    @property
    def layers(self) -> tuple[int, ...]:
        return self.layout.layers

    def is_offloaded(self, layer: int) -> bool:
        return layer in self.layout.offloaded

    def _slot_rows(self) -> torch.Tensor:
        return self._slots.view(self.layout.slot_rows, self.layout.row_elems)

    def _layer_rows(self, layer: int) -> torch.Tensor:
        """``[rows, 2, block, d]`` block rows of ``layer`` (resident: ``[S, Hkv, NB]``; offloaded: its slots)."""
        if self.is_offloaded(layer):
            li = self.layout.offload_index(layer)
            per_layer = self.layout.slot_rows // len(self.layout.offloaded)
            return self._slots[li * per_layer : (li + 1) * per_layer]
        return self._resident[self.layout.resident.index(layer)]

    def _host_blocks(self) -> torch.Tensor:
        """The host store as ``[S, L_off, Hkv, NB, 2, block, d]``."""
        lay = self.layout
        return self._host.view(
            lay.num_seqs, len(lay.offloaded), lay.num_kv_heads, lay.blocks_per_seq, 2, lay.block_size, lay.head_dim
        )

    def _ctas(self, batch_size: int) -> int:
        return self.num_ctas if self.num_ctas is not None else default_cta_quota(batch_size)

    def reset(self, slots: list[int]) -> None:
        """Forget the sequences in ``slots`` (before new sequences take them)."""
        H = self.layout.num_kv_heads
        for s in slots:
            self.lengths[s] = 0

        def work():
            for s in slots:
                self._dynamic[:, s * H : (s + 1) * H] = -1

        self.streams.run(COMPUTE, work)

    def store(self, layer, step, k, v):
        """A prefill's fresh prompts (each written whole: full non-init blocks of offloaded layers go to host memory)
        or a decode step's one token per sequence. A prefill after cached tokens (chunked prefill) is not supported:
        NotImplementedError."""
        if step.is_decode:
            self._append(layer, step, k, v)
            return
        for n, (start, end) in enumerate(zip(step.offsets, step.offsets[1:])):
            if step.prefix_lens[n]:
                raise NotImplementedError(
                    f"the block KV cache takes fresh prompts only: slot {step.slots[n]} got a prefill after "
                    f"{step.prefix_lens[n]} cached tokens (no chunked prefill with offload='cpu')"
                )
            self._write_prefill(layer, step.slots[n], k[start:end], v[start:end])

    def _write_prefill(self, layer: int, slot: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """A fresh sequence's prompt: ``k, v [T, Hkv, d]`` at positions ``0 .. T − 1`` of ``slot``. Full non-init
        blocks of offloaded layers go to host memory on the transfer queue."""
        lay = self.layout
        T = k.shape[0]
        if k.shape != v.shape or k.shape[1:] != (lay.num_kv_heads, lay.head_dim) or not 0 < T <= lay.capacity:
            raise ValueError(
                f"k and v must be [T, {lay.num_kv_heads}, {lay.head_dim}] with 0 < T <= capacity {lay.capacity}, "
                f"got {list(k.shape)} and {list(v.shape)}"
            )
        if not 0 <= slot < lay.num_seqs:
            raise ValueError(f"slot must be in [0, {lay.num_seqs}), got {slot}")
        if not (k.dtype == v.dtype == lay.dtype):
            raise ValueError(f"k and v must be {lay.dtype}, got {k.dtype} and {v.dtype}")
        cfg, blk = self.config, lay.block_size
        nb, full = cfg.num_blocks(T), T // blk
        H = lay.num_kv_heads
        to_host = self.is_offloaded(layer) and full > cfg.init_blocks
        staging = None  # allocated here, filled on the compute queue, read on the transfer queue
        if to_host:
            staging = torch.empty(H, full - cfg.init_blocks, 2, blk, lay.head_dim, dtype=lay.dtype, device=self.device)
        qb = nb - 1
        on_gpu = [*range(min(cfg.init_blocks, nb)), *range(max(cfg.init_blocks, qb - cfg.local_blocks), nb)]
        gpu_blocks = torch.tensor(on_gpu, device=self.device)
        gpu_slots = torch.tensor([self._maps[layer].forced_slot(b) for b in on_gpu] if self.is_offloaded(layer) else [],
                                 dtype=torch.int64, device=self.device)  # fmt: skip

        def compute_work():
            kb, vb = _blocks(k, blk, nb), _blocks(v, blk, nb)  # [Hkv, nb, block, d]
            rows = self._layer_rows(layer)
            if not self.is_offloaded(layer):
                view = rows.view(lay.num_seqs, H, lay.blocks_per_seq, 2, blk, lay.head_dim)[slot, :, :nb]
                view[:, :, 0], view[:, :, 1] = kb, vb
                return
            view = rows.view(lay.num_seqs, H, lay.slots_per_row, 2, blk, lay.head_dim)[slot]
            view[:, gpu_slots, 0], view[:, gpu_slots, 1] = kb[:, gpu_blocks], vb[:, gpu_blocks]
            self._dynamic[lay.offload_index(layer), slot * H : (slot + 1) * H] = -1
            if to_host:
                staging[:, :, 0], staging[:, :, 1] = kb[:, cfg.init_blocks : full], vb[:, cfg.init_blocks : full]

        self.streams.run(COMPUTE, compute_work)
        self.lengths[slot] = T
        if not to_host:
            return
        dst = self._host_blocks()[slot, lay.offload_index(layer), :, cfg.init_blocks : full]

        def transfer_work():
            for h in range(H):
                dst[h].copy_(staging[h], non_blocking=True)

        self.streams.record(COMPUTE, "staged")
        self.streams.wait(TRANSFER, "staged")
        self.streams.run(TRANSFER, transfer_work)
        self.streams.hold(staging, TRANSFER)

    def _append(self, layer: int, step: CacheStep, k: torch.Tensor, v: torch.Tensor) -> None:
        """One decode token per sequence: ``k, v [N, Hkv, d]`` at ``step.positions`` (the blocks it fills are written
        back at :meth:`end_step`)."""
        lay = self.layout
        H = lay.num_kv_heads
        if k.shape != (step.num_seqs, H, lay.head_dim) or v.shape != k.shape:
            raise ValueError(f"k and v must be [N={step.num_seqs}, {H}, {lay.head_dim}], got {list(k.shape)}")
        if k.dtype != lay.dtype or v.dtype != lay.dtype:
            raise ValueError(f"k and v must be {lay.dtype}, got {k.dtype} and {v.dtype}")
        for s, p in zip(step.slots, step.prefix_lens):
            if p != self.lengths[s] or p >= lay.capacity:
                raise ValueError(
                    f"slot {s} holds {self.lengths[s]} tokens (capacity {lay.capacity}); cannot append position {p}"
                )
        offloaded = self.is_offloaded(layer)
        cfg, blk = self.config, lay.block_size
        heads = torch.arange(H, device=self.device)

        def work():
            block = step.positions // blk
            if offloaded:
                j = torch.where(block < cfg.init_blocks, block, cfg.init_blocks + block % (cfg.local_blocks + 1))
                row = (step.slot_index[:, None] * H + heads) * lay.slots_per_row + j[:, None]
            else:
                row = (step.slot_index[:, None] * H + heads) * lay.blocks_per_seq + block[:, None]
            self._layer_rows(layer)[row, :, (step.positions % blk)[:, None]] = torch.stack((k, v), dim=2)

        self.streams.run(COMPUTE, work)

    def begin_step(self, step):
        """The compute queue waits for the previous step's write-back (event ``written``): it read ring slots that
        this step's writes may reuse."""
        self.streams.wait(COMPUTE, "written")

    def end_step(self, step):
        """After a decode step of the sequences in ``step.slots``, whose new tokens were at ``step.prefix_lens``:
        advance their lengths and write every block the step filled back to host memory (a prefill wrote its prompts
        whole in :meth:`store`: nothing left to do)."""
        if not step.is_decode:
            return
        for s, p in zip(step.slots, step.prefix_lens):
            self.lengths[s] = p + 1
        self._write_back_filled(step.slots, step.prefix_lens)

    @contextmanager
    def graph_capture(self) -> Iterator[None]:
        """Events recorded outside a capture cannot be waited on inside it (replays on one stream are ordered anyway,
        and :meth:`begin_step` orders each replay after the previous write-back), and events recorded inside it must
        not be reused outside: the streams forget every event before and after."""
        self.streams.forget_events()
        try:
            yield
        finally:
            self.streams.forget_events()

    def _write_back_filled(self, slots: list[int], positions: list[int]) -> None:
        lay, cfg = self.layout, self.config
        blk, H = lay.block_size, lay.num_kv_heads
        src, dst = [], []
        for s, p in zip(slots, positions):
            b = p // blk
            if (p + 1) % blk or b < cfg.init_blocks:
                continue
            for m in self._maps.values():
                for h in range(H):
                    src.append(m.gpu_offset + (s * H + h) * m.slots_per_row + m.forced_slot(b))
                    dst.append(s * m.host_seq_stride + h * m.host_head_stride + m.host_offset + b)
        if not src:
            return
        ctas = self._ctas(len(slots))

        def work():
            copy_rows(
                self._slot_rows(), self._host, _to_device(src, self.device), _to_device(dst, self.device),
                num_ctas=ctas, use_kernel=self.use_kernel,
            )  # fmt: skip

        self.streams.record(COMPUTE, "appended")
        self.streams.wait(TRANSFER, "appended")
        self.streams.run(TRANSFER, work)
        self.streams.record(TRANSFER, "written")

    def _plan(self, layer: int, selection: torch.Tensor, step: CacheStep) -> None:
        """``layer``'s blocks for this step: ``selection [N, Hkv, W]`` (a decode selector's output, forced blocks
        included). Offloaded layers diff it against their slots (compute queue) and queue the copy tasks; resident
        layers map it to their rows."""
        lay = self.layout
        N, H, W = selection.shape
        if N != step.num_seqs or H != lay.num_kv_heads or W != self.config.decode_width():
            raise ValueError(
                f"selection must be [N={step.num_seqs}, {lay.num_kv_heads}, {self.config.decode_width()}], "
                f"got {list(selection.shape)}"
            )
        if self.is_offloaded(layer):
            plan = self._plans[layer]
            table = plan.table[: N * H * W].view(N, H, W)
            li = lay.offload_index(layer)

            def work():
                plan_slot_copies(
                    selection, step.seqlens, step.slot_index, self._dynamic[li], self._maps[layer], plan,
                    self._stats[li], use_kernel=self.use_kernel,
                )  # fmt: skip

            self.streams.wait(COMPUTE, f"copied:{layer}")
            self.streams.run(COMPUTE, work)
            self.streams.record(COMPUTE, f"planned:{layer}")
            self._unissued.add(layer)
        else:
            table = self._resident_tables[layer][: N * H * W].view(N, H, W)

            def work():
                base = step.slot_index[:, None, None] * H + torch.arange(H, device=self.device)[:, None]
                mapped = base * lay.blocks_per_seq + selection
                table.copy_(torch.where(selection >= 0, mapped, -1))

            self.streams.run(COMPUTE, work)
        self._table[layer] = table

    def _issue(self, layer: int, batch_size: int) -> None:
        """Issue ``layer``'s planned copy on the transfer queue (no-op if issued already or not offloaded)."""
        if layer not in self._unissued:
            return
        plan = self._plans[layer]
        ctas = self._ctas(batch_size)

        def work():
            copy_rows(
                self._host, self._slot_rows(), plan.src, plan.dst, plan.count, num_ctas=ctas, use_kernel=self.use_kernel
            )

        self.streams.wait(TRANSFER, f"planned:{layer}")
        self.streams.wait(TRANSFER, f"read:{layer}")
        self.streams.run(TRANSFER, work)
        self.streams.record(TRANSFER, f"copied:{layer}")
        self._unissued.discard(layer)

    def prefetch(self, layer, step, block_ids):
        """Plan ``layer``'s blocks now and, with ``prefetch=True``, issue their copy on the transfer queue."""
        self._plan(layer, block_ids, step)
        self._announced[layer] = block_ids
        if self.prefetch_enabled:
            self._issue(layer, step.num_seqs)

    def block_slots(self, layer, step, block_ids, block_size):
        """``layer``'s block rows as ``(k_slots, v_slots)`` and its block table; plans first unless :meth:`prefetch`
        announced this very ``block_ids`` tensor, issues the copy unless issued, and makes the compute queue wait for
        it."""
        if block_size != self.layout.block_size:
            raise ValueError(f"block_size {block_size} is not this cache's ({self.layout.block_size})")
        self._log_selection(layer, block_ids)
        if self._announced.pop(layer, None) is not block_ids:
            self._plan(layer, block_ids, step)
        if self.is_offloaded(layer):
            if layer in self._unissued:
                # A copy issued at its layer starts when the layer asks, not as soon as its plan exists: under a
                # captured CUDA graph the transfer queue would otherwise run it as early as its events allow, which
                # is a prefetch the mode does not have.
                self.streams.record(COMPUTE, f"asked:{layer}")
                self.streams.wait(TRANSFER, f"asked:{layer}")
            self._issue(layer, step.num_seqs)
            self.streams.wait(COMPUTE, f"copied:{layer}")
        rows = self._layer_rows(layer)
        return rows[:, 0], rows[:, 1], self._table[layer]

    def release(self, layer):
        """Event ``read:l`` after the attention that read ``layer``'s slots (the next copy into them waits for it)."""
        if self.is_offloaded(layer):
            self.streams.record(COMPUTE, f"read:{layer}")

    def gather(self, layer, slots, length):
        """Dense keys and values ``[N, Hkv, length, d]`` of ``slots`` (assembled from GPU rows and host memory after a
        full synchronisation: for inspection and tests, not for the decode path)."""
        self.streams.synchronize()
        lay, cfg = self.layout, self.config
        H, blk, d = lay.num_kv_heads, lay.block_size, lay.head_dim
        keys = torch.zeros(len(slots), H, length, d, dtype=lay.dtype, device=self.device)
        values = torch.zeros_like(keys)
        rows = self._layer_rows(layer)
        for i, s in enumerate(slots):
            n = min(length, self.lengths[s])
            qb = (self.lengths[s] - 1) // blk
            for b in range(cfg.num_blocks(n)):
                for h in range(H):
                    if not self.is_offloaded(layer):
                        block = rows[(s * H + h) * lay.blocks_per_seq + b]
                    elif b < cfg.init_blocks or b >= qb - cfg.local_blocks:
                        j = b if b < cfg.init_blocks else cfg.init_blocks + b % (cfg.local_blocks + 1)
                        block = rows[(s * H + h) * lay.slots_per_row + j]
                    else:
                        block = self._host[lay.host_row(layer, s, h, b)].view(2, blk, d).to(self.device)
                    m = min(blk, n - b * blk)
                    keys[i, h, b * blk : b * blk + m] = block[0, :m]
                    values[i, h, b * blk : b * blk + m] = block[1, :m]
        return keys, values

    def nbytes(self) -> CacheBytes:
        plans = [t for p in self._plans.values() for t in (p.table, p.src, p.dst, p.count)]
        tensors = [self._resident, self._slots, self._dynamic, self._stats, self._host]
        return CacheBytes.of([*tensors, *plans, *self._resident_tables.values()])

    def transfer_stats(self) -> dict[str, float]:
        """Totals over every plan so far (reads the device): dynamic entries, hits, misses copied, overflow (must be
        0), the hit rate and the bytes copied host -> GPU."""
        totals = dict(zip(STAT_FIELDS, self._stats.sum(0).tolist()))
        totals["hit_rate"] = totals["hits"] / totals["dynamic"] if totals["dynamic"] else float("nan")
        totals["bytes_copied"] = totals["misses"] * self.layout.row_bytes
        return totals


def _blocks(x: torch.Tensor, block: int, num_blocks: int) -> torch.Tensor:
    """``x [T, Hkv, d]`` as ``[Hkv, num_blocks, block, d]``, zero-padded after ``T``."""
    T, H, d = x.shape
    pad = num_blocks * block - T
    if pad:
        x = torch.cat([x, x.new_zeros(pad, H, d)])
    return x.view(num_blocks, block, H, d).permute(2, 0, 1, 3)
