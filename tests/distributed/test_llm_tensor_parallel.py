"""Tensor parallelism over gloo on the CPU with tiny Qwen3.5 hybrids (written by transformers' own classes) on 2 ranks,
all through one ``LLM(tensor_parallel_size=2)`` — one group of worker processes for the whole module:

* every rank gives the single-process logits — a 300-token prefill (five GDN chunks, block-sparse past 64 tokens)
  and four decode steps — in each GDN mode (dense, sparse) and attention mode (dense, sparse, sparda with a random
  Forecast), with the KV heads split (2 heads) and replicated (1 head), and reads only its share of the checkpoint's
  bytes (the ranks load each case's model through ``LLM.collective_rpc``);
* the group's own model (sparse GDN, SparDA over the offloaded cache, each rank pinning its own share of the host,
  decode through the static-buffer step a GPU captures as a graph) generates the single-process greedy tokens, and
  streams them; a request refused on every rank raises on the driver and the workers go on;
* ``longsparse serve``'s app over it answers a completion with the single-process greedy text;
* a rank that fails mid-request ends that request with a 500 error body naming the rank's error; the engine is then
  dead: ``/health`` and later requests answer 503, and every worker has ended. (Last: it ends the group.)"""

import pytest
import torch

from longsparse import LLM
from longsparse.distributed import TensorParallel
from longsparse.engine.scheduler import SchedulerConfig
from tests.distributed.faulty import break_prefill
from tests.distributed.workers import Run, assert_each_rank_read_its_share, llm_model_steps, model_steps
from tests.helpers import SMALL_BLOCK_SPARSE, rel_err
from tests.serve.conftest import serve
from tests.tiny_models import build, random_ids, save, write_tokenizer

httpx = pytest.importorskip("httpx")

pytestmark = pytest.mark.slow

RANKS = 2
TOL = 1e-5
"""float32, the same sums in another order (each rank's partial sums, then the all-reduce)."""
RUNS = {
    "kv-split": [Run("dense", "dense"), Run("sparse", "sparse"), Run("sparse", "sparda", forecast_seed=0)],
    "kv-replicated": [Run("dense", "dense"), Run("dense", "sparda", forecast_seed=1)],
}
TWO_PAIRS_PER_RANK = dict(linear_num_key_heads=4, linear_num_value_heads=8)
"""GDN heads such that SparseGDN's tier split weighs pairs on each rank and across ranks."""
SPLIT = ("proj", "conv1d", "dt_bias", "A_log", "embed_tokens", "lm_head")
"""Checkpoint tensors the ranks split (every other tensor, the norms, is read whole by each rank)."""
OPTIONS = dict(gdn="sparse", attention="sparda", forecast="random", offload="cpu", cuda_graphs=True,
               sparse_attention_config=SMALL_BLOCK_SPARSE)  # fmt: skip
PROMPTS = [random_ids(150, seed=1), random_ids(77, seed=2), random_ids(9, seed=3)]
NEW_TOKENS = 12
SERVED = "tiny-tp"
SERVE_CONFIG = SchedulerConfig(max_num_seqs=2, max_model_len=256, max_num_batched_tokens=64, max_queued_requests=4)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    folders = {
        "kv-split": save(build("qwen35", seed=5, **TWO_PAIRS_PER_RANK), tmp_path_factory.mktemp("kv-split")),
        "kv-replicated": save(build("qwen35", seed=6, num_key_value_heads=1), tmp_path_factory.mktemp("kv-repl")),
    }
    write_tokenizer(folders["kv-split"])
    return folders


@pytest.fixture(scope="module")
def group(folders):
    with LLM(folders["kv-split"], tensor_parallel_size=RANKS, **OPTIONS) as llm:
        yield llm


@pytest.fixture(scope="module")
def single(folders):
    return LLM(folders["kv-split"], **OPTIONS)


@pytest.fixture(scope="module")
def results(folders, group):
    """{case: (single-process outputs, [outputs of each rank])}."""
    ids, forced = random_ids(300, seed=7), random_ids(4, seed=8)
    out = {}
    for case, runs in RUNS.items():
        job = (folders[case], runs, ids, forced, SMALL_BLOCK_SPARSE)
        out[case] = model_steps(TensorParallel(), *job), group.collective_rpc(llm_model_steps, *job)
    return out


