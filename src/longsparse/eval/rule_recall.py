"""Recall of candidate block-selection rules on RULER prompts, where an answer is read and where it is written.

A prompt is run once through the dense model with the dense model's own answer appended (teacher forcing), and each
attention layer's queries are kept at two kinds of rows:

* ``question``: the last prompt rows (the question; the last of them writes the answer's first token, in prefill);
* ``answer``: the rows of the answer's tokens, which write the rest of it — what decode steps compute.

Every :class:`Rule` scores the blocks of every attention layer from the same captures (``eval.recall``'s selectors:
InfLLM-V2 on the layer's own queries, Forecast on the previous layer's input, the oracle on the dense mass), selects
with its geometry, and is tallied per (row kind, length, layer, KV head) against the dense attention mass of the
GQA group (:class:`~longsparse.eval.recall.RecallTally`: recall of the mass outside the forced init and local
blocks, and how often the block of largest such mass is chosen).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..models.base import CausalLM
from ..models.capture import capture_attention
from ..models.forecast import ForecastProjections
from ..ops.sparse_attn.config import SparseAttentionConfig
from ..ops.sparse_attn.naive import forced_blocks
from .recall import (
    RecallTally,
    block_mass,
    forecast_selector,
    infllmv2_selector,
    oracle_selector,
    selected_mask,
)

SELECTORS = ("infllmv2", "forecast", "oracle")
ROW_KINDS = ("question", "answer")

CANDIDATE_RULES: dict[str, dict] = {
    "current": {},
    "cmp16": {"kernel_size": 16, "kernel_stride": 8},
    "cmp8": {"kernel_size": 8, "kernel_stride": 4},
    "keymax": {"kernel_size": 1, "kernel_stride": 1},
    "quest64": {"kernel_size": 64, "kernel_stride": 64, "key_summary": "bounds"},
    "quest16": {"kernel_size": 16, "kernel_stride": 16, "key_summary": "bounds"},
    "groupmax": {"group_reduce": "max"},
    "neighbour1": {"neighbour_blocks": 1},
    "sumpool": {"pool_reduce": "sum"},
    "cmp8.sumpool": {"kernel_size": 8, "kernel_stride": 4, "pool_reduce": "sum"},
    "cmp8.groupmax": {"kernel_size": 8, "kernel_stride": 4, "group_reduce": "max"},
    "topk40": {"topk": 40},
    "cmp8.topk40": {"kernel_size": 8, "kernel_stride": 4, "topk": 40},
}
"""The candidate selection rules by name: the :class:`SparseAttentionConfig` fields each changes from a base geometry
(``keymax``: windows of one key, a block scored by its largest ``q·k``; ``quest<N>``: Quest's key bounds over windows
of ``N`` keys; ``topk40``: 48 blocks instead of 24, the budget of an 8K context scaled from a 4K one)."""


def candidate_config(base: SparseAttentionConfig, rule: str) -> SparseAttentionConfig:
    """``base`` with the fields of :data:`CANDIDATE_RULES` ``[rule]``; ValueError naming the candidates otherwise."""
    if rule not in CANDIDATE_RULES:
        raise ValueError(f"unknown rule {rule!r}; the candidates are {', '.join(CANDIDATE_RULES)}")
    return dataclasses.replace(base, **CANDIDATE_RULES[rule])


@dataclass(frozen=True)
class Rule:
    """A selection rule: ``selector`` (``infllmv2``, ``forecast`` or ``oracle``) scoring with ``config``'s rules and
    selecting with its geometry and budget."""

    name: str
    selector: str
    config: SparseAttentionConfig

    def __post_init__(self):
        if self.selector not in SELECTORS:
            raise ValueError(
                f"rule {self.name!r}: selector must be one of {', '.join(SELECTORS)}, got {self.selector!r}"
            )
        if not isinstance(self.config, SparseAttentionConfig):
            raise ValueError(f"rule {self.name!r} needs a SparseAttentionConfig, got {type(self.config).__name__}")


@dataclass(frozen=True)
class Prompt:
    """One prompt with the answer the dense model wrote: ``ids [T]`` (prompt, then answer), the prompt's length and
    the sample's target length (the tally's ``length``)."""

    ids: torch.Tensor
    prompt_len: int
    length: int

    def rows(self, question_rows: int) -> dict[str, torch.Tensor]:
        """Query positions of each row kind: the last ``question_rows`` prompt rows; the answer's rows but its last
        (the row of answer token ``j`` writes token ``j + 1``)."""
        T, n = self.ids.numel(), self.prompt_len
        return {
            "question": torch.arange(max(0, n - question_rows), n),
            "answer": torch.arange(n, T - 1),
        }


def rule_recall(
    model: CausalLM,
    prompts: Sequence[Prompt],
    rules: Sequence[Rule],
    *,
    projections: ForecastProjections | None = None,
    question_rows: int = 32,
) -> dict[tuple[str, int, str, int, int], RecallTally]:
    """Tallies per ``(rule, length, row kind, attention layer, KV head)`` over ``prompts``."""
    names = [r.name for r in rules]
    if len(set(names)) != len(names):
        raise ValueError(f"rule names must be unique, got {names}")
    attention = model.config.attention_layers
    selectors = {}
    for rule in rules:
        if rule.selector == "infllmv2":
            selectors[rule.name] = infllmv2_selector(rule.config)
        elif rule.selector == "forecast":
            if projections is None:
                raise ValueError(f"rule {rule.name!r} scores with Forecast and needs its projections")
            selectors[rule.name] = forecast_selector(projections, rule.config, attention)
        else:
            selectors[rule.name] = oracle_selector
    tallies: dict[tuple[str, int, str, int, int], RecallTally] = {}
    device = model.lm_head.weight.device
    for prompt in prompts:
        kinds = prompt.rows(question_rows)
        positions = torch.cat(list(kinds.values()))
        spans = np.cumsum([0] + [len(v) for v in kinds.values()])  # kind i: captured rows spans[i] … spans[i + 1]
        captures = capture_attention(model, prompt.ids, positions)
        pos = positions.to(device)
        cos, sin = model.rotary(pos)
        for target in attention:
            cap = captures[target]
            masses: dict[int, torch.Tensor] = {}  # by block size: the rules share it, and it costs a dense attention
            for rule in rules:
                geometry = rule.config
                if geometry.block_size not in masses:
                    masses[geometry.block_size] = block_mass(cap.q, cap.k, pos, geometry.block_size)
                mass = masses[geometry.block_size]
                forced = forced_blocks(pos, mass.shape[-1], geometry)[None].expand_as(mass)
                scores = selectors[rule.name](target, captures, pos, cos, sin, mass)
                chosen = selected_mask(scores, pos, geometry)
                for kind, lo, hi in zip(kinds, spans[:-1], spans[1:]):
                    if hi == lo:
                        continue
                    for h in range(mass.shape[0]):
                        key = (rule.name, prompt.length, kind, target, h)
                        part = (slice(h, h + 1), slice(int(lo), int(hi)))
                        tallies.setdefault(key, RecallTally()).add(mass[part], chosen[part], forced[part])
    return tallies


def recall_table(tallies: Mapping[tuple[str, int, str, int, int], RecallTally]) -> list[dict]:
    """One row per tally key: ``recall``, ``recall_with_forced``, ``top_block_hit`` and ``free_mass``."""
    rows = []
    for (rule, length, kind, layer, head), t in sorted(tallies.items()):
        rows.append({
            "rule": rule, "length": length, "rows": kind, "layer": layer, "head": head, "recall": t.recall,
            "recall_with_forced": t.recall_with_forced, "top_block_hit": t.top_block_hit,
            "free_mass": t.free / t.total if t.total > 0 else float("nan"),
        })  # fmt: skip
    return rows


def summarize_rules(rows: list[dict], oracle: str = "oracle") -> dict:
    """Per rule, per row kind and length (and ``all`` lengths): the mean over (layer, head) of ``recall`` and
    ``top_block_hit``, the 10th percentile of ``recall`` over (layer, head) (``recall_p10``: the heads a rule fails),
    and ``of_oracle``: the mean recall over the oracle's."""
    out: dict = {}
    lengths = sorted({r["length"] for r in rows})
    for rule in dict.fromkeys(r["rule"] for r in rows):
        for kind in ROW_KINDS:
            for length in [*lengths, "all"]:
                mine = [r for r in rows if r["rule"] == rule and r["rows"] == kind and length in ("all", r["length"])]
                base = [r for r in rows if r["rule"] == oracle and r["rows"] == kind and length in ("all", r["length"])]
                if not mine:
                    continue
                recall = np.array([r["recall"] for r in mine], dtype=float)
                entry = {
                    "recall": float(np.nanmean(recall)),
                    "recall_p10": float(np.nanpercentile(recall, 10)),
                    "top_block_hit": float(np.nanmean([r["top_block_hit"] for r in mine])),
                }
                if base:
                    entry["of_oracle"] = entry["recall"] / float(np.nanmean([r["recall"] for r in base]))
                out.setdefault(rule, {}).setdefault(kind, {})[str(length)] = entry
    return out


