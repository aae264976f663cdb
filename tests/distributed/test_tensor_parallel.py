"""Tensor parallelism over gloo on the CPU, tiny Qwen3.5 hybrids (written by transformers' own classes) on 2 ranks:
every rank gives the single-process logits — a 300-token prefill (five GDN chunks, block-sparse past 64 tokens) and
four decode steps — in each GDN mode (dense, sparse) and attention mode (dense, sparse, sparda with a random
Forecast), with the KV heads split (2 heads) and replicated (1 head); each rank reads only its share of the
checkpoint's bytes."""

import pytest
import torch

from longsparse.distributed import TensorParallel
from tests.distributed.workers import Run, assert_each_rank_read_its_share, model_steps, spawn
from tests.helpers import SMALL_BLOCK_SPARSE, rel_err
from tests.tiny_models import build, random_ids, save

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


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """{case: (single-process outputs, [outputs of each rank])} from one spawn of the ranks for both cases."""
    folders = {
        "kv-split": save(build("qwen35", seed=5, **TWO_PAIRS_PER_RANK), tmp_path_factory.mktemp("kv-split")),
        "kv-replicated": save(build("qwen35", seed=6, num_key_value_heads=1), tmp_path_factory.mktemp("kv-repl")),
    }
    ids, forced = random_ids(300, seed=7), random_ids(4, seed=8)
    jobs = [(folders[case], RUNS[case], ids, forced, SMALL_BLOCK_SPARSE) for case in RUNS]
    per_rank = spawn(run_cases, RANKS, tmp_path_factory.mktemp("ranks"), jobs)
    single = run_cases(TensorParallel(), jobs)
    return {case: (single[i], [ranks[i] for ranks in per_rank]) for i, case in enumerate(RUNS)}


def run_cases(parallel, jobs):
    return [model_steps(parallel, *job) for job in jobs]


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
