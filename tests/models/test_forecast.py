"""The Forecast adapter: safetensors + JSON round trip, the projection it defines, validation against a model, the
errors of a missing, malformed or mismatched adapter, the weight each sparda layer uses, the query initialisation, and
the attention observer through which training and recall read the model."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from longsparse import LLM
from longsparse.models import ExecutionModes, load_model
from longsparse.models.batch import ForwardBatch
from longsparse.models.capture import capture_attention
from longsparse.models.config import decoder_config_from_hf, hybrid_config_from_hf
from longsparse.models.forecast import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    ForecastError,
    ForecastProjections,
    forecast_source,
    forecast_states,
    init_from_queries,
    query_weights,
    resolve_forecast,
)
from longsparse.models.layers import RotaryEmbedding, apply_rotary
from longsparse.ops.sparse_attn import SparseAttentionConfig
from tests.helpers import rel_err
from tests.tiny_models import TINY, TINY_GDN, build, random_ids, save
from tests.train.tiny import tiny_hybrid, tiny_llama

LLAMA3 = decoder_config_from_hf({**TINY, "num_hidden_layers": 3}, "LlamaForCausalLM")
HYBRID = hybrid_config_from_hf({**TINY, **TINY_GDN}, "Qwen3_5ForCausalLM")  # attention layers 1 and 3
SMALL = SparseAttentionConfig(block_size=16, window=32, topk=2, kernel_size=8, kernel_stride=4, dense_len=0)


def test_save_and_load_round_trip(tmp_path):
    adapter = ForecastProjections.random(LLAMA3, seed=2)
    adapter.metadata["teacher_window"] = [2, 1]
    folder = adapter.save(tmp_path / "adapter")
    meta = json.loads((folder / CONFIG_FILE).read_text())
    assert meta == {"random_weights": True, "teacher_window": [2, 1], "base_model": adapter.base_model,
                    "layers": [0, 1], "head_dim": 16, "num_kv_heads": 2, "hidden_size": 64,
                    "attention_layers": [0, 1, 2], "num_hidden_layers": 3}  # fmt: skip
    assert sorted(load_file(str(folder / WEIGHTS_FILE))) == [
        "forecast.0.weight", "forecast.1.weight", "forecast_current.0.weight"
    ]  # fmt: skip
    back = ForecastProjections.load(folder)
    assert back.layers == (0, 1) and back.current_layer == 0 and back.random_weights
    assert back.base_model == adapter.base_model and back.metadata == adapter.metadata
    assert back.attention_layers == (0, 1, 2) and back.num_hidden_layers == 3
    assert back.sparse_config is None and back.training is None
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


@pytest.mark.parametrize("store", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_training_record_round_trip(tmp_path, store):
    """What training writes (selection geometry, run record) comes back typed; weights in the stored dtype."""
    record = {"teacher": "fine", "config": {"lr": 0.002, "fine_grid": [2, 1]}, "data": "kjv"}
    adapter = ForecastProjections.for_model(HYBRID, "tiny qwen3.5", sparse_config=SMALL, training=record)
    adapter.save(tmp_path, dtype=store)
    meta = json.loads((tmp_path / CONFIG_FILE).read_text())
    assert meta["sparse_config"]["window"] == 32 and meta["training"] == record and meta["attention_layers"] == [1, 3]
    back = ForecastProjections.load(tmp_path)
    assert back.sparse_config == SMALL and back.training == record and back.metadata == {}
    assert back.next_weight(1).dtype == store
    assert torch.equal(back.next_weight(1).float(), adapter.next_weight(1).detach().to(store).float())
    with pytest.raises(ValueError, match="dtype must be one of float32, bfloat16, float16 or None"):
        adapter.save(tmp_path, dtype=torch.int8)


def test_each_target_layer_has_one_weight():
    """Layer a_i's forecast chooses a_{i+1}'s blocks; the first attention layer chooses its own (a hybrid skips its
    GDN layers)."""
    model = tiny_hybrid()
    att = model.config.attention_layers
    p = ForecastProjections.for_model(model.config, "tiny")
    assert att == (1, 3, 4) and [forecast_source(att, t) for t in att] == [1, 1, 3]
    assert sorted(p.state_dict()) == ["forecast.1.weight", "forecast.3.weight", "forecast_current.1.weight"]
    assert p.weight_for(1, att) is p.current_weight(1) and p.weight_for(4, att) is p.next_weight(3)
    assert p.weight_for(3, att) is p.next_weight(1)
    with pytest.raises(ForecastError, match=r"layer 2 is not an attention layer \(\[1, 3, 4\]\)"):
        p.weight_for(2, att)


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
    "hidden-size": (lambda t, m: m.update(hidden_size=32), "gives hidden_size 32 but the tensors read 64 channels"),
    "sparse-config": (lambda t, m: m.update(sparse_config={"window": 33}), "bad sparse_config .* multiple of"),
    "attention-order": (lambda t, m: m.update(attention_layers=[0, 2, 1]), "attention_layers must be distinct"),
    "attention-int": (lambda t, m: m.update(attention_layers=3), "attention_layers must be a list"),
    "layer-count": (lambda t, m: m.update(num_hidden_layers=0), "num_hidden_layers must be a positive integer"),
    "training": (lambda t, m: m.update(training=[1]), "training must be a mapping"),
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


def test_recorded_geometry_must_match_the_model():
    """An adapter that records its model's layers is refused by a deeper model its tensors would otherwise fit."""
    adapter = ForecastProjections.for_model(LLAMA3, "tiny")
    deeper = decoder_config_from_hf({**TINY, "num_hidden_layers": 4}, "LlamaForCausalLM")
    with pytest.raises(ForecastError, match=r"made for num_hidden_layers 3, the model's are 4"):
        adapter.check_model(deeper)
    unrecorded = _adapter([0, 1], 0)
    unrecorded.check_model(deeper)  # nothing recorded: only the tensors' fit is checked


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


