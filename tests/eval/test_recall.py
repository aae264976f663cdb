"""Selection recall: block masses, selections, tallies, and the oracle bound on tiny models."""

import numpy as np
import pytest
import torch

from longsparse.eval.recall import (
    RecallTally,
    block_mass,
    forecast_selector,
    infllmv2_selector,
    oracle_selector,
    query_positions,
    recall_rows,
    selected_mask,
    selection_recall,
    summarize,
)
from longsparse.models.forecast import ForecastProjections, init_from_queries
from longsparse.ops.sparse_attn import SparseAttentionConfig
from longsparse.ops.sparse_attn.naive import select_blocks_ref
from tests.train.tiny import SMALL, tiny_llama


def test_block_mass_is_the_groups_mean_attention_per_block():
    gen = torch.Generator().manual_seed(0)
    T, P = 71, 6
    q = torch.randn(P, 6, 16, generator=gen, dtype=torch.float64)
    k = torch.randn(T, 2, 16, generator=gen, dtype=torch.float64)
    pos = torch.tensor([0, 3, 15, 16, 50, 70])
    mass = block_mass(q, k, pos, 16)
    assert mass.shape == (2, P, 5)
    assert torch.allclose(mass.sum(-1), torch.ones(2, P, dtype=torch.float64))
    for h in range(2):
        for p, i in enumerate(pos.tolist()):
            probs = torch.stack([torch.softmax(k[: i + 1, h] @ q[p, h * 3 + g] / 4.0, 0) for g in range(3)]).mean(0)
            direct = torch.zeros(5, dtype=torch.float64).index_add_(0, torch.arange(i + 1) // 16, probs)
            assert torch.allclose(mass[h, p], direct, rtol=1e-12, atol=1e-15)


def test_selected_mask_marks_exactly_the_listed_blocks():
    gen = torch.Generator().manual_seed(1)
    pos = torch.tensor([40, 100, 150, 202])
    scores = torch.randn(2, 4, 13, generator=gen)
    mask = selected_mask(scores, pos, SMALL)
    lists = select_blocks_ref(scores[None], pos[None], SMALL)[0]  # [P, Hkv, S]
    for p in range(4):
        for h in range(2):
            listed = {b for b in lists[p, h].tolist() if b >= 0}
            assert set(torch.nonzero(mask[h, p])[:, 0].tolist()) == listed


def test_tally_by_hand():
    mass = torch.tensor([[[0.5, 0.2, 0.3]]])
    forced = torch.tensor([[[True, False, False]]])
    selected = torch.tensor([[[True, False, True]]])
    tally = RecallTally()
    tally.add(mass, selected, forced)
    assert tally.recall == pytest.approx(0.3 / 0.5) and tally.recall_with_forced == pytest.approx(0.8)
    assert np.isnan(RecallTally().recall)


def _selectors(model):
    untrained = ForecastProjections.for_model(model.config, "tiny")
    init_from_queries(untrained, model)
    random = ForecastProjections.random(model.config, seed=0)
    attention = model.config.attention_layers
    return {
        "infllmv2": infllmv2_selector(SMALL),
        "untrained": forecast_selector(untrained, SMALL, attention),
        "random": forecast_selector(random, SMALL, attention),
        "oracle": oracle_selector,
    }


def _sequences(n, T, seed):
    gen = torch.Generator().manual_seed(seed)
    ids = [torch.randint(0, 101, (T,), generator=gen) for _ in range(n)]
    pos = [query_positions(T, 24, 0.5, np.random.default_rng([seed, i])) for i in range(n)]
    return ids, pos


def test_oracle_bounds_every_selector_per_layer():
    model = tiny_llama(seed=4)
    ids, pos = _sequences(2, 203, 0)
    tallies = selection_recall(model, ids, pos, _selectors(model), SMALL)
    assert sorted({layer for layer, _ in tallies}) == [0, 1, 2]
    for layer in (0, 1, 2):
        oracle = tallies[(layer, "oracle")]
        assert 0 < oracle.free < oracle.total
        for name in ("infllmv2", "untrained", "random"):
            t = tallies[(layer, name)]
            assert 0 <= t.recall <= oracle.recall + 1e-9
            assert t.recall_with_forced <= oracle.recall_with_forced + 1e-9
            assert t.free == pytest.approx(oracle.free) and t.total == pytest.approx(oracle.total)
    rows = recall_rows(tallies, 203)
    summary = summarize(rows, ["infllmv2", "untrained", "random", "oracle"])
    assert {"recall_infllmv2", "recall_untrained_with_forced", "recall_oracle_203", "free_mass"} <= set(summary)


def test_a_budget_covering_every_block_recalls_everything():
    model = tiny_llama(seed=5)
    ids, pos = _sequences(1, 150, 1)
    wide = SparseAttentionConfig(block_size=16, init_blocks=1, window=32, topk=16, kernel_size=8, kernel_stride=4)
    selectors = {"infllmv2": infllmv2_selector(wide)}
    for t in selection_recall(model, ids, pos, selectors, wide).values():
        assert t.recall == pytest.approx(1.0) and t.recall_with_forced == pytest.approx(1.0)


def test_query_positions_come_from_the_tail():
    pos = query_positions(4096, 100, 0.25, np.random.default_rng(0))
    assert pos.numel() == 100 and len(set(pos.tolist())) == 100
    assert int(pos.min()) >= 3072 and int(pos.max()) < 4096 and torch.equal(pos, pos.sort().values)
    with pytest.raises(ValueError, match="tail must be in"):
        query_positions(100, 5, 0.0, np.random.default_rng(0))
