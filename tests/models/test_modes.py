"""Per-layer execution modes: validation, SparseGDN through the whole model, and clear errors for modes that cannot
run as asked."""

import pytest

from longsparse import LLM
from longsparse.engine import ModelRunner
from longsparse.models import ExecutionModes, load_model
from longsparse.models.gdn import DenseGDN, SparseGDN
from longsparse.ops.gdn import SparseGDNConfig, SparseGDNKernelConfig
from tests.helpers import rel_err
from tests.tiny_models import build, random_ids, save


@pytest.fixture(scope="module")
def qwen35_path(tmp_path_factory):
    return save(build("qwen35", seed=8, max_position_embeddings=1024), tmp_path_factory.mktemp("qwen35"))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(gdn="fast"), "gdn mode must be one of dense, sparse, got 'fast'"),
        (dict(attention="flash"), "attention mode must be one of dense, sparse, sparda, got 'flash'"),
        (dict(gdn={-1: "sparse"}), "keyed by layer index"),
    ],
    ids=["gdn-name", "attention-name", "negative-layer"],
)
def test_modes_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ExecutionModes(**kwargs)


def test_per_layer_mode_must_name_a_layer_of_its_kind(qwen35_path):
    with pytest.raises(ValueError, match="gdn mode given for layer 1, which is full_attention"):
        load_model(qwen35_path, modes=ExecutionModes(gdn={1: "sparse"}))


def test_sparda_without_a_forecast_adapter_says_how_to_give_one(qwen35_path):
    with pytest.raises(ValueError, match="attention mode 'sparda' needs a Forecast adapter: pass forecast=PATH"):
        load_model(qwen35_path, modes=ExecutionModes(attention={3: "sparda"}))


def test_exact_sparse_gdn_equals_dense(qwen35_path):
    """SparseGDN with the exact solve and every event kept is the dense operator, through the whole model (packed
    sequences of different lengths, so cu_seqlens reaches the op)."""
    exact = SparseGDNConfig(solve="full", selection="all")
    dense = load_model(qwen35_path)
    torch_backend = SparseGDNKernelConfig(backend="torch")
    sparse = load_model(qwen35_path, modes=ExecutionModes(gdn={0: "sparse"}), sparse_gdn_config=exact,
                        sparse_gdn_kernel_config=torch_backend)  # fmt: skip
    cores = [layer.mixer.core for layer in sparse.model.model.layers if hasattr(layer.mixer, "core")]
    assert [type(c) for c in cores] == [SparseGDN, DenseGDN]
    ids = [random_ids(n, seed=20 + i) for i, n in enumerate([130, 9])]
    out = ModelRunner(sparse.model).prefill(ids)
    assert rel_err(out.logits, ModelRunner(dense.model).prefill(ids).logits) <= 1e-5
    assert out.gdn_keep_ratios == [1.0]


def test_sparse_gdn_changes_the_model_and_reports_its_keep_ratio(qwen35_path):
    ids = [random_ids(64 * 6 + 5, seed=3)]
    dense = ModelRunner(load_model(qwen35_path).model).prefill(ids).logits
    sparse = load_model(qwen35_path, modes=ExecutionModes(gdn="sparse"))
    out = ModelRunner(sparse.model).prefill(ids)
    assert 0 < min(out.gdn_keep_ratios) and max(out.gdn_keep_ratios) < 1
    assert rel_err(out.logits, dense) > 1e-6  # events were really skipped
    llm = LLM(qwen35_path, gdn="sparse")
    llm.generate([ids[0]], max_new_tokens=2)
    assert f"GDN keep ratio {llm.last_stats.keep_ratio:.3f}" in llm.last_stats.summary()
    assert 0 < llm.last_stats.keep_ratio < 1


def test_modes_are_recorded_on_the_model(qwen35_path):
    modes = ExecutionModes(gdn="dense", attention={1: "dense"})
    assert load_model(qwen35_path, modes=modes).model.modes == modes
