"""Supported architectures: how to read each one's config, which model class runs it and how its checkpoint names
map onto our parameters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .base import CausalLM
from .config import BaseConfig, decoder_config_from_hf, hybrid_config_from_hf
from .hybrid import Qwen35ForCausalLM
from .llama import LlamaForCausalLM


@dataclass(frozen=True)
class Architecture:
    """One ``architectures`` entry of ``config.json``.

    ``text_config_key``: where the text model's settings are (``"text_config"`` for multimodal checkpoints), or
    ``None`` for the top level. ``weight_prefixes``: ``(checkpoint prefix, our prefix)`` pairs, tried in order.
    ``ignored_prefixes``: checkpoint tensors this text-only model deliberately skips (vision tower, multi-token
    prediction head).
    """

    name: str
    parse: Callable[[dict, str, str], BaseConfig]
    model_class: type[CausalLM]
    text_config_key: str | None = None
    weight_prefixes: tuple[tuple[str, str], ...] = (("", ""),)
    ignored_prefixes: tuple[str, ...] = ()

    def config_from_hf(self, raw: dict, where: str = "config.json") -> BaseConfig:
        if self.text_config_key is None:
            return self.parse(raw, self.name, where)
        text = raw.get(self.text_config_key)
        if not isinstance(text, dict):
            raise ValueError(f"{where}: {self.name} needs a '{self.text_config_key}' object")
        text = dict(text)
        if "tie_word_embeddings" in raw:
            text["tie_word_embeddings"] = raw["tie_word_embeddings"]
        return self.parse(text, self.name, f"{where} ({self.text_config_key})")

    def map_name(self, name: str) -> str | None:
        """Our parameter name for checkpoint tensor ``name``; ``""`` if it is deliberately ignored, ``None`` if no
        prefix matches (an unexpected tensor)."""
        if name.startswith(self.ignored_prefixes):
            return ""
        for src, dst in self.weight_prefixes:
            if name.startswith(src):
                return dst + name[len(src) :]
        return None


_QWEN35_IGNORED = ("mtp.", "model.visual.")

ARCHITECTURES: dict[str, Architecture] = {
    a.name: a
    for a in (
        Architecture("LlamaForCausalLM", decoder_config_from_hf, LlamaForCausalLM),
        Architecture("Qwen2ForCausalLM", decoder_config_from_hf, LlamaForCausalLM),
        Architecture("Qwen3ForCausalLM", decoder_config_from_hf, LlamaForCausalLM),
        Architecture("MiniCPMForCausalLM", decoder_config_from_hf, LlamaForCausalLM),
        Architecture("Qwen3_5ForCausalLM", hybrid_config_from_hf, Qwen35ForCausalLM, ignored_prefixes=_QWEN35_IGNORED),
        Architecture(
            "Qwen3_5ForConditionalGeneration",
            hybrid_config_from_hf,
            Qwen35ForCausalLM,
            text_config_key="text_config",
            weight_prefixes=(("model.language_model.", "model."), ("lm_head.", "lm_head.")),
            ignored_prefixes=_QWEN35_IGNORED,
        ),
    )
}

# GGUF files name a llama.cpp architecture in their metadata; transformers' reader reports it as ``model_type``.
GGUF_MODEL_TYPES: dict[str, str] = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def supported_architectures() -> list[str]:
    return sorted(ARCHITECTURES)


def find_architecture(raw: dict, where: str = "config.json") -> Architecture:
    """The :class:`Architecture` named by ``raw["architectures"]``; ValueError listing the supported ones if none is."""
    names = raw.get("architectures") or []
    if isinstance(names, str):
        names = [names]
    for name in names:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    listed = ", ".join(names) if names else "none"
    raise ValueError(
        f"{where}: unsupported architecture ({listed}); supported architectures: {', '.join(supported_architectures())}"
    )
