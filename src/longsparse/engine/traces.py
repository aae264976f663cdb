"""Selection traces: which KV blocks each decode step of a block-sparse model read, per attention layer and KV head.

A trace is recorded by decoding given tokens (teacher forcing) after a prompt, with the KV cache logging every
block list the attention layers hand to :meth:`~longsparse.engine.cache.KVCache.block_slots` — what an offloaded
cache would have to have on the GPU at that layer (for ``sparda``, the Forecast of the previous attention layer's
choice; for ``sparse``, the layer's own). Traces are the input of the locality model of ``longsparse bench decode``
(:mod:`longsparse.bench.locality`).

File format (:func:`save_traces` / :func:`load_traces`): one ``.npz`` with ``meta`` (a JSON list, one entry per
trace: label, context, layers, num_blocks, steps and the :class:`SparseAttentionConfig` fields) and ``selected_<i>``
(``np.packbits`` of trace ``i``'s boolean ``[steps, layers, heads, num_blocks]`` along the last axis).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..models.base import CausalLM
from ..ops.sparse_attn import SparseAttentionConfig
from ..ops.sparse_attn.naive import forced_blocks
from .cache import KVCache, allocate_compressed_keys
from .decode_modes import build_cache, prepare_model
from .runner import ModelRunner


@dataclass(frozen=True, eq=False)
class SelectionTrace:
    """``selected [steps, layers, heads, num_blocks]`` (bool): block ``b`` was read by KV head ``h`` of attention layer
    ``layers[i]`` at decode step ``t``, whose token sits at position ``context + t`` (``context`` tokens were cached
    before the first step). ``config``: the selection geometry (forced blocks, budget)."""

    label: str
    context: int
    layers: tuple[int, ...]
    config: SparseAttentionConfig
    selected: np.ndarray

    def __post_init__(self):
        if self.selected.dtype != np.bool_ or self.selected.ndim != 4:
            raise ValueError(f"selected must be a 4-d bool array, got {self.selected.dtype} {self.selected.shape}")
        if self.selected.shape[1] != len(self.layers):
            raise ValueError(f"selected has {self.selected.shape[1]} layers, layers lists {len(self.layers)}")
        need = self.config.num_blocks(self.context + self.steps)
        if self.selected.shape[3] < need:
            raise ValueError(f"selected has {self.selected.shape[3]} blocks, the last step needs {need}")

    @property
    def steps(self) -> int:
        return self.selected.shape[0]

    @property
    def heads(self) -> int:
        return self.selected.shape[2]

    def positions(self) -> np.ndarray:
        """``[steps]`` position of each step's token."""
        return self.context + np.arange(self.steps)

    def forced(self) -> np.ndarray:
        """``[steps, num_blocks]`` bool: the init and local-window blocks of each step (those every selector reads)."""
        return forced_mask(self.positions(), self.selected.shape[3], self.config)


def forced_mask(positions: np.ndarray, num_blocks: int, config: SparseAttentionConfig) -> np.ndarray:
    """``[len(positions), num_blocks]`` bool: the blocks every selector reads for a query at each position — the
    init blocks and the local window (:func:`~longsparse.ops.sparse_attn.naive.forced_blocks`)."""
    return forced_blocks(torch.as_tensor(np.asarray(positions)), num_blocks, config).numpy()


