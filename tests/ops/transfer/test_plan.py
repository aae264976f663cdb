"""The copy planner: over many decode steps, every selected block is found in the slot its table entry names once the
planned copies have run; hits stay in place; the kernel (interpreter) plans exactly what the reference plans."""

import pytest
import torch

from longsparse.ops.sparse_attn import MINICPM4, SparseAttentionConfig
from longsparse.ops.sparse_attn.naive import forced_blocks, select_blocks_ref
from longsparse.ops.transfer import (
    STAT_FIELDS,
    CopyPlan,
    SlotMap,
    copy_rows_ref,
    max_dynamic_blocks,
    plan_slot_copies,
    plan_slot_copies_ref,
)

CFG = SparseAttentionConfig(block_size=16, init_blocks=1, window=32, topk=6, kernel_size=16, kernel_stride=8,
                            dense_len=96)  # fmt: skip
TWO_INIT = SparseAttentionConfig(block_size=16, init_blocks=2, window=16, topk=7, kernel_size=16, kernel_stride=8,
                                 dense_len=0)  # fmt: skip


def tag(s: int, h: int, b: int) -> int:
    """A unique id for block b of head h of sequence slot s: what a slot holding it must contain."""
    return (s * 8 + h) * 1000 + b


class Layer:
    """One offloaded layer with a fake content model: each GPU row and host row holds the tag of its block."""

    def __init__(self, cfg, num_seqs, heads, capacity, layer_index=1, num_layers=3):
        self.cfg, self.S, self.H = cfg, num_seqs, heads
        self.C = max_dynamic_blocks(cfg, capacity)
        nb = cfg.num_blocks(capacity)
        spr = cfg.init_blocks + cfg.local_blocks + 1 + self.C
        self.map = SlotMap(
            cfg.block_size, cfg.init_blocks, cfg.local_blocks, self.C, heads,
            host_seq_stride=num_layers * heads * nb, host_head_stride=nb, host_offset=layer_index * heads * nb,
            gpu_offset=layer_index * num_seqs * heads * spr,
        )  # fmt: skip
        self.resident = torch.full((num_seqs * heads, self.C), -1, dtype=torch.int32)
        self.gpu = torch.full((self.map.gpu_offset + num_seqs * heads * spr, 1), -1, dtype=torch.int64)
        self.host = torch.full((num_seqs * num_layers * heads * nb, 1), -1, dtype=torch.int64)
        for s in range(num_seqs):
            for h in range(heads):
                for b in range(nb):
                    self.host[s * self.map.host_seq_stride + h * nb + self.map.host_offset + b] = tag(s, h, b)

    def write_forced(self, seq_slots, seqlens):
        """What the cache keeps on the GPU itself: init blocks and the window ring (appends write the tail)."""
        m = self.map
        for s, n in zip(seq_slots.tolist(), seqlens.tolist()):
            qb = (n - 1) // m.block_size
            for h in range(self.H):
                base = m.gpu_offset + (s * self.H + h) * m.slots_per_row
                for b in [*range(min(m.init_blocks, qb + 1)), *range(max(m.init_blocks, qb - m.local_blocks), qb + 1)]:
                    self.gpu[base + m.forced_slot(b)] = tag(s, h, b)


def random_selection(cfg, seqlens, heads, width, dynamic_cap, gen):
    """Forced blocks plus up to ``dynamic_cap`` random candidates (every causal block below ``dense_len``)."""
    rows = []
    for n in seqlens.tolist():
        nb = cfg.num_blocks(n)
        forced = forced_blocks(torch.tensor([n - 1]), nb, cfg)[0]
        per_head = []
        for _ in range(heads):
            cand = (~forced).nonzero().flatten()
            if n >= cfg.dense_len:
                k = min(len(cand), cfg.budget_blocks - int(forced.sum()), dynamic_cap)
                cand = cand[torch.randperm(len(cand), generator=gen)[:k]]
            chosen = torch.cat([forced.nonzero().flatten(), cand]).sort().values
            per_head.append(torch.cat([chosen, chosen.new_full((width - len(chosen),), -1)]))
        rows.append(torch.stack(per_head))
    return torch.stack(rows).to(torch.int32)


