"""Continuous batching: which requests run in the next step, and how many of their tokens.

A request waits in a FIFO queue until a cache slot is free, then runs until it finishes or is aborted, and its slot
goes to the next one. Each step has a token budget (``max_num_batched_tokens``): every running request that has
finished its prompt decodes one token, and what is left of the budget prefills prompts — first the unfinished prompts
of running requests, then newly admitted ones — in chunks continued from the tokens already cached
(``chunked_prefill``) or whole. So a request that arrives while others decode joins them between two steps, and a
long prompt does not stall the decodes for longer than one budget of tokens.

Slots are the cache's: ``max_num_seqs`` of ``max_model_len`` tokens each, allocated once. A request whose prompt and
``max_new_tokens`` cannot fit one slot is refused when it is added (``ValueError`` naming the limit); one that fits
waits while every slot is taken; past ``max_queued_requests`` waiting requests :class:`QueueFull` is raised.

The scheduler knows no model or tensor: :class:`~longsparse.engine.llm_engine.LLMEngine` runs the plan it returns.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from .sampler import SamplingParams


class QueueFull(RuntimeError):
    """Every slot is taken and ``max_queued_requests`` requests already wait."""


class RequestStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """One prompt's progress: ``prompt_ids`` and the tokens generated after them in cache slot ``slot``.

    ``num_computed``: tokens whose keys and values are in the cache (the prompt's prefilled part; once decoding, every
    token but the newest output, which the next decode step feeds). ``ignore_eos``: an end-of-sequence token is kept
    as an output token and does not end the request (a load generator's fixed output lengths).
    ``finish_reason``: ``"eos"``, ``"stop"``, ``"length"`` or ``"abort"``.
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    ignore_eos: bool = False
    arrival_time: float = field(default_factory=time.monotonic)
    status: RequestStatus = RequestStatus.WAITING
    slot: int | None = None
    num_computed: int = 0
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def prefilled(self) -> bool:
        return self.num_computed >= len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.status is RequestStatus.FINISHED


@dataclass(frozen=True)
class SchedulerConfig:
    """``max_num_seqs`` slots of ``max_model_len`` tokens (prompt + output); ``max_num_batched_tokens``: the tokens
    one step runs (decode tokens + prefill tokens; at least ``max_num_seqs``, so that every running request decodes
    every step); ``max_queued_requests``: waiting requests beyond which :meth:`Scheduler.add` raises
    :class:`QueueFull`; ``chunked_prefill``: prompts longer than what is left of a step's budget are prefilled over
    several steps (off for caches that take whole prompts only, such as the offloaded block cache: a prompt longer
    than the budget then runs in a step of its own); ``max_step_records``: the last step records kept."""

    max_num_seqs: int = 8
    max_model_len: int = 4096
    max_num_batched_tokens: int = 2048
    max_queued_requests: int = 256
    chunked_prefill: bool = True
    max_step_records: int = 10_000

    def __post_init__(self):
        for name in ("max_num_seqs", "max_model_len", "max_num_batched_tokens", "max_step_records"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.max_queued_requests, int) or self.max_queued_requests < 0:
            raise ValueError(f"max_queued_requests must be a non-negative integer, got {self.max_queued_requests!r}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be at least max_num_seqs "
                f"({self.max_num_seqs}): every running sequence decodes one token per step"
            )


@dataclass(frozen=True)
class PrefillChunk:
    """Prompt tokens ``start … end − 1`` of ``request`` (``start`` of them already cached)."""

    request: Request
    start: int
    end: int

    @property
    def completes_prompt(self) -> bool:
        return self.end == self.request.prompt_len


@dataclass
class StepPlan:
    """One step: ``decodes`` (one token each, in slot order), ``prefills`` (prompt chunks) and ``new_slots`` (slots
    taken by requests admitted in this step, whose cache state must be emptied before the step runs)."""

    decodes: list[Request] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)
    new_slots: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(c.end - c.start for c in self.prefills)

    @property
    def empty(self) -> bool:
        return not self.decodes and not self.prefills


@dataclass(frozen=True)
class StepRecord:
    """What step ``step`` ran: ``decodes`` (request ids), ``prefills`` (``(request id, start, end)``), ``admitted``
    (requests that took a slot in it) and ``waiting`` (queue length after it was planned)."""

    step: int
    decodes: tuple[str, ...]
    prefills: tuple[tuple[str, int, int], ...]
    admitted: tuple[str, ...]
    waiting: int


