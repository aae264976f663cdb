"""``LLMEngine``: a loaded model, caches allocated once for ``max_num_seqs`` slots of ``max_model_len`` tokens, and the
continuous-batching :class:`~longsparse.engine.scheduler.Scheduler` that shares them among requests.

Requests are added at any time (:meth:`LLMEngine.add_request`); each :meth:`LLMEngine.step` runs the scheduler's plan
— one decode call for the running requests, one prefill call for the prompt chunks of the step — samples a token for
every request that has a new last position (each with its own temperature, top-p and seed), detokenizes it and
returns what each request gained. The model's part of a step — the caches, the forward passes, the sampling — is its
executor's (:mod:`~longsparse.engine.executor`): in this process, or on the ranks of a tensor-parallel group, whose
rank 0 sends back the sampled tokens. The engine is synchronous and not thread-safe:
:class:`~longsparse.engine.async_engine.AsyncLLMEngine` runs it in a thread of its own for the server.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass, field, replace

from ..cache import CompressedKeys, GDNStates, KVCache
from .detokenizer import IncrementalDetokenizer
from .executor import GeneratorKey, ModelExecutor, ModelStep, RemoteExecutor, start_executor
from .sampler import SamplingParams
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
    with its decode when it has one). What the layers did (keep ratios, attended blocks) is the executor's
    :meth:`~longsparse.engine.executor.ModelExecutor.summary`."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    decode_tokens: int = 0
    steps: int = 0
    finished: Counter = field(default_factory=Counter)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0


class LLMEngine:
    """Continuous batching over the model of ``llm`` (an :class:`~longsparse.engine.api.LLM`; see the module
    docstring).

    ``config``: the scheduler's limits (default :class:`SchedulerConfig`'s, its ``max_model_len`` capped at the
    model's context). ``caches``: the ``(kv, gdn_states, compressed_keys)`` of ``llm.allocate(config.max_num_seqs,
    config.max_model_len)`` when the caller allocated them (``LLM.generate`` checks memory before the context);
    default: allocated here, once, and checked against the memory free now by the capacity model
    (:class:`~longsparse.cache.CapacityError` names what does not fit). ``executor``: where the model steps run,
    when the caller started it (:func:`~longsparse.engine.executor.start_executor`, which the engine calls
    otherwise: in this process, or on ``llm``'s tensor-parallel workers). The offloaded block cache takes whole
    prompts only, so with ``offload="cpu"`` prompts are not chunked; its host store is the LLM's one pinned buffer,
    so one offloading engine runs over an LLM at a time (and under tensor parallelism one engine of any kind: the
    ranks hold one executor each). With ``llm.cuda_graphs`` the decode steps run through a
    :class:`~longsparse.engine.decode_graph.GraphDecoder` (CUDA graphs replayed on a GPU, their step function
    elsewhere).
    """

    def __init__(
        self,
        llm,
        config: SchedulerConfig | None = None,
        *,
        caches: tuple[KVCache | None, GDNStates | None, CompressedKeys | None] | None = None,
        executor: ModelExecutor | RemoteExecutor | None = None,
    ):
        context = llm.config.max_position_embeddings
        if config is None:
            config = SchedulerConfig(max_model_len=min(SchedulerConfig.max_model_len, context))
        if config.max_model_len > context:
            raise ValueError(f"max_model_len ({config.max_model_len}) is over the model's context length ({context})")
        self.llm = llm
        self.executor = executor if executor is not None else start_executor(llm, config, caches)
        if self.executor.info.whole_prompts and config.chunked_prefill:
            config = replace(config, chunked_prefill=False)
        self.config = config
        self.scheduler = Scheduler(config)
        self.stats = EngineStats()
        self._eos = frozenset(llm.eos_token_ids)
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._generators: dict[str, GeneratorKey] = {}
        self._seeds: dict[GeneratorKey, int] = {}
        self._released: list[GeneratorKey] = []
        self._requests: dict[str, Request] = {}
        self._ids = itertools.count()

    @property
    def decode_path(self) -> str:
        """How decode steps run: ``"eager"``, ``"cuda graph"`` or ``"graph step"`` (the graphs' step function
        without a graph, off a GPU)."""
        return self.executor.info.decode_path

    @property
    def alive(self) -> bool:
        """False once the executor has failed for good (a tensor-parallel rank failed and the workers ended)."""
        return self.executor.alive

    @property
    def graphs(self):
        """The executor's :class:`~longsparse.engine.decode_graph.GraphDecoder` when it is in this process (None
        without ``cuda_graphs``, and under tensor parallelism, where each rank holds its own)."""
        return self.executor.graphs

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
        generator: str | None = None,
    ) -> str:
        """Queue a prompt (text or token ids) and return its request id. ValueError for a prompt that can never run
        (empty, out-of-vocabulary ids, longer than ``max_model_len`` with its ``max_new_tokens``, stop strings
        without a tokenizer, an id in use); :class:`~longsparse.engine.scheduler.QueueFull` when the queue is full.
        ``generator``: the name of a generator that seeded requests share, seeded with the first one's seed,
        instead of one of each request's own seed (``LLM.generate``'s prompts share one, so that they draw different
        tokens under one seed)."""
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
        if params.seed is not None:
            key = ("shared", generator) if generator is not None else ("request", request_id)
            if key not in self._generators.values():
                self._seeds[key] = params.seed
            self._generators[request_id] = key
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
        start = time.perf_counter()
        step, rows = self._model_step(plan)
        result = self.executor.execute(step)
        for r in plan.decodes:
            r.num_computed = r.num_tokens
        for c in plan.prefills:
            c.request.num_computed = c.end
            self.stats.prompt_tokens += c.end - c.start
        self.stats.steps += 1
        self.stats.generation_tokens += len(rows)
        outputs = [self._append(request, token) for request, token in zip(rows, result.tokens)]
        # what the executor did not time (sending the step to the ranks, detokenizing) counts as its sampling does
        rest = time.perf_counter() - start - result.decode_seconds - result.prefill_seconds
        self.stats.decode_seconds += result.decode_seconds + (rest if plan.decodes else 0.0)
        self.stats.prefill_seconds += result.prefill_seconds + (0.0 if plan.decodes else rest)
        self.stats.decode_tokens += len(plan.decodes)
        return outputs

    def _model_step(self, plan: StepPlan) -> tuple[ModelStep, list[Request]]:
        """``plan`` as its executor runs it, and the requests of its sampled rows (the decodes, then the prompts
        whose last chunk it prefills)."""
        decodes, chunks = plan.decodes, plan.prefills
        done = [i for i, c in enumerate(chunks) if c.completes_prompt]
        rows = decodes + [chunks[i].request for i in done]
        step = ModelStep(
            new_slots=plan.new_slots,
            decode_tokens=[r.output_ids[-1] for r in decodes],
            decode_lengths=[r.num_tokens - 1 for r in decodes],
            decode_slots=[r.slot for r in decodes],
            free_slots=self.scheduler.free_slots if decodes else [],
            prefill_ids=[c.request.prompt_ids[c.start : c.end] for c in chunks],
            prefill_slots=[c.request.slot for c in chunks],
            prefill_starts=[c.start for c in chunks],
            prefill_done=done,
            sampling=[(r.params.temperature, r.params.top_p, self._generators.get(r.request_id)) for r in rows],
            seeds=self._seeds,
            released=self._released,
        )
        self._seeds, self._released = {}, []
        return step, rows

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
        for table in (self._requests, self._detokenizers):
            table.pop(request.request_id, None)
        key = self._generators.pop(request.request_id, None)
        if key is not None and key not in self._generators.values():
            if self._seeds.pop(key, None) is None:  # created by an earlier step
                self._released.append(key)
