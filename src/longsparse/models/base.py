"""What every causal LM here shares: embeddings → decoder layers → final norm → LM head, over a packed batch."""

from __future__ import annotations

import torch
from torch import nn

from .attention import make_attention_backend
from .batch import ForwardBatch
from .config import BaseConfig
from .forecast import ForecastProjections
from .gdn import make_gdn_core
from .layers import Attention, GatedDeltaNet, RotaryEmbedding
from .modes import ExecutionModes


class TextModel(nn.Module):
    """Hugging Face's ``model.*`` module: ``embed_tokens``, ``layers``, ``norm``."""

    def __init__(self, embed_tokens: nn.Embedding, layers: list[nn.Module], norm: nn.Module):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.layers = nn.ModuleList(layers)
        self.norm = norm


class CausalLM(nn.Module):
    """Base of the decoders. Subclasses build ``self.model`` (a :class:`TextModel`) and call :meth:`_finish`.

    ``forward(input_ids [T], batch) -> hidden [T, hidden_size]`` (after the final norm);
    ``compute_logits(hidden [N, hidden_size]) -> [N, vocab_size]`` in float32. ``forecast``: the Forecast projections
    attached with :meth:`attach_forecast` (None without an adapter), read by SparDA attention.
    """

    config: BaseConfig
    model: TextModel

    def _finish(self, config: BaseConfig) -> None:
        self.config = config
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = RotaryEmbedding(config.rope)
        self.modes = ExecutionModes()
        self.forecast: ForecastProjections | None = None
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the embedding matrix with the LM head when the config ties them (again after materialising)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def attach_forecast(self, projections: ForecastProjections) -> None:
        """Attach a Forecast adapter (ValueError if it was made for another geometry), frozen, on the model's device
        and in its dtype."""
        projections.config.check_matches(self.config)
        weight = self.lm_head.weight
        self.forecast = projections.to(device=weight.device, dtype=weight.dtype).requires_grad_(False).eval()

    def set_modes(self, modes: ExecutionModes, sparse_gdn_config=None) -> None:
        """Choose each layer's execution mode (see :mod:`longsparse.models.modes`); raises if a mode is unavailable."""
        modes.check_layers(self.config.layer_types)
        for i, layer in enumerate(self.model.layers):
            mixer = layer.mixer
            mode = modes.for_layer(i, self.config.layer_types[i])
            if isinstance(mixer, GatedDeltaNet):
                mixer.core = make_gdn_core(mode, sparse_gdn_config)
            elif isinstance(mixer, Attention):
                mixer.backend = make_attention_backend(mode)
        self.modes = modes

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(self, input_ids: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        if input_ids.dim() != 1 or input_ids.shape[0] != batch.offsets[-1]:
            raise ValueError(
                f"input_ids must be the packed [T] tokens of the batch (T={batch.offsets[-1]}), "
                f"got shape {list(input_ids.shape)}"
            )
        h = self.embed(input_ids)
        cos, sin = self.rotary(batch.positions)
        for layer in self.model.layers:
            h = layer(h, cos, sin, batch)
        return self.model.norm(h)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
