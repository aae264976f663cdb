"""Forecast projections (SparDA, sparda-notes §2.2): per attention layer, one linear map that forecasts which KV
blocks the *next* attention layer will read, kept as a small adapter beside a base checkpoint.

For the attention layers ``a_0 < a_1 < … < a_n`` of a model (every layer of a Llama; the full-attention layers of a
hybrid):

* ``forecast.{a_i}.weight [Hkv·d, hidden]`` (``i < n``) reads layer ``a_i``'s attention input ``x`` (after its input
  norm: what ``q_proj`` reads) and gives ``F = RoPE(W x)`` as ``[T, Hkv, d]``: one vector per GQA group, rotated at
  the token's position like a query, scored against layer ``a_{i+1}``'s compressed keys.
* ``forecast_current.{a_0}.weight``: the first attention layer has no earlier forecast; ``RoPE(W x_{a_0})`` scores its
  own compressed keys (the notes' ``F_0^cur``).

On disk an adapter is a folder with ``forecast.safetensors`` (those tensors) and ``forecast.json`` (the fields of
:class:`ForecastConfig`). The rotation is part of the definition (``"rotary": true`` in the JSON): compressed keys
are averages of rotated keys, and a rotated forecast scores them by relative position as the next layer's queries do.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .._optional import require
from ..ops.sparse_attn.config import SparseAttentionConfig
from .config import BaseConfig
from .layers import apply_rotary

WEIGHTS_FILE = "forecast.safetensors"
CONFIG_FILE = "forecast.json"
STORE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""Weight dtypes an adapter file may be written in (loading always yields float32 unless asked otherwise)."""


