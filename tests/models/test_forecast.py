"""The Forecast adapter: safetensors + JSON round trip, the projection it defines, validation against a model, and
the errors of a missing, malformed or mismatched adapter."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from longsparse import LLM
from longsparse.models import ExecutionModes, load_model
from longsparse.models.config import decoder_config_from_hf, hybrid_config_from_hf
from longsparse.models.forecast import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    ForecastError,
    ForecastProjections,
    forecast_states,
    resolve_forecast,
)
from longsparse.models.layers import RotaryEmbedding
from longsparse.ops.sparse_attn import SparseAttentionConfig
from tests.helpers import rel_err
from tests.tiny_models import TINY, TINY_GDN, build, random_ids, save

LLAMA3 = decoder_config_from_hf({**TINY, "num_hidden_layers": 3}, "LlamaForCausalLM")
HYBRID = hybrid_config_from_hf({**TINY, **TINY_GDN}, "Qwen3_5ForCausalLM")  # attention layers 1 and 3
SMALL = SparseAttentionConfig(block_size=16, window=32, topk=2, kernel_size=8, kernel_stride=4, dense_len=0)


def test_save_and_load_round_trip(tmp_path):
    adapter = ForecastProjections.random(LLAMA3, seed=2)
    adapter.metadata["teacher_window"] = [2, 1]
    folder = adapter.save(tmp_path / "adapter")
    meta = json.loads((folder / CONFIG_FILE).read_text())
    assert meta == {"random_weights": True, "teacher_window": [2, 1], "base_model": adapter.base_model,
                    "layers": [0, 1], "head_dim": 16, "num_kv_heads": 2}  # fmt: skip
    assert sorted(load_file(str(folder / WEIGHTS_FILE))) == [
        "forecast.0.weight", "forecast.1.weight", "forecast_current.0.weight"
    ]  # fmt: skip
    back = ForecastProjections.load(folder)
    assert back.layers == (0, 1) and back.current_layer == 0 and back.random_weights
    assert back.base_model == adapter.base_model and back.metadata == adapter.metadata
    assert (back.hidden_size, back.num_kv_heads, back.head_dim) == (64, 2, 16)
    for name, tensor in adapter.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor)
    assert not any(p.requires_grad for p in back.parameters())
    half = ForecastProjections.load(folder, dtype=torch.bfloat16)
    assert half.next_weight(1).dtype == torch.bfloat16


def test_full_adapters_follow_the_attention_layers():
    hybrid = ForecastProjections.for_model(HYBRID, "tiny qwen3.5")
    assert hybrid.layers == (1,) and hybrid.current_layer == 1 and not hybrid.random_weights
    assert hybrid.next_weight(1).shape == (2 * 16, 64) and hybrid.next_weight(1).requires_grad  # trainable
    hybrid.check_model(HYBRID)
    with pytest.raises(ForecastError, match="no forecast.3.weight \\(it holds layers \\(1,\\)\\)"):
        hybrid.next_weight(3)
    with pytest.raises(ForecastError, match="no forecast_current.3.weight"):
        hybrid.current_weight(3)


def test_forecast_states_is_the_rotated_projection():
    """``F = RoPE(W x)`` per KV head, rotated like the queries at each token's position (partial rotary here)."""
    weight = torch.randn(2 * 16, 64, dtype=torch.float64)
    x = torch.randn(5, 64, dtype=torch.float64)
    rope = RotaryEmbedding(HYBRID.rope)  # rotary_dim 4 of head_dim 16
    positions = torch.tensor([0, 1, 7, 30, 31])
    cos, sin = rope(positions)
    f = forecast_states(weight, x, cos, sin, 2)
    plain = (x @ weight.T).view(5, 2, 16)
    assert f.shape == (5, 2, 16) and f.dtype == torch.float64
    assert rel_err(f[..., 4:], plain[..., 4:]) < 1e-6 and rel_err(f[0], plain[0]) < 1e-6  # unrotated, position 0
    angle = positions[:, None].double() * rope.inv_freq[None, :]  # [5, 2]
    c, s = angle.cos()[:, None], angle.sin()[:, None]
    lo, hi = plain[..., :2], plain[..., 2:4]
    assert rel_err(f[..., :4], torch.cat([lo * c - hi * s, hi * c + lo * s], dim=-1)) < 1e-6


