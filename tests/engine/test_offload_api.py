"""``LLM(..., offload="cpu")`` and ``longsparse generate --offload cpu`` on a tiny checkpoint: with a block budget that
covers every block the offloaded sparse path generates the dense path's tokens; offloading changes nothing but where
the blocks live (the same tokens as the GPU-resident mode, with a Forecast adapter from a folder or random); requests
that do not fit are refused with the capacity model's numbers."""

import dataclasses

import pytest

from longsparse import LLM, cli
from longsparse.cache import BlockKVCache, CapacityError
from longsparse.models.forecast import ForecastError, ForecastProjections
from tests.helpers import EVERY_BLOCK_SPARSE, SMALL_BLOCK_SPARSE, one_thread
from tests.tiny_models import EOS, build, random_ids, save, write_tokenizer

SMALL = SMALL_BLOCK_SPARSE
EVERY_BLOCK = EVERY_BLOCK_SPARSE


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    hf = build("llama-gqa-bias", seed=17, eos_token_id=EOS, bos_token_id=None, max_position_embeddings=2048)
    path = save(hf, tmp_path_factory.mktemp("tiny-offload"))
    write_tokenizer(path)
    return path


PROMPTS = [random_ids(n, seed=60 + n) for n in (70, 131)]


def test_offloaded_sparse_with_every_block_generates_the_dense_tokens(tiny):
    dense = LLM(tiny).generate(PROMPTS, max_new_tokens=40)
    llm = LLM(tiny, attention="sparse", offload="cpu", sparse_attention_config=EVERY_BLOCK)
    offloaded = llm.generate(PROMPTS, max_new_tokens=40)
    assert [r.token_ids for r in offloaded] == [r.token_ids for r in dense]
    stats = llm.last_stats
    assert stats.block_hit_rate is not None and stats.kv_bytes.host > 0
    assert "block hit rate" in stats.summary()
    assert stats.decode_block_fraction == pytest.approx(1.0)  # every causal block, as the budget allows


def test_offloaded_sparda_equals_the_resident_mode_with_an_adapter_from_a_folder(tiny, tmp_path):
    """The random adapter written to a folder and loaded back drives the same selections: the offloaded pipeline
    generates the resident sparda mode's tokens; both say that the weights are random."""
    adapter = ForecastProjections.random(LLM(tiny).config, seed=3)
    folder = adapter.save(tmp_path / "adapter")
    tight = dataclasses.replace(SMALL, topk=4)  # at most 6 of the 5-11 causal blocks of 70-160 tokens
    resident = LLM(tiny, attention="sparda", forecast=folder, sparse_attention_config=tight)
    want = resident.generate(PROMPTS, max_new_tokens=30)
    llm = LLM(tiny, attention="sparda", offload="cpu", forecast=folder, sparse_attention_config=tight)
    assert llm.decode_mode == "sparda" and resident.decode_mode == "sparda_gpu"
    got = llm.generate(PROMPTS, max_new_tokens=30)
    assert [r.token_ids for r in got] == [r.token_ids for r in want]
    stats = llm.last_stats
    assert 0 <= stats.block_hit_rate < 1 and resident.last_stats.block_hit_rate is None  # blocks were copied
    assert stats.decode_block_fraction == pytest.approx(resident.last_stats.decode_block_fraction)
    assert stats.decode_block_fraction < 0.9  # the budget really restricted the decode steps
    assert "RANDOM Forecast weights" in stats.summary()


def test_forecast_weights_that_do_not_fit_the_model_are_refused(tiny, tmp_path):
    config = LLM(tiny).config
    wrong = ForecastProjections(
        hidden_size=config.hidden_size, num_kv_heads=config.num_key_value_heads, head_dim=2 * config.head_dim,
        layers=[0], current_layer=0, base_model="other",
    )  # fmt: skip
    with pytest.raises(ForecastError, match="head_dim is 32, the model's is 16"):
        LLM(tiny, attention="sparda", offload="cpu", forecast=wrong.save(tmp_path / "wrong"))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(offload="gpu"), "offload must be None or 'cpu'"),
        (dict(offload="cpu"), "needs attention='sparse' or 'sparda'"),
        (dict(offload="cpu", attention={0: "sparse"}), "needs attention='sparse' or 'sparda'"),
        (dict(offload="cpu", attention="sparda"), "attention mode 'sparda' needs a Forecast adapter"),
        (dict(attention="dense", forecast="random"), "a Forecast adapter was given but no attention layer runs"),
        (dict(attention="sparse", num_ctas=16), "num_ctas sets the host-to-GPU copy kernel of offload='cpu'"),
    ],
    ids=["unknown-offload", "dense-offload", "per-layer-offload", "sparda-no-adapter", "adapter-without-sparda",
         "ctas-without-offload"],
)  # fmt: skip
def test_bad_offload_settings_are_refused(tiny, kwargs, match):
    with pytest.raises(ValueError, match=match):
        LLM(tiny, **kwargs)


def test_a_request_beyond_host_memory_is_refused_before_allocating(tiny):
    llm = LLM(tiny, attention="sparse", offload="cpu", sparse_attention_config=SMALL)
    with pytest.raises(CapacityError, match="pinned host memory .* at most"):
        llm.generate(PROMPTS, max_new_tokens=10**8)
    assert llm.max_batch(10**8) == 0
    assert llm.max_batch(4096) > llm.max_batch(10**6) > 0


def test_generate_cli_offloads(tiny, capsys):
    # MiniCPM4's geometry: a short prompt is below dense_len (dense prefill, every block selected in decode)
    argv = ["generate", "--model", str(tiny), "--prompt", "w1 w2 w3 w4 w5", "--max-new-tokens", "2",
            "--attention", "sparda", "--offload", "cpu", "--forecast", "random", "--num-ctas", "8"]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr()
    assert out.out.strip() and "attention sparda with RANDOM" in out.err
    # every block was selected as dense or forced, none dynamically: a hit rate does not apply
    assert "block hit rate" not in out.err and "nan" not in out.err


def test_offloaded_cache_uses_the_requested_copy_quota(tiny):
    llm = LLM(tiny, attention="sparse", offload="cpu", sparse_attention_config=SMALL, num_ctas=8)
    kv, _, compressed = llm.allocate(2, 100)
    assert isinstance(kv, BlockKVCache) and kv.num_ctas == 8 and kv.prefetch_enabled is False
    assert sorted(compressed.k_cmp) == list(llm.config.attention_layers)


def test_generate_cli_refuses_offload_of_dense_attention(tiny, capsys):
    argv = ["generate", "--model", str(tiny), "--prompt", "w1", "--offload", "cpu"]
    assert cli.main(argv) == 2
    assert "needs attention='sparse' or 'sparda'" in capsys.readouterr().err
