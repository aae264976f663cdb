"""``LLMEngine``: a loaded model, caches allocated once for ``max_num_seqs`` slots of ``max_model_len`` tokens, and the
continuous-batching :class:`~longsparse.engine.scheduler.Scheduler` that shares them among requests.

Requests are added at any time (:meth:`LLMEngine.add_request`); each :meth:`LLMEngine.step` runs the scheduler's plan
— one decode call for the running requests, one prefill call for the prompt chunks of the step — samples a token for
every request that has a new last position (each with its own temperature, top-p and seed), detokenizes it and
returns what each request gained. The engine is synchronous and not thread-safe:
:class:`~longsparse.engine.async_engine.AsyncLLMEngine` runs it in a thread of its own for the server.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass, field, replace

import torch

from ..cache import BlockKVCache, CompressedKeys, GDNStates, KVCache
from ..models.plan import BlockFractions
from .decode_graph import GraphDecoder
from .detokenizer import IncrementalDetokenizer
from .sampler import SamplingParams, sample
from .scheduler import Request, Scheduler, SchedulerConfig, StepPlan


@dataclass(frozen=True)
class RequestOutput:
    """What request ``request_id`` gained in one step: ``new_token_ids`` and ``new_text`` (text that can no longer
    change: a tail that may still become a stop string is held back until it cannot), its token counts so far and,
    once it ended, ``finish_reason`` (``"eos"``, ``"stop"``, ``"length"`` or ``"abort"``)."""

    request_id: str
    new_text: str
    new_token_ids: tuple[int, ...]
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class EngineStats:
    """Totals since the engine started: ``prompt_tokens`` prefilled, ``generation_tokens`` sampled (``decode_tokens``
    of them by decode steps, the others by the prefills that completed a prompt), ``steps`` run, finished requests
    by finish reason; the seconds spent in prefill and in decode work (a step's sampling and detokenization count
    with its decode when it has one); the sparse GDN layers' keep ratios (``keep_ratio_sum`` over
    ``keep_ratio_count`` layer calls) and the block-sparse layers' attended block shares, by phase."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    decode_tokens: int = 0
    steps: int = 0
    finished: Counter = field(default_factory=Counter)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    keep_ratio_sum: float = 0.0
    keep_ratio_count: int = 0
    prefill_blocks: BlockFractions = field(default_factory=BlockFractions)
    decode_blocks: BlockFractions = field(default_factory=BlockFractions)

    @property
    def keep_ratio(self) -> float | None:
        return self.keep_ratio_sum / self.keep_ratio_count if self.keep_ratio_count else None