def _write(folder, tensors, meta):
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / WEIGHTS_FILE))
    (folder / CONFIG_FILE).write_text(json.dumps(meta))
    return folder


def _good():
    names = ("forecast.0.weight", "forecast.1.weight", "forecast_current.0.weight")
    tensors = {name: torch.zeros(32, 64) for name in names}
    return tensors, {"base_model": "tiny", "layers": [0, 1], "head_dim": 16, "num_kv_heads": 2}


BAD_FILES = {
    "layers-mismatch": (lambda t, m: m.update(layers=[0]), "lists layers \\[0\\] but .* holds forecast weights for"),
    "missing-key": (lambda t, m: m.pop("head_dim"), "lacks head_dim"),
    "layers-not-a-list": (lambda t, m: m.update(layers="0,1"), "'layers' must be a list"),
    "stray-tensor": (lambda t, m: t.update({"lm_head.weight": torch.zeros(2, 2)}), "unexpected tensor"),
    "two-currents": (lambda t, m: t.update({"forecast_current.1.weight": torch.zeros(32, 64)}), "more than one"),
    "wrong-rows": (lambda t, m: t.update({"forecast.1.weight": torch.zeros(30, 64)}), "has shape \\[30, 64\\]"),
    "int-weights": (lambda t, m: t.update({"forecast.1.weight": torch.zeros(32, 64, dtype=torch.int32)}), "float"),
    "text-head-dim": (lambda t, m: m.update(head_dim="16"), "head_dim must be a positive integer, got '16'"),
}


@pytest.mark.parametrize("case", BAD_FILES)
def test_malformed_adapter_files_are_refused(tmp_path, case):
    tensors, meta = _good()
    edit, message = BAD_FILES[case]
    edit(tensors, meta)
    with pytest.raises(ForecastError, match=message):
        ForecastProjections.load(_write(tmp_path / case, tensors, meta))


def test_missing_or_unreadable_files_are_refused(tmp_path):
    with pytest.raises(ForecastError, match="is not a folder"):
        ForecastProjections.load(tmp_path / "nothing")
    folder = _write(tmp_path / "a", *_good())
    (folder / CONFIG_FILE).write_text("{not json")
    with pytest.raises(ForecastError, match="is not valid JSON"):
        ForecastProjections.load(folder)
    (folder / CONFIG_FILE).unlink()
    with pytest.raises(ForecastError, match=f"has no {CONFIG_FILE}"):
        ForecastProjections.load(folder)
    folder = _write(tmp_path / "b", *_good())
    (folder / WEIGHTS_FILE).write_bytes(b"garbage")
    with pytest.raises(ForecastError, match="is not a readable safetensors file"):
        ForecastProjections.load(folder)
    (folder / WEIGHTS_FILE).unlink()
    with pytest.raises(ForecastError, match=f"has no {WEIGHTS_FILE}"):
        ForecastProjections.load(folder)


def _adapter(layers, current, heads=2, head_dim=16, hidden=64):
    return ForecastProjections(hidden_size=hidden, num_kv_heads=heads, head_dim=head_dim, layers=layers,
                               current_layer=current, base_model="tiny")  # fmt: skip


