"""The locality model: the slot-cache simulation is the copy planner's rule, the statistics count what they say, and a
fitted process produces valid selections whose hit rate and run lengths match what it was fitted to."""

from pathlib import Path

import numpy as np
import pytest
import torch

from longsparse.bench.locality import (
    MAX_AGE,
    LocalityProcess,
    dynamic_blocks,
    fit_hazard,
    fit_process,
    replayed_hit_rate,
    slot_cache_hits,
    trace_locality,
)
from longsparse.engine.traces import SelectionTrace, forced_mask, load_traces
from longsparse.ops.sparse_attn import MINICPM4, SparseAttentionConfig
from longsparse.ops.transfer import SlotMap, max_dynamic_blocks
from longsparse.ops.transfer.naive import plan_slot_copies_ref

SMOL = SparseAttentionConfig(block_size=64, init_blocks=1, window=512, topk=16, kernel_size=32, kernel_stride=16,
                             dense_len=0)  # fmt: skip
"""The trained SmolLM2 adapter's geometry (adapters/smollm2-135m-instruct): 14 dynamic blocks per selection."""
TRACES = Path(__file__).resolve().parents[2] / "benchmarks" / "traces" / "selections.npz"


def _hazard(layers: int, scale: float = 1.0) -> np.ndarray:
    """A decreasing hazard (young blocks leave often, old ones rarely), different per layer."""
    base = np.concatenate([np.linspace(0.45, 0.1, 8), np.full(MAX_AGE - 8, 0.04)])
    return np.clip(np.stack([base * scale * (0.6 + 0.8 * i / max(1, layers - 1)) for i in range(layers)]), 1e-3, 1)


def _as_trace(lists: np.ndarray, config, context: int, label="synthetic") -> SelectionTrace:
    """Block lists ``[steps, layers, rows, W]`` (−1 padded) as a :class:`SelectionTrace`."""
    steps, layers, rows, _ = lists.shape
    nb = config.num_blocks(context + steps)
    mask = np.zeros((steps, layers, rows, nb + 1), dtype=bool)
    np.put_along_axis(mask, np.where(lists >= 0, lists, nb).astype(np.int64), True, axis=3)
    return SelectionTrace(label, context, tuple(range(layers)), config, mask[..., :nb])


def test_slot_cache_simulation_is_the_copy_planners_rule():
    """Per step, the hits of the simulation equal the reference planner's on the same selections — with selections
    of varying size, so that slots keep old blocks that later steps hit again."""
    cfg = SparseAttentionConfig(block_size=16, init_blocks=1, window=32, topk=8, kernel_size=16, kernel_stride=8,
                                dense_len=0)  # fmt: skip
    slots, steps, rows, pos = 5, 30, 3, 400
    rng = np.random.default_rng(0)
    qb = pos // 16
    lists = np.full((steps, rows, cfg.budget_blocks), -1)
    for t in range(steps):
        for r in range(rows):
            n = rng.integers(1, slots + 1)
            dyn = np.sort(rng.choice(np.arange(1, 9), size=n, replace=False))  # few candidates: many hits
            forced = [0, *range(qb - 2, qb + 1)]
            sel = np.sort(np.concatenate([forced, dyn]))
            lists[t, r, : len(sel)] = sel
    slot_map = SlotMap(block_size=16, init_blocks=1, local_blocks=2, dynamic_slots=slots, num_kv_heads=rows,
                       host_seq_stride=rows * 64, host_head_stride=64)  # fmt: skip
    resident = torch.full((rows, slots), -1, dtype=torch.int32)
    want = []
    for t in range(steps):
        selection = torch.tensor(lists[t][None], dtype=torch.int32)
        _, _, _, stats = plan_slot_copies_ref(selection, torch.tensor([pos + 1]), torch.tensor([0]), resident, slot_map)
        want.append(int(stats[1]))
    nb = qb + 1
    dyn = np.zeros((steps, rows, nb + 1), dtype=bool)
    np.put_along_axis(dyn, np.where(lists >= 0, lists, nb), True, axis=2)
    dyn = dyn[..., :nb] & ~forced_mask(np.full(steps, pos), nb, cfg)[:, None]
    hits, counts = slot_cache_hits(dyn, slots)
    assert hits.tolist() == want and counts.sum() > hits.sum() > 0


def test_statistics_of_a_hand_made_trace():
    """Row 0 keeps its dynamic blocks for 3 steps then swaps all; forced blocks are always read."""
    cfg = SMOL
    context, steps = 4096, 6
    nb = cfg.num_blocks(context + steps)
    sel = np.zeros((steps, 1, 1, nb), dtype=bool)
    forced = forced_mask(context + np.arange(steps), nb, cfg)
    sel[:] = forced[:, None, None]
    first, second = np.arange(1, 15), np.arange(20, 34)
    for t in range(steps):
        sel[t, 0, 0, first if t < 3 else second] = True
    stats = trace_locality(SelectionTrace("hand", context, (0,), cfg, sel))
    assert stats["dynamic_per_row"] == 14 and stats["forced_share"] == pytest.approx(10 / 24)
    assert stats["hit_rate_dynamic"] == pytest.approx(4 / 5)  # steps 1, 2, 4, 5 hit everything, step 3 nothing
    assert stats["hit_rate_all"] == pytest.approx((10 + 14 * 4 / 5) / 24)
    assert stats["hit_rate_all_forced_part"] == pytest.approx(10 / 24)
    assert stats["run_length_mean"] is None  # the only run that ended began before the trace
    assert stats["overlap_by_lag"][0] == pytest.approx(4 / 5) and stats["overlap_by_lag"][2] == pytest.approx(0)


