"""Forecast adapters: layout, file format, the query initialisation, the attention observer and capture, loading
beside a base model."""

import json

import pytest
import torch

from longsparse.models.batch import ForwardBatch
from longsparse.models.capture import capture_attention
from longsparse.models.forecast import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    ForecastConfig,
    ForecastProjections,
    init_from_queries,
    init_random,
    query_weights,
)
from longsparse.models.layers import apply_rotary
from tests.helpers import rel_err
from tests.train.tiny import tiny_hybrid, tiny_llama


def _projections(model, seed=0):
    p = ForecastProjections(ForecastConfig.for_model(model.config, "tiny"))
    init_random(p, seed)
    return p


def test_layout_of_a_llama_and_of_a_hybrid():
    llama = ForecastProjections(ForecastConfig.for_model(tiny_llama().config, "tiny"))
    assert sorted(llama.state_dict()) == ["forecast.0.weight", "forecast.1.weight", "forecast_current.0.weight"]
    assert llama.state_dict()["forecast.1.weight"].shape == (2 * 16, 32)
    hybrid = ForecastProjections(ForecastConfig.for_model(tiny_hybrid().config, "tiny"))
    assert sorted(hybrid.state_dict()) == ["forecast.1.weight", "forecast.3.weight", "forecast_current.1.weight"]
    cfg = hybrid.config
    assert [cfg.source_of(t) for t in (1, 3, 4)] == [1, 1, 3]
    assert hybrid.projection_for(1) is hybrid.forecast_current["1"]
    assert hybrid.projection_for(4) is hybrid.forecast["3"]
    with pytest.raises(ValueError, match="layer 2 is not an attention layer"):
        cfg.source_of(2)


@pytest.mark.parametrize("store", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_save_and_load_round_trip(tmp_path, store):
    model = tiny_hybrid()
    p = _projections(model)
    p.save(tmp_path, dtype=store)
    raw = json.loads((tmp_path / CONFIG_FILE).read_text())
    assert {"base_model", "layers", "head_dim", "num_kv_heads", "current_layer", "attention_layers"} <= set(raw)
    assert raw["layers"] == [1, 3] and raw["current_layer"] == 1 and raw["rotary"] is True
    back = ForecastProjections.load(tmp_path / CONFIG_FILE)
    assert back.config == p.config
    for name, w in p.state_dict().items():
        assert torch.equal(back.state_dict()[name], w.to(store).float())


def test_load_rejects_missing_and_misshapen_tensors(tmp_path):
    from safetensors.torch import save_file

    p = _projections(tiny_llama())
    p.save(tmp_path)
    tensors = {k: v.clone() for k, v in p.state_dict().items()}
    del tensors["forecast.1.weight"]
    save_file(tensors, str(tmp_path / WEIGHTS_FILE))
    with pytest.raises(ValueError, match=r"missing tensors \['forecast.1.weight'\]"):
        ForecastProjections.load(tmp_path)
    tensors["forecast.1.weight"] = torch.zeros(3, 32)
    save_file(tensors, str(tmp_path / WEIGHTS_FILE))
    with pytest.raises(ValueError, match=r"forecast.1.weight has shape \[3, 32\], expected \[32, 32\]"):
        ForecastProjections.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="forecast.json and forecast.safetensors"):
        ForecastProjections.load(tmp_path / "nowhere")


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(layers=(0,)), "layers must be every attention layer but the last"),
        (dict(current_layer=1), "current_layer must be the first attention layer 0"),
        (dict(attention_layers=(0, 2, 1)), "attention_layers must be distinct ascending"),
        (dict(head_dim=0), "head_dim must be a positive int"),
        (dict(sparse_config={"window": 33}), "window=33 must be a multiple of block_size=64"),
    ],
    ids=["layers", "current", "order", "head-dim", "sparse"],
)
def test_config_validation(changes, message):
    base = ForecastConfig.for_model(tiny_llama().config, "tiny").to_json() | changes
    with pytest.raises(ValueError, match=message):
        ForecastConfig(**base)


def test_adapter_must_fit_the_model():
    p = _projections(tiny_llama(layers=3))
    with pytest.raises(ValueError, match=r"attention_layers: adapter \(0, 1, 2\), model \(0, 1, 2, 3\)"):
        tiny_llama(layers=4).attach_forecast(p)
    with pytest.raises(ValueError, match="num_kv_heads: adapter 2, model 3"):
        tiny_llama(heads=6, kv_heads=3).attach_forecast(p)


