"""Per-layer execution modes, chosen when a model is loaded.

A GDN layer runs ``dense`` (the chunked gated delta rule) or ``sparse`` (SparseGDN prefill); an attention layer runs
``dense`` (torch SDPA), ``sparse`` (InfLLM-V2-style block-sparse attention) or ``sparda`` (block-sparse attention whose
blocks the previous attention layer's Forecast projection chose; :mod:`longsparse.models.sparse_attention`, geometry
from a ``SparseAttentionConfig``, Forecast weights from :mod:`longsparse.models.forecast`). One mode for every layer of
a kind, or a mapping from layer index to mode (layers it leaves out run ``dense``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..ops.sparse_attn import MINICPM4, TRAINING_FREE, SparseAttentionConfig

GDN_MODES = ("dense", "sparse")
ATTENTION_MODES = ("dense", "sparse", "sparda")


def _check(kind: str, value, allowed: tuple[str, ...]) -> None:
    values = value.values() if isinstance(value, Mapping) else [value]
    for mode in values:
        if mode not in allowed:
            raise ValueError(f"{kind} mode must be one of {', '.join(allowed)}, got {mode!r}")
    if isinstance(value, Mapping):
        for layer in value:
            if not isinstance(layer, int) or layer < 0:
                raise ValueError(f"{kind} modes must be keyed by layer index (int >= 0), got {layer!r}")


@dataclass(frozen=True)
class ExecutionModes:
    """``gdn`` and ``attention``: a mode name for every layer of that kind, or ``{layer_index: mode}``."""

    gdn: str | Mapping[int, str] = "dense"
    attention: str | Mapping[int, str] = "dense"

    def __post_init__(self):
        _check("gdn", self.gdn, GDN_MODES)
        _check("attention", self.attention, ATTENTION_MODES)

    def for_layer(self, layer: int, layer_type: str) -> str:
        """The mode of layer ``layer`` whose type is ``"linear_attention"`` (GDN) or ``"full_attention"``."""
        choice = self.gdn if layer_type == "linear_attention" else self.attention
        if isinstance(choice, Mapping):
            return choice.get(layer, "dense")
        return choice

    def check_layers(self, layer_types: tuple[str, ...]) -> None:
        """ValueError if a per-layer mapping names a layer that does not exist or is of the other kind."""
        kinds = (("gdn", self.gdn, "linear_attention"), ("attention", self.attention, "full_attention"))
        for kind, choice, wanted in kinds:
            if not isinstance(choice, Mapping):
                continue
            for layer in choice:
                if layer >= len(layer_types) or layer_types[layer] != wanted:
                    have = layer_types[layer] if layer < len(layer_types) else "no such layer"
                    raise ValueError(f"{kind} mode given for layer {layer}, which is {have}")


SPARSE_TRAINED_ARCHITECTURES = ("MiniCPMForCausalLM",)
"""Checkpoint classes trained with InfLLM-V2 block-sparse attention (MiniCPM4), whose own geometry is MINICPM4."""


def default_sparse_attention_config(
    architecture: str, trained: SparseAttentionConfig | None = None
) -> SparseAttentionConfig:
    """The geometry ``sparse`` / ``sparda`` layers get when none is given: the one a Forecast adapter records it was
    trained for (``trained``), else MiniCPM4's for the checkpoints trained with it, else ``TRAINING_FREE``."""
    if trained is not None:
        return trained
    return MINICPM4 if architecture in SPARSE_TRAINED_ARCHITECTURES else TRAINING_FREE
