"""``LLM(tensor_parallel_size=2)`` on the CPU (two gloo worker processes) with a tiny Qwen3.5 hybrid generates the
single-process greedy tokens: sparse GDN with SparDA attention through the static-buffer decode step
(``cuda_graphs=True``, what a GPU captures as a graph), and dense GDN with InfLLM-V2 attention over the offloaded
cache, each rank pinning its own share of the host. A request refused on every rank raises on the driver and the
workers go on. (The logits of every mode, rank by rank, are test_tensor_parallel.py's.)"""

import pytest

from longsparse import LLM
from tests.helpers import SMALL_BLOCK_SPARSE
from tests.tiny_models import build, random_ids, save, write_tokenizer

pytestmark = pytest.mark.slow

TWO_PAIRS_PER_RANK = dict(linear_num_key_heads=4, linear_num_value_heads=8)
SETTINGS = {
    "gdn-sparse-sparda-graph-step": dict(gdn="sparse", attention="sparda", forecast="random", cuda_graphs=True),
    "gdn-dense-sparse-offloaded": dict(gdn="dense", attention="sparse", offload="cpu"),
}
PROMPTS = [random_ids(150, seed=1), random_ids(77, seed=2), random_ids(9, seed=3)]
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = save(build("qwen35", seed=5, **TWO_PAIRS_PER_RANK), tmp_path_factory.mktemp("tiny-qwen35"))
    write_tokenizer(folder)
    return folder


@pytest.mark.parametrize("setting", SETTINGS)
def test_two_ranks_generate_the_single_process_tokens(folder, setting):
    options = dict(SETTINGS[setting], sparse_attention_config=SMALL_BLOCK_SPARSE)
    single = LLM(folder, **options)
    expected = single.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
    streamed = []
    with LLM(folder, tensor_parallel_size=2, **options) as llm:
        assert llm.config == single.config
        out = llm.generate(PROMPTS[:1], max_new_tokens=NEW_TOKENS, stream=lambda i, text: streamed.append(text))
        assert out[0].token_ids == expected[0].token_ids and "".join(streamed) == expected[0].text
        out = llm.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
        stats = llm.last_stats
        with pytest.raises(ValueError, match="more than the model's context of 256"):
            llm.generate([random_ids(300, seed=4)], max_new_tokens=4)
        assert llm.generate(PROMPTS[2:], max_new_tokens=4)[0].token_ids == expected[2].token_ids[:4]
    assert [g.token_ids for g in out] == [g.token_ids for g in expected]
    assert all(len(g.token_ids) > 1 for g in out)
    assert len(streamed) > 1 and expected[0].text
    assert stats.tensor_parallel_size == 2 and "tensor parallel 2 ranks" in stats.summary()
    whole = single.last_stats.kv_bytes.gpu + single.last_stats.kv_bytes.host
    held = stats.kv_bytes.gpu + stats.kv_bytes.host
    assert whole // 2 <= held < 0.51 * whole  # two KV heads, one a rank (and a few bytes of bookkeeping each)
    if options.get("offload"):
        assert stats.kv_bytes.host > 0 and stats.block_hit_rate is not None
    else:
        assert stats.decode_path == "graph step" and stats.keep_ratio is not None
