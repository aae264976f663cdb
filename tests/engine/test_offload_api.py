"""``LLM(..., offload="cpu")`` and ``longsparse generate --offload cpu`` on a tiny checkpoint: with a block budget that
covers every block the offloaded sparse path generates the dense path's tokens; SparDA runs with Forecast heads from
a file or random ones; requests that do not fit are refused with the capacity model's numbers."""

import pytest
import torch

from longsparse import LLM, cli
from longsparse.cache import CapacityError
from longsparse.models.forecast_heads import ForecastHeads
from longsparse.ops.sparse_attn import SparseAttentionConfig
from tests.tiny_models import EOS, build, random_ids, save, write_tokenizer

SMALL = SparseAttentionConfig(block_size=16, init_blocks=1, window=32, topk=6, kernel_size=16, kernel_stride=8,
                              dense_len=64)  # fmt: skip
EVERY_BLOCK = SparseAttentionConfig(block_size=16, init_blocks=1, window=32, topk=64, kernel_size=16,
                                    kernel_stride=8, dense_len=0)  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    hf = build("llama-gqa-bias", seed=17, eos_token_id=EOS, bos_token_id=None, max_position_embeddings=2048)
    path = save(hf, tmp_path_factory.mktemp("tiny-offload"))
    write_tokenizer(path)
    return path


PROMPTS = [random_ids(n, seed=60 + n) for n in (70, 131)]


def test_offloaded_sparse_with_every_block_generates_the_dense_tokens(tiny):
    dense = LLM(tiny).generate(PROMPTS, max_new_tokens=40)
    llm = LLM(tiny, attention="sparse", offload="cpu", sparse_attention=EVERY_BLOCK, use_kernel=False)
    offloaded = llm.generate(PROMPTS, max_new_tokens=40)
    assert [r.token_ids for r in offloaded] == [r.token_ids for r in dense]
    stats = llm.last_stats
    assert stats.block_hit_rate is not None and stats.kv_bytes.host > 0
    assert "block hit rate" in stats.summary()


def test_sparda_runs_with_heads_from_a_file_and_equals_random_heads_of_the_same_seed(tiny, tmp_path):
    llm = LLM(tiny, attention="sparda", offload="cpu", forecast="random", sparse_attention=SMALL, use_kernel=False)
    first = llm.generate(PROMPTS, max_new_tokens=30)
    assert 0 <= llm.last_stats.block_hit_rate <= 1
    heads = ForecastHeads.for_config(llm.config).randomize(0)
    heads.save(tmp_path / "forecast.safetensors")
    again = LLM(tiny, attention="sparda", offload="cpu", forecast=tmp_path / "forecast.safetensors",
                sparse_attention=SMALL, use_kernel=False).generate(PROMPTS, max_new_tokens=30)  # fmt: skip
    assert [r.token_ids for r in again] == [r.token_ids for r in first]


def test_forecast_weights_that_do_not_fit_the_model_are_refused(tiny, tmp_path):
    heads = ForecastHeads(64, 2, 16, (0,))  # one layer: the tiny model has two
    heads.save(tmp_path / "wrong.safetensors")
    with pytest.raises(ValueError, match="do not match the model"):
        LLM(tiny, attention="sparda", offload="cpu", forecast=tmp_path / "wrong.safetensors")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(offload="gpu"), "offload must be None or 'cpu'"),
        (dict(offload="cpu"), "needs attention='sparse' or 'sparda'"),
        (dict(offload="cpu", attention="sparda"), "needs Forecast heads"),
        (dict(attention="dense", forecast="random"), "forecast is used with"),
    ],
    ids=["unknown-offload", "dense-offload", "sparda-no-heads", "heads-without-sparda"],
)
def test_bad_offload_settings_are_refused(tiny, kwargs, match):
    with pytest.raises(ValueError, match=match):
        LLM(tiny, **kwargs)


def test_a_request_beyond_host_memory_is_refused_before_allocating(tiny):
    llm = LLM(tiny, attention="sparse", offload="cpu", sparse_attention=SMALL)
    with pytest.raises(CapacityError, match="pinned host memory .* at most"):
        llm.generate(PROMPTS, max_new_tokens=10**8)
    assert llm.max_batch(10**8) == 0
    assert llm.max_batch(4096) > llm.max_batch(10**6) > 0


def test_generate_cli_offloads(tiny, capsys):
    # MiniCPM4's geometry: a short prompt is below dense_len (dense prefill, every block selected in decode)
    argv = ["generate", "--model", str(tiny), "--prompt", "w1 w2 w3 w4 w5", "--max-new-tokens", "2",
            "--attention", "sparda", "--offload", "cpu", "--forecast", "random"]  # fmt: skip
    assert cli.main(argv) == 0
    out = capsys.readouterr()
    assert out.out.strip() and "block hit rate" in out.err


def test_generate_cli_refuses_offload_of_dense_attention(tiny, capsys):
    argv = ["generate", "--model", str(tiny), "--prompt", "w1", "--offload", "cpu"]
    assert cli.main(argv) == 2
    assert "needs attention='sparse' or 'sparda'" in capsys.readouterr().err