def test_fit_recovers_a_known_hazard_and_run_lengths_match():
    hazard = _hazard(4)
    process = LocalityProcess(hazard)
    context = 16384  # 14 of 245 candidates: chance re-selection is ~1 % and left in the fit
    lists = process.selections(SMOL, 4, 30, context, 120, np.random.default_rng(1))
    trace = _as_trace(lists, SMOL, context)
    fitted = fit_hazard([trace])
    young = slice(0, 8)
    assert np.abs(fitted[:, young] - hazard[:, young]).max() < 0.04
    again = _as_trace(LocalityProcess(fitted).selections(SMOL, 4, 30, context, 120, np.random.default_rng(2)),
                      SMOL, context)  # fmt: skip
    a, b = trace_locality(trace), trace_locality(again)
    assert b["hit_rate_dynamic"] == pytest.approx(a["hit_rate_dynamic"], abs=0.015)
    assert b["run_length_mean"] == pytest.approx(a["run_length_mean"], rel=0.08)
    assert a["hit_rate_dynamic"] == pytest.approx(process.expected_hit_rate(4, SMOL, context), abs=0.015)


@pytest.mark.parametrize("config, start", [(SMOL, 4096), (MINICPM4, 131072 - 40)], ids=["smollm2-4k", "minicpm4-128k"])
def test_process_selections_are_valid(config, start):
    """Ascending, −1 padded, no repeats, every forced block, the rest causal candidates, a full dynamic budget."""
    steps, layers, rows = 40, 3, 5
    lists = LocalityProcess(_hazard(2)).selections(config, layers, rows, start, steps, np.random.default_rng(3))
    assert lists.shape == (steps, layers, rows, config.decode_width()) and lists.dtype == np.int32
    k = config.budget_blocks - (config.init_blocks + config.local_blocks + 1)
    for t in range(steps):
        qb = (start + t) // config.block_size
        forced = set(range(config.init_blocks)) | set(range(qb - config.local_blocks, qb + 1))
        for row in lists[t].reshape(-1, lists.shape[-1]):
            valid = row[row >= 0]
            assert (row[len(valid) :] == -1).all() and (np.diff(valid) > 0).all()
            assert forced <= set(valid.tolist()) and valid.max() <= qb
            dyn = set(valid.tolist()) - forced
            assert len(dyn) == k and min(dyn) >= config.init_blocks and max(dyn) < qb - config.local_blocks


def test_process_refuses_positions_it_cannot_fill():
    with pytest.raises(ValueError, match="candidate blocks"):
        LocalityProcess(_hazard(1)).selections(SMOL, 1, 1, 700, 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="dense_len"):
        LocalityProcess(_hazard(1)).selections(MINICPM4, 1, 1, 4096, 4, np.random.default_rng(0))
    with pytest.raises(ValueError, match="entries in"):
        LocalityProcess(np.zeros((2, 4)))


@pytest.mark.slow
@pytest.mark.skipif(not TRACES.is_file(), reason="no recorded traces (longsparse eval traces)")
def test_process_fitted_to_the_recorded_traces_matches_them():
    """On the committed SmolLM2 traces: the process fitted to the longest context, replayed at that geometry, has the
    traces' dynamic hit rate and mean run length."""
    traces = load_traces(TRACES)
    longest = max(t.context for t in traces)
    for label in dict.fromkeys(t.label for t in traces):
        (trace,) = [t for t in traces if t.label == label and t.context == longest]
        process = fit_process([trace], iterations=8)
        layers, heads = trace.selected.shape[1:3]
        lists = process.selections(trace.config, layers, heads, trace.context, trace.steps, np.random.default_rng(4))
        a, b = trace_locality(trace), trace_locality(_as_trace(lists, trace.config, trace.context))
        assert b["hit_rate_dynamic"] == pytest.approx(a["hit_rate_dynamic"], abs=0.02)
        assert b["run_length_mean"] == pytest.approx(a["run_length_mean"], rel=0.15)
        # at 128K chance keeps fewer blocks than among SmolLM2's 116 candidates: no more hits than in the trace
        assert replayed_hit_rate(process, MINICPM4, 32, 2, 131072 - 24, 24) < a["hit_rate_dynamic"] + 0.01


def test_dynamic_blocks_leave_out_the_forced_ones():
    lists = LocalityProcess(_hazard(1)).selections(SMOL, 1, 2, 4096, 3, np.random.default_rng(0))
    dyn = dynamic_blocks(_as_trace(lists, SMOL, 4096))
    assert (dyn.sum(-1) == SMOL.budget_blocks - 10).all()
    assert max_dynamic_blocks(SMOL, 4099) == SMOL.budget_blocks - 10
