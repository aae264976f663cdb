"""SparDA's Forecast projections: one small linear map per attention layer, kept as an adapter next to a base model.

Attention layer ``l`` computes, besides its q, k and v, a forecast of the query of the *next attention layer* ``l'`` (in
a hybrid, the GDN layers in between are skipped), one vector per GQA group (SparDA (Fu et al., arXiv:2606.04511)
Sec. 4.1, Eqs. 3–5)::

    F_t = RoPE_t(W_l x_t)  viewed as [Hkv, d]

``x_t`` is layer ``l``'s attention input (after its input norm: what ``q_proj`` reads), ``W_l [Hkv·d, hidden]`` has
no bias, and ``RoPE_t`` rotates every head as the model rotates its queries at the token's position (partial rotary,
LongRoPE's scale included), so ``F_t · K̃`` — scored against layer ``l'``'s compressed keys, which are means of
rotated keys — depends on relative position like ``q · k`` does. No norm and no scale: the selector ranks the raw
logits. The first attention layer has no predecessor; its own ``forecast_current`` projection selects its blocks.
:func:`forecast_states` is this computation; training and inference both call it.

Adapter folder (what :meth:`ForecastProjections.save` writes and :meth:`ForecastProjections.load` reads):

* ``forecast.safetensors`` — ``forecast.{l}.weight [Hkv·d, hidden]`` for each attention layer ``l`` that forecasts
  the next attention layer (every attention layer but the last in a full adapter), and
  ``forecast_current.{l0}.weight [Hkv·d, hidden]`` for the first attention layer ``l0``.
* ``forecast_config.json`` — ``{"base_model": str, "layers": [l, ...], "head_dim": d, "num_kv_heads": Hkv}``:
  ``layers`` lists the ``forecast.{l}`` indices in ascending order. Optional keys with a meaning (written by
  :meth:`ForecastProjections.for_model` and by training, checked when present): ``hidden_size`` (must match the
  tensors), ``attention_layers`` and ``num_hidden_layers`` (the base model's, compared with the model an adapter is
  loaded into), ``sparse_config`` (the :class:`~longsparse.ops.sparse_attn.SparseAttentionConfig` fields of the
  block selection the weights were trained for; ``CausalLM.set_modes`` uses it when given no geometry) and
  ``training`` (a free-form record of the run: teacher, hyper-parameters, data). Other keys are kept as metadata
  (:attr:`ForecastProjections.metadata`); ``"random_weights": true`` marks weights from
  :meth:`ForecastProjections.random`, which give meaningless selections and serve speed measurements only.

:func:`init_from_queries` gives the untrained starting point of training (each forecast = the next attention layer's
mean query), the baseline a trained adapter must beat.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..ops.sparse_attn.config import SparseAttentionConfig
from .config import BaseConfig
from .layers import apply_rotary

WEIGHTS_FILE = "forecast.safetensors"
CONFIG_FILE = "forecast_config.json"
RANDOM_WEIGHTS_KEY = "random_weights"
RANDOM = "random"
STORE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""Weight dtypes an adapter file may be written in (:meth:`ForecastProjections.save`)."""
_REQUIRED_KEYS = ("base_model", "layers", "head_dim", "num_kv_heads")
_RECORD_KEYS = ("hidden_size", "attention_layers", "num_hidden_layers", "sparse_config", "training")
_NAME = re.compile(r"^(forecast|forecast_current)\.(\d+)\.weight$")


class ForecastError(ValueError):
    """A Forecast adapter that cannot be used as it is: missing or malformed files, or shapes that do not fit."""


