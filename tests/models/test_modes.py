"""Per-layer execution modes: validation, the SparseGDN plumbing (through a stand-in op with SparseGDN's signature),
and clear errors for modes that cannot run as asked."""

from types import SimpleNamespace

import pytest

import longsparse.ops.gdn as gdn_ops
from longsparse import LLM
from longsparse.engine import ModelRunner
from longsparse.models import ExecutionModes, load_model
from longsparse.models.gdn import DenseGDN, SparseGDN
from longsparse.ops.gdn import naive_chunk_gated_delta_rule
from tests.helpers import rel_err
from tests.tiny_models import build, random_ids, save

HAS_SPARSE_GDN = hasattr(gdn_ops, "sparse_chunk_gated_delta_rule")


@pytest.fixture(scope="module")
def qwen35_path(tmp_path_factory):
    return save(build("qwen35", seed=8), tmp_path_factory.mktemp("qwen35"))


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


@pytest.mark.skipif(HAS_SPARSE_GDN, reason="SparseGDN is installed")
def test_sparse_gdn_without_the_op_says_so(qwen35_path):
    with pytest.raises(NotImplementedError, match="sparse_chunk_gated_delta_rule"):
        load_model(qwen35_path, modes=ExecutionModes(gdn="sparse"))


class StandInSparseOp:
    """SparseGDN's signature over the dense reference, keeping every event (so outputs equal dense) and reporting a
    fixed keep ratio; records the keyword arguments of each call."""

    def __init__(self, keep_ratio: float):
        self.keep_ratio = keep_ratio
        self.calls = []

    def __call__(self, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                 use_qk_l2norm_in_kernel=False, cu_seqlens=None, *, gate=None, gate_norm_weight=None, config=None,
                 return_stats=False):  # fmt: skip
        self.calls.append(dict(gate=gate, gate_norm_weight=gate_norm_weight, config=config, cu_seqlens=cu_seqlens))
        o, state = naive_chunk_gated_delta_rule(
            q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens
        )
        return (o, state, SimpleNamespace(keep_ratio=self.keep_ratio)) if return_stats else (o, state)


def test_sparse_gdn_plumbing_with_a_stand_in_op(qwen35_path, monkeypatch):
    op = StandInSparseOp(keep_ratio=0.25)
    monkeypatch.setattr(gdn_ops, "sparse_chunk_gated_delta_rule", op, raising=False)
    dense = load_model(qwen35_path)
    sparse = load_model(qwen35_path, modes=ExecutionModes(gdn={0: "sparse"}), sparse_gdn_config="cfg")
    cores = [layer.mixer.core for layer in sparse.model.model.layers if hasattr(layer.mixer, "core")]
    assert [type(c) for c in cores] == [SparseGDN, DenseGDN]
    lens = [30, 9]
    ids = [random_ids(n, seed=20 + i) for i, n in enumerate(lens)]
    a = ModelRunner(dense.model).prefill(ids).logits
    out = ModelRunner(sparse.model).prefill(ids)
    assert rel_err(out.logits, a) <= 1e-6
    assert out.gdn_keep_ratios == [0.25]
    call = op.calls[-1]
    assert call["config"] == "cfg" and call["cu_seqlens"].tolist() == [0, 30, 39]
    assert call["gate"].shape == (1, sum(lens), 4, 12) and call["gate_norm_weight"].shape == (12,)


def test_generate_reports_the_keep_ratio(qwen35_path, monkeypatch):
    monkeypatch.setattr(gdn_ops, "sparse_chunk_gated_delta_rule", StandInSparseOp(0.3), raising=False)
    llm = LLM(qwen35_path, gdn="sparse")
    llm.generate([random_ids(20, seed=1)], max_new_tokens=3)
    assert llm.last_stats.keep_ratio == pytest.approx(0.3)
    assert "GDN keep ratio 0.300" in llm.last_stats.summary()
    dense = LLM(qwen35_path)
    dense.generate([random_ids(20, seed=1)], max_new_tokens=3)
    assert dense.last_stats.keep_ratio is None


def test_modes_are_recorded_on_the_model(qwen35_path):
    modes = ExecutionModes(gdn="dense", attention={1: "dense"})
    assert load_model(qwen35_path, modes=modes).model.modes == modes