def with_dense_layers(rows: list[dict], rule: str, layers: Sequence[int], name: str) -> list[dict]:
    """``rule``'s rows with ``layers`` run dense (recall 1: every block read), under ``name``."""
    out = []
    for r in rows:
        if r["rule"] != rule:
            continue
        r = {**r, "rule": name}
        if r["layer"] in layers:
            r.update(recall=1.0, recall_with_forced=1.0, top_block_hit=1.0)
        out.append(r)
    return out


def weakest_layers(rows: list[dict], rule: str, count: int) -> list[int]:
    """The ``count`` attention layers where ``rule``'s mean recall (over heads, lengths and row kinds) is lowest."""
    layers = sorted({r["layer"] for r in rows if r["rule"] == rule})
    mean = {i: np.nanmean([r["recall"] for r in rows if r["rule"] == rule and r["layer"] == i]) for i in layers}
    return sorted(sorted(layers, key=lambda i: mean[i])[:count])


def plot_recall(path, result: dict):
    """Horizontal bars: each rule's mean recall per (row kind, length) from ``result["summary"]``
    (:func:`summarize_rules`), rules ordered by their answer-row recall, the oracle's as dashed lines."""
    from ..reports.plot import pyplot, save_figure

    plt = pyplot()
    summary = result["summary"]
    columns = [(kind, length) for kind in ROW_KINDS for length in sorted(
        {n for entry in summary.values() for n in entry.get(kind, {}) if n != "all"}, key=int)]  # fmt: skip
    rules = sorted(summary, key=lambda r: summary[r].get("answer", {}).get("all", {}).get("recall", 0.0))
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(rules) * len(columns) / 2 + 1.5), dpi=120)
    height = 0.8 / len(columns)
    for c, (kind, length) in enumerate(columns):
        ys = [i + c * height for i in range(len(rules))]
        xs = [summary[r].get(kind, {}).get(length, {}).get("recall", float("nan")) for r in rules]
        bars = ax.barh(ys, xs, height=height, label=f"{kind} rows, {int(length) // 1024}K")
        oracle = summary.get("oracle", {}).get(kind, {}).get(length, {}).get("recall")
        if oracle is not None:
            ax.axvline(oracle, color=bars.patches[0].get_facecolor(), linestyle="--", linewidth=1)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(rules))], rules, fontsize=7)
    ax.set(xlabel="recall of the dense mass outside the forced blocks (dashed: oracle)", xlim=(0, 1))
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("block-selection rules at the same budget (mean over layers and KV heads)")
    return save_figure(fig, path)
