"""Selection traces: recorded from the KV cache's selection log, saved and loaded bit for bit, and their slot-cache hit
rate is the offloaded block cache's own."""

import numpy as np
import pytest
import torch

from longsparse.bench.decode import TINY_MODEL, TINY_SPARSE, random_model
from longsparse.bench.locality import dynamic_blocks, slot_cache_hits
from longsparse.engine import allocate_compressed_keys
from longsparse.engine.decode_modes import build_cache, prepare_model
from longsparse.engine.runner import ModelRunner
from longsparse.engine.traces import SelectionTrace, forced_mask, load_traces, record_selections, save_traces
from longsparse.models.forecast import ForecastProjections
from longsparse.ops.transfer import max_dynamic_blocks
from tests.helpers import one_thread

PROMPT, STEPS = 250, 40  # crosses the 16-token block boundaries at 256 and 272


@pytest.fixture(scope="module")
def setup():
    with one_thread():
        model = random_model(TINY_MODEL, 400, torch.device("cpu"), torch.float32, seed=2)
        forecast = ForecastProjections.random(model.config, seed=3)
        ids = torch.randint(0, TINY_MODEL["vocab_size"], (PROMPT + STEPS,), generator=torch.Generator().manual_seed(5))
        modes = {"sparse": ("sparse_gpu", None), "sparda": ("sparda_gpu", forecast)}
        # one mode per call: each prompt is then prefilled by its own mode, as the offloaded twins below prefill it
        traces = [
            trace
            for label, mode in modes.items()
            for trace in record_selections(
                model, ids.tolist(), PROMPT, STEPS, {label: mode}, TINY_SPARSE, dense_prefill=False
            )  # fmt: skip
        ]
    return model, forecast, ids.tolist(), traces


def test_traces_hold_every_step_layer_and_head_with_the_forced_blocks(setup):
    model, _, _, traces = setup
    assert [t.label for t in traces] == ["sparse", "sparda"]
    for t in traces:
        assert t.selected.shape == (
            STEPS,
            len(model.config.attention_layers),
            2,
            TINY_SPARSE.num_blocks(PROMPT + STEPS),
        )
        forced = forced_mask(t.positions(), t.selected.shape[3], TINY_SPARSE)
        assert (t.selected | ~forced[:, None, None]).all()  # every forced block is read
        causal = np.arange(t.selected.shape[3])[None] <= (t.positions() // 16)[:, None]
        assert not (t.selected & ~causal[:, None, None]).any()
        assert (t.selected.sum(-1) == TINY_SPARSE.budget_blocks).all()
    assert not np.array_equal(traces[0].selected, traces[1].selected)  # two selectors, two traces


def test_save_and_load_round_trip(setup, tmp_path):
    traces = setup[3]
    loaded = load_traces(save_traces(tmp_path / "t.npz", traces))
    for a, b in zip(traces, loaded):
        assert (a.label, a.context, a.layers, a.config) == (b.label, b.context, b.layers, b.config)
        assert np.array_equal(a.selected, b.selected)


@pytest.mark.parametrize("index, mode", [(0, "sparse_offload"), (1, "sparda")])
def test_slot_cache_hits_of_a_trace_are_the_block_caches(setup, index, mode):
    """Decoding the same tokens with the offloaded twin: per step, its planner's hits equal the slot-cache
    simulation's on the trace (the trace is what the offloaded cache is asked for)."""
    model, forecast, ids, traces = setup
    trace = traces[index]
    with one_thread(), torch.inference_mode():
        prepare_model(model, mode, TINY_SPARSE, forecast=forecast)
        cache = build_cache(model.config, mode, 1, PROMPT + STEPS + 1, torch.float32, "cpu", TINY_SPARSE,
                            check_memory=False)  # fmt: skip
        compressed = allocate_compressed_keys(model, 1, PROMPT + STEPS + 1)
        runner = ModelRunner(model)
        runner.prefill([ids[:PROMPT]], slots=[0], kv_cache=cache, compressed_keys=compressed)
        got = []
        for t in range(STEPS):
            before = cache.transfer_stats()["hits"]
            runner.decode([ids[PROMPT + t]], prefix_lens=[PROMPT + t], slots=[0], kv_cache=cache, gdn_states=None,
                          compressed_keys=compressed)  # fmt: skip
            got.append(cache.transfer_stats()["hits"] - before)
    dyn = dynamic_blocks(trace)
    offloaded = [i for i, layer in enumerate(trace.layers) if cache.is_offloaded(layer)]
    dyn = dyn[:, offloaded].reshape(STEPS, -1, dyn.shape[-1])
    hits, _ = slot_cache_hits(dyn, max_dynamic_blocks(TINY_SPARSE, PROMPT + STEPS + 1))
    assert sum(got) > 0 and got == hits.tolist()


def test_a_trace_rejects_a_mask_of_the_wrong_shape():
    with pytest.raises(ValueError, match="4-d bool"):
        SelectionTrace("x", 100, (0,), TINY_SPARSE, np.zeros((2, 1, 1, 8), dtype=np.int8))
    with pytest.raises(ValueError, match="the last step needs"):
        SelectionTrace("x", 100, (0,), TINY_SPARSE, np.zeros((2, 1, 1, 3), dtype=bool))


def test_dense_prefill_is_undone_before_the_decode_steps(setup):
    """The prompt is prefilled densely (dense_len raised inside the block) and every decode step selects blocks."""
    model, forecast, ids, traces = setup
    with one_thread():
        (dense,) = record_selections(model, ids, PROMPT, 4, {"sparda": ("sparda_gpu", forecast)}, TINY_SPARSE)
    backends = [layer.mixer.backend for layer in model.model.layers]
    assert all(b.config == TINY_SPARSE for b in backends)
    assert (dense.selected.sum(-1) == TINY_SPARSE.budget_blocks).all()
    assert not np.array_equal(dense.selected, traces[1].selected[:4])  # another prompt state, other selections
