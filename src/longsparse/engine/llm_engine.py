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
from collections import Counter
from collections.abc import Sequence as SequenceABC
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from ..cache import BlockKVCache
from .api import SamplingParams
from .detokenizer import IncrementalDetokenizer
from .sampler import sample
from .scheduler import Request, Scheduler, SchedulerConfig, StepPlan

if TYPE_CHECKING:
    from .api import LLM


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
    """Totals since the engine started: ``prompt_tokens`` prefilled, ``generation_tokens`` sampled, ``steps`` run,
    and finished requests by finish reason."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    steps: int = 0
    finished: Counter = field(default_factory=Counter)


class LLMEngine:
    """Continuous batching over the model of ``llm`` (see the module docstring).

    ``config``: the scheduler's limits (default :class:`SchedulerConfig`'s, its ``max_model_len`` capped at the
    model's context). The caches are allocated here, once, and checked against the memory free now by the capacity
    model (:class:`~longsparse.cache.CapacityError` names what does not fit). The offloaded block cache takes whole
    prompts only, so with ``offload="cpu"`` prompts are not chunked.
    """

    def __init__(self, llm: LLM, config: SchedulerConfig | None = None):
        if config is None:
            context = llm.config.max_position_embeddings
            config = SchedulerConfig(max_model_len=min(SchedulerConfig.max_model_len, context))
        context = llm.config.max_position_embeddings
        if config.max_model_len > context:
            raise ValueError(f"max_model_len ({config.max_model_len}) is over the model's context length ({context})")
        self.llm = llm
        self.kv, self.states, self.compressed = llm.allocate(config.max_num_seqs, config.max_model_len)
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
    ) -> str:
        """Queue a prompt (text or token ids) and return its request id. ValueError for a prompt that can never run
        (empty, out-of-vocabulary ids, longer than ``max_model_len`` with its ``max_new_tokens``, stop strings
        without a tokenizer, an id in use); :class:`~longsparse.engine.scheduler.QueueFull` when the queue is full."""
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
            device = self.llm.loaded.device
            self._generators[request_id] = torch.Generator(device=device).manual_seed(params.seed)
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
        if plan.decodes:
            logits.append(self._decode(plan))
            rows += plan.decodes
        if plan.prefills:
            prefill_logits, finished = self._prefill(plan)
            logits.append(prefill_logits)
            rows += finished
        self.stats.steps += 1
        if not rows:
            return []
        tokens = self._sample(rows, torch.cat(logits) if len(logits) > 1 else logits[0])
        return [self._append(request, token) for request, token in zip(rows, tokens)]

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
        out = self.llm.runner.decode(
            [r.output_ids[-1] for r in requests],
            prefix_lens=[r.num_tokens - 1 for r in requests],
            slots=[r.slot for r in requests],
            kv_cache=self.kv,
            gdn_states=self.states,
            compressed_keys=self.compressed,
        )
        for r in requests:
            r.num_computed = r.num_tokens
        return out.logits

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
        done = []
        for i, c in enumerate(chunks):
            c.request.num_computed = c.end
            self.stats.prompt_tokens += c.end - c.start
            if c.completes_prompt:
                done.append(i)
        return out.logits[done], [chunks[i].request for i in done]

    def _sample(self, requests: list[Request], logits: torch.Tensor) -> list[int]:
        """One token per row of ``logits [N, vocab]``: argmax for greedy requests, else sampled with the request's
        temperature, top-p and generator (its seed's, else torch's default)."""
        tokens = logits.argmax(-1).tolist()
        for i, r in enumerate(requests):
            p = r.params
            if p.temperature > 0:
                generator = self._generators.get(r.request_id)
                tokens[i] = int(sample(logits[i : i + 1], p.temperature, p.top_p, generator)[0])
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

    def generate(
        self, prompts: SequenceABC[str | SequenceABC[int]], params: SamplingParams
    ) -> list[tuple[str, list[int], str]]:
        """Run ``prompts`` to the end together: ``(text, token_ids, finish_reason)`` each, in order."""
        ids = [self.add_request(p, params) for p in prompts]
        texts = dict.fromkeys(ids, "")
        tokens: dict[str, list[int]] = {i: [] for i in ids}
        reasons: dict[str, str] = {}
        while self.has_unfinished_requests():
            for out in self.step():
                if out.request_id in texts:
                    texts[out.request_id] += out.new_text
                    tokens[out.request_id] += out.new_token_ids
                    if out.finished:
                        reasons[out.request_id] = out.finish_reason
        return [(texts[i], tokens[i], reasons[i]) for i in ids]