@dataclass(frozen=True)
class ForecastConfig:
    """What an adapter is for.

    ``base_model``: name of the base checkpoint (informative; compatibility is checked on the geometry).
    ``attention_layers``: every attention layer of the base model, ascending. ``layers``: those that forecast the
    next attention layer (all but the last). ``current_layer``: the first, which also forecasts itself.
    ``num_hidden_layers``, ``hidden_size``, ``num_kv_heads``, ``head_dim``: the base model's geometry.
    ``sparse_config``: the block-selection geometry the projections were trained for
    (:class:`~longsparse.ops.sparse_attn.SparseAttentionConfig` fields), or None. ``training``: free-form record of how
    they were trained.
    """

    base_model: str
    attention_layers: tuple[int, ...]
    num_hidden_layers: int
    hidden_size: int
    num_kv_heads: int
    head_dim: int
    layers: tuple[int, ...] = ()
    current_layer: int = 0
    rotary: bool = True
    sparse_config: dict[str, int] | None = None
    training: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "attention_layers", tuple(int(a) for a in self.attention_layers))
        object.__setattr__(self, "layers", tuple(int(a) for a in self.layers))
        for name in ("num_hidden_layers", "hidden_size", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        att = self.attention_layers
        if not att or list(att) != sorted(set(att)) or att[0] < 0 or att[-1] >= self.num_hidden_layers:
            raise ValueError(
                f"attention_layers must be distinct ascending layer indices below num_hidden_layers="
                f"{self.num_hidden_layers}, got {list(att)}"
            )
        if self.layers != att[:-1]:
            raise ValueError(
                f"layers must be every attention layer but the last, {list(att[:-1])}, got {list(self.layers)}"
            )
        if self.current_layer != att[0]:
            raise ValueError(f"current_layer must be the first attention layer {att[0]}, got {self.current_layer}")
        if self.rotary is not True:
            raise ValueError("only rotary forecasts (rotary=true) are defined")
        if self.sparse_config is not None:
            SparseAttentionConfig(**self.sparse_config)

    @classmethod
    def for_model(cls, config: BaseConfig, base_model: str, **extra) -> ForecastConfig:
        """The adapter layout for a model with ``config`` (its attention layers, GQA geometry)."""
        att = config.attention_layers
        return cls(
            base_model=base_model,
            attention_layers=att,
            num_hidden_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            layers=att[:-1],
            current_layer=att[0],
            **extra,
        )

    def check_matches(self, config: BaseConfig) -> None:
        """ValueError naming every geometry field in which the adapter and a base model's ``config`` differ."""
        ours = (self.attention_layers, self.num_hidden_layers, self.hidden_size, self.num_kv_heads, self.head_dim)
        theirs = (
            config.attention_layers,
            config.num_hidden_layers,
            config.hidden_size,
            config.num_key_value_heads,
            config.head_dim,
        )
        names = ("attention_layers", "num_hidden_layers", "hidden_size", "num_kv_heads", "head_dim")
        diffs = [f"{n}: adapter {a}, model {b}" for n, a, b in zip(names, ours, theirs) if a != b]
        if diffs:
            raise ValueError(f"forecast adapter for {self.base_model!r} does not fit this model ({'; '.join(diffs)})")

    def source_of(self, target: int) -> int:
        """The attention layer whose input forecasts ``target``'s blocks (``target`` itself for the first)."""
        if target not in self.attention_layers:
            raise ValueError(
                f"layer {target} is not an attention layer of this adapter ({list(self.attention_layers)})"
            )
        i = self.attention_layers.index(target)
        return target if i == 0 else self.attention_layers[i - 1]

    def to_json(self) -> dict:
        data = asdict(self)
        data["attention_layers"] = list(self.attention_layers)
        data["layers"] = list(self.layers)
        return data


class ForecastProjections(nn.Module):
    """The projections of one adapter: ``forecast[str(a_i)]`` and ``forecast_current[str(a_0)]``, each an
    ``nn.Linear(hidden, Hkv·d, bias=False)`` (parameter names ``forecast.{layer}.weight``,
    ``forecast_current.{layer}.weight``)."""

    def __init__(self, config: ForecastConfig):
        super().__init__()
        self.config = config
        out = config.num_kv_heads * config.head_dim

        def linear() -> nn.Linear:
            return nn.Linear(config.hidden_size, out, bias=False)

        self.forecast = nn.ModuleDict({str(a): linear() for a in config.layers})
        self.forecast_current = nn.ModuleDict({str(config.current_layer): linear()})

    def projection_for(self, target: int) -> nn.Linear:
        """The projection whose output selects ``target``'s blocks."""
        source = self.config.source_of(target)
        return self.forecast_current[str(source)] if source == target else self.forecast[str(source)]

    def forward(self, target: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Forecast vectors ``[T, Hkv, d]`` for attention layer ``target``'s block selection.

        ``x [T, hidden]``: the attention input of ``config.source_of(target)`` at the T query positions;
        ``cos, sin [T, rotary_dim]``: the model's RoPE tables at those positions."""
        if x.dim() != 2 or x.shape[-1] != self.config.hidden_size:
            raise ValueError(f"x must be [T, hidden={self.config.hidden_size}], got {list(x.shape)}")
        f = self.projection_for(target)(x).view(x.shape[0], self.config.num_kv_heads, self.config.head_dim)
        return apply_rotary(f, cos, sin)

    def save(self, directory: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
        """Write ``forecast.safetensors`` (weights in ``dtype``) and ``forecast.json`` into ``directory``."""
        safetensors_torch = require("safetensors.torch", "saving a forecast adapter")
        if dtype not in STORE_DTYPES.values():
            raise ValueError(f"dtype must be one of {', '.join(STORE_DTYPES)}, got {dtype}")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {name: p.detach().to("cpu", dtype).contiguous() for name, p in self.state_dict().items()}
        safetensors_torch.save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
        (directory / CONFIG_FILE).write_text(json.dumps(self.config.to_json(), indent=2) + "\n")
        return directory

    @classmethod
    def load(
        cls, path: str | Path, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32
    ) -> ForecastProjections:
        """Read an adapter folder (or its ``forecast.json``); every tensor must be present with its shape."""
        safetensors_torch = require("safetensors.torch", "loading a forecast adapter")
        path = Path(path)
        directory = path.parent if path.name == CONFIG_FILE else path
        config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
        if not config_path.is_file() or not weights_path.is_file():
            raise FileNotFoundError(f"a forecast adapter folder holds {CONFIG_FILE} and {WEIGHTS_FILE}: {directory}")
        try:
            raw = json.loads(config_path.read_text())
            config = ForecastConfig(**raw)
        except (json.JSONDecodeError, TypeError) as exc:
            raise ValueError(f"{config_path} is not a forecast adapter config: {exc}") from exc
        module = cls(config)
        tensors = safetensors_torch.load_file(str(weights_path))
        expected = module.state_dict()
        missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
        if missing or unexpected:
            raise ValueError(f"{weights_path}: missing tensors {missing}, unexpected tensors {unexpected}")
        for name, t in tensors.items():
            if t.shape != expected[name].shape:
                raise ValueError(
                    f"{weights_path}: {name} has shape {list(t.shape)}, expected {list(expected[name].shape)}"
                )
        module.load_state_dict({k: v.float() for k, v in tensors.items()})
        return module.to(device=device, dtype=dtype)


def attention_input_scale(layer: nn.Module) -> torch.Tensor:
    """``[hidden]`` float32 effective weight of a decoder layer's input RMSNorm (``1 + w`` for zero-centred norms)."""
    norm = layer.input_layernorm
    w = norm.weight.detach().float()
    return 1.0 + w if norm.zero_centered else w


def query_weights(attn: nn.Module) -> torch.Tensor:
    """``[H, D, hidden]`` float32 query rows of an attention layer (the gate rows of an output-gated ``q_proj`` left
    out)."""
    H, D = attn.num_heads, attn.head_dim
    w = attn.q_proj.weight.detach().float()
    if attn.output_gate:
        return w.view(H, 2 * D, -1)[:, :D]
    return w.view(H, D, -1)


def init_from_queries(projections: ForecastProjections, model: nn.Module) -> None:
    """Start each forecast at the target layer's query map averaged over each GQA group, rescaled to read the source
    layer's normalised input: ``W = mean_g Wq_t[g] · diag(w_t / w_s)`` with ``w`` the input-norm weights, so that
    ``W x_s = mean_g Wq_t[g] (w_t ⊙ x̂_s)`` is the target layer's mean query applied to the source layer's
    normalised residual stream (InfiniGen's premise that adjacent layers' inputs are close). ``forecast_current``
    starts at its own layer's mean query exactly. A channel whose source norm weight is exactly 0 carries no signal
    and gets weight 0. q/k norms (Qwen3, Qwen3.5) are not part of a forecast, so there the start is approximate."""
    cfg = projections.config
    layers = model.model.layers
    with torch.no_grad():
        for target in cfg.attention_layers:
            source = cfg.source_of(target)
            attn = layers[target].mixer
            q = query_weights(attn)
            mean_q = q.view(cfg.num_kv_heads, q.shape[0] // cfg.num_kv_heads, cfg.head_dim, -1).mean(dim=1)
            w_t, w_s = attention_input_scale(layers[target]), attention_input_scale(layers[source])
            ratio = torch.where(w_s == 0, torch.zeros_like(w_s), w_t / torch.where(w_s == 0, 1.0, w_s))
            weight = projections.projection_for(target).weight
            weight.copy_((mean_q.reshape(-1, cfg.hidden_size) * ratio).to(weight.dtype))


def init_random(projections: ForecastProjections, seed: int) -> None:
    """Every projection ``N(0, 1/hidden)`` from ``seed`` (a forecast that knows nothing)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(projections.named_parameters()):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32) / p.shape[-1] ** 0.5
            p.copy_(noise.to(p.dtype))
