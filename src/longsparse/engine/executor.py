"""Where an :class:`~longsparse.engine.llm_engine.LLMEngine`'s model steps run: the engine keeps the scheduler, the
requests and their text; an executor holds the caches, runs each step's model calls and samples.

:class:`ModelExecutor` runs them in this process over an :class:`~longsparse.engine.api.LLM`'s model. Under tensor
parallelism (``LLM(tensor_parallel_size=N)``) every rank holds one over its part of the model, and the driver's engine
talks to them through a :class:`RemoteExecutor`, as vLLM's engine drives its executor: each step's
:class:`ModelStep` (the decodes' last tokens, the prompt chunks, the slots and the sampling of each row — what
changed, not the requests) goes to every rank, every rank runs the model on it (their collectives keep them in step)
and rank 0 samples and sends back the tokens, which the next step's :class:`ModelStep` hands to every rank.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from ..cache import BlockKVCache, CacheBytes, CompressedKeys, GDNStates, KVCache
from ..models.plan import BlockFractions
from .decode_graph import GraphDecoder
from .sampler import sample
from .scheduler import SchedulerConfig

GeneratorKey = tuple[str, str]
"""A random generator of the executor: ``("request", request_id)`` for a request's own seed, ``("shared", name)`` for
one that several requests draw from."""


@dataclass(frozen=True)
class ModelStep:
    """One engine step as the model sees it.

    ``new_slots``: slots whose previous request's state is emptied first. Decodes (in the scheduler's order):
    ``decode_tokens`` (each request's newest token), ``decode_lengths`` (its cached tokens), ``decode_slots``;
    ``free_slots``: the slots no request holds (the CUDA-graph decoder pads its rows with them). Prompt chunks:
    ``prefill_ids`` (the chunk's tokens), ``prefill_slots``, ``prefill_starts`` (the tokens of the prompt already
    cached), ``prefill_done``: the indices of the chunks that complete their prompt, whose last logits are sampled.
    ``sampling``: ``(temperature, top_p, generator key or None)`` of each sampled row — the decodes, then the
    completed chunks; ``seeds``: generators to create (key → seed) before sampling; ``released``: generators no
    request needs any longer."""

    new_slots: list[int] = field(default_factory=list)
    decode_tokens: list[int] = field(default_factory=list)
    decode_lengths: list[int] = field(default_factory=list)
    decode_slots: list[int] = field(default_factory=list)
    free_slots: list[int] = field(default_factory=list)
    prefill_ids: list[list[int]] = field(default_factory=list)
    prefill_slots: list[int] = field(default_factory=list)
    prefill_starts: list[int] = field(default_factory=list)
    prefill_done: list[int] = field(default_factory=list)
    sampling: list[tuple[float, float, GeneratorKey | None]] = field(default_factory=list)
    seeds: dict[GeneratorKey, int] = field(default_factory=dict)
    released: list[GeneratorKey] = field(default_factory=list)


@dataclass(frozen=True)
class StepResult:
    """The sampled token of each row of :attr:`ModelStep.sampling` (None on the ranks that do not sample), and the
    seconds the step's decode and prefill took (sampling counts with the decode when there is one)."""

    tokens: list[int] | None
    decode_seconds: float
    prefill_seconds: float


@dataclass(frozen=True)
class ExecutorSummary:
    """What an executor's caches and layers did so far: the caches' bytes by location (a rank's share under tensor
    parallelism), the sparse GDN layers' mean keep ratio, the block-sparse layers' mean attended block share by
    phase (a CUDA-graph decoder's decodes: its uncaptured steps'), the offloaded cache's block hit rate."""

    kv_bytes: CacheBytes
    state_bytes: CacheBytes
    compressed_key_bytes: CacheBytes
    keep_ratio: float | None
    prefill_block_fraction: float | None
    decode_block_fraction: float | None
    block_hit_rate: float | None


@dataclass(frozen=True)
class ExecutorInfo:
    """What the engine needs to know of its executor: ``whole_prompts`` (the offloaded block cache takes whole
    prompts only: no chunked prefill) and ``decode_path`` (``"eager"``, ``"cuda graph"`` or ``"graph step"``)."""

    whole_prompts: bool
    decode_path: str


class ModelExecutor:
    """Caches for ``config.max_num_seqs`` slots of ``config.max_model_len`` tokens over ``llm``'s model (``caches``:
    the ``(kv, gdn_states, compressed_keys)`` of ``llm.allocate(...)`` when the caller allocated them; else
    allocated here, which raises :class:`~longsparse.cache.CapacityError` when they do not fit), and the steps run on
    them; with ``llm.cuda_graphs``, decode steps through a :class:`~longsparse.engine.decode_graph.GraphDecoder`."""

    alive = True

    def __init__(
        self,
        llm,
        config: SchedulerConfig,
        caches: tuple[KVCache | None, GDNStates | None, CompressedKeys | None] | None = None,
    ):
        self.llm = llm
        if caches is None:
            caches = llm.allocate(config.max_num_seqs, config.max_model_len)
        self.kv, self.states, self.compressed = caches
        self._caches = dict(kv_cache=self.kv, gdn_states=self.states, compressed_keys=self.compressed)
        self.samples = llm.parallel.rank == 0  # the other ranks' logits are the same: rank 0's tokens are used
        self._generators: dict[GeneratorKey, torch.Generator] = {}
        self._keep_ratio_sum: torch.Tensor | float = 0.0
        self._keep_ratio_count = 0
        self._prefill_blocks, self._decode_blocks = BlockFractions(), BlockFractions()
        self.graphs = None
        if llm.cuda_graphs and self.kv is not None:
            loaded = llm.loaded
            self.graphs = GraphDecoder(
                loaded.model, self.kv, self.compressed, self.states, config.max_model_len, config.max_num_seqs,
                capture=loaded.device.type == "cuda",
            )  # fmt: skip
        decode_path = "eager" if self.graphs is None else "cuda graph" if self.graphs.capture else "graph step"
        self.info = ExecutorInfo(isinstance(self.kv, BlockKVCache), decode_path)

    def execute(self, step: ModelStep) -> StepResult:
        """Run ``step``: empty its new slots, decode, prefill its chunks, sample its rows."""
        self._reset_slots(step.new_slots)
        for key in step.released:
            self._generators.pop(key, None)
        logits = []
        start = time.perf_counter()
        if step.decode_tokens:
            logits.append(self._decode(step))
        decoded = time.perf_counter()
        if step.prefill_ids:
            logits.append(self._prefill(step))
        prefilled = time.perf_counter()
        tokens = None
        if self.samples:
            tokens = self._sample(step, torch.cat(logits) if len(logits) > 1 else logits[0]) if step.sampling else []
        after = time.perf_counter() - prefilled
        decode_seconds = decoded - start + (after if step.decode_tokens else 0.0)
        prefill_seconds = prefilled - decoded + (0.0 if step.decode_tokens else after)
        return StepResult(tokens, decode_seconds, prefill_seconds)

    def summary(self) -> ExecutorSummary:
        kv, compressed = self.kv, self.compressed
        decode_blocks = self.graphs.stats if self.graphs is not None else self._decode_blocks
        count = self._keep_ratio_count
        return ExecutorSummary(
            kv_bytes=kv.nbytes() if kv is not None else CacheBytes(),
            state_bytes=self.states.nbytes() if self.states is not None else CacheBytes(),
            compressed_key_bytes=compressed.nbytes() if compressed is not None else CacheBytes(),
            keep_ratio=float(self._keep_ratio_sum) / count if count else None,
            prefill_block_fraction=self._prefill_blocks.mean(),
            decode_block_fraction=decode_blocks.mean(),
            block_hit_rate=kv.transfer_stats()["hit_rate"] if isinstance(kv, BlockKVCache) else None,
        )

    def _reset_slots(self, slots: list[int]) -> None:
        """Empty the state a slot's previous request left (the KV cache and compressed keys are overwritten from
        position 0 by the new prompt's prefill; GDN states and the block cache's bookkeeping are not)."""
        if not slots:
            return
        if self.states is not None:
            self.states.reset(slots)
        if isinstance(self.kv, BlockKVCache):
            self.kv.reset(slots)

    def _decode(self, step: ModelStep) -> torch.Tensor:
        if self.graphs is not None:
            return self.graphs.step(step.decode_tokens, step.decode_slots, step.decode_lengths, step.free_slots)
        out = self.llm.runner.decode(
            step.decode_tokens, prefix_lens=step.decode_lengths, slots=step.decode_slots, **self._caches
        )
        self._decode_blocks.merge(out.block_fractions)
        return out.logits

    def _prefill(self, step: ModelStep) -> torch.Tensor:
        """Run the step's prompt chunks; the logits of those that complete their prompt."""
        out = self.llm.runner.prefill(
            step.prefill_ids, slots=step.prefill_slots, prefix_lens=step.prefill_starts, **self._caches
        )
        self._prefill_blocks.merge(out.block_fractions)
        self._keep_ratio_sum = self._keep_ratio_sum + sum(out.gdn_keep_ratios)
        self._keep_ratio_count += len(out.gdn_keep_ratios)
        return out.logits[step.prefill_done]

    def _sample(self, step: ModelStep, logits: torch.Tensor) -> list[int]:
        """One token per row of ``logits [N, vocab]``: argmax for greedy rows; the others sampled with their
        temperature, top-p and generator (their key's, else torch's default), the rows that share all three in one
        draw."""
        for key, seed in step.seeds.items():
            self._generators[key] = torch.Generator(device=logits.device).manual_seed(seed)
        tokens = logits.argmax(-1).tolist()
        groups: dict[tuple, list[int]] = {}
        for i, (temperature, top_p, key) in enumerate(step.sampling):
            if temperature > 0:
                groups.setdefault((temperature, top_p, key), []).append(i)
        for (temperature, top_p, key), rows in groups.items():
            drawn = sample(logits[rows], temperature, top_p, self._generators.get(key)).tolist()
            for i, token in zip(rows, drawn):
                tokens[i] = token
        return tokens


class RemoteExecutor:
    """The executors of a tensor-parallel group, one on each rank of ``workers`` (the driver's
    :class:`~longsparse.distributed.workers.Workers`), as one: each rank builds a :class:`ModelExecutor` for
    ``config`` (a request too large for a rank's memory is refused on every rank and raised here, the workers going
    on), each step runs on every rank and rank 0's result comes back. A rank that fails ends the workers and raises
    :class:`~longsparse.distributed.workers.RankFailure` from :meth:`execute`; :attr:`alive` is False from then on."""

    graphs = None

    def __init__(self, workers: Any, config: SchedulerConfig):
        self.workers = workers
        self.info: ExecutorInfo = workers.call("start_executor", config)

    @property
    def alive(self) -> bool:
        return self.workers.alive

    def execute(self, step: ModelStep) -> StepResult:
        return self.workers.call("execute_step", step)

    def summary(self) -> ExecutorSummary:
        return self.workers.call("executor_summary")


def start_executor(llm, config: SchedulerConfig, caches=None) -> ModelExecutor | RemoteExecutor:
    """The executor of an engine over ``llm``: its tensor-parallel workers' when it has them, else one in this
    process (over ``caches`` when given)."""
    if llm.workers is not None:
        if caches is not None:
            raise ValueError("with tensor_parallel_size > 1 the caches are allocated by the worker processes")
        return RemoteExecutor(llm.workers, config)
    return ModelExecutor(llm, config, caches)
