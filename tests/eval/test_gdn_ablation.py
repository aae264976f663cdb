"""SparseGDN's ablation on the all-GDN testbed: the summary's arithmetic on known rows, and a run through the library
on a tiny random all-GDN checkpoint."""

import json

import numpy as np
import pytest

from longsparse.eval.gdn_ablation import (
    Variant,
    aggregate_score,
    batches,
    default_variants,
    offset_accuracy,
    plot,
    run,
    summarize,
)
from longsparse.ops.gdn import SparseGDNConfig, SparseGDNKernelConfig
from longsparse.tasks.state_recall import Haystack, RecallVocab
from tests.tiny_models import import_qwen35, randomize

TORCH = SparseGDNKernelConfig(backend="torch")
THREE = [
    Variant("dense", None, "dense"),
    Variant("sparse", SparseGDNConfig(), "default", TORCH),
    Variant("random", SparseGDNConfig(selection="uniform_random"), "control", TORCH),
]


def row(i, task, length, dense, sparse, random, offsets=(10, 50)):
    scores = {"dense": dense, "sparse": sparse, "random": random}
    hits = {k: "".join("1" if j < round(v * len(offsets)) else "0" for j in range(len(offsets)))
            for k, v in scores.items()}  # fmt: skip
    return {"id": f"{task}-{length}-{i}", "task": task, "target_length": length, "needle_offsets": list(offsets),
            "score": scores, "hits": hits, "keep_ratio": {"dense": None, "sparse": 0.29, "random": 0.3},
            "logit_error": {"sparse": 0.01, "random": 0.2},
            "layer_error": {"sparse": [0.1, 0.2], "random": [1, 2]}}  # fmt: skip


def test_summary_of_a_testbed_where_random_selection_loses():
    rows = [row(i, t, n, 1.0, 1.0, 0.0 if i % 2 else 0.5) for t in ("niah", "mqar") for n in (1024, 2048)
            for i in range(20)]  # fmt: skip
    summary, table = summarize(rows, [], THREE, resamples=500)
    assert summary["dense_score"] == summary["sparse_score"] == 100.0
    assert summary["random_score"] == pytest.approx(25.0) and summary["samples"] == 80
    assert summary["sparse_minus_dense"] == {"difference": 0.0, "low": 0.0, "high": 0.0, "samples": 80}
    assert summary["random_minus_dense"]["difference"] == pytest.approx(-75.0)
    assert summary["random_minus_dense"]["high"] < -60 and summary["keep_ratio"] == pytest.approx(0.29)
    assert all(summary["targets"].values())
    assert table["random"]["layer_error"] == [1, 2] and table["random"]["per_length"]["2048"]["score"] == 25.0
    assert table["random"]["needles_found"] == {"tail": 0.0, "body": 50.0}


def test_summary_targets_fail_where_sparse_loses():
    rows = [row(i, "niah", 1024, 1.0, 0.0 if i < 5 else 1.0, 0.0) for i in range(40)]
    summary, _ = summarize(rows, [], THREE, resamples=500)
    assert summary["sparse_minus_dense"]["difference"] == pytest.approx(-12.5)
    targets = summary["targets"]
    assert not targets["sparse_keeps_accuracy (difference >= -0.5, interval reaching 0)"]
    assert targets["testbed_can_fail (random_minus_dense.high < 0)"]


def test_aggregate_is_the_mean_of_stratum_means_and_offsets_split_at_the_tail():
    rows = [row(0, "niah", 1024, 1.0, 1.0, 1.0)] + [row(i, "mqar", 1024, 0.0, 0.0, 0.0) for i in range(3)]
    assert aggregate_score(rows, "dense") == 50.0
    assert offset_accuracy([row(0, "mqar", 1024, 0.5, 0.5, 0.5, offsets=(63, 47))], "dense") == {
        "tail": 100.0, "body": 0.0}  # fmt: skip


def test_batches_respect_the_token_budget():
    assert list(batches("abcde", [3, 3, 5, 1, 9], 6)) == [["a", "b"], ["c", "d"], ["e"]]


def test_default_variants_include_the_controls():
    names = [v.name for v in default_variants()]
    assert names[0] == "dense" and {"sparse", "random", "random_tiers", "full_solve", "budget_10"} <= set(names)
    assert all(v.kernel_config.backend == "torch" for v in default_variants()[1:])


@pytest.mark.slow
def test_a_run_through_the_library_on_a_random_all_gdn_model(tmp_path):
    """Dense, the default and the control load one checkpoint; on the same samples the control moves the logits
    further from dense than the default does; the rows, summary and plot come out."""
    import transformers

    vocab = RecallVocab(keys=8, values=8)
    import_qwen35()
    config = transformers.Qwen3_5TextConfig(
        vocab_size=vocab.size, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        layer_types=["linear_attention"] * 2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=16, linear_value_head_dim=16,
        tie_word_embeddings=True, eos_token_id=vocab.end, pad_token_id=vocab.end, bos_token_id=None,
    )  # fmt: skip
    model = randomize(transformers.Qwen3_5ForCausalLM(config), seed=3)
    model.save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "recipe.json").write_text(json.dumps({"recipe": {"model": {"keys": 8, "values": 8}}}))
    text = " ".join(f"word {i} and more." for i in range(3000))
    rows, text_rows = run(tmp_path / "m", Haystack.from_texts([text]), lengths=[330], samples=2, per_round=1,
                          text_per_length=2, variants=THREE, device="cpu", pairs=4)  # fmt: skip
    assert [r["id"] for r in rows] == ["niah-330-0", "mqar-330-0", "niah-330-1", "mqar-330-1"]
    assert len(text_rows) == 2 and all(len(r["layer_error"]["sparse"]) == 2 for r in rows)
    assert all(0 < r["keep_ratio"]["sparse"] < 1 for r in rows)
    errors = {k: np.mean([r["logit_error"][k] for r in rows]) for k in ("sparse", "random")}
    assert 0 < errors["sparse"] < errors["random"]
    summary, table = summarize(rows, text_rows, THREE, resamples=100)
    assert summary["samples"] == 4 and table["random"]["text_relative_error"] > 0
    assert plot(tmp_path / "p.png", table, "test").stat().st_size > 10_000
