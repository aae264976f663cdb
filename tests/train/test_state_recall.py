"""Training the all-GDN recall testbed: its batches, a few steps of a tiny model, and an export that the library loads
and runs like transformers does."""

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from longsparse import LLM
from longsparse.tasks.state_recall import Haystack, RecallVocab, compose
from longsparse.train.state_recall import (
    IGNORE,
    PRESETS,
    Curriculum,
    RecallDataConfig,
    RecallModelConfig,
    RecallTrainConfig,
    init_gates,
    load_export,
    train,
    training_batch,
)
from tests.tiny_models import import_qwen35


@pytest.fixture(scope="module")
def haystack():
    text = " ".join(f"And the {i}th word was spoken unto them." for i in range(4000))
    return Haystack.from_texts([text], held_out_fraction=0.2)


@pytest.fixture(scope="module")
def export(tmp_path_factory, haystack):
    """Two steps of the smoke preset (a 2-layer model, 4 q/k and 8 v heads), exported."""
    recipe = PRESETS["smoke"]
    recipe = replace(recipe, train=replace(recipe.train, steps=2, eval_lens=(128,), eval_per_task=1))
    out = tmp_path_factory.mktemp("recall")
    return train(out, recipe, haystack, device="cpu", progress_bar=False)


def test_batch_losses_fall_on_bytes_and_asked_values(haystack):
    vocab = RecallVocab()
    config = RecallDataConfig(seq_lens=(200,), stage_deadlines=(1.0,), tokens_per_step=2000, text_fraction=0.3)
    batch = training_batch(haystack, vocab, config, step=5, seq_len=200)
    ids, targets, answer = batch["input_ids"], batch["targets"], batch["is_answer"]
    assert ids.shape == targets.shape == answer.shape == (10, 200)
    assert torch.equal(targets[:, :-1][targets[:, :-1] != IGNORE], ids[:, 1:][targets[:, :-1] != IGNORE])
    loss_on = targets != IGNORE
    assert (targets[loss_on & ~answer] < 256).all()  # LM loss on bytes only
    assert ((targets[answer] >= vocab.first_value) & (targets[answer] < vocab.query)).all()
    assert (ids[answer] >= vocab.first_key).all() and (ids[answer] < vocab.first_value).all()  # asked after its key
    text_rows = (~answer).all(1) & (ids < 256).all(1)
    assert 0 < int(text_rows.sum()) < 10
    again = training_batch(haystack, vocab, config, step=5, seq_len=200)
    assert torch.equal(again["input_ids"], ids)
    assert not torch.equal(training_batch(haystack, vocab, config, step=6, seq_len=200)["input_ids"], ids)


def test_config_checks():
    with pytest.raises(ValueError, match="exactly one of steps and time_budget_s"):
        RecallTrainConfig()
    with pytest.raises(ValueError, match="increasing"):
        RecallDataConfig(seq_lens=(512, 256))
    with pytest.raises(ValueError, match="dt_range"):
        RecallModelConfig(dt_range=(0.1, 0.001))


def test_rows_grow_once_the_model_answers_at_the_current_length_or_at_the_deadline():
    config = RecallDataConfig(seq_lens=(256, 512, 1024), stage_deadlines=(0.5, 0.8, 1.0), advance_window=3)
    curriculum = Curriculum(config)
    grew = [curriculum.record(a, 0.1) for a in (0.95, 0.95, 0.5, None, 0.95, 0.95)]
    assert grew == [None] * 6 and curriculum.seq_len == 256  # 0.5 is still in the window
    assert curriculum.record(0.95, 0.1) == "accuracy" and curriculum.seq_len == 512
    assert curriculum.record(1.0, 0.2) is None and curriculum.record(1.0, 0.2) is None  # a new window, new length
    assert curriculum.record(0.1, 0.8) == "deadline" and curriculum.seq_len == 1024
    assert all(curriculum.record(1.0, 1.0) is None for _ in range(5)) and curriculum.seq_len == 1024
    with pytest.raises(ValueError, match="stage_deadlines"):
        RecallDataConfig(seq_lens=(256, 512), stage_deadlines=(0.5, 0.9))


