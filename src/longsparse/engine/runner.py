"""Prefill and decode steps of a model over packed batches of sequences."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..cache import CompressedKeys, GDNStates, KVCache
from ..models.base import CausalLM
from ..models.batch import AttentionObserver, ForwardBatch
from ..models.plan import BlockFractions, StepStats


@dataclass
class StepOutput:
    """``logits``: float32, ``[N, vocab]`` for the last token of each sequence (``[T, vocab]`` for every token when
    asked). ``gdn_keep_ratios``: one entry per sparse GDN layer that ran. ``block_fractions``: share of the causal KV
    blocks the block-sparse attention layers attended (no rows when none ran)."""

    logits: torch.Tensor
    gdn_keep_ratios: list[float]
    block_fractions: BlockFractions = field(default_factory=BlockFractions)


class ModelRunner:
    """Builds each step's :class:`ForwardBatch` and its :class:`~longsparse.models.plan.StepPlan` (once, before the
    layers run) and runs the model on them, under ``torch.inference_mode``, between the KV cache's
    :meth:`~longsparse.cache.KVCache.begin_step` and :meth:`~longsparse.cache.KVCache.end_step`; the step's statistics
    come back in its :class:`StepOutput`."""

    def __init__(self, model: CausalLM):
        self.model = model
        self.device = model.lm_head.weight.device

    @torch.inference_mode()
    def prefill(
        self,
        token_ids: list[list[int]],
        *,
        slots: list[int] | None = None,
        kv_cache: KVCache | None = None,
        gdn_states: GDNStates | None = None,
        compressed_keys: CompressedKeys | None = None,
        prefix_lens: list[int] | None = None,
        all_logits: bool = False,
        attention_observer: AttentionObserver | None = None,
    ) -> StepOutput:
        """Run ``token_ids[n]`` of each sequence, after the ``prefix_lens[n]`` tokens already cached in its slot.
        ``compressed_keys``: where block-sparse attention layers keep theirs for later decode steps;
        ``attention_observer``: the step's :attr:`ForwardBatch.attention_observer`."""
        batch = ForwardBatch.prefill(
            [len(t) for t in token_ids],
            self.device,
            prefix_lens=prefix_lens,
            slots=slots,
            kv_cache=kv_cache,
            gdn_states=gdn_states,
            compressed_keys=compressed_keys,
        )
        batch.attention_observer = attention_observer
        ids = torch.tensor([t for seq in token_ids for t in seq], device=self.device)
        hidden, stats = self._forward(ids, batch)
        if not all_logits:
            hidden = hidden[torch.tensor(batch.offsets[1:], device=self.device) - 1]
        return StepOutput(self.model.compute_logits(hidden), stats.keep_ratio_values(), stats.block_fractions)

    @torch.inference_mode()
    def decode(
        self,
        tokens: list[int],
        *,
        prefix_lens: list[int],
        slots: list[int],
        kv_cache: KVCache | None,
        gdn_states: GDNStates | None,
        compressed_keys: CompressedKeys | None = None,
        attention_observer: AttentionObserver | None = None,
    ) -> StepOutput:
        """One new token per sequence (``tokens[n]`` at position ``prefix_lens[n]`` of slot ``slots[n]``)."""
        batch = ForwardBatch.decode(
            prefix_lens,
            self.device,
            slots=slots,
            kv_cache=kv_cache,
            gdn_states=gdn_states,
            compressed_keys=compressed_keys,
        )
        batch.attention_observer = attention_observer
        hidden, stats = self._forward(torch.tensor(tokens, device=self.device), batch)
        return StepOutput(self.model.compute_logits(hidden), stats.keep_ratio_values(), stats.block_fractions)

    def _forward(self, ids: torch.Tensor, batch: ForwardBatch) -> tuple[torch.Tensor, StepStats]:
        plan = self.model.plan_step(batch)
        cache = batch.kv_cache
        if cache is not None:
            cache.begin_step(batch)
        hidden = self.model(ids, batch, plan)
        if cache is not None:
            cache.end_step(batch)
        return hidden, plan.stats
