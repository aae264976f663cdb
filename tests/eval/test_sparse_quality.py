"""Attention variants of one loaded model, their runs and paired keep summaries, needle layouts, and the selection
trace read through ``attention_observer`` (tiny random Llama with a word-level tokenizer, float32 on the CPU)."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from longsparse import LLM
from longsparse.eval.attention_variants import AttentionVariant, apply_variant
from longsparse.eval.needles import NeedleSpan, needle_layout, needle_spans
from longsparse.eval.recall import block_mass, forecast_selector, infllmv2_selector, oracle_selector
from longsparse.eval.report import RulerRun
from longsparse.eval.selection_trace import SelectionTrace, traced_generate
from longsparse.eval.sparse_quality import keep_summary, mean_keep, run_variant
from longsparse.models.attention import DenseAttention
from longsparse.models.capture import capture_attention
from longsparse.models.forecast import ForecastProjections
from longsparse.models.sparse_attention import OracleAttention, SpardaAttention
from longsparse.ops.sparse_attn import SparseAttentionConfig
from longsparse.tasks.ruler import Sample
from tests.helpers import one_thread
from tests.tiny_models import EOS, build, random_ids, save, write_tokenizer

SMALL = SparseAttentionConfig(block_size=16, init_blocks=1, window=32, topk=2, kernel_size=8, kernel_stride=4,
                              dense_len=0)  # fmt: skip
FULL = dataclasses.replace(SMALL, topk=16)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    hf = build("llama-gqa-bias", seed=3, num_hidden_layers=3, num_attention_heads=6, hidden_size=96,
               eos_token_id=EOS, bos_token_id=None)  # fmt: skip
    path = save(hf, tmp_path_factory.mktemp("llama"))
    write_tokenizer(path)
    return LLM(path)


@pytest.fixture(scope="module")
def adapter(llm):
    return ForecastProjections.random(llm.config, seed=2)


def words(ids):
    return " ".join(f"w{i % 100}" for i in ids)


def samples(n=4, length=150):
    out = []
    for i in range(n):
        ids = random_ids(length - 4 * i, seed=20 + i)
        out.append(Sample("niah_single_2", i, 0, 256, words(ids), (f"w{ids[40] % 100}",), len(ids), 6))
    return out


def test_apply_variant_sets_modes_backends_and_phases(llm, adapter):
    layers = llm.loaded.model.model.layers
    apply_variant(llm, AttentionVariant("o", "oracle", SMALL, sparse_phases=("decode",), dense_layers=(0,)))
    assert isinstance(layers[0].mixer.backend, DenseAttention)
    assert all(isinstance(layers[i].mixer.backend, OracleAttention) for i in (1, 2))
    assert layers[1].mixer.backend.sparse_phases == {"decode"} and llm.decode_mode == "sparse_gpu"
    apply_variant(llm, AttentionVariant("f", "sparda", SMALL, use_kernel=False), adapter)
    assert all(isinstance(layer.mixer.backend, SpardaAttention) for layer in layers)
    assert layers[2].mixer.backend.use_kernel is False and llm.decode_mode == "sparda_gpu"
    assert llm.loaded.model.attention_label == "f"
    apply_variant(llm, AttentionVariant("d"))
    assert all(isinstance(layer.mixer.backend, DenseAttention) for layer in layers) and llm.decode_mode == "dense_gpu"
    with pytest.raises(ValueError, match="needs a Forecast adapter"):
        apply_variant(llm, AttentionVariant("f", "sparda", SMALL))
    with pytest.raises(ValueError, match="not attention layers"):
        apply_variant(llm, AttentionVariant("s", "sparse", SMALL, dense_layers=(7,)))
    for bad, match in ((dict(mode="sparse"), "needs a SparseAttentionConfig"), (dict(mode="magic"), "mode must"),
                       (dict(sparse_phases=("verify",)), "sparse_phases")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            AttentionVariant("x", **bad)


def test_a_budget_covering_every_block_answers_as_dense(llm, adapter):
    """Full budget: sparse, SparDA and the oracle generate dense's tokens and read every block; a small budget reads
    fewer and changes some answers' text."""
    data = samples()
    dense = run_variant(llm, AttentionVariant("dense"), data, batch_size=3)
    assert mean_keep(dense) is None
    for mode in ("sparse", "sparda", "oracle"):
        full = run_variant(llm, AttentionVariant(mode, mode, FULL), data, forecast=adapter, batch_size=3)
        assert [r["prediction"] for r in full.samples] == [r["prediction"] for r in dense.samples], mode
        assert mean_keep(full) == pytest.approx(1.0) and mean_keep(full, key="attention_prefill_keep") == 1.0
    small = run_variant(llm, AttentionVariant("small", "sparse", SMALL), data, batch_size=2)
    assert [r["id"] for r in small.samples] == [s.id for s in data]
    assert 0.2 < mean_keep(small) < 0.5  # 4 of ~10 blocks in decode
    assert small.config["config"]["topk"] == 2


