"""The continuous-batching scheduler alone (no model): token budget, chunked and whole prefills, admission into free
slots, refusals naming the limit, the queue bound, aborts, and its step records."""

import pytest

from longsparse.engine import SamplingParams
from longsparse.engine.scheduler import QueueFull, Request, Scheduler, SchedulerConfig


def request(rid: str, prompt_len: int, new: int = 4) -> Request:
    return Request(rid, list(range(prompt_len)), SamplingParams(max_new_tokens=new))


def run_plan(plan) -> None:
    """What the engine does with a plan, as far as the scheduler sees it: cached tokens advance, a finished prompt or
    a decode adds one output token."""
    for r in plan.decodes:
        r.num_computed = r.num_tokens
        r.output_ids.append(0)
    for chunk in plan.prefills:
        chunk.request.num_computed = chunk.end
        if chunk.completes_prompt:
            chunk.request.output_ids.append(0)


def test_budget_decodes_first_then_continues_and_admits_prompts_in_chunks():
    s = Scheduler(SchedulerConfig(max_num_seqs=3, max_model_len=200, max_num_batched_tokens=10))
    a, b, c, d = request("a", 4), request("b", 13), request("c", 2), request("d", 3)
    for r in (a, b, c, d):
        s.add(r)
    plan = s.schedule()
    assert [(ch.request.request_id, ch.start, ch.end) for ch in plan.prefills] == [("a", 0, 4), ("b", 0, 6)]
    assert plan.new_slots == [0, 1] and not plan.decodes
    run_plan(plan)
    plan = s.schedule()  # a decodes (1 token), b continues (7 tokens), c is admitted with what is left (2 tokens)
    assert [r.request_id for r in plan.decodes] == ["a"]
    assert [(ch.request.request_id, ch.start, ch.end) for ch in plan.prefills] == [("b", 6, 13), ("c", 0, 2)]
    assert plan.new_slots == [2] and plan.num_tokens == 10
    run_plan(plan)
    plan = s.schedule()  # every slot taken: d waits
    assert [r.request_id for r in plan.decodes] == ["a", "b", "c"] and not plan.prefills
    s.finish(b, "length")
    run_plan(plan)
    plan = s.schedule()  # b's slot goes to d
    assert [r.request_id for r in plan.decodes] == ["a", "c"] and plan.new_slots == [1] and d.slot == 1
    records = list(s.records)
    assert [r.admitted for r in records] == [("a", "b"), ("c",), (), ("d",)]
    assert [r.waiting for r in records] == [2, 1, 1, 0]
    assert records[3].decodes == ("a", "c") and records[3].prefills == (("d", 0, 3),)


def test_without_chunking_a_prompt_over_what_is_left_waits_and_a_long_one_runs_alone():
    s = Scheduler(SchedulerConfig(max_num_seqs=4, max_model_len=100, max_num_batched_tokens=10, chunked_prefill=False))
    for r in (request("a", 6), request("b", 6), request("c", 30)):
        s.add(r)
    plan = s.schedule()
    assert [(ch.request.request_id, ch.start, ch.end) for ch in plan.prefills] == [("a", 0, 6)]
    run_plan(plan)
    plan = s.schedule()
    assert [(ch.request.request_id, ch.end) for ch in plan.prefills] == [("b", 6)]
    run_plan(plan)
    plan = s.schedule()  # 30 tokens over a budget of 10: whole, with no other prompt, beside the decodes
    assert [(ch.request.request_id, ch.end) for ch in plan.prefills] == [("c", 30)]
    assert [r.request_id for r in plan.decodes] == ["a", "b"]


def test_refusals_name_the_limit_and_the_queue_is_bounded():
    s = Scheduler(SchedulerConfig(max_num_seqs=1, max_model_len=50, max_num_batched_tokens=8, max_queued_requests=2))
    with pytest.raises(ValueError, match="max_model_len is 50"):
        s.add(request("long", 50))
    with pytest.raises(ValueError, match=r"need 55 tokens, over max_model_len \(50\): ask for at most 10"):
        s.add(request("long-output", 40, new=15))
    for rid in ("a", "b", "c"):  # one for the free slot, two waiting
        s.add(request(rid, 3))
    with pytest.raises(QueueFull, match="max_queued_requests=2"):
        s.add(request("d", 3))
    assert [r.request_id for r in s.waiting] == ["a", "b", "c"]
    run_plan(s.schedule())
    assert s.abort("b").finish_reason == "abort" and s.abort("b") is None
    s.add(request("d", 3))
    assert s.abort("a").finished and s.num_free_slots == 1
    assert s.schedule().new_slots == [0] and [r.request_id for r in s.running] == ["c"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(max_num_seqs=0), "max_num_seqs must be a positive integer"),
        (dict(max_num_seqs=8, max_num_batched_tokens=4), "max_num_batched_tokens .4. must be at least max_num_seqs"),
        (dict(max_queued_requests=-1), "max_queued_requests must be a non-negative integer"),
    ],
)
def test_config_is_validated(fields, message):
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**fields)