@pytest.mark.parametrize(
    "case, run", [(case, run) for case, runs in RUNS.items() for run in runs], ids=lambda x: getattr(x, "name", x)
)
def test_every_rank_gives_the_single_process_logits(results, case, run):
    single, ranks = results[case]
    reference = single[run.name]
    assert reference.shape == (304, 101) and torch.isfinite(reference).all()
    for rank, out in enumerate(ranks):
        assert out[run.name].shape == reference.shape
        assert rel_err(out[run.name], reference) <= TOL, f"rank {rank}"
    assert torch.equal(ranks[0][run.name], ranks[1][run.name])


@pytest.mark.parametrize("case", RUNS)
def test_each_rank_reads_only_its_share_of_the_checkpoint(results, case):
    single, ranks = results[case]

    def split(name):
        if case == "kv-replicated" and ("k_proj" in name or "v_proj" in name):
            return False  # one KV head, held by both ranks
        return any(part in name for part in SPLIT)

    assert_each_rank_read_its_share(single["bytes_read"], [r["bytes_read"] for r in ranks], split)
    total = sum(single["bytes_read"].values())
    assert all(sum(r["bytes_read"].values()) < 0.6 * total for r in ranks)


def test_two_ranks_generate_the_single_process_tokens(group, single):
    expected = single.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
    streamed = []
    assert group.config == single.config
    out = group.generate(PROMPTS[:1], max_new_tokens=NEW_TOKENS, stream=lambda i, text: streamed.append(text))
    assert out[0].token_ids == expected[0].token_ids and "".join(streamed) == expected[0].text
    out = group.generate(PROMPTS, max_new_tokens=NEW_TOKENS)
    stats = group.last_stats
    with pytest.raises(ValueError, match="more than the model's context of 256"):
        group.generate([random_ids(300, seed=4)], max_new_tokens=4)
    assert group.generate(PROMPTS[2:], max_new_tokens=4)[0].token_ids == expected[2].token_ids[:4]
    assert [g.token_ids for g in out] == [g.token_ids for g in expected]
    assert all(len(g.token_ids) > 1 for g in out)
    assert len(streamed) > 1 and expected[0].text
    assert stats.tensor_parallel_size == 2 and "tensor parallel 2 ranks" in stats.summary()
    whole = single.last_stats.kv_bytes.gpu + single.last_stats.kv_bytes.host
    held = stats.kv_bytes.gpu + stats.kv_bytes.host
    assert whole // 2 <= held < 0.51 * whole  # two KV heads, one a rank (and a few bytes of bookkeeping each)
    assert stats.kv_bytes.host > 0 and stats.block_hit_rate is not None
    assert stats.decode_path == "graph step" and stats.keep_ratio is not None


def test_two_ranks_serve_the_single_process_greedy_text(group, single):
    prompt = "w1 w2 w3 w4 w5 w6 w7 w8 w9"
    expected = single.generate([prompt], max_new_tokens=8)[0]
    for live in serve(group, SERVE_CONFIG, SERVED):
        body = {"model": SERVED, "prompt": prompt, "max_tokens": 8, "temperature": 0}
        response = httpx.post(live.url + "/v1/completions", json=body, timeout=120)
        assert response.status_code == 200
        choice = response.json()["choices"][0]
        assert choice["text"] == expected.text and expected.text
        assert response.json()["usage"]["completion_tokens"] == len(expected.token_ids)


def test_a_rank_that_fails_mid_request_answers_500_and_ends_the_engine(group):
    for live in serve(group, SERVE_CONFIG, SERVED):
        group.collective_rpc(break_prefill, 1)  # the engine thread is idle: nothing else talks to the workers
        body = {"model": SERVED, "prompt": "w1 w2 w3", "max_tokens": 4, "temperature": 0}
        failed = httpx.post(live.url + "/v1/completions", json=body, timeout=120)
        assert failed.status_code == 500
        message = failed.json()["error"]["message"]
        assert "RankFailure" in message and "rank 1 failed: RuntimeError: rank 1 lost its device" in message
        assert httpx.get(live.url + "/health").status_code == 503
        refused = httpx.post(live.url + "/v1/completions", json=body, timeout=120)
        assert refused.status_code == 503 and "rank 1 failed" in refused.json()["error"]["message"]
    assert not group.workers.alive and all(not p.is_alive() for p in group.workers._processes)
