"""SparDA's Forecast projections as a separate module that feeds the attention backends through ``batch.scratch``.

For each attention layer ``l`` but the last, ``F_l = W_l · x_l`` (``x_l`` the layer's normalised input, one
``d``-vector per KV head: ``[T, Hkv, d]``) scores the *next* attention layer's compressed keys (sparda-notes §2.2,
Eq. 4); the first attention layer also has ``F_cur`` for its own blocks (nothing earlier forecasts it). In a hybrid
model the next attention layer lies several GDN layers later: the forecast reaches across them unchanged.

Contract with the backends (what any Forecast implementation must provide): before attention layer ``l`` runs,
``batch.scratch[FORECAST_NEXT][l]`` holds ``F_l [T, Hkv, d]`` (absent for the last layer) and, for the first
attention layer, ``batch.scratch[FORECAST_CURRENT][l]`` holds ``F_cur``. :meth:`ForecastHeads.attach` fills them
through forward pre-hooks on the attention modules, so the model classes and their state dicts stay unchanged.
No positional rotation is applied to ``F`` (the projection learns whatever the keys' rotation asks for).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from .config import BaseConfig
from .layers import Attention

FORECAST_NEXT = "forecast_next"
FORECAST_CURRENT = "forecast_current"


class ForecastHeads(nn.Module):
    """``next.<l>``: ``Linear(hidden, Hkv·d)`` for every attention layer but the last; ``current``: the first
    attention layer's own projection."""

    def __init__(self, hidden_size: int, num_kv_heads: int, head_dim: int, attention_layers: tuple[int, ...]):
        super().__init__()
        if not attention_layers:
            raise ValueError("Forecast heads need at least one attention layer")
        self.attention_layers = tuple(attention_layers)
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        out = num_kv_heads * head_dim
        self.next = nn.ModuleDict(
            {str(layer): nn.Linear(hidden_size, out, bias=False) for layer in self.attention_layers[:-1]}
        )
        self.current = nn.Linear(hidden_size, out, bias=False)

    @classmethod
    def for_config(cls, config: BaseConfig) -> ForecastHeads:
        return cls(config.hidden_size, config.num_key_value_heads, config.head_dim, config.attention_layers)

    def randomize(self, seed: int) -> ForecastHeads:
        """N(0, 1/hidden) weights from ``seed`` (benchmarks and demos: the selections mean nothing)."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for _, p in sorted(self.named_parameters()):
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[-1] ** 0.5)
        return self

    def project(self, layer: int, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(F_next, F_cur)`` of attention layer ``layer`` for ``x [T, hidden]``, each ``[T, Hkv, d]`` or None."""
        shape = (x.shape[0], self.num_kv_heads, self.head_dim)
        nxt = self.next[str(layer)](x).view(shape) if str(layer) in self.next else None
        cur = self.current(x).view(shape) if layer == self.attention_layers[0] else None
        return nxt, cur

    def attach(self, model: nn.Module) -> list[RemovableHandle]:
        """Fill ``batch.scratch`` before each attention layer of ``model`` (a :class:`CausalLM`); returns the hook
        handles (``handle.remove()`` detaches)."""
        handles = []
        for i, layer in enumerate(model.model.layers):
            mixer = layer.mixer
            if not isinstance(mixer, Attention):
                continue
            if i not in self.attention_layers:
                raise ValueError(f"attention layer {i} has no Forecast head (heads for {self.attention_layers})")
            handles.append(mixer.register_forward_pre_hook(self._hook))
        return handles

    def _hook(self, module: Attention, args) -> None:
        x, _cos, _sin, batch = args
        nxt, cur = self.project(module.layer_idx, x)
        if nxt is not None:
            batch.scratch.setdefault(FORECAST_NEXT, {})[module.layer_idx] = nxt
        if cur is not None:
            batch.scratch.setdefault(FORECAST_CURRENT, {})[module.layer_idx] = cur

    def save(self, path: str | Path) -> None:
        """Weights as safetensors (``next.<l>.weight``, ``current.weight``)."""
        from safetensors.torch import save_file

        save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}, str(path))

    @classmethod
    def load(cls, path: str | Path, config: BaseConfig, *, dtype: torch.dtype, device: torch.device | str):
        """Heads for ``config`` with weights from a safetensors file written by :meth:`save`; missing, unexpected or
        misshapen tensors raise ValueError."""
        from safetensors.torch import load_file

        heads = cls.for_config(config)
        try:
            tensors = load_file(str(path))
        except OSError as exc:
            raise ValueError(f"cannot read Forecast weights from {path}: {exc}") from exc
        want = heads.state_dict()
        missing, unexpected = sorted(set(want) - set(tensors)), sorted(set(tensors) - set(want))
        bad = sorted(k for k in set(want) & set(tensors) if tensors[k].shape != want[k].shape)
        if missing or unexpected or bad:
            raise ValueError(
                f"Forecast weights in {path} do not match the model: missing {missing}, unexpected {unexpected}, "
                f"misshapen {bad}"
            )
        heads.load_state_dict(tensors)
        return heads.to(device=device, dtype=dtype)