class Scheduler:
    """Waiting and running requests over ``config.max_num_seqs`` slots (see the module docstring)."""

    def __init__(self, config: SchedulerConfig):
        self.config = config
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._free_slots = list(range(config.max_num_seqs))
        self.records: deque[StepRecord] = deque(maxlen=config.max_step_records)
        self._steps = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    @property
    def free_slots(self) -> list[int]:
        """Slots no request holds now (a copy)."""
        return sorted(self._free_slots)

    def check(self, prompt_len: int, max_new_tokens: int) -> None:
        """Raise ValueError naming the limit if a request of ``prompt_len`` tokens asking for up to
        ``max_new_tokens`` can never run (it would not fit one slot)."""
        limit = self.config.max_model_len
        if prompt_len <= 0:
            raise ValueError("a prompt must have at least one token")
        if prompt_len >= limit:
            raise ValueError(
                f"the prompt has {prompt_len} tokens and this server's max_model_len is {limit}: at most {limit - 1} "
                "prompt tokens leave room for one new token"
            )
        if prompt_len + max_new_tokens > limit:
            raise ValueError(
                f"the prompt ({prompt_len} tokens) and max_tokens ({max_new_tokens}) need {prompt_len + max_new_tokens}"
                f" tokens, over max_model_len ({limit}): ask for at most {limit - prompt_len} new tokens"
            )

    def add(self, request: Request) -> None:
        """Queue ``request`` (ValueError if it can never fit, :class:`QueueFull` if the queue is full)."""
        self.check(request.prompt_len, request.params.max_new_tokens)
        if len(self.waiting) - len(self._free_slots) >= self.config.max_queued_requests:
            raise QueueFull(
                f"all {self.config.max_num_seqs} slots are taken and {len(self.waiting)} requests wait "
                f"(max_queued_requests={self.config.max_queued_requests}); try again later"
            )
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def abort(self, request_id: str) -> Request | None:
        """Remove the unfinished request ``request_id`` (its slot becomes free); None if there is none."""
        for request in self.waiting:
            if request.request_id == request_id:
                self.waiting.remove(request)
                request.status, request.finish_reason = RequestStatus.FINISHED, "abort"
                return request
        for request in self.running:
            if request.request_id == request_id:
                self.finish(request, "abort")
                return request
        return None

    def finish(self, request: Request, reason: str) -> None:
        """``request`` ended (``reason``): it leaves the running batch and frees its slot."""
        self.running.remove(request)
        heapq.heappush(self._free_slots, request.slot)
        request.status, request.finish_reason = RequestStatus.FINISHED, reason

    def schedule(self) -> StepPlan:
        """The next step's plan (see the module docstring); an empty plan when there is nothing to run."""
        budget = self.config.max_num_batched_tokens
        plan = StepPlan()
        plan.decodes = sorted((r for r in self.running if r.prefilled), key=lambda r: r.slot)
        budget -= len(plan.decodes)
        for request in self.running:
            if not request.prefilled and budget > 0:
                budget -= self._plan_prefill(plan, request, budget)
        admitted = []
        while self.waiting and self._free_slots and budget > 0:
            request = self.waiting[0]
            if not self.config.chunked_prefill and request.prompt_len > budget and plan.prefills:
                break  # a whole prompt that does not fit what is left runs in a later step
            self.waiting.popleft()
            request.slot = heapq.heappop(self._free_slots)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            plan.new_slots.append(request.slot)
            admitted.append(request.request_id)
            budget -= self._plan_prefill(plan, request, budget)
        if not plan.empty:
            self.records.append(
                StepRecord(
                    self._steps,
                    tuple(r.request_id for r in plan.decodes),
                    tuple((c.request.request_id, c.start, c.end) for c in plan.prefills),
                    tuple(admitted),
                    len(self.waiting),
                )
            )
            self._steps += 1
        return plan

    def _plan_prefill(self, plan: StepPlan, request: Request, budget: int) -> int:
        """Add ``request``'s next prompt chunk to ``plan`` (the rest of its prompt, cut to ``budget`` when chunking);
        returns its token count."""
        start = request.num_computed
        end = request.prompt_len
        if self.config.chunked_prefill:
            end = min(end, start + budget)
        plan.prefills.append(PrefillChunk(request, start, end))
        return end - start