def forecast_states(
    weight: torch.Tensor, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, num_kv_heads: int
) -> torch.Tensor:
    """``F [T, Hkv, d]``: ``x [T, hidden] @ weight.T`` (``weight [Hkv·d, hidden]``) per KV head, rotated by the
    model's ``cos, sin [T, rotary_dim]`` like the queries (see the module docstring); in ``x``'s dtype."""
    T = x.shape[0]
    f = (x @ weight.T).view(T, num_kv_heads, weight.shape[0] // num_kv_heads)
    return apply_rotary(f, cos, sin)


def forecast_source(attention_layers: Sequence[int], target: int) -> int:
    """The attention layer whose input forecasts ``target``'s blocks: the attention layer before it in
    ``attention_layers`` (ascending), or ``target`` itself when it is the first (its current-layer projection)."""
    attention_layers = list(attention_layers)
    if target not in attention_layers:
        raise ForecastError(f"layer {target} is not an attention layer ({attention_layers})")
    k = attention_layers.index(target)
    return target if k == 0 else attention_layers[k - 1]


class ForecastProjections(nn.Module):
    """The Forecast weights of one base model: ``forecast[str(l)]`` and ``forecast_current[str(l0)]`` are bias-free
    ``nn.Linear(hidden, Hkv·d)``, so ``state_dict()`` names are the adapter file's (``forecast.3.weight``).

    Args:
        hidden_size, num_kv_heads, head_dim: the base model's.
        layers: attention layers that forecast the next attention layer.
        current_layer: the first attention layer (its same-layer projection), or None for an adapter without one.
        base_model: free text naming the checkpoint the adapter was trained for (reported, not checked).
        attention_layers, num_hidden_layers: the base model's (None: not recorded); :meth:`check_model` compares them.
        sparse_config: the block-selection geometry the weights were trained for (None: not recorded).
        training: a JSON-able record of how the weights were trained (teacher, hyper-parameters, data).
        metadata: further JSON keys, kept as they are.
    """

    def __init__(
        self,
        *,
        hidden_size: int,
        num_kv_heads: int,
        head_dim: int,
        layers: Iterable[int],
        current_layer: int | None,
        base_model: str,
        attention_layers: Iterable[int] | None = None,
        num_hidden_layers: int | None = None,
        sparse_config: SparseAttentionConfig | None = None,
        training: Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
    ):
        super().__init__()
        for name, value in (("hidden_size", hidden_size), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ForecastError(f"{name} must be a positive integer, got {value!r}")
        layers = list(layers)
        if any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in layers) or len(set(layers)) != len(
            layers
        ):
            raise ForecastError(f"layers must be distinct layer indices (int >= 0), got {layers!r}")
        if current_layer is not None and (not isinstance(current_layer, int) or current_layer < 0):
            raise ForecastError(f"current_layer must be a layer index (int >= 0) or None, got {current_layer!r}")
        if not isinstance(base_model, str):
            raise ForecastError(f"base_model must be a string, got {base_model!r}")
        if attention_layers is not None:
            if isinstance(attention_layers, (str, bytes)) or not isinstance(attention_layers, Iterable):
                raise ForecastError(f"attention_layers must be a list of layer indices, got {attention_layers!r}")
            attention_layers = tuple(attention_layers)
            if any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in attention_layers) or list(
                attention_layers
            ) != sorted(set(attention_layers)):
                raise ForecastError(
                    f"attention_layers must be distinct ascending layer indices, got {list(attention_layers)!r}"
                )
        if num_hidden_layers is not None and (
            not isinstance(num_hidden_layers, int) or isinstance(num_hidden_layers, bool) or num_hidden_layers <= 0
        ):
            raise ForecastError(f"num_hidden_layers must be a positive integer or None, got {num_hidden_layers!r}")
        if sparse_config is not None and not isinstance(sparse_config, SparseAttentionConfig):
            raise ForecastError(f"sparse_config must be a SparseAttentionConfig or None, got {sparse_config!r}")
        if training is not None and not isinstance(training, Mapping):
            raise ForecastError(f"training must be a mapping (a JSON object) or None, got {training!r}")
        clash = sorted(set(metadata or {}) & set(_REQUIRED_KEYS + _RECORD_KEYS))
        if clash:
            raise ForecastError(f"metadata may not hold the adapter's own keys {clash}")
        self.hidden_size, self.num_kv_heads, self.head_dim = hidden_size, num_kv_heads, head_dim
        self.base_model = base_model
        self.attention_layers: tuple[int, ...] | None = attention_layers
        self.num_hidden_layers = num_hidden_layers
        self.sparse_config = sparse_config
        self.training = dict(training) if training is not None else None
        self.metadata = dict(metadata or {})
        out = num_kv_heads * head_dim
        self.forecast = nn.ModuleDict({str(i): nn.Linear(hidden_size, out, bias=False) for i in sorted(layers)})
        current = [] if current_layer is None else [current_layer]
        self.forecast_current = nn.ModuleDict({str(i): nn.Linear(hidden_size, out, bias=False) for i in current})

    @property
    def layers(self) -> tuple[int, ...]:
        """Attention layers holding a next-layer projection, ascending."""
        return tuple(sorted(int(i) for i in self.forecast))

    @property
    def current_layer(self) -> int | None:
        return next((int(i) for i in self.forecast_current), None)

    @property
    def random_weights(self) -> bool:
        """True for weights drawn by :meth:`random` (meaningless selections: speed measurements only)."""
        return bool(self.metadata.get(RANDOM_WEIGHTS_KEY, False))

    def next_weight(self, layer: int) -> torch.Tensor:
        """``[Hkv·d, hidden]``: attention layer ``layer``'s forecast of the next attention layer."""
        if str(layer) not in self.forecast:
            raise ForecastError(f"the Forecast adapter has no forecast.{layer}.weight (it holds layers {self.layers})")
        return self.forecast[str(layer)].weight

    def current_weight(self, layer: int) -> torch.Tensor:
        """``[Hkv·d, hidden]``: the first attention layer's forecast of its own blocks."""
        if str(layer) not in self.forecast_current:
            raise ForecastError(
                f"the Forecast adapter has no forecast_current.{layer}.weight "
                f"(its current-layer projection is for layer {self.current_layer})"
            )
        return self.forecast_current[str(layer)].weight

    def weight_for(self, target: int, attention_layers: Sequence[int]) -> torch.Tensor:
        """``[Hkv·d, hidden]``: the weight whose forecast chooses attention layer ``target``'s blocks in a model with
        ``attention_layers`` — ``forecast.{s}`` of the previous attention layer ``s``, or ``forecast_current`` for the
        first (:func:`forecast_source`). Training, the selection-recall evaluation and ``sparda`` attention all pick
        their weight here."""
        source = forecast_source(attention_layers, target)
        return self.current_weight(target) if source == target else self.next_weight(source)

    @classmethod
    def for_model(
        cls,
        config: BaseConfig,
        base_model: str,
        metadata: Mapping[str, Any] | None = None,
        *,
        sparse_config: SparseAttentionConfig | None = None,
        training: Mapping[str, Any] | None = None,
    ):
        """A full adapter for ``config`` (every attention layer but the last, plus the first one's current-layer
        projection) that records the model's attention layers and layer count, with ``nn.Linear``'s default
        initialisation (training starts from :func:`init_from_queries` instead)."""
        attention = config.attention_layers
        if not attention:
            raise ForecastError(f"{config.architecture} has no attention layers to forecast")
        return cls(
            hidden_size=config.hidden_size,
            num_kv_heads=config.num_key_value_heads,
            head_dim=config.head_dim,
            layers=attention[:-1],
            current_layer=attention[0],
            base_model=base_model,
            attention_layers=attention,
            num_hidden_layers=config.num_hidden_layers,
            sparse_config=sparse_config,
            training=training,
            metadata=metadata,
        )

    @classmethod
    def random(cls, config: BaseConfig, seed: int = 0) -> ForecastProjections:
        """A full adapter of N(0, 1/hidden) weights, marked ``random_weights``: for speed measurements and tests of
        the plumbing only — its block choices carry no information."""
        adapter = cls.for_model(config, f"random Forecast for {config.architecture}", {RANDOM_WEIGHTS_KEY: True})
        init_random(adapter, seed)
        return adapter.requires_grad_(False)

    def check_model(self, config: BaseConfig) -> None:
        """ForecastError unless this adapter fits ``config``: its heads, head size and hidden size, each
        ``forecast.{l}`` on an attention layer that has a next attention layer, ``forecast_current`` on the first."""
        where = f"Forecast adapter for {self.base_model!r}"
        for name, ours, theirs in (
            ("num_kv_heads", self.num_kv_heads, config.num_key_value_heads),
            ("head_dim", self.head_dim, config.head_dim),
            ("hidden size", self.hidden_size, config.hidden_size),
        ):
            if ours != theirs:
                raise ForecastError(f"{where}: {name} is {ours}, the model's is {theirs}")
        attention = config.attention_layers
        for name, ours, theirs in (
            ("num_hidden_layers", self.num_hidden_layers, config.num_hidden_layers),
            ("attention_layers", self.attention_layers, tuple(attention)),
        ):
            if ours is not None and ours != theirs:
                raise ForecastError(f"{where}: it was made for {name} {ours}, the model's are {theirs}")
        allowed = set(attention[:-1])
        bad = [i for i in self.layers if i not in allowed]
        if bad:
            raise ForecastError(
                f"{where}: forecast.{bad[0]}.weight is on layer {bad[0]}, which is not an attention layer followed by "
                f"another attention layer (the model's attention layers: {list(attention)})"
            )
        current = self.current_layer
        if current is not None and (not attention or current != attention[0]):
            first = attention[0] if attention else None
            raise ForecastError(
                f"{where}: forecast_current.{current}.weight must be on the first attention layer, which is {first}"
            )

    def config_json(self) -> dict[str, Any]:
        """The contents of ``forecast_config.json`` (see the module docstring); unrecorded keys are left out."""
        record = {
            "hidden_size": self.hidden_size,
            "attention_layers": None if self.attention_layers is None else list(self.attention_layers),
            "num_hidden_layers": self.num_hidden_layers,
            "sparse_config": None if self.sparse_config is None else asdict(self.sparse_config),
            "training": self.training,
        }
        return {
            **self.metadata,
            "base_model": self.base_model,
            "layers": list(self.layers),
            "head_dim": self.head_dim,
            "num_kv_heads": self.num_kv_heads,
            **{k: v for k, v in record.items() if v is not None},
        }

    def save(self, folder: str | Path, dtype: torch.dtype | None = None) -> Path:
        """Write ``forecast.safetensors`` (weights in ``dtype``, one of :data:`STORE_DTYPES`; None: as they are) and
        ``forecast_config.json`` into ``folder`` (created if needed)."""
        from safetensors.torch import save_file

        if dtype is not None and dtype not in STORE_DTYPES.values():
            raise ValueError(f"dtype must be one of {', '.join(STORE_DTYPES)} or None, got {dtype}")
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {name: t.detach().to("cpu", dtype).contiguous() for name, t in self.state_dict().items()}
        save_file(tensors, str(folder / WEIGHTS_FILE))
        (folder / CONFIG_FILE).write_text(json.dumps(self.config_json(), indent=2) + "\n")
        return folder

    @classmethod
    def load(
        cls, folder: str | Path, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None
    ) -> ForecastProjections:
        """Read an adapter folder (see the module docstring); ForecastError on anything missing or inconsistent.
        Weights keep their stored dtype unless ``dtype`` is given; parameters do not require grad."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        folder = Path(folder)
        if not folder.is_dir():
            raise ForecastError(f"Forecast adapter {folder} is not a folder (it must hold {WEIGHTS_FILE} and "
                                f"{CONFIG_FILE})")  # fmt: skip
        for name in (WEIGHTS_FILE, CONFIG_FILE):
            if not (folder / name).is_file():
                raise ForecastError(f"Forecast adapter {folder} has no {name}")
        try:
            meta = json.loads((folder / CONFIG_FILE).read_text())
        except json.JSONDecodeError as exc:
            raise ForecastError(f"{folder / CONFIG_FILE} is not valid JSON: {exc}") from exc
        if not isinstance(meta, dict):
            raise ForecastError(f"{folder / CONFIG_FILE} must hold a JSON object")
        missing = [k for k in _REQUIRED_KEYS if k not in meta]
        if missing:
            raise ForecastError(f"{folder / CONFIG_FILE} lacks {', '.join(missing)}")
        listed = meta["layers"]
        if not isinstance(listed, list) or any(not isinstance(i, int) for i in listed):
            raise ForecastError(f"{folder / CONFIG_FILE}: 'layers' must be a list of layer indices, got {listed!r}")
        try:
            tensors = load_file(str(folder / WEIGHTS_FILE))
        except (SafetensorError, OSError) as exc:
            raise ForecastError(f"{folder / WEIGHTS_FILE} is not a readable safetensors file: {exc}") from exc
        found: dict[str, list[int]] = {"forecast": [], "forecast_current": []}
        unexpected = []
        for name in tensors:
            match = _NAME.match(name)
            if match is None:
                unexpected.append(name)
            else:
                found[match.group(1)].append(int(match.group(2)))
        if unexpected:
            raise ForecastError(
                f"{folder / WEIGHTS_FILE}: unexpected tensor(s) {sorted(unexpected)} (only forecast.{{l}}.weight "
                "and forecast_current.{l}.weight belong in an adapter)"
            )
        if sorted(found["forecast"]) != sorted(listed):
            raise ForecastError(
                f"{folder}: {CONFIG_FILE} lists layers {sorted(listed)} but {WEIGHTS_FILE} holds forecast weights "
                f"for {sorted(found['forecast'])}"
            )
        if len(found["forecast_current"]) > 1:
            raise ForecastError(f"{folder / WEIGHTS_FILE}: more than one forecast_current weight "
                                f"({sorted(found['forecast_current'])})")  # fmt: skip
        if not tensors:
            raise ForecastError(f"{folder / WEIGHTS_FILE} holds no forecast weights")
        head_dim, heads = meta["head_dim"], meta["num_kv_heads"]
        hidden = next(iter(tensors.values())).shape[-1]
        for name, t in sorted(tensors.items()):
            if t.dim() != 2 or not t.is_floating_point():
                raise ForecastError(f"{folder / WEIGHTS_FILE}: {name} must be a 2-D float tensor, got "
                                    f"{t.dtype} {list(t.shape)}")  # fmt: skip
            if isinstance(head_dim, int) and isinstance(heads, int) and tuple(t.shape) != (heads * head_dim, hidden):
                raise ForecastError(
                    f"{folder / WEIGHTS_FILE}: {name} has shape {list(t.shape)}, expected [num_kv_heads * head_dim, "
                    f"hidden] = [{heads} * {head_dim}, {hidden}] from {CONFIG_FILE} and the first tensor"
                )
        if meta.get("hidden_size", hidden) != hidden:
            raise ForecastError(
                f"{folder}: {CONFIG_FILE} gives hidden_size {meta['hidden_size']!r} but the tensors read {hidden} "
                "channels"
            )
        sparse_config = meta.get("sparse_config")
        if sparse_config is not None:
            try:
                sparse_config = SparseAttentionConfig(**sparse_config)
            except (TypeError, ValueError) as exc:
                raise ForecastError(f"{folder / CONFIG_FILE}: bad sparse_config {sparse_config!r}: {exc}") from exc
        extra = {k: v for k, v in meta.items() if k not in _REQUIRED_KEYS + _RECORD_KEYS}
        adapter = cls(
            hidden_size=hidden,
            num_kv_heads=heads,
            head_dim=head_dim,
            layers=found["forecast"],
            current_layer=found["forecast_current"][0] if found["forecast_current"] else None,
            base_model=meta["base_model"],
            attention_layers=meta.get("attention_layers"),
            num_hidden_layers=meta.get("num_hidden_layers"),
            sparse_config=sparse_config,
            training=meta.get("training"),
            metadata=extra,
        )
        adapter.to(next(iter(tensors.values())).dtype)  # keep the stored dtype (float32 from nn.Linear otherwise)
        adapter.load_state_dict(tensors, strict=True)
        adapter.requires_grad_(False)
        return adapter.to(device=device, dtype=dtype)


def resolve_forecast(
    forecast: str | Path | ForecastProjections | None, config: BaseConfig, dtype: torch.dtype, device: torch.device
) -> ForecastProjections | None:
    """The adapter ``forecast`` names — a folder, ``"random"`` (:meth:`ForecastProjections.random`), an adapter
    object, or None — checked against ``config`` and placed in the model's ``dtype`` on its ``device``."""
    if forecast is None:
        return None
    if isinstance(forecast, ForecastProjections):
        adapter = forecast
    elif str(forecast) == RANDOM:
        adapter = ForecastProjections.random(config)
    elif isinstance(forecast, (str, Path)):
        adapter = ForecastProjections.load(forecast)
    else:
        raise ForecastError(f"forecast must be a folder, 'random' or a ForecastProjections, got {forecast!r}")
    adapter.check_model(config)
    return adapter.to(device=device, dtype=dtype)