MISMATCHES = {
    "kv-heads": (_adapter([1], 1, heads=4, head_dim=8), "num_kv_heads is 4, the model's is 2"),
    "head-dim": (_adapter([1], 1, heads=1, head_dim=32), "num_kv_heads is 1"),
    "hidden": (_adapter([1], 1, hidden=32), "hidden size is 32, the model's is 64"),
    "gdn-layer": (_adapter([0], 1), "forecast.0.weight is on layer 0, which is not an attention layer"),
    "last-attention-layer": (_adapter([1, 3], 1), "forecast.3.weight is on layer 3"),
    "current-not-first": (_adapter([1], 3), "forecast_current.3.weight must be on the first attention layer, which is"),
}


@pytest.mark.parametrize("case", MISMATCHES)
def test_adapters_that_do_not_fit_the_model_are_refused(case):
    adapter, message = MISMATCHES[case]
    with pytest.raises(ForecastError, match=message):
        adapter.check_model(HYBRID)


def test_resolve_reads_folders_random_and_objects(tmp_path):
    folder = ForecastProjections.random(HYBRID, seed=4).save(tmp_path / "a")
    loaded = resolve_forecast(str(folder), HYBRID, torch.bfloat16, torch.device("cpu"))
    assert loaded.random_weights and loaded.next_weight(1).dtype == torch.bfloat16
    assert resolve_forecast("random", HYBRID, torch.float32, torch.device("cpu")).random_weights
    assert resolve_forecast(None, HYBRID, torch.float32, torch.device("cpu")) is None
    with pytest.raises(ForecastError, match="num_kv_heads is 2"):
        resolve_forecast(folder, decoder_config_from_hf({**TINY, "num_key_value_heads": 4}, "LlamaForCausalLM"),
                         torch.float32, torch.device("cpu"))  # fmt: skip
    with pytest.raises(ForecastError, match="must be a folder, 'random' or a ForecastProjections"):
        resolve_forecast(3, HYBRID, torch.float32, torch.device("cpu"))


@pytest.fixture(scope="module")
def qwen35_path(tmp_path_factory):
    return save(build("qwen35", seed=6), tmp_path_factory.mktemp("qwen35"))


def test_sparda_needs_each_weight_it_uses(qwen35_path):
    only_current = _adapter([], 1)
    with pytest.raises(ForecastError, match="sparda on layer 3: the Forecast adapter has no forecast.1.weight"):
        load_model(qwen35_path, modes=ExecutionModes(attention="sparda"), forecast=only_current)
    # sparda on layer 1 alone needs only the current-layer projection
    loaded = load_model(qwen35_path, modes=ExecutionModes(attention={1: "sparda"}), forecast=only_current,
                        sparse_attention_config=SMALL, device="cpu")  # fmt: skip
    assert [e.target for e in loaded.model.model.layers[1].mixer.forecasters] == [1]


def test_forecast_without_sparda_is_an_error(qwen35_path):
    with pytest.raises(ValueError, match="a Forecast adapter was given but no attention layer runs 'sparda'"):
        load_model(qwen35_path, modes=ExecutionModes(attention="sparse"), forecast="random")


def test_generate_with_a_saved_adapter(qwen35_path, tmp_path):
    """A trained-looking adapter (random weights, no random flag) from a folder: generation runs and the stats
    report sparda without the random-weights warning; the random adapter is flagged."""
    adapter = ForecastProjections.random(HYBRID, seed=7)
    adapter.metadata.clear()
    folder = adapter.save(tmp_path / "adapter")
    prompt = random_ids(70, seed=8)
    llm = LLM(qwen35_path, attention="sparda", forecast=folder, sparse_attention_config=SMALL, device="cpu")
    llm.generate([prompt], max_new_tokens=4)
    summary = llm.last_stats.summary()
    assert "attention sparda, KV blocks attended" in summary and "RANDOM" not in summary
    flagged = LLM(qwen35_path, attention="sparda", forecast="random", sparse_attention_config=SMALL, device="cpu")
    flagged.generate([prompt], max_new_tokens=4)
    assert "attention sparda with RANDOM Forecast weights (speed only" in flagged.last_stats.summary()
