"""Drive a :class:`BlockKVCache` through prefill and decode steps through the ``KVCache`` interface, in the order the
runner (each step's begin and end), the block-sparse attention backends and the Forecast emitters call it, with keys
that say which block they belong to, and an "attention" that checks every block it reads.

Key of position ``p`` of (layer ``l``, sequence slot ``s``, head ``h``): channel 0 holds ``tag(l, s, h, p // block)``,
channel 1 holds ``p % block``, the rest ``p``; the value is the key negated. A read of table entry ``e`` is *stale*
unless every unmasked row of the slot it names holds the keys of block ``block_ids[e]`` of the right sequence, head
and layer. Selections are hostile: each step's dynamic blocks avoid the previous step's where the candidates allow,
so nearly every dynamic slot is recycled every step.
"""

from __future__ import annotations

import torch

from longsparse.cache import BlockKVCache, CacheStep
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

    def __call__(self, layer: int, batch: CacheStep) -> torch.Tensor:
        cfg, H = self.cfg, self.cache.layout.num_kv_heads
        W, C = cfg.decode_width(), self.cache.layout.dynamic_slots
        out = torch.full((batch.num_seqs, H, W), -1, dtype=torch.int32)
        for n, (s, p) in enumerate(zip(batch.slots, batch.prefix_lens)):
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

    def __call__(self, layer: int, batch: CacheStep, block_ids: torch.Tensor) -> None:
        blk = self.cache.layout.block_size
        H = self.cache.layout.num_kv_heads
        k_slots, _, table = self.cache.block_slots(layer, batch, block_ids, blk)

        def work():
            ids = block_ids.long()
            valid = (table >= 0) & (ids >= 0)
            keys = k_slots[table.long().clamp_min(0)]  # [N, H, W, block, d]
            want = torch.empty(ids.shape, dtype=torch.float32, device=ids.device)
            for n, s in enumerate(batch.slots):
                for h in range(H):
                    want[n, h] = ((layer * 16 + s) * 4 + h) * 4096 + ids[n, h].float()
            pos = ids[..., None] * blk + torch.arange(blk, device=ids.device)
            live = valid[..., None] & (pos < batch.seqlens.long()[:, None, None, None])
            wrong = live & ((keys[..., 0] != want[..., None]) | (keys[..., 1] != (pos % blk).float()))
            self.stale.add_(wrong.sum())
            self.checked.add_(live.sum())

        self.cache.streams.run(COMPUTE, work)
        self.cache.release(layer)


def prefill(cache: BlockKVCache, lengths: dict[int, int]) -> None:
    """Each sequence's prompt (slot -> tokens) written as a prefill step of its own."""
    lay = cache.layout
    for layer in lay.layers:
        for s, T in lengths.items():
            k = keys_for(layer, s, torch.arange(T), lay.num_kv_heads, lay.head_dim, lay.block_size)
            k = k.to(cache.device, lay.dtype)
            step = CacheStep.prefill([T], cache.device, slots=[s])
            cache.begin_step(step)
            cache.store(layer, step, k, -k)
            cache.end_step(step)


def decode_batch(cache: BlockKVCache, lengths: dict[int, int]) -> CacheStep:
    """The decode step of the sequences in ``lengths`` (slot -> cached tokens), in slot order."""
    slots = sorted(lengths)
    return CacheStep.decode([lengths[s] for s in slots], cache.device, slots=slots)


def decode(cache: BlockKVCache, lengths: dict[int, int], steps: int, *, forecast: bool, seed: int = 0):
    """``steps`` decode steps of the sequences in ``lengths`` (slot -> tokens), in the models' order. With
    ``forecast`` (SparDA), each attention layer announces the next one's blocks (the first layer also its own) through
    :meth:`~BlockKVCache.prefetch` before it stores its token and attends; without, each layer selects its own blocks
    after storing its token (InfLLM-V2)."""
    lay = cache.layout
    select = HostileSelector(cache, seed)
    attend = CheckingAttention(cache)
    for _ in range(steps):
        batch = decode_batch(cache, lengths)
        cache.begin_step(batch)
        announced = {}
        for i, layer in enumerate(lay.layers):
            if forecast:
                for target in ([layer] if i == 0 else []) + list(lay.layers[i + 1 : i + 2]):
                    announced[target] = select(target, batch)
                    cache.prefetch(target, batch, announced[target])
            k = torch.stack(
                [keys_for(layer, s, torch.tensor([lengths[s]]), lay.num_kv_heads, lay.head_dim, lay.block_size)[0]
                 for s in batch.slots]
            ).to(cache.device, lay.dtype)  # fmt: skip
            cache.store(layer, batch, k, -k)
            attend(layer, batch, announced.pop(layer) if forecast else select(layer, batch))
        cache.end_step(batch)
        for s in batch.slots:
            lengths[s] += 1
    return attend