class LLMEngine:
    """Continuous batching over the model of ``llm`` (an :class:`~longsparse.engine.api.LLM`; see the module
    docstring).

    ``config``: the scheduler's limits (default :class:`SchedulerConfig`'s, its ``max_model_len`` capped at the
    model's context). ``caches``: the ``(kv, gdn_states, compressed_keys)`` of ``llm.allocate(config.max_num_seqs,
    config.max_model_len)`` when the caller allocated them (``LLM.generate`` checks memory before the context);
    default: allocated here, once, and checked against the memory free now by the capacity model
    (:class:`~longsparse.cache.CapacityError` names what does not fit). The offloaded block cache takes whole
    prompts only, so with ``offload="cpu"`` prompts are not chunked; its host store is the LLM's one pinned buffer,
    so one offloading engine runs over an LLM at a time. With ``llm.cuda_graphs`` the decode steps run through a
    :class:`~longsparse.engine.decode_graph.GraphDecoder` (CUDA graphs replayed on a GPU, their step function
    elsewhere).
    """

    def __init__(
        self,
        llm,
        config: SchedulerConfig | None = None,
        *,
        caches: tuple[KVCache | None, GDNStates | None, CompressedKeys | None] | None = None,
    ):
        context = llm.config.max_position_embeddings
        if config is None:
            config = SchedulerConfig(max_model_len=min(SchedulerConfig.max_model_len, context))
        if config.max_model_len > context:
            raise ValueError(f"max_model_len ({config.max_model_len}) is over the model's context length ({context})")
        self.llm = llm
        if caches is None:
            caches = llm.allocate(config.max_num_seqs, config.max_model_len)
        self.kv, self.states, self.compressed = caches
        if isinstance(self.kv, BlockKVCache) and config.chunked_prefill:
            config = replace(config, chunked_prefill=False)
        self.config = config
        self.scheduler = Scheduler(config)
        self.stats = EngineStats()
        self._eos = frozenset(llm.loaded.eos_token_ids)
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._generators: dict[str, torch.Generator] = {}
        self._requests: dict[str, Request] = {}
        self._ids = itertools.count()
        self.graphs = None
        if llm.cuda_graphs and self.kv is not None:
            device = llm.loaded.device
            self.graphs = GraphDecoder(
                llm.loaded.model, self.kv, self.compressed, self.states, config.max_model_len, config.max_num_seqs,
                capture=device.type == "cuda",
            )  # fmt: skip

    @property
    def decode_path(self) -> str:
        """How decode steps run: ``"eager"``, ``"cuda graph"`` or ``"graph step"`` (the graphs' step function
        without a graph, off a GPU)."""
        if self.graphs is None:
            return "eager"
        return "cuda graph" if self.graphs.capture else "graph step"

    @property
    def tokenizer(self):
        return self.llm.tokenizer

    def add_request(
        self,
        prompt: str | SequenceABC[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        ignore_eos: bool = False,
        generator: torch.Generator | None = None,
    ) -> str:
        """Queue a prompt (text or token ids) and return its request id. ValueError for a prompt that can never run
        (empty, out-of-vocabulary ids, longer than ``max_model_len`` with its ``max_new_tokens``, stop strings
        without a tokenizer, an id in use); :class:`~longsparse.engine.scheduler.QueueFull` when the queue is full.
        ``generator``: what a sampled request draws from instead of a generator of its own seed (``LLM.generate``'s
        prompts share one, so that they draw different tokens under one seed)."""
        ids = self.llm.encode(prompt)
        if params.stop and self.tokenizer is None:
            raise ValueError("stop strings need a tokenizer, and this checkpoint has none")
        request_id = f"req-{next(self._ids)}" if request_id is None else request_id
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        request = Request(request_id, ids, params, ignore_eos=ignore_eos)
        self.scheduler.add(request)
        self._requests[request_id] = request
        if self.tokenizer is not None:
            self._detokenizers[request_id] = IncrementalDetokenizer(self.tokenizer, params.stop)
        if generator is None and params.seed is not None:
            generator = torch.Generator(device=self.llm.loaded.device).manual_seed(params.seed)
        if generator is not None:
            self._generators[request_id] = generator
        return request_id

    def abort_request(self, request_id: str) -> bool:
        """Stop ``request_id`` and free its slot; False if it is not (or no longer) running or waiting."""
        request = self.scheduler.abort(request_id)
        if request is None:
            return False
        self._forget(request)
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_work

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def kv_usage(self) -> float:
        """Share of the cache's token positions (``max_num_seqs × max_model_len``) holding a running request's
        tokens."""
        used = sum(r.num_computed for r in self.scheduler.running)
        return used / (self.config.max_num_seqs * self.config.max_model_len)

    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; one output per request that gained a token or ended."""
        plan = self.scheduler.schedule()
        if plan.empty:
            return []
        self._reset_slots(plan.new_slots)
        rows: list[Request] = []
        logits = []
        start = time.perf_counter()
        if plan.decodes:
            logits.append(self._decode(plan))
            rows += plan.decodes
        decoded = time.perf_counter()
        if plan.prefills:
            prefill_logits, finished = self._prefill(plan)
            logits.append(prefill_logits)
            rows += finished
        prefilled = time.perf_counter()
        self.stats.steps += 1
        outputs = []
        if rows:
            tokens = self._sample(rows, torch.cat(logits) if len(logits) > 1 else logits[0])
            outputs = [self._append(request, token) for request, token in zip(rows, tokens)]
        after = time.perf_counter() - prefilled
        self.stats.decode_seconds += decoded - start + (after if plan.decodes else 0.0)
        self.stats.prefill_seconds += prefilled - decoded + (0.0 if plan.decodes else after)
        self.stats.decode_tokens += len(plan.decodes)
        return outputs

    def _reset_slots(self, slots: list[int]) -> None:
        """Empty the state a slot's previous request left (the KV cache and compressed keys are overwritten from
        position 0 by the new prompt's prefill; GDN states and the block cache's bookkeeping are not)."""
        if not slots:
            return
        if self.states is not None:
            self.states.reset(slots)
        if isinstance(self.kv, BlockKVCache):
            self.kv.reset(slots)

    def _decode(self, plan: StepPlan) -> torch.Tensor:
        requests = plan.decodes
        tokens = [r.output_ids[-1] for r in requests]
        lengths = [r.num_tokens - 1 for r in requests]
        slots = [r.slot for r in requests]
        if self.graphs is not None:
            logits = self.graphs.step(tokens, slots, lengths, self.scheduler.free_slots)
        else:
            out = self.llm.runner.decode(
                tokens,
                prefix_lens=lengths,
                slots=slots,
                kv_cache=self.kv,
                gdn_states=self.states,
                compressed_keys=self.compressed,
            )
            self.stats.decode_blocks.merge(out.block_fractions)
            logits = out.logits
        for r in requests:
            r.num_computed = r.num_tokens
        return logits

    def _prefill(self, plan: StepPlan) -> tuple[torch.Tensor, list[Request]]:
        """Run the plan's prompt chunks; the logits of the chunks that complete their prompt, and their requests."""
        chunks = plan.prefills
        out = self.llm.runner.prefill(
            [c.request.prompt_ids[c.start : c.end] for c in chunks],
            slots=[c.request.slot for c in chunks],
            prefix_lens=[c.start for c in chunks],
            kv_cache=self.kv,
            gdn_states=self.states,
            compressed_keys=self.compressed,
        )
        stats = self.stats
        stats.prefill_blocks.merge(out.block_fractions)
        stats.keep_ratio_sum += sum(out.gdn_keep_ratios)
        stats.keep_ratio_count += len(out.gdn_keep_ratios)
        done = []
        for i, c in enumerate(chunks):
            c.request.num_computed = c.end
            stats.prompt_tokens += c.end - c.start
            if c.completes_prompt:
                done.append(i)
        return out.logits[done], [chunks[i].request for i in done]

    def _sample(self, requests: list[Request], logits: torch.Tensor) -> list[int]:
        """One token per row of ``logits [N, vocab]``: argmax for greedy requests; the others sampled with their
        temperature, top-p and generator (their seed's, a shared one, else torch's default), the rows that share
        all three in one draw."""
        tokens = logits.argmax(-1).tolist()
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            if r.params.temperature > 0:
                generator = self._generators.get(r.request_id)
                groups.setdefault((r.params.temperature, r.params.top_p, id(generator)), []).append(i)
        for (temperature, top_p, _), rows in groups.items():
            generator = self._generators.get(requests[rows[0]].request_id)
            drawn = sample(logits[rows], temperature, top_p, generator).tolist()
            for i, token in zip(rows, drawn):
                tokens[i] = token
        self.stats.generation_tokens += len(tokens)
        return tokens

    def _append(self, request: Request, token: int) -> RequestOutput:
        """Add ``token`` to ``request``: an end-of-sequence token ends it (and is not kept, unless ``ignore_eos``),
        a stop string in its text ends it, ``max_new_tokens`` ends it."""
        detokenizer = self._detokenizers.get(request.request_id)
        reason = None
        new_ids: tuple[int, ...] = ()
        if token in self._eos and not request.ignore_eos:
            reason = "eos"
        else:
            request.output_ids.append(token)
            new_ids = (token,)
            if detokenizer is not None and detokenizer.push(token):
                reason = "stop"
            elif len(request.output_ids) >= request.params.max_new_tokens:
                reason = "length"
        text = detokenizer.take(final=reason is not None) if detokenizer is not None else ""
        if reason is not None:
            self.scheduler.finish(request, reason)
            self._forget(request)
        return RequestOutput(request.request_id, text, new_ids, request.prompt_len, len(request.output_ids), reason)

    def _forget(self, request: Request) -> None:
        self.stats.finished[request.finish_reason] += 1
        for table in (self._requests, self._detokenizers, self._generators):
            table.pop(request.request_id, None)
