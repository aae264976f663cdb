"""Our decoders give transformers' logits (fp32, relative error <= 1e-4) on tiny random checkpoints that
transformers itself wrote: full prefill, prefill followed by decode steps, and batches of different lengths."""

import pytest
import torch

from longsparse.engine import ModelRunner, allocate_caches
from longsparse.models import load_model
from tests.helpers import rel_err
from tests.tiny_models import CASES, build, random_ids, reference_logits, save

TOL = 1e-4


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """case -> (transformers model, our loaded model); written and loaded once per module."""
    out = {}
    for i, case in enumerate(CASES):
        hf = build(case, seed=i)
        path = save(hf, tmp_path_factory.mktemp(case))
        out[case] = (hf, load_model(path))
    return out


@pytest.mark.parametrize("case", CASES)
def test_prefill_logits_match_transformers(checkpoints, case):
    hf, ours = checkpoints[case]
    ids = random_ids(131 if case == "qwen35" else 37, seed=1)  # 131: three GDN chunks, the last one partial
    ref = reference_logits(hf, ids)
    out = ModelRunner(ours.model).prefill([ids], all_logits=True).logits
    assert out.shape == ref.shape
    assert rel_err(out, ref) <= TOL


@pytest.mark.parametrize("case", CASES)
def test_decode_steps_match_transformers_cached_decoding(checkpoints, case):
    """Prefill 67 tokens (past one GDN chunk), then 6 decode steps; transformers decodes the same way with its cache."""
    hf, ours = checkpoints[case]
    ids = random_ids(73, seed=2)
    prompt = 67
    with torch.no_grad():
        out = hf(torch.tensor([ids[:prompt]]), use_cache=True)
        refs = [out.logits[0, -1]]
        cache = out.cache
        for t in range(prompt, len(ids)):
            out = hf(torch.tensor([[ids[t]]]), cache=cache, use_cache=True)
            refs.append(out.logits[0, -1])
    runner = ModelRunner(ours.model)
    kv, states = allocate_caches(ours.config, 1, len(ids), torch.float32, "cpu")
    got = [runner.prefill([ids[:prompt]], kv_cache=kv, gdn_states=states).logits[0]]
    for t in range(prompt, len(ids)):
        got.append(runner.decode([ids[t]], prefix_lens=[t], slots=[0], kv_cache=kv, gdn_states=states).logits[0])
    for step, (a, b) in enumerate(zip(got, refs)):
        assert rel_err(a, b) <= TOL, f"step {step}"


@pytest.mark.parametrize("case", ["llama-gqa-bias", "qwen35"])
def test_batch_of_different_lengths_matches_one_by_one(checkpoints, case):
    """Three sequences (13, 70, 29 prompt tokens) prefilled in one packed step, then decoded together for 5 steps,
    in slots out of order; each must match transformers run on that sequence alone."""
    hf, ours = checkpoints[case]
    lengths, steps, slots = [13, 70, 29], 5, [2, 0, 1]
    seqs = [random_ids(n + steps, seed=10 + i) for i, n in enumerate(lengths)]
    refs = [reference_logits(hf, s) for s in seqs]
    runner = ModelRunner(ours.model)
    kv, states = allocate_caches(ours.config, 3, max(lengths) + steps, torch.float32, "cpu")
    first = runner.prefill([s[:n] for s, n in zip(seqs, lengths)], slots=slots, kv_cache=kv, gdn_states=states)
    for i, n in enumerate(lengths):
        assert rel_err(first.logits[i], refs[i][n - 1]) <= TOL, f"prefill of sequence {i}"
    for step in range(steps):
        pos = [n + step for n in lengths]
        out = runner.decode(
            [s[p] for s, p in zip(seqs, pos)], prefix_lens=pos, slots=slots, kv_cache=kv, gdn_states=states
        )
        for i, p in enumerate(pos):
            assert rel_err(out.logits[i], refs[i][p]) <= TOL, f"decode step {step} of sequence {i}"


def test_prefill_after_a_cached_prefix_matches_full_prefill(checkpoints):
    """A second prefill continuing a cached sequence (chunked prefill) gives the full prefill's logits."""
    hf, ours = checkpoints["qwen35"]
    ids = random_ids(90, seed=3)
    ref = reference_logits(hf, ids)
    runner = ModelRunner(ours.model)
    kv, states = allocate_caches(ours.config, 1, len(ids), torch.float32, "cpu")
    runner.prefill([ids[:41]], kv_cache=kv, gdn_states=states)
    out = runner.prefill([ids[41:]], prefix_lens=[41], kv_cache=kv, gdn_states=states, all_logits=True).logits
    assert rel_err(out, ref[41:]) <= TOL
