"""Recall of selection rules at question and answer rows (`eval.rule_recall`) on a tiny model with real forwards."""

import dataclasses

import pytest
import torch

from longsparse.eval.recall import RecallTally
from longsparse.eval.rule_recall import (
    Prompt,
    Rule,
    recall_table,
    rule_recall,
    summarize_rules,
    weakest_layers,
    with_dense_layers,
)
from longsparse.models import load_model
from longsparse.models.forecast import ForecastProjections
from longsparse.ops.sparse_attn import SparseAttentionConfig
from tests.helpers import one_thread
from tests.tiny_models import build, random_ids, save

SMALL = SparseAttentionConfig(block_size=16, init_blocks=1, window=16, topk=3, kernel_size=8, kernel_stride=4,
                              dense_len=0)  # fmt: skip


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    hf = build("llama-gqa-bias", seed=5, num_hidden_layers=3, num_attention_heads=6, hidden_size=96)
    with one_thread():
        yield load_model(save(hf, tmp_path_factory.mktemp("llama")), dtype=torch.float32)


def test_rules_are_bounded_by_the_oracle_and_a_full_budget_recalls_everything(model):
    prompts = [Prompt(torch.tensor(random_ids(n, seed=n)), n - 6, 4096 if n < 150 else 8192) for n in (131, 170)]
    rules = [
        Rule("current", "infllmv2", SMALL),
        Rule("groupmax", "infllmv2", dataclasses.replace(SMALL, group_reduce="max")),
        Rule("quest", "infllmv2", dataclasses.replace(SMALL, kernel_size=16, kernel_stride=16, key_summary="bounds")),
        Rule("mass", "infllmv2", dataclasses.replace(SMALL, kernel_size=1, kernel_stride=1, pool_reduce="sum")),
        Rule("forecast", "forecast", SMALL),
        Rule("full", "infllmv2", dataclasses.replace(SMALL, topk=16)),
        Rule("oracle", "oracle", SMALL),
    ]
    adapter = ForecastProjections.random(model.config, seed=1)
    tallies = rule_recall(model.model, prompts, rules, projections=adapter, question_rows=20)
    layers = model.config.attention_layers
    for length in (4096, 8192):
        for kind in ("question", "answer"):
            for layer in layers:
                for h in range(2):
                    oracle = tallies["oracle", length, kind, layer, h]
                    assert oracle.top_rows == (20 if kind == "question" else 5)
                    assert oracle.top_block_hit == 1.0 and 0 < oracle.recall <= 1
                    for rule in ("current", "groupmax", "quest", "forecast"):
                        assert tallies[rule, length, kind, layer, h].chosen <= oracle.chosen * (1 + 1e-6)
                    assert tallies["mass", length, kind, layer, h].chosen == pytest.approx(oracle.chosen, rel=1e-5)
                    assert tallies["full", length, kind, layer, h].recall == pytest.approx(1.0)
    rows = recall_table(tallies)
    assert len(rows) == len(rules) * 2 * 2 * len(layers) * 2
    summary = summarize_rules(rows)
    assert summary["oracle"]["answer"]["all"]["of_oracle"] == pytest.approx(1.0)
    assert summary["current"]["question"]["4096"]["recall"] < summary["full"]["question"]["4096"]["recall"]
    weak = weakest_layers(rows, "current", 1)
    dense = with_dense_layers(rows, "current", weak, "current.dense1")
    assert {r["recall"] for r in dense if r["layer"] in weak} == {1.0}
    assert [r["recall"] for r in dense if r["layer"] not in weak] == [
        r["recall"] for r in rows if r["rule"] == "current" and r["layer"] not in weak
    ]
    with pytest.raises(ValueError, match="unique"):
        rule_recall(model.model, prompts, [rules[0], rules[0]])
    with pytest.raises(ValueError, match="needs its projections"):
        rule_recall(model.model, prompts, [rules[4]])
    with pytest.raises(ValueError, match="selector must be"):
        Rule("x", "quest", SMALL)


def test_tallies_merge_as_one_tally_over_all_rows():
    mass = torch.tensor([[0.5, 0.2, 0.3], [0.1, 0.6, 0.3]], dtype=torch.float64)
    forced = torch.tensor([[True, False, False], [True, False, False]])
    chosen = torch.tensor([[True, True, False], [True, True, False]])
    whole, a, b = RecallTally(), RecallTally(), RecallTally()
    whole.add(mass, chosen, forced)
    a.add(mass[:1], chosen[:1], forced[:1])
    b.add(mass[1:], chosen[1:], forced[1:])
    a.merge(b)
    assert (a.top_hits, a.top_rows) == (whole.top_hits, whole.top_rows) == (1, 2)  # row 0 misses its top block
    assert a.recall == pytest.approx(whole.recall) and whole.recall == pytest.approx((0.2 + 0.6) / (0.5 + 0.9))
