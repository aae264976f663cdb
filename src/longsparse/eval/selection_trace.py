"""Instruments that locate where block-sparse attention loses an answer, read through ``attention_observer``.

:class:`SelectionTrace` watches one sequence being generated (one prompt, greedy: :func:`traced_generate`) in any
attention mode. At the last ``prefill_positions`` prompt positions and at every generated token it takes each
attention layer's queries and all its keys so far (and, for Forecast selectors, the forecasting layer's input), and
asks every selector which blocks it would choose there — InfLLM-V2 from the layer's own queries, a Forecast adapter
from the previous attention layer's input, the oracle from the dense attention mass (``eval.recall``'s selectors, with
the geometry and rules of the given :class:`~longsparse.ops.sparse_attn.SparseAttentionConfig`). It records, per
(phase, selector, attention layer, KV head):

* the recall of the dense attention mass: chosen non-forced mass / all non-forced mass (``eval.recall``'s
  definition), and the mass of all selected blocks / total mass;
* at each query position: the dense mass that falls on the needle's blocks (which layers and heads read the answer),
  whether every needle block is selected, and the share of the needle's mass the selection keeps.

The dense mass is that of the run's own queries and keys: in a dense run, what the selectors would give up; in a
sparse run, what the run's own trajectory asked for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..models.capture import AttentionCapture
from ..ops.sparse_attn.config import SparseAttentionConfig
from ..ops.sparse_attn.naive import forced_blocks
from .recall import Selector, block_mass, selected_mask


@dataclass
class MassTally:
    """Sums over query positions per (attention layer, KV head), ``[layers, Hkv]`` each."""

    chosen: np.ndarray
    free: np.ndarray
    selected: np.ndarray
    total: np.ndarray

    @classmethod
    def zeros(cls, layers: int, heads: int) -> MassTally:
        return cls(*(np.zeros((layers, heads)) for _ in range(4)))

    def recall(self) -> np.ndarray:
        return np.divide(self.chosen, self.free, out=np.full_like(self.chosen, np.nan), where=self.free > 0)

    def recall_with_forced(self) -> np.ndarray:
        return np.divide(self.selected, self.total, out=np.full_like(self.total, np.nan), where=self.total > 0)


@dataclass
class PositionRecord:
    """One query position: ``needle_mass [layers, Hkv]`` and, per selector, ``covered`` (every needle block selected)
    and ``kept`` (selected needle mass / needle mass), ``[layers, Hkv]`` each."""

    phase: str
    position: int
    needle_mass: np.ndarray
    covered: dict[str, np.ndarray] = field(default_factory=dict)
    kept: dict[str, np.ndarray] = field(default_factory=dict)


class SelectionTrace:
    """``attention_observer`` of one sequence's prefill and decode steps (batch of one). ``model``: the running
    model; ``selectors``: name -> ``eval.recall`` selector; ``needle_tokens``: prompt positions of the answer."""

    def __init__(
        self,
        model,
        selectors: Mapping[str, Selector],
        config: SparseAttentionConfig,
        needle_tokens: Sequence[int] = (),
        prefill_positions: int = 8,
    ):
        self.model = model
        self.selectors = dict(selectors)
        self.config = config
        self.layers = list(model.config.attention_layers)
        self.heads = model.config.num_key_value_heads
        self.needle_blocks = sorted({t // config.block_size for t in needle_tokens})
        self.prefill_positions = prefill_positions
        self.keys: dict[int, torch.Tensor] = {}
        self.captures: dict[int, AttentionCapture] = {}
        self.tallies: dict[tuple[str, str], MassTally] = {}
        self.records: list[PositionRecord] = []
        self._current: dict[int, PositionRecord] = {}

    def __call__(self, layer: int, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> None:
        decode = layer in self.keys and q.shape[0] == 1
        self.keys[layer] = torch.cat([self.keys[layer], k.float()]) if decode else k.float().clone()
        T = self.keys[layer].shape[0]
        if decode:
            positions = torch.tensor([T - 1], device=q.device)
        else:
            positions = torch.arange(max(0, T - self.prefill_positions), T, device=q.device)
        rows = positions - (T - q.shape[0])
        self.captures[layer] = AttentionCapture(x[rows].float(), q[rows].float(), self.keys[layer])
        self._measure(layer, positions, "decode" if decode else "prefill")

    def _record(self, layer: int, phase: str, position: int) -> PositionRecord:
        if position not in self._current:
            shape = (len(self.layers), self.heads)
            self._current[position] = PositionRecord(phase, position, np.zeros(shape))
            self.records.append(self._current[position])
        return self._current[position]

    @torch.no_grad()
    def _measure(self, layer: int, positions: torch.Tensor, phase: str) -> None:
        cfg, a = self.config, self.layers.index(layer)
        cap = self.captures[layer]
        mass = block_mass(cap.q, cap.k, positions, cfg.block_size)  # [Hkv, P, NB]
        NB = mass.shape[-1]
        forced = forced_blocks(positions, NB, cfg)[None].expand_as(mass)
        cos, sin = self.model.rotary(positions)
        needle = torch.tensor([b for b in self.needle_blocks if b < NB], dtype=torch.long, device=mass.device)
        needle_mass = mass[..., needle].sum(-1)  # [Hkv, P]
        records = [self._record(layer, phase, int(p)) for p in positions.tolist()]
        for p, rec in enumerate(records):
            rec.needle_mass[a] = needle_mass[:, p].cpu().numpy()
        free = mass.masked_fill(forced, 0.0)
        for name, select in self.selectors.items():
            sel = selected_mask(select(layer, self.captures, positions, cos, sin, mass), positions, cfg)
            tally = self.tallies.setdefault((phase, name), MassTally.zeros(len(self.layers), self.heads))
            tally.chosen[a] += free.masked_fill(~sel, 0.0).sum((1, 2)).cpu().numpy()
            tally.free[a] += free.sum((1, 2)).cpu().numpy()
            tally.selected[a] += mass.masked_fill(~sel, 0.0).sum((1, 2)).cpu().numpy()
            tally.total[a] += mass.sum((1, 2)).cpu().numpy()
            if not len(needle):
                continue
            covered = sel[..., needle].all(-1)  # [Hkv, P]
            kept = mass.masked_fill(~sel, 0.0)[..., needle].sum(-1) / needle_mass.clamp_min(1e-30)
            for p, rec in enumerate(records):
                shape = (len(self.layers), self.heads)
                rec.covered.setdefault(name, np.zeros(shape, dtype=bool))[a] = covered[:, p].cpu().numpy()
                rec.kept.setdefault(name, np.zeros(shape))[a] = kept[:, p].cpu().numpy()

    def summary(self, needle_threshold: float = 0.05) -> dict:
        """Per (phase, selector): recall matrices ``[layers][Hkv]`` and their mass-weighted means; per position: the
        (layer, head) cells that put at least ``needle_threshold`` of their mass on the needle ("reading" it) and,
        per selector, those of them whose needle blocks were not all selected."""
        out: dict = {"layers": self.layers, "needle_blocks": self.needle_blocks, "recall": {}, "positions": []}
        for (phase, name), t in self.tallies.items():
            out["recall"].setdefault(phase, {})[name] = {
                "recall": float(t.chosen.sum() / t.free.sum()) if t.free.sum() > 0 else None,
                "recall_with_forced": float(t.selected.sum() / t.total.sum()) if t.total.sum() > 0 else None,
                "per_head": _rounded(t.recall()),
                "per_head_with_forced": _rounded(t.recall_with_forced()),
            }
        for rec in self.records:
            reading = rec.needle_mass >= needle_threshold
            entry = {
                "phase": rec.phase,
                "position": rec.position,
                "needle_mass": _rounded(rec.needle_mass),
                "reading": [[self.layers[a], int(h)] for a, h in zip(*np.nonzero(reading))],
                "missed": {
                    name: [[self.layers[a], int(h)] for a, h in zip(*np.nonzero(reading & ~cov))]
                    for name, cov in rec.covered.items()
                },
                "kept_where_read": {
                    name: float((kept * rec.needle_mass)[reading].sum() / rec.needle_mass[reading].sum())
                    if reading.any()
                    else None
                    for name, kept in rec.kept.items()
                },
            }
            out["positions"].append(entry)
        return out


def _rounded(a: np.ndarray, digits: int = 4) -> list:
    return np.where(np.isnan(a), None, np.round(a, digits)).tolist()


@torch.inference_mode()
def traced_generate(llm, prompt_ids: list[int], max_new_tokens: int, observer) -> tuple[list[int], dict]:
    """Greedy generation of one prompt through ``llm``'s model with ``observer`` as every step's
    ``attention_observer`` (``LLM.generate``'s steps, which take no observer). Returns the generated token ids (an
    end-of-sequence token excluded) and the attended block fractions ``{"prefill", "decode"}`` (None if no
    block-sparse layer ran)."""
    eos = set(llm.loaded.eos_token_ids)
    kv, states, compressed = llm.allocate(1, len(prompt_ids) + max_new_tokens)
    caches = dict(kv_cache=kv, gdn_states=states, compressed_keys=compressed, attention_observer=observer)
    step = llm.runner.prefill([prompt_ids], **caches)
    fractions = {"prefill": step.block_fractions.mean()}
    decode_fractions = []
    token = int(step.logits.argmax(-1))
    out: list[int] = []
    while token not in eos and len(out) < max_new_tokens:
        out.append(token)
        if len(out) == max_new_tokens:
            break
        step = llm.runner.decode([token], prefix_lens=[len(prompt_ids) + len(out) - 1], slots=[0], **caches)
        decode_fractions.append(step.block_fractions.mean())
        token = int(step.logits.argmax(-1))
    known = [f for f in decode_fractions if f is not None]
    fractions["decode"] = float(np.mean(known)) if known else None
    return out, fractions