def save_traces(path: str | Path, traces: Sequence[SelectionTrace]) -> Path:
    """Write ``traces`` to one compressed ``.npz`` (module docstring)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = [
        dict(label=t.label, context=t.context, layers=list(t.layers), num_blocks=t.selected.shape[3], steps=t.steps,
             heads=t.heads, config=dataclasses.asdict(t.config))
        for t in traces
    ]  # fmt: skip
    arrays = {f"selected_{i}": np.packbits(t.selected, axis=-1) for i, t in enumerate(traces)}
    np.savez_compressed(path, meta=np.array(json.dumps(meta)), **arrays)
    return path


def load_traces(path: str | Path) -> list[SelectionTrace]:
    """The traces :func:`save_traces` wrote to ``path``."""
    with np.load(path) as data:
        meta = json.loads(str(data["meta"]))
        return [
            SelectionTrace(
                label=m["label"], context=m["context"], layers=tuple(m["layers"]),
                config=SparseAttentionConfig(**m["config"]),
                selected=np.unpackbits(data[f"selected_{i}"], axis=-1, count=m["num_blocks"]).astype(bool),
            )
            for i, m in enumerate(meta)
        ]  # fmt: skip


def _log_to_mask(log: list[tuple[int, torch.Tensor]], layers: Sequence[int], steps: int, num_blocks: int):
    """``selection_log`` entries (one ``(layer, block_ids [1, Hkv, W])`` per layer and step, in order) as the bool
    ``[steps, layers, Hkv, num_blocks]`` of :class:`SelectionTrace`."""
    if len(log) != steps * len(layers):
        raise ValueError(f"expected {steps * len(layers)} logged selections, got {len(log)}")
    heads = log[0][1].shape[1]
    mask = np.zeros((steps, len(layers), heads, num_blocks + 1), dtype=bool)  # column num_blocks takes the −1 pads
    index = {layer: i for i, layer in enumerate(layers)}
    for n, (layer, ids) in enumerate(log):
        t, i = divmod(n, len(layers))
        if layers[i] != layer:
            raise ValueError(f"selection {n} is of layer {layer}, expected layer {layers[i]}")
        ids = ids[0].long().cpu().numpy()
        mask[t, index[layer], np.arange(heads)[:, None], np.where(ids >= 0, ids, num_blocks)] = True
    return mask[..., :num_blocks]


class _DensePrefill:
    """Within the block, the block-sparse backends of ``model`` attend densely to prompts of up to ``length`` tokens
    (their ``dense_len`` raised), as MiniCPM4 does below its ``dense_len``; decode selections are unchanged."""

    def __init__(self, model: CausalLM, length: int):
        self.backends = [
            layer.mixer.backend
            for layer in model.model.layers
            if hasattr(getattr(layer.mixer, "backend", None), "config")
        ]
        self.length = length

    def __enter__(self):
        self.saved = [b.config for b in self.backends]
        for b in self.backends:
            b.config = dataclasses.replace(b.config, dense_len=max(b.config.dense_len, self.length + 1))

    def __exit__(self, *exc):
        for b, config in zip(self.backends, self.saved):
            b.config = config


def record_selections(
    model: CausalLM,
    ids: Sequence[int],
    context: int,
    steps: int,
    modes: dict[str, tuple[str, object]],
    config: SparseAttentionConfig,
    *,
    dense_prefill: bool = True,
    progress=None,
) -> list[SelectionTrace]:
    """Per entry ``label: (decode_mode, forecast)`` of ``modes`` (a GPU-resident block-sparse mode, ``"sparse_gpu"``
    or ``"sparda_gpu"``, and its Forecast adapter or None), the trace of ``steps`` decode steps of tokens
    ``ids[context : context + steps]`` after a prompt ``ids[:context]``, with selection geometry ``config``.

    The prompt is prefilled once (densely with ``dense_prefill``, as MiniCPM4 prefills below its ``dense_len``;
    else in the first mode) and its KV cache and compressed keys are copied for every mode, so all modes decode
    after the same prompt state. ``progress``: a tqdm-like wrapper for the step loop.
    """
    if context <= 0 or steps <= 0 or len(ids) < context + steps:
        raise ValueError(
            f"need context > 0, steps > 0 and context + steps <= {len(ids)} tokens, got {context} + {steps}"
        )
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and context + steps > limit:
        raise ValueError(f"context + steps = {context + steps} exceeds the model's {limit} positions")
    device, dtype = model.lm_head.weight.device, model.lm_head.weight.dtype
    capacity = context + steps + 1
    runner = ModelRunner(model)
    layers = tuple(model.config.attention_layers)
    num_blocks = config.num_blocks(context + steps)
    first_mode, first_forecast = next(iter(modes.values()))
    prepare_model(model, first_mode, config, forecast=first_forecast)
    kv = build_cache(model.config, first_mode, 1, capacity, dtype, device, config, check_memory=False)
    compressed = allocate_compressed_keys(model, 1, capacity)
    with torch.inference_mode():
        if dense_prefill:
            with _DensePrefill(model, context):
                runner.prefill([list(ids[:context])], slots=[0], kv_cache=kv, compressed_keys=compressed)
        else:
            runner.prefill([list(ids[:context])], slots=[0], kv_cache=kv, compressed_keys=compressed)
    prompt_state = _tensors(kv, compressed)
    saved = [t.clone() for t in prompt_state]
    traces = []
    for label, (mode, forecast) in modes.items():
        prepare_model(model, mode, config, forecast=forecast)
        for t, s in zip(prompt_state, saved):
            t.copy_(s)
        kv.selection_log = []
        loop = range(steps) if progress is None else progress(range(steps), desc=f"{label} @ {context}")
        with torch.inference_mode():
            for t in loop:
                runner.decode([int(ids[context + t])], prefix_lens=[context + t], slots=[0], kv_cache=kv,
                              gdn_states=None, compressed_keys=compressed)  # fmt: skip
        mask = _log_to_mask(kv.selection_log, layers, steps, num_blocks)
        kv.selection_log = None
        traces.append(SelectionTrace(label, context, layers, config, mask))
    return traces


def _tensors(kv: KVCache, compressed) -> list[torch.Tensor]:
    """Every tensor a decode step writes in a resident KV cache and the compressed keys."""
    out = [*kv.keys.values(), *kv.values.values()]
    if compressed is not None:
        out += [*compressed.k_cmp.values(), *compressed.ring.values()]
    return out