def run_steps(layer, seq_slots, start_lens, steps, seed, use_kernel):
    gen = torch.Generator().manual_seed(seed)
    width = layer.cfg.decode_width()
    plan = CopyPlan.allocate(layer.S * layer.H, width, layer.C, "cpu")
    stats = torch.zeros(len(STAT_FIELDS), dtype=torch.int64)
    seqlens = torch.tensor(start_lens, dtype=torch.int32)
    history = []
    for _ in range(steps):
        sel = random_selection(layer.cfg, seqlens, layer.H, width, layer.C, gen)
        before = layer.resident.clone()
        table = plan_slot_copies(sel, seqlens, seq_slots, layer.resident, layer.map, plan, stats, use_kernel=use_kernel)
        n = int(plan.count)
        layer.write_forced(seq_slots, seqlens)
        copy_rows_ref(layer.host, layer.gpu, plan.src[:n], plan.dst[:n])
        history.append((sel, before, table.clone(), sorted(zip(plan.src[:n].tolist(), plan.dst[:n].tolist()))))
        seqlens += torch.randint(1, 40, seqlens.shape, generator=gen, dtype=torch.int32)
    return history, stats


CASES = {
    "S3-N2-H2-slots2,0-dense-then-sparse": (CFG, 3, 2, [2, 0], [40, 83]),
    "S2-N2-H2-slots0,1-init2": (TWO_INIT, 2, 2, [0, 1], [120, 300]),
    "S4-N1-H3-slot3": (CFG, 4, 3, [3], [97]),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("use_kernel", [False, True], ids=["ref", "kernel"])
def test_every_selected_block_is_in_its_slot_after_the_planned_copies(case, use_kernel):
    cfg, S, H, slots, lens = CASES[case]
    layer = Layer(cfg, S, H, capacity=1200)
    seq_slots = torch.tensor(slots)
    history, stats = run_steps(layer, seq_slots, lens, steps=12, seed=7, use_kernel=use_kernel)
    for sel, _before, table, tasks in history:
        assert ((sel >= 0) == (table >= 0)).all()
        dst_rows = [d for _, d in tasks]
        assert len(set(dst_rows)) == len(dst_rows)  # a slot is written at most once per step
    sel, _, table, _ = history[-1]  # the content model reflects the last step
    for n, s in enumerate(slots):
        for h in range(H):
            for e in (sel[n, h] >= 0).nonzero().flatten().tolist():
                assert int(layer.gpu[layer.map.gpu_offset + int(table[n, h, e])]) == tag(s, h, int(sel[n, h, e]))
    assert int(stats[3]) == 0 and int(stats[0]) == int(stats[1]) + int(stats[2]) and int(stats[2]) > 0


@pytest.mark.parametrize("case", CASES)
def test_hits_are_exactly_the_blocks_resident_before_the_step(case):
    cfg, S, H, slots, lens = CASES[case]
    layer = Layer(cfg, S, H, capacity=1200)
    history, stats = run_steps(layer, torch.tensor(slots), lens, steps=10, seed=11, use_kernel=False)
    hits = 0
    for sel, before, table, _tasks in history:
        for n, s in enumerate(slots):
            for h in range(H):
                held = set(before[s * H + h].tolist()) - {-1}
                forced_slots = layer.map.forced_slots
                for e in (sel[n, h] >= 0).nonzero().flatten().tolist():
                    j = int(table[n, h, e]) - (s * H + h) * layer.map.slots_per_row
                    if j >= forced_slots:
                        was_held = int(sel[n, h, e]) in held
                        hits += was_held
                        if was_held:  # a hit keeps the slot it had
                            assert int(before[s * H + h, j - forced_slots]) == int(sel[n, h, e])
    assert hits == int(stats[1]) and hits > 0


@pytest.mark.parametrize("case", CASES)
def test_kernel_plans_what_the_reference_plans(case):
    cfg, S, H, slots, lens = CASES[case]
    ref_layer, ker_layer = Layer(cfg, S, H, 1200), Layer(cfg, S, H, 1200)
    ref, ref_stats = run_steps(ref_layer, torch.tensor(slots), lens, steps=8, seed=5, use_kernel=False)
    ker, ker_stats = run_steps(ker_layer, torch.tensor(slots), lens, steps=8, seed=5, use_kernel=True)
    for (_, before_r, table_r, tasks_r), (_, before_k, table_k, tasks_k) in zip(ref, ker):
        assert torch.equal(before_r, before_k) and torch.equal(table_r, table_k) and tasks_r == tasks_k
    assert torch.equal(ref_layer.resident, ker_layer.resident) and torch.equal(ref_stats, ker_stats)


def test_reference_lists_tasks_in_row_then_list_order():
    m = SlotMap(16, 1, 1, 3, 1, host_seq_stride=100, host_head_stride=100)
    resident = torch.tensor([[5, -1, 7]], dtype=torch.int32)
    sel = torch.tensor([[[0, 2, 5, 6, 9, 10, -1]]], dtype=torch.int32)  # seqlen 170: block 10 is the tail
    table, src, dst, stats = plan_slot_copies_ref(sel, torch.tensor([170]), torch.tensor([0]), resident, m)
    assert src.tolist() == [2, 6] and dst.tolist() == [4, 5]  # misses 2, 6 -> free slots 1, 2 (block 7 evicted)
    assert table.tolist() == [[[0, 4, 3, 5, 2, 1, -1]]]  # ring: block 9 -> slot 1 + 9 % 2, block 10 -> 1 + 0
    assert resident.tolist() == [[5, 2, 6]] and stats.tolist() == [3, 1, 2, 0]


def test_too_few_dynamic_slots_is_counted_as_overflow_not_silently_wrong():
    m = SlotMap(16, 1, 1, 1, 1, host_seq_stride=100, host_head_stride=100)
    resident = torch.full((1, 1), -1, dtype=torch.int32)
    sel = torch.tensor([[[0, 2, 5, 9, 10]]], dtype=torch.int32)
    for use_kernel in (False, True):
        plan = CopyPlan.allocate(1, 5, 1, "cpu")
        stats = torch.zeros(4, dtype=torch.int64)
        table = plan_slot_copies(sel, torch.tensor([170]), torch.tensor([0]), resident.clone(), m, plan, stats,
                                 use_kernel=use_kernel)  # fmt: skip
        assert stats.tolist() == [2, 0, 1, 1] and int(plan.count) == 1
        assert int(table[0, 0, 2]) == -1  # the block without a slot is not attended from a wrong slot


@pytest.mark.parametrize(
    "cfg, capacity, want",
    [(MINICPM4, 131072, 94), (MINICPM4, 4096, 30), (SparseAttentionConfig(dense_len=0), 131072, 62)],
    ids=["minicpm-128k", "minicpm-4k-dense", "minicpm-sparse-only-128k"],
)
def test_max_dynamic_blocks_of_minicpm(cfg, capacity, want):
    assert max_dynamic_blocks(cfg, capacity) == want


@pytest.mark.parametrize("cfg", [CFG, TWO_INIT], ids=["dense96", "init2"])
def test_max_dynamic_blocks_bounds_the_selector_and_is_reached(cfg):
    """Selections of the reference selector over every length up to the capacity never hold more dynamic blocks."""
    capacity = 300
    most = 0
    gen = torch.Generator().manual_seed(0)
    for n in range(1, capacity + 1):
        nb = cfg.num_blocks(n)
        scores = torch.randn(1, 1, 1, nb, generator=gen, dtype=torch.float64)
        pos = torch.tensor([[n - 1]])
        sel = select_blocks_ref(scores, pos, cfg, dense_rows=torch.tensor([[n < cfg.dense_len]]),
                                width=cfg.decode_width())[0, 0, 0]  # fmt: skip
        forced = forced_blocks(pos, nb, cfg)[0, 0]
        most = max(most, int((~forced[sel[sel >= 0].long()]).sum()))
    assert most == max_dynamic_blocks(cfg, capacity)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(selection=torch.zeros(1, 3, 7, dtype=torch.int32)), "KV heads"),
        (dict(resident=torch.zeros(2, 3, dtype=torch.int64)), "int32"),
        (dict(selection=torch.zeros(1, 2, 6, dtype=torch.int32)), "plan buffers"),
        (dict(seqlens=torch.tensor([5, 6])), r"\[N\]"),
        (dict(stats=torch.zeros(3, dtype=torch.int64)), "stats"),
    ],
    ids=["heads", "resident-dtype", "width", "seqlens", "stats"],
)
def test_bad_input_is_refused(change, match):
    m = SlotMap(16, 1, 1, 3, 2, host_seq_stride=100, host_head_stride=50)
    args = dict(selection=torch.zeros(1, 2, 7, dtype=torch.int32), seqlens=torch.tensor([5]),
                seq_slots=torch.tensor([0]), resident=torch.zeros(2, 3, dtype=torch.int32), slot_map=m,
                plan=CopyPlan.allocate(2, 7, 3, "cpu"), stats=torch.zeros(4, dtype=torch.int64))  # fmt: skip
    args.update(change)
    with pytest.raises(ValueError, match=match):
        plan_slot_copies(**args)