def init_random(projections: ForecastProjections, seed: int) -> None:
    """Every projection ``N(0, 1/hidden)`` from ``seed``, in parameter-name order (a forecast that knows nothing)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in sorted(projections.named_parameters()):
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32) / projections.hidden_size**0.5
            p.copy_(noise.to(p.dtype))


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
    and gets weight 0. q/k norms (Qwen3, Qwen3.5) are not part of a forecast, so there the start is approximate.
    Every target of ``projections`` in ``model`` (a :class:`~longsparse.models.base.CausalLM`) is set."""
    attention = model.config.attention_layers
    projections.check_model(model.config)
    layers = model.model.layers
    heads, head_dim, hidden = projections.num_kv_heads, projections.head_dim, projections.hidden_size
    targets = [t for t in attention if _has_weight(projections, t, attention)]
    with torch.no_grad():
        for target in targets:
            source = forecast_source(attention, target)
            q = query_weights(layers[target].mixer)
            mean_q = q.view(heads, q.shape[0] // heads, head_dim, -1).mean(dim=1)
            w_t, w_s = attention_input_scale(layers[target]), attention_input_scale(layers[source])
            ratio = torch.where(w_s == 0, torch.zeros_like(w_s), w_t / torch.where(w_s == 0, 1.0, w_s))
            weight = projections.weight_for(target, attention)
            weight.copy_((mean_q.reshape(-1, hidden) * ratio).to(weight.dtype))


def _has_weight(projections: ForecastProjections, target: int, attention_layers: Sequence[int]) -> bool:
    source = forecast_source(attention_layers, target)
    return str(source) in (projections.forecast_current if source == target else projections.forecast)
