"""Drive a :class:`BlockKVCache` through prefill and decode steps the way the attention backend does, with keys that
say which block they belong to, and an "attention" that checks every block it reads.

Key of position ``p`` of (layer ``l``, sequence slot ``s``, head ``h``): channel 0 holds ``tag(l, s, h, p // block)``,
channel 1 holds ``p % block``, the rest ``p``; the value is the key negated. A read of table entry ``e`` is *stale*
unless every unmasked row of the slot it names holds the keys of block ``block_ids[e]`` of the right sequence, head
and layer. Selections are hostile: each step's dynamic blocks avoid the previous step's where the candidates allow,
so nearly every dynamic slot is recycled every step.
"""

from __future__ import annotations

import torch

from longsparse.cache import BlockKVCache, DecodeRows
from longsparse.cache.streams import COMPUTE
from longsparse.ops.sparse_attn.naive import forced_blocks


def tag(layer: int, s: int, h: int, b: int) -> float:
    return float(((layer * 16 + s) * 4 + h) * 4096 + b)


def keys_for(layer: int, s: int, positions: torch.Tensor, heads: int, d: int, block: int) -> torch.Tensor:
    """``[len(positions), heads, d]`` float32 keys carrying their tags."""
    p = positions.to(torch.float32)
    k = p[:, None, None].expand(len(positions), heads, d).clone()
    for h in range(heads):
        k[:, h, 0] = torch.tensor([tag(layer, s, h, int(x) // block) for x in positions.tolist()])
    k[:, :, 1] = (positions % block).to(torch.float32)[:, None]
    return k


class HostileSelector:
    """Forced blocks plus dynamic blocks chosen to avoid the previous step's (per layer, sequence and head)."""

    def __init__(self, cache: BlockKVCache, seed: int):
        self.cache, self.cfg = cache, cache.config
        self.gen = torch.Generator().manual_seed(seed)
        self.previous: dict[tuple[int, int, int], set[int]] = {}

    def __call__(self, layer: int, rows: DecodeRows) -> torch.Tensor:
        cfg, H = self.cfg, self.cache.layout.num_kv_heads
        W, C = cfg.decode_width(), self.cache.layout.dynamic_slots
        out = torch.full((rows.num_seqs, H, W), -1, dtype=torch.int32)
        for n, (s, p) in enumerate(zip(rows.slots, rows.positions)):
            nb = cfg.num_blocks(p + 1)
            forced = forced_blocks(torch.tensor([p]), nb, cfg)[0]
            for h in range(H):
                cand = [b for b in (~forced).nonzero().flatten().tolist()]
                if p + 1 >= cfg.dense_len:
                    k = min(len(cand), cfg.budget_blocks - int(forced.sum()), C)
                    prev = self.previous.get((layer, s, h), set())
                    fresh = [b for b in cand if b not in prev]
                    order = torch.randperm(len(fresh), generator=self.gen).tolist()
                    chosen = [fresh[i] for i in order[:k]]
                    rest = [b for b in cand if b not in chosen]
                    chosen += rest[: k - len(chosen)]
                else:
                    chosen = cand
                self.previous[(layer, s, h)] = set(chosen)
                blocks = sorted(forced.nonzero().flatten().tolist() + chosen)
                out[n, h, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        return out.to(self.cache.device)


class CheckingAttention:
    """Counts table entries whose slot does not hold the block the entry names (device-side, no host sync)."""

    def __init__(self, cache: BlockKVCache):
        self.cache = cache
        self.stale = torch.zeros((), dtype=torch.int64, device=cache.device)
        self.checked = torch.zeros((), dtype=torch.int64, device=cache.device)

    def __call__(self, layer: int, rows: DecodeRows) -> None:
        view = self.cache.acquire(layer)
        blk = self.cache.layout.block_size
        H = self.cache.layout.num_kv_heads

        def work():
            table, ids = view.table.long(), view.block_ids.long()
            valid = (table >= 0) & (ids >= 0)
            keys = view.k_slots[table.clamp_min(0)]  # [N, H, W, block, d]
            want = torch.empty(ids.shape, dtype=torch.float32, device=ids.device)
            for n, s in enumerate(rows.slots):
                for h in range(H):
                    want[n, h] = ((layer * 16 + s) * 4 + h) * 4096 + ids[n, h].float()
            pos = ids[..., None] * blk + torch.arange(blk, device=ids.device)
            live = valid[..., None] & (pos < rows.seqlens.long()[:, None, None, None])
            wrong = live & ((keys[..., 0] != want[..., None]) | (keys[..., 1] != (pos % blk).float()))
            self.stale.add_(wrong.sum())
            self.checked.add_(live.sum())

        self.cache.streams.run(COMPUTE, work)
        self.cache.release(layer)


def prefill(cache: BlockKVCache, lengths: dict[int, int]) -> None:
    lay = cache.layout
    for layer in lay.layers:
        for s, T in lengths.items():
            k = keys_for(layer, s, torch.arange(T), lay.num_kv_heads, lay.head_dim, lay.block_size)
            k = k.to(cache.device, lay.dtype)
            n_cmp = max(1, cache.config.num_compressed(T))
            k_cmp = torch.zeros(n_cmp, lay.num_kv_heads, lay.head_dim, device=cache.device, dtype=lay.dtype)
            cache.write_prefill(layer, s, k, -k, k_cmp)


def decode(cache: BlockKVCache, lengths: dict[int, int], steps: int, *, forecast: bool, seed: int = 0):
    """``steps`` decode steps of the sequences in ``lengths`` (slot -> tokens), scheduled like the backend: with
    ``forecast`` each layer plans (and, if the cache prefetches, copies) the next layer's blocks before attending."""
    lay = cache.layout
    select = HostileSelector(cache, seed)
    attend = CheckingAttention(cache)
    slots = sorted(lengths)
    for _ in range(steps):
        rows = DecodeRows.build(slots, [lengths[s] for s in slots], cache.device)
        for layer in lay.layers:
            k = torch.stack(
                [keys_for(layer, s, torch.tensor([lengths[s]]), lay.num_kv_heads, lay.head_dim, lay.block_size)[0]
                 for s in slots]
            ).to(cache.device, lay.dtype)  # fmt: skip
            cache.append(layer, rows, k, -k)
            if not forecast:
                cache.plan(layer, select(layer, rows), rows)
            else:
                if layer == cache.first_layer:
                    cache.plan(layer, select(layer, rows), rows)
                nxt = cache.next_layer(layer)
                if nxt is not None:
                    cache.plan(nxt, select(nxt, rows), rows)
                    if cache.prefetch_enabled:
                        cache.prefetch(nxt, rows.num_seqs)
            attend(layer, rows)
        for s in slots:
            lengths[s] += 1
    return attend
