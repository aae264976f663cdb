"""``LLM(..., cuda_graphs=True)``: the decode step function that a CUDA graph captures (static buffers, positions
advanced in place, every slot stepping until the last sequence ends), run on the CPU without a graph, generates the
eager path's tokens — on a hybrid with a sequence ending early, with block-sparse attention, and offloaded."""

import json
from types import SimpleNamespace

import pytest

from longsparse import LLM, cli
from longsparse.engine import cli as generate_cli
from tests.helpers import SMALL_BLOCK_SPARSE, one_thread
from tests.tiny_models import EOS, random_ids, tokenized_checkpoints

SMALL = SMALL_BLOCK_SPARSE


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return tokenized_checkpoints(tmp_path_factory, ("qwen35", "llama-gqa-bias"), seed=23, max_position_embeddings=2048)


def _tokens(results):
    return [(r.token_ids, r.finish_reason) for r in results]


def test_hybrid_graph_decode_equals_eager_with_a_sequence_ending_early(checkpoints):
    path = checkpoints["qwen35"]
    prompts = [random_ids(n, seed=70 + n) for n in (9, 30, 17)]
    third = LLM(path).generate([prompts[1]], max_new_tokens=4)[0].token_ids[3]
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [EOS, third]}))
    try:
        eager, graphs = LLM(path), LLM(path, cuda_graphs=True)
    finally:
        (path / "generation_config.json").unlink()
    want = eager.generate(prompts, max_new_tokens=10)
    got = graphs.generate(prompts, max_new_tokens=10)
    assert _tokens(got) == _tokens(want)
    assert want[1].finish_reason == "eos" and len(want[1].token_ids) == 3  # it stopped while the others went on
    assert graphs.last_stats.decode_tokens == eager.last_stats.decode_tokens
    on_gpu = graphs.loaded.device.type == "cuda"
    assert graphs.last_stats.decode_path == ("cuda graph" if on_gpu else "graph step")
    assert eager.last_stats.decode_path == "eager"


@pytest.mark.parametrize("offload", [None, "cpu"])
def test_block_sparse_graph_decode_equals_eager(checkpoints, offload):
    """Past the dense length, across block boundaries, with the KV in the GPU-resident block cache or offloaded."""
    path = checkpoints["llama-gqa-bias"]
    prompts = [random_ids(n, seed=80 + n) for n in (70, 101)]
    kwargs = dict(attention="sparse", sparse_attention_config=SMALL, offload=offload)
    want = LLM(path, **kwargs).generate(prompts, max_new_tokens=24)
    got = LLM(path, cuda_graphs=True, **kwargs).generate(prompts, max_new_tokens=24)
    assert _tokens(got) == _tokens(want)


def test_generate_cli_takes_the_flag(checkpoints, capsys):
    path = checkpoints["llama-gqa-bias"]
    argv = ["generate", "--model", str(path), "--prompt", "w1 w2 w3", "--max-new-tokens", "3"]
    assert cli.main(argv + ["--cuda-graphs"]) == 0
    with_graphs = capsys.readouterr().out
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == with_graphs


def test_eager_decode_on_a_gpu_earns_a_hint():
    hint = generate_cli.eager_decode_hint
    stats = SimpleNamespace(decode_path="eager", decode_tokens=generate_cli.EAGER_HINT_TOKENS)
    assert hint(stats, "cuda") == generate_cli.EAGER_HINT
    assert hint(stats, "cpu") is None
    assert hint(SimpleNamespace(decode_path="cuda graph", decode_tokens=99), "cuda") is None
    assert hint(SimpleNamespace(decode_path="eager", decode_tokens=3), "cuda") is None
