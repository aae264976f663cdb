"""Tiny random checkpoints written by transformers' own model classes, and their reference logits.

transformers is the external reference here: nobody on this project wrote it. Its Qwen3.5 modeling module picks FLA's
Triton kernels at import time whenever ``fla`` is importable — and they fail on CPU — so :func:`import_qwen35` imports
it with ``fla`` blocked (its pure-torch fallbacks then run).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

QWEN35_MODULE = "transformers.models.qwen3_5.modeling_qwen3_5"
EOS = 100  # "<eos>" of the word-level tokenizer of write_tokenizer

TINY = dict(
    vocab_size=101,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)
TINY_GDN = dict(
    num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    linear_conv_kernel_dim=4,
    linear_key_head_dim=8,
    linear_value_head_dim=12,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}

# case id -> (transformers config class, model class, settings on top of TINY)
CASES = {
    "llama-gqa-bias": ("LlamaConfig", "LlamaForCausalLM", dict(attention_bias=True, mlp_bias=True)),
    "llama-tied-llama3rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE),
    ),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "qwen35": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", TINY_GDN),
}


def import_qwen35():
    """transformers' Qwen3.5 modeling module, imported with FLA blocked (see the module docstring)."""
    if QWEN35_MODULE not in sys.modules:
        with pytest.MonkeyPatch.context() as mp:
            mp.setitem(sys.modules, "fla", None)
            importlib.import_module(QWEN35_MODULE)
    return sys.modules[QWEN35_MODULE]


def randomize(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter random, so that no part of the model is an identity or a zero: matrices N(0, 1/fan_in)
    (embeddings N(0, 1/hidden)), vectors (norm weights, biases, A_log, dt_bias) their initial value + N(0, 0.2²).
    Everything comes from ``seed``: GDN's ``A_log``, which transformers initialises as log U(0, 16) from torch's
    global generator (seeded at random per process), is drawn from it afresh, so a seed names one model in every
    run."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("A_log"):
                p.copy_(torch.log(16 * torch.rand(p.shape, generator=gen, dtype=torch.float64)).to(p.dtype))
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(p.dtype)
            if p.dim() >= 2:
                p.copy_(noise / p.shape[-1] ** 0.5)
            else:
                p.add_(0.2 * noise)
    return model


def build(case: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A random transformers model of ``case`` (see :data:`CASES`), float32, eval mode."""
    import transformers

    config_name, model_name, settings = CASES[case]
    if case.startswith("qwen35"):
        import_qwen35()
    config = getattr(transformers, config_name)(**{**TINY, **settings, **overrides})
    model = getattr(transformers, model_name)(config).eval()
    return randomize(model, seed)


def save(model: torch.nn.Module, path: Path, **kwargs) -> Path:
    model.save_pretrained(path, **kwargs)
    return path


def reference_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """``[T, vocab]`` float32 logits of transformers' model on one sequence (full causal forward)."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def random_ids(n: int, seed: int, vocab: int = TINY["vocab_size"]) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def write_tokenizer(path, chat_template=None):
    """A word-level tokenizer over "w0" … "w99" and "<eos>" (ids 0 … 100); decoding joins words with spaces."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(100)} | {"<eos>": EOS}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")
    if chat_template:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(path)


def tokenized_checkpoints(tmp_path_factory, cases, seed: int, **overrides) -> dict[str, Path]:
    """case -> a checkpoint folder of :func:`build` ``(case, seed, eos_token_id=EOS, bos_token_id=None,
    **overrides)`` with :func:`write_tokenizer`'s tokenizer."""
    out = {}
    for case in cases:
        hf = build(case, seed=seed, eos_token_id=EOS, bos_token_id=None, **overrides)
        out[case] = save(hf, tmp_path_factory.mktemp(case))
        write_tokenizer(out[case])
    return out