def _run(name, scores, lengths=(4096, 8192), keep=None):
    records = [
        dict(id=f"t/{n}/{i}", task="t", target_length=n, prompt_sha1=f"{n}-{i}", score=s, attention_keep=keep)
        for n in lengths
        for i, s in enumerate(scores)
    ]
    return RulerRun(name, {}, records)


def test_keep_summary_pairs_each_run_with_the_baseline():
    runs = {
        "dense": _run("dense", [1.0] * 10),
        "sparse": _run("sparse", [1.0] * 8 + [0.0] * 2, keep=0.25),
        "cut": _run("cut", [1.0] * 10, lengths=(4096,), keep=0.5),  # stopped by a time limit after 4K
    }
    summary = keep_summary(runs, "dense", resamples=2000)
    assert summary["dense"]["score"] == 100.0 and "minus_baseline" not in summary["dense"]
    s = summary["sparse"]
    assert s["minus_baseline"]["difference"] == pytest.approx(-20.0) and s["keep_ratio"] == 0.25
    assert s["minus_baseline"]["low"] < -20.0 < s["minus_baseline"]["high"] <= 0.0
    assert s["per_length"]["8192"]["minus_baseline"]["samples"] == 10
    assert summary["cut"]["minus_baseline"] == {"difference": 0.0, "low": 0.0, "high": 0.0, "samples": 10}
    with pytest.raises(ValueError, match="baseline"):
        keep_summary(runs, "oracle")


def test_needle_spans_and_their_layout(llm):
    prompt = words(range(70)) + " w7"
    spans = needle_spans(llm.tokenizer, prompt, ("w7", "w33"))
    assert spans == [NeedleSpan("w7", 7, 8), NeedleSpan("w33", 33, 34), NeedleSpan("w7", 70, 71)]
    assert llm.tokenizer.encode(prompt)[33] == 33
    cfg = dataclasses.replace(SMALL, window=16)  # one local block before the query's own
    far = needle_layout(NeedleSpan("x", 30, 35), 71, cfg)
    assert (far.blocks, far.offset_in_block, far.straddles, far.tokens_before_end) == ((1, 2), 14, True, 41)
    assert not far.in_local_window and needle_layout(NeedleSpan("x", 50, 52), 71, cfg).in_local_window


def test_trace_of_a_dense_run_measures_the_dense_attention(llm, adapter):
    """The trace reads keys incrementally through decode steps: its needle masses equal those of one dense forward
    over prompt + generated tokens at the same positions; the oracle keeps at least InfLLM-V2's mass in every
    (layer, head); a needle in every query's local window is always covered."""
    apply_variant(llm, AttentionVariant("dense"))
    ids = random_ids(120, seed=5)
    selectors = {"infllmv2": infllmv2_selector(SMALL), "oracle": oracle_selector,
                 "forecast": forecast_selector(adapter.float(), SMALL, llm.config.attention_layers)}  # fmt: skip
    far = SelectionTrace(llm.loaded.model, selectors, SMALL, needle_tokens=range(40, 44), prefill_positions=3)
    out, fractions = traced_generate(llm, ids, 6, far)
    assert out == llm.generate([ids], max_new_tokens=6)[0].token_ids and fractions["decode"] is None
    summary = json.loads(json.dumps(far.summary()))  # what a run writes
    positions = [p["position"] for p in summary["positions"]]
    assert positions == list(range(117, 119 + len(out)))  # the last token generated is never fed back
    full = torch.tensor(ids + out[:-1])
    captures = capture_attention(llm.loaded.model, full, torch.tensor(positions))
    for a, layer in enumerate(llm.config.attention_layers):
        mass = block_mass(captures[layer].q, captures[layer].k, torch.tensor(positions), 16)  # [Hkv, P, NB]
        want = mass[..., 2].T.numpy()  # block 2 holds tokens 40-43
        got = np.stack([rec.needle_mass[a] for rec in far.records])  # the summary rounds them
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    for phase in ("prefill", "decode"):
        recall = {n: np.array(r["per_head"], dtype=float) for n, r in summary["recall"][phase].items()}
        assert (recall["oracle"] >= recall["infllmv2"] - 1e-6).all() and (recall["oracle"] <= 1 + 1e-6).all()
    near = SelectionTrace(llm.loaded.model, selectors, SMALL, needle_tokens=[118], prefill_positions=2)
    traced_generate(llm, ids, 3, near)
    assert all(not missed for p in near.summary()["positions"] for missed in p["missed"].values())