def test_gate_initialisation_spans_short_and_long_memories():
    """Mamba-2's decay initialisation, not transformers' (dt_bias = 1, which forgets within a few tokens)."""
    config = RecallModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    model = import_qwen35().Qwen3_5ForCausalLM(config.to_transformers())
    init_gates(model, config, seed=0)
    layers = [m for m in model.modules() if hasattr(m, "dt_bias")]
    rates = torch.cat([m.A_log.exp() * torch.nn.functional.softplus(m.dt_bias) for m in layers]).detach()
    assert len(layers) == 2 and rates.numel() == 64
    assert rates.min() > 0.01 * 1e-3 and rates.max() < 16 * 0.1
    assert (rates < 1 / 100).sum() >= 4 and (rates > 1 / 4).sum() >= 4  # memories of hundreds of tokens and of a few
    assert not torch.equal(layers[0].dt_bias, layers[1].dt_bias)


@pytest.mark.parametrize("gates", ["transformers", "init_gates"])
def test_the_answer_gradient_reaches_the_needle_only_from_the_recipes_gates(haystack, gates):
    """What kept the first H200 run at chance: under transformers' initialisation the answer's loss has no gradient at
    a needle ~400 tokens back (the decay underflows), so nothing can learn to keep it; under :func:`init_gates` it
    does."""
    config = RecallModelConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2)
    torch.manual_seed(0)
    model = import_qwen35().Qwen3_5ForCausalLM(config.to_transformers())
    if gates == "init_gates":
        init_gates(model, config, seed=0)
    tokens, answers, needles = compose(np.random.default_rng(3), haystack.train, 512, 1, config.vocab)
    ids = torch.from_numpy(tokens)[None]
    embeds = model.get_input_embeddings()(ids).detach().requires_grad_()
    logits = model(inputs_embeds=embeds, use_cache=False).logits
    answer, needle = int(answers[0]), int(needles[0])
    torch.nn.functional.cross_entropy(logits[0, answer - 1], ids[0, answer]).backward()
    grad = embeds.grad[0].norm(dim=-1)
    assert answer - needle > 300 and grad[answer - 1] > 0
    reach = float(grad[needle] / grad[answer - 1])
    assert reach == 0.0 if gates == "transformers" else reach > 1e-5, reach


@pytest.mark.slow
def test_export_is_an_all_gdn_qwen35_that_the_library_runs_like_transformers(export):
    config = json.loads((export / "config.json").read_text())
    assert set(config["layer_types"]) == {"linear_attention"} and config["vocab_size"] == 16 + 16 + 258
    recipe = json.loads((export / "recipe.json").read_text())
    assert recipe["step"] == 2 and recipe["recipe"]["model"]["keys"] == 16
    log = [json.loads(line) for line in (export / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log if "loss" in r] == [1, 2] and any("held_out" in r for r in log)
    ids = np.random.default_rng(0).integers(0, 256, 150).tolist()
    ours = LLM(export, gdn="dense", device="cpu").runner.prefill([ids], all_logits=True).logits
    hf = import_qwen35().Qwen3_5ForCausalLM.from_pretrained(export, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids]), use_cache=False).logits[0]
    assert (ours - ref).norm() / ref.norm() < 1e-5
    sparse = LLM(export, gdn="sparse", device="cpu")
    sparse.generate([ids], max_new_tokens=2)
    assert 0 < sparse.last_stats.keep_ratio < 1


@pytest.mark.slow
def test_init_from_loads_the_export(export):
    model = import_qwen35().Qwen3_5ForCausalLM.from_pretrained(export, dtype=torch.float32)
    fresh = type(model)(model.config)
    load_export(fresh, export)
    ids = torch.tensor([[1, 2, 3, 280, 270]])
    with torch.no_grad():
        assert torch.equal(fresh(ids, use_cache=False).logits, model(ids, use_cache=False).logits)
    other = type(model)(replace_hidden(model.config))
    with pytest.raises(ValueError, match="another shape"):
        load_export(other, export)


def replace_hidden(config):
    config = type(config).from_dict(config.to_dict())
    config.hidden_size = 48
    return config