def test_sparda_layers_use_the_weights_training_trains(qwen35_path):
    """Each emitter's weight is ``weight_for(target)`` of the adapter, the one training and recall use."""
    adapter = ForecastProjections.random(HYBRID, seed=9)
    loaded = load_model(qwen35_path, modes=ExecutionModes(attention="sparda"), forecast=adapter,
                        sparse_attention_config=SMALL, device="cpu")  # fmt: skip
    layers = loaded.model.model.layers
    emitters = [(i, e) for i in HYBRID.attention_layers for e in layers[i].mixer.forecasters]
    assert [(i, e.target) for i, e in emitters] == [(1, 1), (1, 3)]
    for source, e in emitters:
        assert source == forecast_source(HYBRID.attention_layers, e.target)
        assert torch.equal(e.weight, adapter.weight_for(e.target, HYBRID.attention_layers))


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
    p = ForecastProjections.for_model(model.config, "tiny")
    init_from_queries(p, model)
    ids = torch.randint(0, 101, (50,), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(3, 50, 7)
    caps = capture_attention(model, ids, pos)
    cos, sin = model.rotary(pos)
    f = forecast_states(p.current_weight(0), caps[0].x, cos, sin, 2)
    assert rel_err(f, caps[0].q.view(len(pos), 2, 3, 16).mean(2)) < 1e-6


def test_query_init_reads_the_source_input_through_the_target_norm():
    """forecast.{s} = mean_g Wq_t[g] · diag(w_t / w_s): applied to the source input x_s = w_s ⊙ x̂ it gives the target
    layer's mean query of w_t ⊙ x̂ (before RoPE)."""
    model = tiny_llama(seed=3)
    p = ForecastProjections.for_model(model.config, "tiny")
    init_from_queries(p, model)
    layers = model.model.layers
    x_hat = torch.randn(9, 32, generator=torch.Generator().manual_seed(2))
    x_source = layers[1].input_layernorm.weight * x_hat
    target_q = layers[2].self_attn.q_proj(layers[2].input_layernorm.weight * x_hat).view(9, 2, 3, 16).mean(2)
    assert rel_err((x_source @ p.weight_for(2, (0, 1, 2)).T).view(9, 2, 16), target_q) < 1e-6


def test_query_weights_leave_out_the_output_gate():
    model = tiny_hybrid()
    attn = model.model.layers[3].self_attn
    x = torch.randn(5, 32, generator=torch.Generator().manual_seed(3))
    q_only = attn.q_proj(x).view(5, 4, 32)[..., :16]
    assert rel_err(torch.einsum("hdc,tc->thd", query_weights(attn), x), q_only) < 1e-6