def test_observer_sees_what_the_backend_gets_and_changes_nothing():
    model = tiny_llama(seed=1)
    ids = torch.randint(0, 101, (77,), generator=torch.Generator().manual_seed(0))
    plain = model(ids, ForwardBatch.prefill([77], "cpu"))
    pos = torch.tensor([0, 5, 40, 76])
    caps = capture_attention(model, ids, pos)
    seen = []
    watched = ForwardBatch.prefill([77], "cpu")
    watched.attention_observer = lambda layer, x, q, k: seen.append(layer)
    observed = model(ids, watched)
    assert torch.equal(plain, observed) and seen == [0, 1, 2]
    assert sorted(caps) == [0, 1, 2]
    cos, sin = model.rotary(torch.arange(77))
    for layer, cap in caps.items():
        attn = model.model.layers[layer].self_attn
        assert cap.x.shape == (4, 32) and cap.q.shape == (4, 6, 16) and cap.k.shape == (77, 2, 16)
        q = apply_rotary(attn.q_proj(cap.x).view(4, 6, 16), cos[pos], sin[pos])
        assert rel_err(cap.q, q) < 1e-6
        # keys at the chosen positions follow from the captured inputs there
        k = apply_rotary(attn.k_proj(cap.x).view(4, 2, 16), cos[pos], sin[pos])
        assert rel_err(cap.k[pos], k) < 1e-6


def test_capture_rejects_bad_positions():
    model = tiny_llama()
    ids = torch.zeros(10, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"positions must lie in \[0, T=10\), got 3 .. 10"):
        capture_attention(model, ids, torch.tensor([3, 10]))
    with pytest.raises(ValueError, match="int64"):
        capture_attention(model, ids, torch.tensor([1.0]))


def test_query_init_of_the_current_forecast_is_the_groups_mean_query():
    """forecast_current starts at its own layer's mean query: F(x) = mean over each group's heads of q (rotated)."""
    model = tiny_llama(seed=2)
    p = ForecastProjections(ForecastConfig.for_model(model.config, "tiny"))
    init_from_queries(p, model)
    ids = torch.randint(0, 101, (50,), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(3, 50, 7)
    caps = capture_attention(model, ids, pos)
    cos, sin = model.rotary(pos)
    f = p(0, caps[0].x, cos, sin)
    assert rel_err(f, caps[0].q.view(len(pos), 2, 3, 16).mean(2)) < 1e-6


def test_query_init_reads_the_source_input_through_the_target_norm():
    """forecast.{s} = mean_g Wq_t[g] · diag(w_t / w_s): applied to the source input x_s = w_s ⊙ x̂ it gives the target
    layer's mean query of w_t ⊙ x̂ (before RoPE)."""
    model = tiny_llama(seed=3)
    p = ForecastProjections(ForecastConfig.for_model(model.config, "tiny"))
    init_from_queries(p, model)
    layers = model.model.layers
    x_hat = torch.randn(9, 32, generator=torch.Generator().manual_seed(2))
    x_source = layers[1].input_layernorm.weight * x_hat
    target_q = layers[2].self_attn.q_proj(layers[2].input_layernorm.weight * x_hat).view(9, 2, 3, 16).mean(2)
    assert rel_err(p.projection_for(2)(x_source).view(9, 2, 16), target_q) < 1e-6


def test_query_weights_leave_out_the_output_gate():
    model = tiny_hybrid()
    attn = model.model.layers[3].self_attn
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(3))
    q_only = attn.q_proj(x).view(5, 4, 32)[..., :16]
    assert rel_err(torch.einsum("hdc,tc->thd", query_weights(attn), x), q_only) < 1e-6


def test_load_model_attaches_an_adapter(tmp_path):
    from longsparse.models import load_model
    from tests.tiny_models import build, save

    folder = save(build("llama-gqa-bias", seed=4), tmp_path / "llama")
    loaded = load_model(folder)
    p = ForecastProjections(ForecastConfig.for_model(loaded.config, "llama"))
    init_random(p, 5)
    p.save(tmp_path / "adapter", dtype=torch.float32)
    with_adapter = load_model(folder, forecast=tmp_path / "adapter")
    attached = with_adapter.model.forecast
    assert attached is not None and not any(w.requires_grad for w in attached.parameters())
    assert torch.equal(attached.state_dict()["forecast.0.weight"], p.state_dict()["forecast.0.weight"])
    assert loaded.model.forecast is None
